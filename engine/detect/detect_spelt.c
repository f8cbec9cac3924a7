/* Numbers spelt out in words (detect_spelt.h).  One pass over the text in
 * tokens -- runs of letters (UTF-8 letters included) and runs of digits --
 * with the bytes between them checked to be a number's separators
 * (spaces, commas, dashes, slashes, brackets); a run of number tokens is
 * built item by item and judged when the next token does not continue
 * it.  Each token is read once (a word is folded into a small buffer and
 * looked up in a table of ~110 short words), so the work is linear in the
 * text whatever it holds. */
#include "detect_spelt.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

enum { EN = 1, FR = 2, ES = 4, DE = 8 };
/* a digit word; a teen or ten-to-nineteen word (two digits); a tens word
 * (two digits, or with the digit word after it: twenty-one); double /
 * triple before a digit word; "hundred" after one; "plus" before a
 * number (+44); the "and" inside a tens word (vingt et un, treinta y
 * cuatro); a group of digits */
enum { K_DIGIT, K_TEEN, K_TENS, K_MULT, K_HUNDRED, K_PLUS, K_AND, K_GROUP };
/* what a word takes after it into its own two digits: a digit word
 * (twenty-one, dix-huit), a teen (soixante-dix) */
enum { ABS_D = 1, ABS_T = 2 };

typedef struct numword {
    const char *w; /* lowercase */
    uint8_t n;     /* its bytes */
    uint8_t kind, value, lang, absorbs;
} numword;
#define W(s) s, sizeof s - 1

/* words that are as often something else: "null" in code and data
 * ([null, null, 1, 2, 3]), "oh" the exclamation -- a run needs two
 * spelt digits besides them */
static int weak_word(const numword *nw) { return strcmp(nw->w, "null") == 0 || strcmp(nw->w, "oh") == 0; }

static const numword numwords[] = {
    /* English; "six", "zero", "double", "triple" and "plus" are French too */
    { W("zero"), K_DIGIT, 0, EN | FR, 0 }, { W("oh"), K_DIGIT, 0, EN, 0 }, { W("one"), K_DIGIT, 1, EN, 0 },
    { W("two"), K_DIGIT, 2, EN, 0 }, { W("three"), K_DIGIT, 3, EN, 0 }, { W("four"), K_DIGIT, 4, EN, 0 },
    { W("five"), K_DIGIT, 5, EN, 0 }, { W("six"), K_DIGIT, 6, EN | FR, 0 }, { W("seven"), K_DIGIT, 7, EN, 0 },
    { W("eight"), K_DIGIT, 8, EN, 0 }, { W("nine"), K_DIGIT, 9, EN, 0 }, { W("niner"), K_DIGIT, 9, EN, 0 },
    { W("ten"), K_TEEN, 10, EN, 0 }, { W("eleven"), K_TEEN, 11, EN, 0 }, { W("twelve"), K_TEEN, 12, EN, 0 },
    { W("thirteen"), K_TEEN, 13, EN, 0 }, { W("fourteen"), K_TEEN, 14, EN, 0 }, { W("fifteen"), K_TEEN, 15, EN, 0 },
    { W("sixteen"), K_TEEN, 16, EN, 0 }, { W("seventeen"), K_TEEN, 17, EN, 0 }, { W("eighteen"), K_TEEN, 18, EN, 0 },
    { W("nineteen"), K_TEEN, 19, EN, 0 }, { W("twenty"), K_TENS, 20, EN, ABS_D }, { W("thirty"), K_TENS, 30, EN, ABS_D },
    { W("forty"), K_TENS, 40, EN, ABS_D }, { W("fifty"), K_TENS, 50, EN, ABS_D }, { W("sixty"), K_TENS, 60, EN, ABS_D },
    { W("seventy"), K_TENS, 70, EN, ABS_D }, { W("eighty"), K_TENS, 80, EN, ABS_D }, { W("ninety"), K_TENS, 90, EN, ABS_D },
    { W("double"), K_MULT, 2, EN | FR, 0 }, { W("triple"), K_MULT, 3, EN | FR, 0 }, { W("hundred"), K_HUNDRED, 0, EN, 0 },
    { W("plus"), K_PLUS, 0, EN | FR | DE, 0 },
    /* French: numbers are read in pairs (z\u00e9ro six, douze, trente-quatre, soixante-dix-huit) */
    { W("z\xc3\xa9ro"), K_DIGIT, 0, FR, 0 }, { W("un"), K_DIGIT, 1, FR, 0 }, { W("deux"), K_DIGIT, 2, FR, 0 },
    { W("trois"), K_DIGIT, 3, FR, 0 }, { W("quatre"), K_DIGIT, 4, FR, 0 }, { W("cinq"), K_DIGIT, 5, FR, 0 },
    { W("sept"), K_DIGIT, 7, FR, 0 }, { W("huit"), K_DIGIT, 8, FR, 0 }, { W("neuf"), K_DIGIT, 9, FR, 0 },
    { W("dix"), K_TEEN, 10, FR, ABS_D }, { W("onze"), K_TEEN, 11, FR, 0 }, { W("douze"), K_TEEN, 12, FR, 0 },
    { W("treize"), K_TEEN, 13, FR, 0 }, { W("quatorze"), K_TEEN, 14, FR, 0 }, { W("quinze"), K_TEEN, 15, FR, 0 },
    { W("seize"), K_TEEN, 16, FR, 0 }, { W("vingt"), K_TENS, 20, FR, ABS_D }, { W("vingts"), K_TENS, 20, FR, ABS_D },
    { W("trente"), K_TENS, 30, FR, ABS_D }, { W("quarante"), K_TENS, 40, FR, ABS_D },
    { W("cinquante"), K_TENS, 50, FR, ABS_D }, { W("soixante"), K_TENS, 60, FR, ABS_D | ABS_T }, { W("et"), K_AND, 0, FR, 0 },
    /* Spanish */
    { W("cero"), K_DIGIT, 0, ES, 0 }, { W("uno"), K_DIGIT, 1, ES, 0 }, { W("dos"), K_DIGIT, 2, ES, 0 },
    { W("tres"), K_DIGIT, 3, ES, 0 }, { W("cuatro"), K_DIGIT, 4, ES, 0 }, { W("cinco"), K_DIGIT, 5, ES, 0 },
    { W("seis"), K_DIGIT, 6, ES, 0 }, { W("siete"), K_DIGIT, 7, ES, 0 }, { W("ocho"), K_DIGIT, 8, ES, 0 },
    { W("nueve"), K_DIGIT, 9, ES, 0 }, { W("diez"), K_TEEN, 10, ES, 0 }, { W("once"), K_TEEN, 11, ES, 0 },
    { W("doce"), K_TEEN, 12, ES, 0 }, { W("trece"), K_TEEN, 13, ES, 0 }, { W("catorce"), K_TEEN, 14, ES, 0 },
    { W("quince"), K_TEEN, 15, ES, 0 }, { W("diecis\xc3\xa9is"), K_TEEN, 16, ES, 0 }, { W("dieciseis"), K_TEEN, 16, ES, 0 },
    { W("diecisiete"), K_TEEN, 17, ES, 0 }, { W("dieciocho"), K_TEEN, 18, ES, 0 }, { W("diecinueve"), K_TEEN, 19, ES, 0 },
    { W("veinte"), K_TENS, 20, ES, ABS_D }, { W("treinta"), K_TENS, 30, ES, ABS_D }, { W("cuarenta"), K_TENS, 40, ES, ABS_D },
    { W("cincuenta"), K_TENS, 50, ES, ABS_D }, { W("sesenta"), K_TENS, 60, ES, ABS_D }, { W("setenta"), K_TENS, 70, ES, ABS_D },
    { W("ochenta"), K_TENS, 80, ES, ABS_D }, { W("noventa"), K_TENS, 90, ES, ABS_D }, { W("y"), K_AND, 0, ES, 0 },
    /* German: digits are read one by one (null eins sieben ...), "zwo" on the phone */
    { W("null"), K_DIGIT, 0, DE, 0 }, { W("eins"), K_DIGIT, 1, DE, 0 }, { W("zwei"), K_DIGIT, 2, DE, 0 },
    { W("zwo"), K_DIGIT, 2, DE, 0 }, { W("drei"), K_DIGIT, 3, DE, 0 }, { W("vier"), K_DIGIT, 4, DE, 0 },
    { W("f\xc3\xbcnf"), K_DIGIT, 5, DE, 0 }, { W("fuenf"), K_DIGIT, 5, DE, 0 }, { W("sechs"), K_DIGIT, 6, DE, 0 },
    { W("sieben"), K_DIGIT, 7, DE, 0 }, { W("acht"), K_DIGIT, 8, DE, 0 }, { W("neun"), K_DIGIT, 9, DE, 0 },
    { W("zehn"), K_TEEN, 10, DE, 0 }, { W("elf"), K_TEEN, 11, DE, 0 }, { W("zw\xc3\xb6lf"), K_TEEN, 12, DE, 0 },
};

#define WORD_MAX 16 /* bytes: the longest number word is 11 */

/* ASCII letters and Latin-1 capitals (\u00c0-\u00de, as UTF-8) in lowercase */
static size_t fold_word(const char *s, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 'A' && c <= 'Z') c = (unsigned char)(c + 32);
        else if (i > 0 && (unsigned char)s[i - 1] == 0xC3 && c >= 0x80 && c <= 0x9E && c != 0x97) c = (unsigned char)(c + 0x20);
        out[i] = (char)c;
    }
    return n;
}

#define N_WORDS (sizeof numwords / sizeof numwords[0])

/* the table's words chained by first byte, built once (detectors are
 * shared by threads): a word of prose is compared with the few number
 * words of its first letter, not all ~110 */
static int16_t chain_head[256], chain_next[N_WORDS];
static pthread_once_t chain_once = PTHREAD_ONCE_INIT;

static void build_chains(void)
{
    memset(chain_head, 0xff, sizeof chain_head); /* -1: none */
    for (size_t i = N_WORDS; i-- > 0;) {
        const unsigned char f = (unsigned char)numwords[i].w[0];
        chain_next[i] = chain_head[f];
        chain_head[f] = (int16_t)i;
    }
}

static const numword *lookup(const char *s, size_t n)
{
    char w[WORD_MAX];
    if (n >= sizeof w) return NULL;
    fold_word(s, n, w);
    for (int i = chain_head[(unsigned char)w[0]]; i >= 0; i = chain_next[i])
        if (numwords[i].n == n && memcmp(numwords[i].w, w, n) == 0) return &numwords[i];
    return NULL;
}

/* a number's name before it on its line, and the type its spans take
 * ("": a number of no kind, "account number" is an id; alone, a phone);
 * the name may end in 's' or be followed by non-letters only (not "pink",
 * "cardigan") */
static const struct {
    const char *w, *type;
} cues[] = {
    { "pin", "secret" }, { "code", "secret" }, { "passcode", "secret" }, { "password", "secret" },
    { "passwort", "secret" }, { "geheimzahl", "secret" }, { "clave", "secret" }, { "contrase\xc3\xb1" "a", "secret" },
    { "card", "card" }, { "cvv", "card" }, { "cvc", "card" }, { "carte", "card" }, { "tarjeta", "card" },
    { "karte", "card" }, { "kreditkarte", "card" }, { "ssn", "ssn" }, { "social", "ssn" },
    { "account", "id" }, { "acct", "id" }, { "routing", "id" }, { "iban", "id" }, { "passport", "id" },
    { "licence", "id" }, { "license", "id" }, { "compte", "id" }, { "cuenta", "id" }, { "konto", "id" },
    { "kontonummer", "id" }, { "phone", "phone" }, { "telephone", "phone" }, { "t\xc3\xa9l\xc3\xa9phone", "phone" },
    { "tel", "phone" }, { "t\xc3\xa9l", "phone" }, { "mobile", "phone" }, { "cell", "phone" }, { "call", "phone" },
    { "text", "phone" }, { "whatsapp", "phone" }, { "number", "" }, { "num\xc3\xa9ro", "" },
    { "numero", "" }, { "n\xc3\xbamero", "" }, { "nummer", "" }, { "portable", "phone" },
    { "tel\xc3\xa9" "fono", "phone" }, { "telefono", "phone" }, { "m\xc3\xb3vil", "phone" }, { "movil", "phone" },
    { "telefon", "phone" }, { "handy", "phone" }, { "handynummer", "phone" }, { "telefonnummer", "phone" },
    { "extension", "phone" }, { "ext", "phone" }, { "fax", "phone" },
};

#define CUE_BACK 48 /* bytes looked back for a number's name */

static int is_letter(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
/* what may stand between a number's parts */
static int is_sep(unsigned char c) { return c == ' ' || c == '\t' || c == ',' || c == '-' || c == '/' || c == '(' || c == ')'; }

/* the type named by the nearest cue in the CUE_BACK bytes of its line before
 * byte `at` (a plain "number" only if nothing else is named), or NULL */
static const char *cue_type(const char *t, size_t at, uint64_t *steps)
{
    size_t a = at;
    while (a > 0 && at - a < CUE_BACK && t[a - 1] != '\n') a--;
    char buf[CUE_BACK];
    const size_t n = at - a;
    fold_word(t + a, n, buf);
    *steps += n;
    const char *type = NULL, *plain = NULL;
    for (size_t p = 0; p < n; p++) {
        if (!is_letter((unsigned char)buf[p]) || (p > 0 && is_letter((unsigned char)buf[p - 1]))) continue;
        for (size_t k = 0; k < sizeof cues / sizeof cues[0]; k++) {
            const size_t wl = strlen(cues[k].w);
            if (wl > n - p || memcmp(buf + p, cues[k].w, wl) != 0) continue;
            size_t e = p + wl;
            if (e < n && buf[e] == 's' && *cues[k].type) e++; /* "the numbers seventy-nine, fifty-four": figures, not a number */
            if (e < n && is_letter((unsigned char)buf[e])) continue;
            if (*cues[k].type) type = cues[k].type; /* the last one found is the nearest */
            else plain = "phone";
        }
    }
    return type ? type : plain;
}

/* a run of number tokens being built */
typedef struct run {
    size_t start, end; /* its bytes so far: to the end of its last item */
    unsigned lang;     /* the languages all its words belong to */
    int digits, spelt; /* the digits it stands for; of them, spelt in words */
    int strong;        /* digit, teen and tens words not weak_word */
    int items;         /* items finished */
    /* the item being built: its kind, value (-1: a group of digits), the
     * words it may still take (ABS_*), its digits */
    int kind, value, absorbs;
    int prev, step, even; /* the last finished item's value; the step between items; all steps equal so far */
    int same, same_digit; /* one digit repeated so far (-1: none yet) */
    int comma_gaps, gaps, tens; /* gaps holding a comma, all gaps; teens or tens in it */
    int mult;                   /* a double / triple waiting for its digit word (0: none) */
    int joined;                 /* an "and" waiting for its digit word */
} run;

static void same_digit(run *r, int d)
{
    if (r->same_digit < 0) r->same_digit = d;
    else r->same &= r->same_digit == d;
}

/* the item being built is done: its value joins the steps */
static void finish_item(run *r)
{
    if (r->items > 0) {
        const int step = r->value - r->prev;
        if (r->value < 0 || r->prev < 0 || step == 0) r->even = 0;
        else if (r->items == 1) r->step = step;
        else r->even &= step == r->step;
    }
    r->prev = r->value;
    r->items++;
}

static void start_item(run *r, int kind, int value, int absorbs, int digits, int spelt, size_t end)
{
    if (r->items > 0 || r->kind >= 0) finish_item(r);
    r->kind = kind, r->value = value, r->absorbs = absorbs;
    r->digits += digits, r->spelt += spelt;
    r->end = end;
    r->tens |= kind == K_TEEN || kind == K_TENS;
}

/* judges a finished run: a span when it stands for a number */
static cp_status judge(const char *t, run *r, cp_spans *out, cp_error *err)
{
    if (r->kind < 0 || r->spelt < 3 || r->strong < 2 || r->digits < 4) return CP_OK;
    finish_item(r);
    const char *type = cue_type(t, r->start, &out->steps);
    if (r->digits < 7 && !type) return CP_OK;
    /* counting, a countdown, steps of two (four, six, eight, ten), one
     * digit over and over: prose, even after a number's name ("a number
     * of them: one, two, three, four") -- a PIN of 1234 or 0000 guards
     * nothing anyway */
    if ((r->items >= 3 && r->even) || r->same) return CP_OK;
    /* "sizes four, six, eight, ten, twelve", "scores of nine, ten, seven,
     * eight": an English list, a comma at every step, with teens or tens.
     * French and Spanish read a phone in pairs just so */
    if (!type && (r->lang & EN) && r->tens && r->gaps > 0 && r->comma_gaps == r->gaps) return CP_OK;
    if (!type) type = r->digits > 15 ? "id" : "phone";
    return cp_spans_add(out, (uint32_t)r->start, (uint32_t)r->end, type, 0.8f, err);
}

static void reset(run *r)
{
    memset(r, 0, sizeof *r);
    r->kind = -1, r->prev = -1, r->same = 1, r->same_digit = -1, r->even = 1;
}

cp_status cp_find_spelt_numbers(const char *t, size_t len, cp_spans *out, cp_error *err)
{
    const unsigned char *u = (const unsigned char *)t;
    if (pthread_once(&chain_once, build_chains) != 0) return cp_fail(err, CP_EINVAL, "spelt numbers: cannot build the word table");
    run r;
    reset(&r);
    int active = 0;
    out->steps += len;
    for (size_t i = 0; i <= len;) {
        /* the gap before the next token: separators only, and how many commas */
        size_t g = i;
        int commas = 0, clean = 1;
        while (g < len && !is_letter(u[g]) && !is_digit(u[g])) {
            clean &= is_sep(u[g]) && g - i < 8;
            /* a comma with no space after it splits a CSV's cells (Seven,One Eight Seven,32464) */
            clean &= u[g] != ',' || (g + 1 < len && u[g + 1] == ' ');
            commas += u[g] == ',';
            g++;
        }
        if (g >= len) {
            if (active && judge(t, &r, out, err)) return CP_ENOMEM;
            break;
        }
        size_t e = g;
        const int digits = is_digit(u[g]);
        while (e < len && (digits ? is_digit(u[e]) : is_letter(u[e]))) e++;
        /* a token glued to one of the other class (4one, abc123) is no
         * number's part: the gap must hold a separator */
        const int joinable = clean && g > i;
        const numword *nw = digits ? NULL : lookup(t + g, e - g);
        const int kind = digits ? K_GROUP : nw ? nw->kind : -1;
        const int tight = commas == 0; /* parts of one number word: twenty-one, dix-huit */
        int cont = active && joinable && kind >= 0 && (digits || (nw->lang & r.lang));
        if (cont) {
            switch (kind) {
            case K_DIGIT:
                if (r.mult) { /* double six: the digit twice */
                    start_item(&r, K_DIGIT, nw->value, 0, r.mult, r.mult, e);
                    same_digit(&r, nw->value);
                    r.even = 0, r.mult = 0;
                } else if ((r.joined || tight) && (r.absorbs & ABS_D) && nw->value > 0) {
                    r.value += nw->value, r.absorbs = 0, r.end = e, r.joined = 0; /* twenty-one: still two digits */
                } else if (r.joined) {
                    cont = 0;
                } else {
                    start_item(&r, K_DIGIT, nw->value, 0, 1, 1, e);
                    same_digit(&r, nw->value);
                }
                break;
            case K_TEEN:
                if (r.mult || r.joined) cont = 0;
                else if (tight && (r.absorbs & ABS_T)) r.value += nw->value, r.absorbs = nw->absorbs, r.end = e; /* soixante-dix */
                else start_item(&r, K_TEEN, nw->value, nw->absorbs, 2, 2, e), r.same = 0;
                break;
            case K_TENS:
                if (r.mult || r.joined) cont = 0;
                else start_item(&r, K_TENS, nw->value, nw->absorbs, 2, 2, e), r.same = 0;
                break;
            case K_MULT:
                if (r.mult || r.joined) cont = 0;
                else r.mult = nw->value;
                break;
            case K_HUNDRED: /* nine hundred: the digit word and two zeros */
                if (r.mult || r.joined || r.kind != K_DIGIT || !tight) cont = 0;
                else r.digits += 2, r.spelt += 2, r.value *= 100, r.end = e, r.same = 0;
                break;
            case K_AND:
                if (r.mult || r.joined || !(r.absorbs & ABS_D) || !tight) cont = 0;
                else r.joined = 1;
                break;
            case K_GROUP:
                if (r.mult || r.joined) cont = 0;
                else {
                    start_item(&r, K_GROUP, -1, 0, (int)(e - g), 0, e);
                    for (size_t k = g; k < e; k++) same_digit(&r, u[k] - '0');
                }
                break;
            default: cont = 0; break; /* K_PLUS: only first */
            }
            if (cont && !digits) r.lang &= nw->lang;
            if (cont && kind <= K_TENS) r.strong += !weak_word(nw);
            if (cont && kind != K_MULT && kind != K_AND) r.gaps++, r.comma_gaps += commas > 0;
        }
        if (!cont) {
            if (active && judge(t, &r, out, err)) return CP_ENOMEM;
            active = 0;
            reset(&r);
            /* a run starts at a digit word, a teen, a tens word, a double,
             * "plus", or a group of digits */
            if (kind == K_DIGIT || kind == K_TEEN || kind == K_TENS || kind == K_MULT || kind == K_PLUS || kind == K_GROUP) {
                active = 1;
                r.start = g;
                r.lang = digits ? (EN | FR | ES | DE) : nw->lang;
                r.strong = kind <= K_TENS && !weak_word(nw);
                if (kind == K_MULT) r.mult = nw->value, r.end = g;
                else if (kind == K_PLUS) r.end = g; /* +44: the span opens at "plus" once a number follows */
                else if (kind == K_GROUP) {
                    start_item(&r, K_GROUP, -1, 0, (int)(e - g), 0, e);
                    for (size_t k = g; k < e; k++) same_digit(&r, u[k] - '0');
                } else {
                    start_item(&r, kind, nw->value, nw->absorbs, kind == K_DIGIT ? 1 : 2, kind == K_DIGIT ? 1 : 2, e);
                    if (kind == K_DIGIT) same_digit(&r, nw->value);
                    else r.same = 0, r.tens = 1;
                }
            }
        }
        i = e;
    }
    return CP_OK;
}
