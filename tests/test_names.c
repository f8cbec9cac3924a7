/* The free-text recognizer (engine/detect/detect_names.c): names, places,
 * organisations, street addresses, ages and titles found with their exact
 * byte offsets; sentences whose only capitals are ordinary words left alone;
 * documents and system prompts not scanned under the default policy; the
 * CLI's default chain includes it and --no-names leaves it out.  The
 * sentences are written for this suite (not taken from any evaluation
 * set); each golden offset is where the expected text lies in the sentence. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../engine/detect/detect.h"
#include "helpers.h"

static cp_detect_chain names_chain(void) { return test_chain_of(cp_detector_names); }

/* the spans of text in role, as "type[start,end);..." */
static void spans_of(cp_detect_chain *c, const char *text, size_t len, cp_role role, char *out, size_t cap)
{
    test_spans_at(c, text, len, role, out, cap);
}

/* a user turn and the spans the chain must find in it ("type[start,end);" each) */
typedef struct span_case {
    const char *text, *want;
} span_case;

/* each case finds exactly its spans */
static void expect_spans(cp_detect_chain *c, const span_case *cases, size_t n)
{
    char got[512];
    for (size_t i = 0; i < n; i++) {
        spans_of(c, cases[i].text, strlen(cases[i].text), CP_ROLE_USER, got, sizeof got);
        cr_assert_str_eq(got, cases[i].want, "case %zu '%s': got '%s'", i, cases[i].text, got);
    }
}

/* each near miss is left unmarked */
static void expect_no_spans(cp_detect_chain *c, const char *const *negatives, size_t n)
{
    char got[512];
    for (size_t i = 0; i < n; i++) {
        spans_of(c, negatives[i], strlen(negatives[i]), CP_ROLE_USER, got, sizeof got);
        cr_assert_str_eq(got, "", "'%s' flagged: %s", negatives[i], got);
    }
}

Test(names, finds_people_places_orgs_addresses_ages_with_offsets)
{
    cp_detect_chain c = names_chain();
    static const span_case cases[] = {
        /* a name mid-sentence, three words */
        { "Please ask Benedikt Aurelius Kamau to sign.", "person[11,34);" },
        /* an honorific: its own title span, the abbreviation's '.' not a sentence end */
        { "Yesterday I spoke with Dr. Wanjiru Otieno about it.", "title[23,26);person[27,41);" },
        /* non-ASCII letters; a day after it is not a name */
        { "Send it to Siobh\xc3\xa1n N\xc3\xad Bhriain by Friday.", "person[11,31);" },
        /* non-ASCII capitals (utf8proc), a hyphenated surname */
        { "The invoice went to \xc5\x81ukasz \xc5\xbb\xc3\xb3\xc5\x82kowski-Brandt last week.", "person[20,47);" },
        /* two capitalised words at a sentence start, particles inside */
        { "Ludwig van der Berg signed it.", "person[0,19);" },
        /* a sentence-start greeting is dropped, the name after it kept */
        { "Thanks Adaeze, see you soon.", "person[7,13);" },
        /* "I" right after a name is not part of it */
        { "Tell Kwame I said hello.", "person[5,10);" },
        /* one capitalised word at a sentence start that is a name after all:
         * a speaker label, a sentence of its own, the subject of a verb of people */
        { "Amara: I will bring the slides.", "person[0,5);" },
        { "What is your surname? Okafor.", "person[22,28);" },
        { "Amara replied that she agreed.", "person[0,5);" },
        /* a strong cue takes lowercase names, up to a function word */
        { "my name is amara okafor and I need help", "person[11,23);" },
        { "Call me Ishmael.", "person[8,15);" },
        /* ages after cues, and N-year-old */
        { "I'm 34 and my brother is aged 41.", "age[4,6);age[30,32);" },
        { "He is a 67-year-old retired pilot.", "age[8,10);" },
        /* organisations by their suffix, the suffix's '.' included */
        { "She joined Brightwater Analytics Ltd. in 2019.", "org[11,37);" },
        { "He studied at the University of Troms\xc3\xb8 for years.", "org[18,39);" },
        /* a place after a place cue, in capitals too */
        { "We landed in OSLO late.", "location[13,17);" },
        /* a place after a place cue */
        { "We flew from Ouagadougou on a Tuesday.", "location[13,24);" },
        /* addresses: number first with unit and locality; street type first; a compound street */
        { "Deliver to 1729 Larkspur Avenue, Apt 5C, Riverton.", "address[11,49);" },
        { "Ship it to Via Garibaldi 27, Lucca.", "address[11,34);" },
        { "Via Garibaldi 27, Lucca, is the address.", "address[0,23);" }, /* no cue before it */
        { "The office is at Kastanienallee 8 in the north.", "address[17,33);" },
        { "Her flat is on 14 Quarry Lane.", "address[15,29);" },
        /* house number, street, number, locality (no street type) */
        { "Post it to 4923 Harjukuja 54, Espoo.", "address[11,35);" },
    };
    expect_spans(&c, cases, sizeof cases / sizeof cases[0]);
    cp_chain_free(&c);
}

Test(names, ordinary_capitals_are_not_flagged)
{
    cp_detect_chain c = names_chain();
    static const char *const negatives[] = {
        "The report is due on Monday.",
        "In March we met again, and in December too.",
        "I think I can do it if I try.",
        "Thanks! See you on Friday.",
        "Hello. What is the plan for Wednesday?",
        "Please send the file. Then call back.",
        "Could you summarize the second passage? It is long.",
        "He said it was fine. She agreed. They left in June.",
        /* roles, salutations and speaker labels name no one */
        "Project Manager: we should start now.",
        "Dear Sir or Madam, thank you.",
        "Professor B said it works.",
    };
    expect_no_spans(&c, negatives, sizeof negatives / sizeof negatives[0]);
    cp_chain_free(&c);
}

/* A capitalised pronoun, article or greeting of another language at a
 * sentence start is no name (it is no English word, so the word list alone
 * would take it for one); the name after it still is. */
Test(names, sentence_start_function_words_of_other_languages_are_not_names)
{
    cp_detect_chain c = names_chain();
    static const span_case cases[] = {
        { "Ich wohne in der Hauptstra\xc3\x9f" "e 5", "address[17,31);" },
        { "Wir treffen uns morgen.", "" },
        { "Je pense que oui.", "" },
        { "Yo vivo aqu\xc3\xad.", "" },
        { "Ik woon hier.", "" },
        { "Eu moro aqui.", "" },
        /* Как тебя зовут? / Я живу здесь. */
        { "\xd0\x9a\xd0\xb0\xd0\xba \xd1\x82\xd0\xb5\xd0\xb1\xd1\x8f \xd0\xb7\xd0\xbe\xd0\xb2\xd1\x83\xd1\x82?", "" },
        { "\xd0\xaf \xd0\xb6\xd0\xb8\xd0\xb2\xd1\x83 \xd0\xb7\xd0\xb4\xd0\xb5\xd1\x81\xd1\x8c.", "" },
        /* the name after such a word is kept, as after Hello */
        { "Liebe Anna, danke.", "person[6,10);" },
        { "Je m'appelle Pierre.", "person[13,19);" },
    };
    expect_spans(&c, cases, sizeof cases / sizeof cases[0]);
    cp_chain_free(&c);
}

/* More free-text PII forms, written for this suite: military and P.O. boxes, a
 * ship, a street after an address cue with no street type, a lowercase
 * street type (Hungarian), an address block whose country line follows a
 * blank line; firms named by three surnames, by a number, by a lowercase
 * legal suffix, a university in capitals; a sentence-initial pair of
 * surnames, a double-barrelled surname; a place in capitals after "to", a
 * city line above a country line.  Offsets are the expected substrings'
 * byte positions, computed apart from the program. */
Test(names, addresses_firms_and_places_of_many_forms)
{
    cp_detect_chain c = names_chain();
    static const span_case cases[] = {
        { "The parcel went to PSC 4410, Box 2231 today.", "address[19,37);" },
        { "Mail it to USNS Okonkwo FPO AE 09510 please.", "address[11,36);" },
        { "She lives on Kowalczyka 19 with her aunt.", "address[13,26);" },
        { "Our office is at 12 Andr\xc3\xa1ssy \xc3\xbat 45 now.", "address[17,36);" },
        /* a number, then a street type that leads its name (French, Spanish): the postcode and city after it */
        { "the parcel goes to 18 rue des Tanneurs, 69002 Lyon.", "address[19,50);" },
        { "we live at 5 bis avenue Jean-Jaur\xc3\xa8s, 33000 Bordeaux now.", "address[11,52);" },
        { "send it to 7 calle de Alcal\xc3\xa1, 28014 Madrid please.", "address[11,43);" },
        { "we got 2 al Rashid.", "person[12,18);" }, /* "al" between a number and a name is no street */
        { "She lives at 5 V\xc3\xa1" "ci utca now.", "address[13,25);" },
        { "Write to P.O. Box 77, Harare.", "address[9,28);" },
        { "Maria Jensen\n\nN\xc3\xb8rregade 14\nAarhus\n\nDenmark 8000", "person[0,12);address[14,48);" },
        { "> Apt. 316\n> VORDINGBORG\n> Denmark", "address[2,34);" },
        { "I met the partners of Okafor, Lindqvist and Tanaka yesterday.", "org[22,50);" },
        { "She joined 37 Signals Inc last year.", "org[11,25);" },
        { "he works at blue harbor logistics llc now", "org[12,37);" },
        { "She studied at the University of TARTU.", "org[19,38);" },
        { "Abernathy and Okoro were the engineers.", "person[0,9);person[14,19);" },
        { "Fitzgerald-Mbeki is joining us.", "person[0,16);" },
        /* the same where each word is also an English word (the word list alone would share them) */
        { "Rose and Okoro were the engineers.", "person[0,4);person[9,14);" },
        { "Young-Baker is joining us.", "person[0,11);" },
        { "He flew to KIRUNA on Monday.", "location[11,17);" },
        { "Deliver to:\nTORSHAVN\nDenmark", "location[12,20);location[21,28);" },
        /* full dates, with a time when one follows */
        { "We met on 2021-03-14 at home.", "date[10,20);" },
        { "Logged at 2000-04-16 11:34:35 by the system.", "date[10,29);" },
        { "She was born 4/14/1962 in Lyon.", "date[13,22);location[26,30);" },
        { "Due 16.04.2000, sharp.", "date[4,14);" },
    };
    expect_spans(&c, cases, sizeof cases / sizeof cases[0]);
    /* and ordinary sentences near those rules stay shareable */
    static const char *const negatives[] = {
        "We walked 3 blocks down the street.", "On Monday and Tuesday I was at home.",
        "Hello and welcome to the show.",     "I have 2 dogs and 3 cats at home.",
        "Thanks, and see you on Friday.",     "we went to the shop and bought 2 apples.",
        "Version 1.2.3 is out.",              "The score was 10-20-30 today.",
        "Chapter 3/4 is done.",               "It happened in 2019.",
        "We have 3 avenues to explore.",      "he scored 5 via a header.",
        "I ran 5 avenue blocks.",
    };
    expect_no_spans(&c, negatives, sizeof negatives / sizeof negatives[0]);
    cp_chain_free(&c);
}

/* The gazetteer: a country or major place is a location where a lone
 * capital would be taken for an ordinary word (a sentence start), in
 * capitals, and (countries only) in lowercase; it types a run as a place.
 * Offsets counted by hand. */
Test(names, gazetteer_places)
{
    cp_detect_chain c = names_chain();
    static const span_case cases[] = {
        /* alone at a sentence start */
        { "Estonia was lovely. Portugal too.", "location[0,7);location[20,28);" },
        { "Budapest is cold in winter.", "location[0,8);" },
        /* in capitals without a place cue (an address's last line) */
        { "Send it to Lina:\nTRONDHEIM\nNORWAY", "person[11,15);location[17,26);location[27,33);" },
        /* a country in lowercase, with or without a cue */
        { "i'm originally from switzerland", "location[20,31);" },
        { "we liked tunisia a lot", "location[9,16);" },
        /* a run holding a gazetteer word is a place, not a person */
        { "It served Southern Italy for years.", "location[10,24);" },
        { "They sailed past New Zealand.", "location[17,28);" },
        /* non-ASCII entries */
        { "Z\xc3\xbcrich was sunny.", "location[0,7);" },
    };
    expect_spans(&c, cases, sizeof cases / sizeof cases[0]);
    /* capitalised only: these are English words in lowercase */
    static const char *const negatives[] = { "we ate turkey and rice", "a china cup on the table", "the rio of it" };
    expect_no_spans(&c, negatives, sizeof negatives / sizeof negatives[0]);
    cp_chain_free(&c);
}

/* Under the default policy documents and system prompts never reach the
 * recognizer (they are public, shared); user and assistant turns do. */
Test(names, default_policy_scans_user_and_assistant_only)
{
    cp_detect_chain c = names_chain();
    static const char text[] = "Forward it to Benedikt Kamau at 12 Quarry Lane.";
    char got[512];
    spans_of(&c, text, strlen(text), CP_ROLE_DOCUMENT, got, sizeof got);
    cr_assert_str_eq(got, "", "a document was scanned: %s", got);
    spans_of(&c, text, strlen(text), CP_ROLE_SYSTEM, got, sizeof got);
    cr_assert_str_eq(got, "", "a system prompt was scanned: %s", got);
    spans_of(&c, text, strlen(text), CP_ROLE_USER, got, sizeof got);
    cr_assert_str_eq(got, "person[14,28);address[32,46);", "user: %s", got);
    spans_of(&c, text, strlen(text), CP_ROLE_ASSISTANT, got, sizeof got);
    cr_assert_str_eq(got, "person[14,28);address[32,46);", "assistant: %s", got);
    cp_chain_free(&c);
}

/* A message longer than the scanner's word window: every name is found once,
 * those next to the window's cut too, at its own offset. */
Test(names, long_message_across_windows_loses_nothing)
{
    cp_detect_chain c = names_chain();
    static const char unit[] = "alpha beta gamma Kofi delta "; /* 5 words, Kofi at byte 17 */
    const size_t units = 2000, ul = sizeof unit - 1;
    char *text = malloc(units * ul + 1);
    cr_assert(text);
    for (size_t u = 0; u < units; u++) memcpy(text + u * ul, unit, ul);
    text[units * ul] = 0;
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_eq(cp_chain_detect(&c, text, units * ul, CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(s.n, units, "%zu spans for %zu names", s.n, units);
    for (size_t i = 0; i < s.n; i++) {
        cr_assert_eq(s.v[i].start, i * ul + 17, "span %zu starts at %u", i, s.v[i].start);
        cr_assert_eq(s.v[i].end, i * ul + 21, "span %zu ends at %u", i, s.v[i].end);
    }
    cp_spans_free(&s);
    free(text);
    cp_chain_free(&c);
}

/* Hostile bytes: no span ever leaves the message, nothing fails. */
Test(names, spans_stay_inside_odd_input)
{
    cp_detect_chain c = names_chain();
    static const char *const odd[] = { "A", "Mr.", "Mr", "12 Oak", "Via 7", "Apt", "my name is", "I'm", "-'", "\xc3\xa9\xcc\x81",
                                       "X Y Z", "1 A B C D E F G H St" };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        cp_spans s = { 0 };
        cp_error err = { 0 };
        size_t len = strlen(odd[i]);
        cr_assert_eq(cp_chain_detect(&c, odd[i], len, CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
        cr_assert(!s.wholly, "'%s' failed closed", odd[i]);
        for (size_t k = 0; k < s.n; k++) cr_assert(s.v[k].start < s.v[k].end && s.v[k].end <= len, "'%s'", odd[i]);
        cp_spans_free(&s);
    }
    cp_chain_free(&c);
}


/* The CLI's chain (detect, run, serve, eval-detect share it) has the
 * recognizer by default; --no-names leaves it out. */
Test(names, cli_default_chain_has_it_and_no_names_removes_it)
{
    static char out[1 << 14];
    cr_assert_eq(test_cli_output("detect --json 'ask Benedikt Kamau'", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "{\"start\":4,\"end\":18,\"type\":\"person\""), "%s", out);
    cr_assert_eq(test_cli_output("detect --json --role document 'ask Benedikt Kamau'", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"spans\":[]"), "%s", out);
    cr_assert_eq(test_cli_output("detect --json --no-names 'ask Benedikt Kamau'", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"spans\":[]"), "%s", out);
}

/* cp_spans_resolve (one pass since the recognizer makes long messages hold
 * thousands of spans) against its definition, checked pair by pair here: a
 * span goes when it lies inside a larger one, or inside an equal one of
 * higher score (one of two identical ones stays); the bytes covered never
 * change. */
Test(names, resolve_matches_its_definition)
{
    uint32_t seed = 12345;
    for (int round = 0; round < 200; round++) {
        cp_spans s = { 0 };
        cp_error err = { 0 };
        int n = 1 + round % 24;
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            uint32_t a = (seed >> 8) % 40, l = (seed >> 20) % 12;
            cr_assert_eq(cp_spans_add(&s, a, a + l, "t", (float)((seed >> 4) % 3), &err), CP_OK);
        }
        cp_span orig[32];
        memcpy(orig, s.v, (size_t)n * sizeof *orig);
        int want = 0;
        for (int i = 0; i < n; i++) {
            int gone = 0;
            for (int j = 0; j < n && !gone; j++) {
                if (j == i) continue;
                const cp_span *x = &orig[i], *y = &orig[j];
                int in = y->start <= x->start && x->end <= y->end, same = y->start == x->start && y->end == x->end;
                gone = in && (!same || y->score > x->score || (y->score == x->score && j < i));
            }
            want += !gone;
        }
        uint8_t before[64] = { 0 }, after[64] = { 0 };
        for (int i = 0; i < n; i++)
            for (uint32_t b = orig[i].start; b < orig[i].end; b++) before[b] = 1;
        cp_spans_resolve(&s);
        cr_assert_eq((int)s.n, want, "round %d: %zu spans kept, %d by the definition", round, s.n, want);
        for (size_t i = 0; i < s.n; i++)
            for (uint32_t b = s.v[i].start; b < s.v[i].end; b++) after[b] = 1;
        cr_assert_eq(memcmp(before, after, sizeof before), 0, "round %d: the covered bytes changed", round);
        for (size_t i = 1; i < s.n; i++) cr_assert(s.v[i - 1].start <= s.v[i].start, "round %d: not sorted", round);
        cp_spans_free(&s);
    }
}

/* The common-word list (wamerican, read at run time): a sentence-initial
 * capitalised word that is no English word is a name; one that is (however,
 * well-known, don't) is an ordinary sentence start.  Offsets by hand. */
Test(names, word_list_tells_names_from_sentence_starts)
{
    cp_detect_chain c = names_chain();
    static const span_case cases[] = {
        { "Usamov is very reliable.", "person[0,6);" },
        { "J\xc3\xa4rvilehto began writing as a teenager.", "person[0,11);" },
        { "Opencounter was born on a beach.", "person[0,11);" },
        { "O'Rourke will call you back.", "person[0,8);" },
        { "Unfortunately the train was late.", "" },
        { "Well-known songs were played.", "" },
        { "Don't worry about it.", "" },
        { "Yesterday we walked home.", "" },
    };
    expect_spans(&c, cases, sizeof cases / sizeof cases[0]);
    cp_chain_free(&c);
}

/* No list, or a file that is no word list: refused with the reason (and
 * how to install it), never a recognizer without it; the CLI refuses to
 * start. */
Test(names, missing_word_list_is_refused)
{
    cp_detector *d = NULL;
    cp_error err = { 0 };
    cr_assert_neq(cp_detector_names_words("/nonexistent/words", &d, &err), CP_OK);
    cr_assert(strstr(err.msg, "/nonexistent/words") && strstr(err.msg, "wamerican"), "%s", err.msg);
    cr_assert_null(d);
    char dir[512], path[600], out[4096];
    test_tmpdir(dir, sizeof dir, "names-words");
    snprintf(path, sizeof path, "%s/short", dir);
    cr_assert(write_bytes(path, "apple\nbanana\n", 13));
    err.msg[0] = 0;
    cr_assert_neq(cp_detector_names_words(path, &d, &err), CP_OK);
    cr_assert(strstr(err.msg, "not a word list"), "%s", err.msg);
    cr_assert_null(d);
    int rc = test_cli_output("detect --words /nonexistent/words 'hello there'", out, sizeof out);
    cr_assert(rc == 1 && strstr(out, "wamerican"), "exit %d: %s", rc, out);
    rc = test_cli_output("detect --no-names --words /nonexistent/words 'hello there'", out, sizeof out);
    cr_assert(rc == 0, "--no-names needs no list: exit %d: %s", rc, out);
}

/* eval-detect's report: per gold type the mask recall (the target metric:
 * the type's tokens under any detection, whatever its type) with the
 * type's target and its verdict, the typed recall beside it.  "Zed
 * Oakhurst" is labelled a place here but found as a person (a capitalised
 * run mid-sentence): mask R 1, typed R 0, whatever the tokenizer's split.
 * "dog" is labelled a person and found by nothing: 0 and NOT met. */
Test(names, eval_detect_reports_mask_recall_as_the_target, .timeout = TEST_TIMEOUT(30))
{
    require_kit(); /* the token-level scores use the kit's tokenizer */
    static char out[1 << 14];
    char dir[512], data[700], args[1024];
    test_tmpdir(dir, sizeof dir, "eval-mask");
    snprintf(data, sizeof data, "%s/d.json", dir);
    static const char set[] =
        "[{\"full_text\":\"Yesterday I met Zed Oakhurst at noon.\",\"spans\":[{\"entity_type\":\"GPE\",\"start_position\":16,"
        "\"end_position\":28}]},{\"full_text\":\"the dog barked.\",\"spans\":[{\"entity_type\":\"PERSON\",\"start_position\":4,"
        "\"end_position\":7}]}]";
    cr_assert(write_bytes(data, set, sizeof set - 1));
    snprintf(args, sizeof args, "eval-detect --quiet-progress --no-ner --data %s", data);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "mask R (the target metric)"), "%s", out);
    /* name, ours, spans, mask R, target verdict, typed P, typed R */
    char name[32], ours[16], t1[16], t2[16];
    double mr = -1, tp = -1, tr = -1;
    long spans = 0;
    const char *g = strstr(out, "\nGPE ");
    cr_assert(g && sscanf(g + 1, "%31s %15s %ld %lf %15s %15s %lf %lf", name, ours, &spans, &mr, t1, t2, &tp, &tr) == 8, "%s", out);
    cr_assert(spans == 1 && mr == 1.0 && strcmp(t1, ">=0.85") == 0 && strcmp(t2, "met") == 0 && tr == 0.0, "GPE row: %s", g);
    const char *p = strstr(out, "\nPERSON ");
    char t3[16];
    cr_assert(p && sscanf(p + 1, "%31s %15s %ld %lf %15s %15s %15s", name, ours, &spans, &mr, t1, t2, t3) == 7, "%s", out);
    cr_assert(mr == 0.0 && strcmp(t1, ">=0.90") == 0 && strcmp(t2, "NOT") == 0 && strcmp(t3, "met") == 0, "PERSON row: %s", p);
    /* nothing detected outside gold: any-PII precision 1, its target met */
    cr_assert(strstr(out, "precision 1.000 (>=0.85 met)"), "%s", out);
}
