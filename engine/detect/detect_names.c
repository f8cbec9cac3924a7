/* Built-in free-text recognizer ("names"): people, organisations, places,
 * street addresses, ages and titles in prose, found by a hand-written
 * scanner over UTF-8 words -- no regexes, so no backtracking.
 *
 * Why a scanner and not patterns: the evidence for a name is the shape of
 * the words around it (capitalised, not at a sentence start, after a cue,
 * before a street type), and one left-to-right pass over a word array sees
 * all of it in time linear in the message.  Every lookahead is bounded by a
 * constant number of words, and the word array is a fixed window
 * (WINDOW words, reused), so memory does not grow with the message either.
 *
 * A false positive here only keeps some user text private (less KV shared);
 * a false negative shares a person's name.  The rules lean to recall, with a
 * small list of capitalised words that are never names (days, months, "I",
 * sentence-start function words) to keep ordinary sentences shareable.
 *
 * The chain's per-role policy decides which messages reach it: by default
 * user and assistant turns only (documents and system prompts are public).
 *
 * This file is the detector: the window loop that runs every rule, and the
 * rules for people, organisations and places (cue words, capitalised runs).
 * The word lists, the scanner, dates and addresses are in its siblings,
 * which detect_names_internal.h lists. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "detect_names_internal.h"

/* ---- names by cue and by run ------------------------------------------------- */

static int sentence_start(const scan *s, size_t i) { return (s->w[i].gap & (G_END | G_COLON | G_PARA)) != 0; }

/* a word that can be part of a name run */
static int namey(const scan *s, size_t k) { return s->w[k].shape == S_CAP && !(s->w[k].lex & L_STOP) && !s->used[k]; }

/* the last word of the capitalised run starting at i (particles inside) */
static size_t run_end(const scan *s, size_t i)
{
    size_t j = i;
    /* bounded: "Dr. Dr. Dr. ..." is one run as long as the message, and
     * every cue and word before it would walk it again (quadratic) */
    while (j + 1 < s->n && j + 1 < i + MAX_RUN) {
        STEP(s);
        size_t k = j + 1;
        size_t p = k; /* up to two particles: van der, de la */
        while (p < s->n && p < k + 2 && joined(s, p) && s->w[p].shape == S_LOWER && (s->w[p].lex & L_PARTICLE)) p++;
        if (joined(s, k) && namey(s, k)) j = k;
        else if (p > k && p < s->n && joined(s, p) && namey(s, p)) j = p;
        else if (joined(s, k) && s->w[k].shape == S_UPPER && (s->w[k].lex & L_ORG)) j = k; /* Acme AG */
        else if (p > k && p < s->n && joined(s, p) && s->w[p].shape == S_UPPER && !s->used[p] && (s->w[j].lex & L_ORG))
            j = p; /* University of PORVOO */
        else break;
    }
    return j;
}

static int number_value(const scan *s, size_t k, int max)
{
    const word *w = &s->w[k];
    if (w->shape != S_NUM || w->e - w->s > 3) return -1;
    int v = 0;
    for (uint32_t i = w->s; i < w->e; i++) v = v * 10 + (s->t[i] - '0');
    return v <= max ? v : -1;
}

/* the word before i has flag f and only spaces lie between them */
static int prev_is(const scan *s, size_t i, uint32_t f)
{
    return i > 0 && !(s->w[i].gap & (G_END | G_PARA | G_OTHER | G_COMMA)) && (s->w[i - 1].lex & f);
}

/* Project Manager, Grad C, Sir, B: roles, titles alone and initials alone name no one */
static int only_roles(const scan *s, size_t i, size_t j)
{
    for (size_t k = i; k <= j; k++)
        if (STEP(s), !(s->w[k].lex & (L_ROLE | L_HONOR)) && !is_initial_letter(s->t, &s->w[k])) return 0;
    return 1;
}

static cp_status person_after(scan *s, size_t k, float score, cp_error *err)
{
    size_t j = run_end(s, k);
    /* a trailing org word makes it an organisation (Dr Who Ltd is rare; Acme Ltd is not) */
    return emit(s, k, j, (s->w[j].lex & L_ORG) ? "org" : "person", score, err);
}

static cp_status pass_cues(scan *s, cp_error *err)
{
    const word *w = s->w;
    const char *t = s->t;
    for (size_t i = 0; i < s->lim; i++) {
        STEP(s);
        if (s->used[i] || i + 1 >= s->n) continue;
        size_t k = i + 1;
        cp_status rc = CP_OK;
        int cap_next = joined(s, k) && (w[k].shape == S_CAP || w[k].shape == S_UPPER) && !s->used[k];
        int plain_next = cap_next && !(w[k].lex & (L_FUNC | L_STOP));
        /* Mr Smith, Dr. Ada Obi (mr. in lowercase too) */
        /* (not Professor B: a speaker label's initial names no one) */
        if ((w[i].lex & L_HONOR) && cap_next && !only_roles(s, k, run_end(s, k)) &&
            (w[i].shape == S_CAP || (w[i].shape == S_LOWER && (w[i].lex & L_ABBR) && (w[k].gap & G_DOT)))) {
            if ((rc = emit(s, i, i, "title", 0.8f, err)) || (rc = person_after(s, k, 0.8f, err))) return rc;
            continue;
        }
        /* my name is X, call me X, name: X -- lowercase names too */
        uint32_t f = w[i].lex;
        int strong = ((f & K_IS) && prev_is(s, i, K_NAME)) || ((f & K_ME) && prev_is(s, i, K_CALL)) ||
                     ((f & K_NAME) && (w[k].gap & G_COLON) && !(w[k].gap & (G_END | G_PARA)));
        int weak = ((f & K_AM) && prev_is(s, i, K_I)) || (f & (K_IM | K_NAMED));
        int cue_gap = joined(s, k) || (strong && !(w[k].gap & (G_END | G_PARA | G_OTHER)));
        if ((strong && cue_gap && (w[k].shape == S_CAP || w[k].shape == S_UPPER) && !s->used[k]) || (weak && plain_next)) {
            if ((rc = person_after(s, k, 0.8f, err))) return rc;
            continue;
        }
        if (strong && cue_gap && w[k].shape == S_LOWER && !(w[k].lex & L_FUNC)) {
            size_t j = k;
            while (j + 1 < s->n && j < k + 2 && joined(s, j + 1) && w[j + 1].shape == S_LOWER && !(w[j + 1].lex & L_FUNC))
                j++, STEP(s);
            if ((rc = emit(s, k, j, "person", 0.7f, err))) return rc;
            continue;
        }
        /* I am 34, I'm 34, aged 34, turned 21 */
        int age_cue = weak || (w[i].lex & L_AGECUE);
        if (age_cue && !(f & K_NAMED) && (joined(s, k) || (w[k].gap & ~(G_COLON)) == 0) &&
            number_value(s, k, 130) >= 0) {
            /* "I am 5 minutes late" is no age: a measure word after the number */
            int unit_after = k + 1 < s->n && joined(s, k + 1) && w[k + 1].shape == S_LOWER && !(w[k + 1].lex & L_FUNC) &&
                             !(w[k + 1].lex & K_YEARS);
            if (!unit_after && (rc = emit(s, k, k, "age", 0.7f, err))) return rc;
            continue;
        }
        /* in OSLO, from ΠΑΦΟΣ: a place written in capitals after a place cue */
        /* (to and on too, not of: the University of TARTU is one name) */
        int place_cue = (w[i].lex & L_LOCCUE) || ((w[i].lex & L_ADDRCUE) && !(w[i].lex & L_PARTICLE));
        if (w[i].shape == S_LOWER && place_cue && joined(s, k) && w[k].shape == S_UPPER && !s->used[k] &&
            !(w[k].lex & (L_STOP | L_FUNC | L_ROLE | L_ORG))) {
            size_t j = k;
            while (j + 1 < s->n && j < k + 3 && joined(s, j + 1) && w[j + 1].shape == S_UPPER && !s->used[j + 1]) j++, STEP(s);
            if ((rc = emit(s, k, j, "location", 0.6f, err))) return rc;
            continue;
        }
        /* 34 years old, 34-year-old */
        if (number_value(s, i, 130) >= 0 && i + 2 < s->n && (w[k].lex & K_YEARS) && joined(s, k) && (w[k + 1].lex & K_OLD) &&
            joined(s, k + 1)) {
            if ((rc = emit(s, i, i, "age", 0.7f, err))) return rc;
            continue;
        }
        if (w[i].shape == S_ALNUM && !s->used[i]) {
            uint32_t d = w[i].s;
            while (d < w[i].e && t[d] >= '0' && t[d] <= '9') d++;
            static const char yo[] = "-year-old", yso[] = "-years-old";
            size_t rest = w[i].e - d;
            if (d > w[i].s && d - w[i].s <= 3 &&
                ((rest == sizeof yo - 1 && memcmp(t + d, yo, rest) == 0) || (rest == sizeof yso - 1 && memcmp(t + d, yso, rest) == 0))) {
                s->used[i] = 1;
                if ((rc = cp_spans_add(s->out, w[i].s, d, "age", 0.7f, err))) return rc;
            }
        }
    }
    return CP_OK;
}

/* what a run of capitalised words i..j is */
static const char *run_type(const scan *s, size_t i, size_t j)
{
    for (size_t k = i; k <= j; k++)
        if (STEP(s), s->w[k].lex & L_ORG) return "org";
    int place = (s->w[j].lex & L_STREET) != 0; /* Quarry Lane, without its number */
    for (size_t k = i; k <= j; k++) STEP(s), place |= (s->w[k].lex & (L_PLACE | L_GAZ)) != 0;
    if (i > 0 && joined(s, i) && s->w[i - 1].shape == S_LOWER && (s->w[i - 1].lex & L_LOCCUE)) place = 1;
    return place ? "location" : "person";
}

/* Word k is a common English word: listed as it is, or (Well-known, Don't,
 * Anna’s) its parts are -- all the parts of a hyphenated word, the part
 * before an apostrophe followed by a short suffix. */
static int word_is_common(const scan *s, size_t k)
{
    const char *t = s->t;
    uint32_t a = s->w[k].s, e = s->w[k].e;
    if (cp_names_common_word(s->words, t + a, e - a)) return 1;
    for (uint32_t b = a; b < e; b++) {
        int apos = t[b] == '\'' ? 1 : (e - b >= 3 && (unsigned char)t[b] == 0xe2 && (unsigned char)t[b + 1] == 0x80 &&
                                         (unsigned char)t[b + 2] == 0x99) ? 3 : 0;
        if (apos) return e - (b + (uint32_t)apos) <= 2 && cp_names_common_word(s->words, t + a, b - a);
        if (t[b] != '-') continue;
        if (!cp_names_common_word(s->words, t + a, b - a)) return 0;
        a = b + 1;
        if (memchr(t + a, '-', e - a) == NULL) return cp_names_common_word(s->words, t + a, e - a);
    }
    return 0;
}

static int lone_name(const scan *s, size_t a)
{
    const word *w = s->w;
    if (w[a].lex & (L_ROLE | L_HONOR | L_PLACE | L_ORG | L_STREET | L_UNIT) || is_initial_letter(s->t, &w[a])) return 0;
    /* Usamov, Järvilehto, Opencounter: no English word (an English word that
     * is also a name -- Will, Rose -- stays shareable at a sentence start) */
    if (!w[a].lex && !word_is_common(s, a)) return 1;
    if (a + 1 >= s->n) return (w[a].gap & (G_END | G_PARA)) != 0; /* the message's last sentence */
    uint8_t g = w[a + 1].gap;
    if ((g & G_COLON) && !(g & (G_END | G_OTHER | G_COMMA)) && (w[a].gap & (G_NL | G_PARA))) return 1;
    if ((g & G_END) && !(g & G_DOT && w[a].lex)) return 1;
    /* Ramsey-Johnson: both halves capitalised */
    for (uint32_t b = w[a].s + 1; b + 1 < w[a].e; b++)
        if (s->t[b] == '-' && s->t[b + 1] >= 'A' && s->t[b + 1] <= 'Z') return 1;
    /* Usamov and Bowers were ...: a pair of names */
    if (!w[a].lex && a + 2 < s->n && joined(s, a + 1) && w[a + 1].shape == S_LOWER && (w[a + 1].lex & K_AND) &&
        joined(s, a + 2) && namey(s, a + 2) && !(w[a + 2].lex & (L_FUNC | L_ROLE)))
        return 1;
    return joined(s, a + 1) && (w[a + 1].lex & K_SAYS);
}

/* Clark, Romero and Hall: three capitalised names, a comma, "and" -- a firm's name
 * (or three people): the end word, or 0 */
static size_t firm_of_names(const scan *s, size_t i)
{
    const word *w = s->w;
    if (i + 3 >= s->n || w[i].shape != S_CAP || (w[i].lex & (L_FUNC | L_STOP))) return 0;
    if (!(w[i + 1].gap & G_COMMA) || (w[i + 1].gap & (G_END | G_PARA | G_OTHER | G_COLON)) || !namey(s, i + 1)) return 0;
    if (!joined(s, i + 2) || !(w[i + 2].lex & K_AND) || w[i + 2].shape != S_LOWER) return 0;
    return joined(s, i + 3) && namey(s, i + 3) && !(w[i + 3].lex & L_FUNC) ? i + 3 : 0;
}

/* a CITY line right above a country line (SEINÄJOKI / Finland 38524) */
static size_t city_line(const scan *s, size_t i)
{
    const word *w = s->w;
    if (w[i].shape != S_UPPER || !(w[i].gap & (G_NL | G_PARA)) || s->used[i] || (w[i].lex & (L_STOP | L_ORG | L_UNIT)))
        return 0;
    size_t j = i;
    while (j + 1 < s->n && j < i + 3 && joined(s, j + 1) && !(w[j + 1].gap & G_NL) && w[j + 1].shape == S_UPPER) j++;
    return j + 1 < s->n && (w[j + 1].gap & (G_NL | G_PARA)) && (w[j + 1].lex & L_GAZ) ? j : 0;
}

/* stillwater supercomputing inc.: lowercase words before a legal suffix */
static size_t lower_firm_start(const scan *s, size_t k)
{
    const word *w = s->w;
    size_t a = k;
    while (a > 0 && k - a < 3 && joined(s, a) && w[a - 1].shape == S_LOWER && !(w[a - 1].lex & (L_FUNC | L_ADDRCUE)) && !s->used[a - 1])
        a--;
    return a;
}

static cp_status pass_runs(scan *s, cp_error *err)
{
    for (size_t i = 0; i < s->lim; i++) {
        STEP(s);
        size_t f;
        if (!s->used[i] && (f = firm_of_names(s, i))) {
            cp_status rc = emit(s, i, f, "org", 0.6f, err);
            if (rc) return rc;
            i = f;
            continue;
        }
        if ((f = city_line(s, i))) {
            cp_status rc = emit(s, i, f, "location", 0.6f, err);
            if (rc) return rc;
            i = f;
            continue;
        }
        if (!s->used[i] && s->w[i].shape == S_LOWER && (s->w[i].lex & L_LEGAL) && (f = lower_firm_start(s, i)) < i) {
            cp_status rc = emit(s, f, i, "org", 0.6f, err);
            if (rc) return rc;
            continue;
        }
        /* a place from the gazetteer in capitals (TRONDHEIM), or a country in lowercase (from tunisia) */
        if (!s->used[i] && (((s->w[i].lex & L_GAZ) && s->w[i].shape == S_UPPER) || ((s->w[i].lex & L_GAZLC) && s->w[i].shape == S_LOWER))) {
            cp_status rc = emit(s, i, i, "location", 0.6f, err);
            if (rc) return rc;
            continue;
        }
        if (s->w[i].shape != S_CAP || s->used[i]) continue;
        int initial = sentence_start(s, i);
        /* sentence-start and function words are not names: The, Please, Hello, May */
        size_t a = i;
        while (a < s->n && s->w[a].shape == S_CAP && !s->used[a] && (s->w[a].lex & (L_FUNC | L_STOP)) && (a == i || joined(s, a)))
            a++, STEP(s);
        if (a > i) {
            if (a >= s->n || !joined(s, a) || !namey(s, a)) {
                i = a - 1;
                continue;
            }
            initial = 0; /* "Hello Anna": Anna is not where the sentence starts */
        }
        size_t j = run_end(s, a);
        /* one capitalised word at a sentence start is most often an ordinary
         * word -- unless it is a speaker label at a line start (Amara: ...),
         * a sentence of its own (What is your surname? Okafor.) or the
         * subject of a verb of people (Amara replied) */
        if (initial && j == a && !lone_name(s, a) && !(s->w[a].lex & L_GAZ)) continue;
        if (only_roles(s, a, j)) {
            i = j;
            continue;
        }
        const char *type = run_type(s, a, j);
        /* 48 Factoring Inc: a number opening a firm's name */
        if (type[0] == 'o' && a > 0 && !s->used[a - 1] && joined(s, a) && s->w[a - 1].shape == S_NUM) a--;
        cp_status rc = emit(s, a, j, type, 0.6f, err);
        if (rc) return rc;
        i = j;
    }
    return CP_OK;
}

/* ---- the detector ---------------------------------------------------------- */

typedef struct scratch {
    word w[WINDOW];
    uint8_t used[WINDOW];
} scratch;

/* where the next window starts: after a sentence that ends with a lowercase
 * word, so no rule needs words on both sides of the cut */
static size_t cut_at(const word *w, size_t n)
{
    for (size_t k = n - LOOK; k > n / 2; k--)
        if ((w[k].gap & (G_END | G_PARA)) && w[k - 1].shape == S_LOWER) return k;
    return n - LOOK;
}

static cp_status names_detect(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    (void)role; /* the chain's policy chooses the roles */
    const names *nm = d->impl;
    if (len > UINT32_MAX) return cp_fail(err, CP_ERANGE, "names: message of %zu bytes is over 4 GiB", len);
    /* per call, not in the detector: the chain may be shared by threads */
    scratch *sc = cp_malloc(sizeof *sc, "names scratch", err);
    if (!sc) return CP_ENOMEM;
    cp_status rc = cp_names_pass_scripts(text, len, out, &out->steps, err);
    size_t pos = 0;
    while (pos < len && rc == CP_OK) {
        size_t stop;
        size_t n = cp_names_tokenize(nm, text, len, pos, sc->w, WINDOW, &stop, &out->steps);
        if (n == 0) break;
        size_t lim = stop < len ? cut_at(sc->w, n) : n;
        memset(sc->used, 0, n);
        scan s = { text, len, sc->w, n, lim, sc->used, out, &out->steps, &nm->words };
        if ((rc = cp_names_pass_dates(&s, err)) || (rc = cp_names_pass_addresses(&s, err)) || (rc = pass_cues(&s, err)) ||
            (rc = pass_runs(&s, err)))
            break;
        if (stop >= len) break;
        pos = sc->w[lim - 1].e;
    }
    free(sc);
    return rc;
}

static void names_free(names *nm)
{
    if (!nm) return;
    free(nm->words.buf);
    free(nm->words.tab);
    free(nm);
}

static void names_destroy(cp_detector *d)
{
    names_free(d->impl);
    free(d);
}

cp_status cp_detector_names(cp_detector **out, cp_error *err) { return cp_detector_names_words(NULL, out, err); }

cp_status cp_detector_names_words(const char *words, cp_detector **out, cp_error *err)
{
    *out = NULL;
    cp_detector *d = cp_calloc(1, sizeof *d, "detector", err);
    names *nm = d ? cp_calloc(1, sizeof *nm, "names lexicon", err) : NULL;
    if (!nm) {
        free(d);
        return CP_ENOMEM;
    }
    cp_status rc = cp_names_words_load(&nm->words, words ? words : CP_WORDS_DEFAULT, err);
    if (rc) {
        names_free(nm);
        free(d);
        return rc;
    }
    cp_names_lexicon_fill(nm);
    d->name = "names";
    d->free_text = 1;
    d->detect = names_detect;
    d->destroy = names_destroy;
    d->impl = nm;
    *out = d;
    return CP_OK;
}
