/* Street addresses typed in lowercase (chat is): "i live at 42 baker
 * street", "send it to 1600 pennsylvania avenue nw, washington dc 20500",
 * "flat 3, 27 high st, london sw1a 1aa", "flat 12, mg road, bengaluru
 * 560001".  The capitalised rules (detect_names_address.c) take the
 * capitals as the sign of a name; in lowercase a house number and a
 * street type stand around ordinary words as often ("a 10 minute walk",
 * "4 lane road"), so here the type comes from a shorter list, the words
 * between are no function, unit or measure words, and a core needs an
 * address cue before it (at, to, on, lives, address, a unit) or a
 * locality or postcode after it. */
#include <string.h>

#include "detect_names_internal.h"

/* street types that name a street in lowercase prose too; "walk", "row",
 * "grove", "square", "circle", "trail" follow a number as often as prose */
static const char *const lower_types[] = { "street", "st",   "road",     "rd",      "avenue", "ave",     "lane",
                                           "ln",     "drive", "dr",      "boulevard", "blvd", "court",   "ct",
                                           "place",  "pl",   "terrace",  "close",   "crescent", "way",   "parkway",
                                           "pkwy",   "highway", "hwy",   NULL };

/* words that make the number before them a count or a measure ("a 2 hour
 * drive", "a 5 star place"), not a house number */
static const char *const measures[] = { "minute", "minutes", "min",   "mins",   "hour",     "hours",  "hr",      "hrs",
                                        "second", "seconds", "day",   "days",   "week",     "weeks",  "month",   "months",
                                        "year",   "years",   "mile",  "miles",  "km",       "kilometre", "kilometres",
                                        "kilometer", "kilometers", "metre", "metres", "meter", "meters", "yard", "yards",
                                        "feet",   "foot",    "ft",    "block",  "blocks",   "step",   "steps",   "star",
                                        "stars",  "bedroom", "bed",   "storey", "story",    "hole",   "seat",    "seater",
                                        "door",   "car",     "cars",  "people", "person",   "times",  "percent", "am",
                                        "pm",     "lb",      "kg",    NULL };

/* directions after a US street type: 1600 pennsylvania avenue nw */
static const char *const directions[] = { "n", "s", "e", "w", "ne", "nw", "se", "sw", NULL };

static int word_in(const scan *s, size_t k, const char *const *list)
{
    const size_t n = s->w[k].e - s->w[k].s;
    for (int i = 0; list[i]; i++)
        if (strlen(list[i]) == n && memcmp(s->t + s->w[k].s, list[i], n) == 0) return 1;
    return 0;
}

/* a lowercase street name from word k: one to three name words, then a
 * type from lower_types; returns the type's index or 0 */
static size_t lower_street_at(const scan *s, size_t k)
{
    const word *w = s->w;
    for (size_t j = k; j < s->n && j <= k + 3; j++) {
        STEP(s);
        if ((j > k && !joined(s, j)) || w[j].shape != S_LOWER || s->used[j]) return 0;
        if (j > k && word_in(s, j, lower_types)) {
            /* a lowercase word after the type makes it a compound noun
             * ("4 main road closures", "2 high street shops"), unless it
             * is a function word, a unit, a place or a direction */
            const size_t a = j + 1;
            if (a < s->n && joined(s, a) && w[a].shape == S_LOWER &&
                !(w[a].lex & (L_FUNC | L_STOP | L_LOCCUE | L_ADDRCUE | L_UNIT | L_GAZ)) && !word_in(s, a, directions))
                return 0;
            return j;
        }
        if ((w[j].lex & (L_FUNC | L_STOP | L_STREET | L_UNIT | L_ADDRCUE | L_LOCCUE)) || word_in(s, j, measures)) return 0;
    }
    return 0;
}

/* a postcode at word k: 4 to 10 digits (20500, 20500-1234), or a UK one
 * (sw1a 1aa, NW1 6XE; the outward code alone too); returns its last word
 * or 0 */
static size_t postcode_at(const scan *s, size_t k)
{
    const word *w = s->w;
    const size_t n = w[k].e - w[k].s;
    const char *p = s->t + w[k].s;
    if (w[k].shape == S_NUM) {
        size_t d = 0;
        for (size_t i = 0; i < n; i++) d += p[i] >= '0' && p[i] <= '9';
        return d >= 4 && d <= 10 ? k : 0;
    }
    const int letter0 = (p[0] | 0x20) >= 'a' && (p[0] | 0x20) <= 'z';
    if (w[k].shape != S_ALNUM || n < 2 || n > 4 || !letter0) return 0;
    if (k + 1 < s->n && joined(s, k + 1) && w[k + 1].shape == S_ALNUM && w[k + 1].e - w[k + 1].s == 3 &&
        s->t[w[k + 1].s] >= '0' && s->t[w[k + 1].s] <= '9')
        return k + 1;
    return k;
}

/* a locality at word k: a place of the gazetteer (with its postcode), or
 * up to three lowercase words and a postcode (washington dc 20500), or a
 * postcode alone; returns its last word or 0 */
static size_t locality_at(const scan *s, size_t k)
{
    const word *w = s->w;
    if ((w[k].lex & L_GAZ) && (w[k].shape == S_LOWER || w[k].shape == S_CAP)) {
        const size_t p = k + 1 < s->n && joined(s, k + 1) ? postcode_at(s, k + 1) : 0;
        return p ? p : k;
    }
    for (size_t j = k; j < s->n && j <= k + 3; j++) {
        STEP(s);
        if (j > k && !joined(s, j)) return 0;
        const size_t p = postcode_at(s, j);
        if (p) return p;
        if (w[j].shape != S_LOWER || (w[j].lex & (L_FUNC | L_STOP)) || word_in(s, j, measures)) return 0;
    }
    return 0;
}

/* whether word i (a house number) has an address cue in the three words
 * before it, in its sentence: at, to, on, of, lives, address, or a unit
 * (flat 3, 27 high st) */
static int cue_before(const scan *s, size_t i)
{
    for (size_t b = i; b > 0 && i - b < 3; b--) {
        if (s->w[b].gap & (G_END | G_PARA | G_COLON | G_OTHER)) return 0;
        if (s->w[b - 1].lex & (L_ADDRCUE | L_UNIT)) return 1;
    }
    return 0;
}

size_t cp_names_lower_tail(const scan *s, size_t j)
{
    const word *w = s->w;
    for (int parts = 0; parts < 6; parts++) {
        const size_t k = j + 1;
        if (k >= s->n || s->used[k] || (w[k].gap & (G_END | G_PARA | G_OTHER | G_COLON))) break;
        const int apart = (w[k].gap & (G_COMMA | G_NL)) != 0;
        size_t e = 0;
        if (!apart && word_in(s, j, lower_types) && word_in(s, k, directions)) e = k; /* avenue nw */
        else if (!apart && w[j].shape == S_NUM) e = lower_street_at(s, k); /* flat 3, 27 | high st */
        if (!e && w[k].shape == S_NUM && k + 1 < s->n && joined(s, k + 1)) e = lower_street_at(s, k + 1); /* , 27 high st */
        if (!e && apart && w[j].shape == S_NUM) e = lower_street_at(s, k); /* flat 12, mg road (after a unit's number only) */
        if (!e && (apart || postcode_at(s, j))) e = locality_at(s, k); /* , london sw1a 1aa | 10115 berlin */
        if (!e) break;
        j = e;
    }
    return j;
}

size_t cp_names_lower_address(const scan *s, size_t i)
{
    const word *w = s->w;
    if (w[i].shape != S_NUM || w[i].e - w[i].s > 5 || i + 1 >= s->n || !joined(s, i + 1)) return 0;
    const size_t j = lower_street_at(s, i + 1);
    if (!j) return 0;
    return cue_before(s, i) || cp_names_lower_tail(s, j) > j ? j : 0;
}
