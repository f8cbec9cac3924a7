/* Street addresses typed in lowercase and the shortened forms the
 * capitalised rules missed (engine/detect/detect_names_address*.c): each
 * found whole with its locality and postcode, and the near misses --
 * counts, measures, compound nouns, lanes of a road -- left alone.  The
 * sentences are written for this suite. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../engine/detect/detect.h"
#include "helpers.h"

static cp_detect_chain names_chain(void) { return test_chain_of(cp_detector_names); }

/* the address spans found in text, as "matched text;..." */
static void addresses_in(cp_detect_chain *c, const char *text, char *out, size_t cap)
{
    test_spans_text(c, text, "address", out, cap);
}

Test(names, lowercase_addresses_are_found_whole)
{
    cp_detect_chain c = names_chain();
    static const struct { const char *text, *want; } cases[] = {
        { "i live at 42 baker street", "42 baker street;" },
        { "send it to 1600 pennsylvania avenue nw, washington dc 20500 asap",
          "1600 pennsylvania avenue nw, washington dc 20500;" },
        { "flat 3, 27 high st, london sw1a 1aa", "flat 3, 27 high st, london sw1a 1aa;" },
        { "flat 12, mg road, bengaluru 560001", "flat 12, mg road, bengaluru 560001;" },
        { "my address is 7 church road, leeds", "7 church road, leeds;" },
        { "i live at 42 baker street with my wife", "42 baker street;" },
        /* lowercase words after its comma are no locality without a postcode or a known place */
        { "i live at 42 baker street, quite close to it", "42 baker street;" },
        /* no cue before it, but a locality after it */
        { "42 elm drive, springfield 62704 is the house", "42 elm drive, springfield 62704;" },
        /* a capitalised address goes on into a lowercase locality and postcode */
        { "I live at 42 Baker Street, london nw1 6xe", "42 Baker Street, london nw1 6xe;" },
        /* a lowercase type that leads its name, French and Spanish */
        { "12 rue de la paix", "12 rue de la paix;" },
        { "vivo en 7 calle mayor", "7 calle mayor;" },
        /* a compound street shortened to -str. before its number, a lowercase city after the postcode */
        { "Hauptstr. 5, 10115 berlin", "Hauptstr. 5, 10115 berlin;" },
    };
    char got[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        addresses_in(&c, cases[i].text, got, sizeof got);
        cr_assert_str_eq(got, cases[i].want, "case %zu '%s': got '%s'", i, cases[i].text, got);
    }
    cp_chain_free(&c);
}

Test(names, lowercase_address_near_misses_are_prose)
{
    cp_detect_chain c = names_chain();
    static const char *const negatives[] = {
        "it's a 10 minute walk to the station",
        "a 2 hour drive to the coast",
        "we live on a 4 lane road",
        "there are 2 coffee shops on my street",
        "we went to 3 different places",
        "at 5 star place we ate well",
        "it is a 1 way street",
        "due to 4 main road closures we were late",
        "i moved 3 boxes to the close",
        "add 2 cups flour and stir",
        "he scored 2 goals at the court",
        "42 baker street is a famous novel address",
        "5 route options were shown",
        "we went to 2 nice gardens today",
    };
    char got[512];
    for (size_t i = 0; i < sizeof negatives / sizeof negatives[0]; i++) {
        addresses_in(&c, negatives[i], got, sizeof got);
        cr_assert_str_eq(got, "", "near miss %zu '%s' was flagged: %s", i, negatives[i], got);
    }
    cp_chain_free(&c);
}
