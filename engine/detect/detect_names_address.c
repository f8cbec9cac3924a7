/* The free-text recognizer's street addresses: a core (a number, names and
 * a street type in either order; a compound street name; a ship; a unit; or
 * capitalised words and a number after an address cue; a number and a
 * street type that leads its name, 18 rue des Tanneurs), then the lines
 * after it (units, a locality, a region code, a postcode, a country). */
#include <stdint.h>
#include <string.h>

#include "detect_names_internal.h"

/* a capitalised word ending in a compound street type (Lindenstra\u00dfe):
 * found once per word by the scanner (the address rules ask up to 7 times) */
static int street_compound(const scan *s, size_t k) { return (s->w[k].lex & L_COMPOUND) != 0; }

static int num_like(const scan *s, size_t k) { return s->w[k].shape == S_NUM || (s->w[k].shape == S_ALNUM && s->t[s->w[k].s] >= '0' && s->t[s->w[k].s] <= '9'); }

/* Hauptstr. 5: a compound street shortened to "-str." before its number
 * (the '.' read as a sentence end) */
static int str_dot(const scan *s, size_t j)
{
    const word *w = s->w;
    const size_t n = w[j].e - w[j].s;
    return j + 1 < s->n && n > 3 && memcmp(s->t + w[j].e - 3, "str", 3) == 0 && (w[j + 1].gap & G_DOT) &&
           (w[j + 1].gap & ~(G_DOT | G_END)) == 0;
}

/* address parts may be separated by commas and line breaks, not by a
 * sentence end, a blank line or other punctuation */
static int addr_joined(const scan *s, size_t k) { return (s->w[k].gap & (G_END | G_PARA | G_OTHER | G_COLON)) == 0; }

/* word k spelt exactly (lowercase) as lit */
static int word_is(const scan *s, size_t k, const char *lit)
{
    const size_t n = strlen(lit);
    return s->w[k].e - s->w[k].s == n && memcmp(s->t + s->w[k].s, lit, n) == 0;
}

/* 18 rue des Tanneurs, 5 bis avenue Jean-Jaur\u00e8s, 7 calle de Alcal\u00e1: after
 * the number at i (and "bis" / "ter"), a street type that leads its name
 * (L_STREETPRE) at j, then particles and capitalised names: the last name,
 * or 0 (the type must be followed by a name) */
static size_t street_led_by_type(const scan *s, size_t i, size_t j)
{
    const word *w = s->w;
    if (j > i + 2 || !(w[j].lex & L_STREETPRE) || w[j].shape == S_UPPER) return 0;
    /* in lowercase, not a word prose uses between a number and a name ("5 via Messi", "2 al Rashid") */
    if (w[j].shape == S_LOWER && (w[j].lex & (L_LOCCUE | L_PARTICLE | L_ABBR))) return 0;
    if (j == i + 2 && !word_is(s, i + 1, "bis") && !word_is(s, i + 1, "ter")) return 0;
    /* 12 rue de la paix: a lowercase type that is no English word takes
     * lowercase names (two at most: the sentence goes on in lowercase) */
    int lower_names = w[j].shape == S_LOWER && !(w[j].lex & L_STREET) && !word_is(s, j, "route") ? 2 : 0;
    size_t last = 0;
    for (size_t k = j + 1; k < s->n && k <= j + 4 && joined(s, k); k++) {
        STEP(s);
        if (w[k].shape == S_CAP && !(w[k].lex & (L_FUNC | L_STOP))) last = k;
        else if (w[k].shape == S_LOWER && (w[k].lex & L_PARTICLE)) continue;
        else if (lower_names > 0 && w[k].shape == S_LOWER && !(w[k].lex & (L_FUNC | L_STOP | L_STREET | L_UNIT))) last = k, lower_names--;
        else break;
    }
    return last;
}

/* the end of the address core starting at word i, or 0 if none starts there */
static size_t address_core(const scan *s, size_t i)
{
    const word *w = s->w;
    size_t lim = i + 7 < s->n ? i + 7 : s->n;
    int capish = w[i].shape == S_CAP || w[i].shape == S_UPPER;
    /* 221 Baker Street, 10 Downing St: a number, names, a street type */
    if (num_like(s, i)) {
        for (size_t j = i + 1; j < lim && joined(s, j); j++) {
            STEP(s);
            const size_t led = street_led_by_type(s, i, j);
            if (led) return led;
            if (j == i + 1 && (word_is(s, j, "bis") || word_is(s, j, "ter"))) continue; /* 5 bis avenue ... */
            int cap = w[j].shape == S_CAP || w[j].shape == S_UPPER;
            if (j > i + 1 && cap && (w[j].lex & L_STREET)) return j;
            /* 6076 Piroska u. 97, 210 Fourth avenue: a street type in lowercase after a capitalised name */
            if (j > i + 1 && w[j].shape == S_LOWER && (w[j].lex & L_STREET) && (w[j - 1].shape == S_CAP || w[j - 1].shape == S_UPPER))
                return j + 1 < s->n && joined(s, j + 1) && num_like(s, j + 1) ? j + 1 : j;
            /* 2274 Via delle Coste 41, 5049 Harjukuja 54: house number, street, number */
            if (j > i + 1 && num_like(s, j) && (w[j - 1].shape == S_CAP || w[j - 1].shape == S_UPPER)) return j;
            if (!cap && !num_like(s, j) && !(w[j].shape == S_LOWER && (w[j].lex & L_PARTICLE))) break;
        }
        return 0;
    }
    /* Via Roma 12, Rue de la Paix 5, ul. Kwiatowa 5: a street type, names, a number */
    if ((w[i].lex & L_STREETPRE) && (capish || (w[i].shape == S_LOWER && (w[i].lex & L_ABBR)))) {
        for (size_t j = i + 1; j < lim && joined(s, j); j++) {
            STEP(s);
            if (num_like(s, j)) return j > i + 1 ? j : 0;
            if (w[j].shape != S_CAP && w[j].shape != S_UPPER && !(w[j].shape == S_LOWER && (w[j].lex & L_PARTICLE))) break;
        }
    }
    /* Villacher Strasse 89, R\u00e1k\u00f3czi \u00fat 66, Hammarv\u00e4gen 15: names ending in a street type, a number */
    if (w[i].shape == S_CAP && !(w[i].lex & (L_FUNC | L_STOP))) {
        for (size_t j = i; j + 1 < lim && (j == i || joined(s, j)); j++) {
            STEP(s);
            int typed = street_compound(s, j) || (j > i && (w[j].lex & L_STREET));
            if (typed && (joined(s, j + 1) || str_dot(s, j)) && num_like(s, j + 1)) return j + 1;
            if (j > i && w[j].shape != S_CAP && !(w[j].lex & L_STREET) && !(w[j].lex & L_PARTICLE)) break;
        }
    }
    /* USNS Brown, USCGC Khadzhiyev (the FPO line follows) */
    if ((w[i].lex & L_SHIP) && w[i].shape == S_UPPER && i + 1 < s->n && joined(s, i + 1) && w[i + 1].shape == S_CAP) return i + 1;
    /* Apt 4B, Apt. 22, Suite 300, Box 12, unit #5 */
    if ((w[i].lex & L_UNIT) && (capish || w[i].shape == S_LOWER) && i + 1 < s->n &&
        (joined(s, i + 1) || (w[i + 1].gap & ~(G_HASH | G_DOT)) == 0) && (num_like(s, i + 1) || w[i + 1].shape == S_ALNUM))
        return i + 1;
    return 0;
}

/* lives on Grössgstötten 50, at Nieuwe Baan 473 St.: after an address cue,
 * up to three capitalised words and a number (no street type) */
static size_t address_after_cue(const scan *s, size_t i)
{
    const word *w = s->w;
    if (i == 0 || !joined(s, i) || w[i - 1].shape != S_LOWER || !(w[i - 1].lex & L_ADDRCUE) || w[i].shape != S_CAP ||
        (w[i].lex & (L_FUNC | L_STOP | L_ROLE | L_HONOR)))
        return 0;
    for (size_t j = i + 1; j < s->n && j <= i + 3 && joined(s, j); j++) {
        STEP(s);
        if (num_like(s, j)) return j + 1 < s->n && joined(s, j + 1) && (w[j + 1].lex & L_STREET) ? j + 1 : j;
        if (w[j].shape != S_CAP && !(w[j].shape == S_LOWER && (w[j].lex & L_PARTICLE))) break;
    }
    return 0;
}

/* an address line goes on after a blank line when that line is its country (Estonia 62488) */
static int addr_next_line(const scan *s, size_t k)
{
    return addr_joined(s, k) || ((s->w[k].gap & G_PARA) && !(s->w[k].gap & (G_END | G_OTHER | G_COLON)) && (s->w[k].lex & L_GAZ));
}

cp_status cp_names_pass_addresses(scan *s, cp_error *err)
{
    const word *w = s->w;
    for (size_t i = 0; i < s->lim; i++) {
        STEP(s);
        if (s->used[i]) continue;
        size_t j = address_core(s, i);
        if (!j) j = address_after_cue(s, i);
        if (!j) j = cp_names_lower_address(s, i);
        if (!j) continue;
        size_t a = i;
        while (a > 0 && i - a < 2 && !s->used[a - 1] && joined(s, a) && num_like(s, a - 1)) a--; /* 230 107 Igias St */
        if (w[i].lex & L_UNIT) /* P.O. Box 12 */
            while (a > 0 && i - a < 2 && !s->used[a - 1] && joined(s, a) && is_initial_letter(s->t, &w[a - 1])) a--;
        /* then units, a locality, a region code and a postcode */
        for (size_t k = j + 1, steps = 0; k < s->n && steps < 10 && addr_next_line(s, k); k++, steps++) {
            STEP(s);
            int ok = num_like(s, k) || (w[k].shape == S_ALNUM) || w[k].shape == S_UPPER ||
                     (w[k].shape == S_CAP && !(w[k].lex & (L_STOP | L_FUNC))) || (w[k].lex & L_UNIT) ||
                     (w[k].shape == S_LOWER && (w[k].lex & L_PARTICLE) && k + 1 < s->n && w[k + 1].shape == S_CAP);
            if (!ok) break;
            j = k;
        }
        j = cp_names_lower_tail(s, j); /* the lowercase parts after it: 42 baker street, london sw1a 1aa */
        cp_status rc = emit(s, a, j, "address", 0.7f, err);
        if (rc) return rc;
        i = j;
    }
    return CP_OK;
}
