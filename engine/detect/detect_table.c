/* Secrets in tables (detect_table.h).  Line by line: a line whose cells
 * are all short (a header, not prose that happens to hold commas) and one
 * of which names a secret starts a table; the lines after it that hold its
 * separator are its rows, and their cells in the named columns are
 * marked; a row ends the table when its cell count is not the header's.
 * A two-cell line naming a secret in its first cell, its second one word
 * or its first nothing but the name, is also a key-value row
 * ("password,hunter2", "password,correct horse battery staple"): the
 * second cell is marked. */
#include "detect_table.h"

#include <ctype.h>
#include <stdint.h>
#include <string.h>

#define MAX_COLS 64          /* columns tracked; cells past them are not marked */
#define HEADER_CELL_BYTES 48 /* a header cell longer than this is prose */
#define HEADER_CELL_WORDS 5

/* one cell: its trimmed, unquoted bytes [a, b) */
typedef struct cell {
    size_t a, b;
} cell;

/* the line's separator: '|', tab, ',' or ';', the first of these it holds,
 * or 0 */
static char separator_of(const char *t, size_t ls, size_t le)
{
    int has[4] = { 0 };
    for (size_t i = ls; i < le; i++) {
        char c = t[i];
        has[0] |= c == '|', has[1] |= c == '\t', has[2] |= c == ',', has[3] |= c == ';';
    }
    return has[0] ? '|' : has[1] ? '\t' : has[2] ? ',' : has[3] ? ';' : 0;
}

static int blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* the cells of line [ls, le) split at sep (a markdown row's outer bars
 * dropped; ',', ';' and tab cells may be quoted, "" an escaped quote);
 * returns how many, at most max written -- or, at the first cell longer
 * than limit, minus one minus its index (a prose line stops there) */
static int split(const char *t, size_t ls, size_t le, char sep, cell *cells, int max, size_t limit)
{
    while (ls < le && blank(t[ls]) && t[ls] != sep) ls++;
    while (le > ls && blank(t[le - 1]) && t[le - 1] != sep) le--;
    if (sep == '|') {
        if (ls < le && t[ls] == '|') ls++;
        if (le > ls && t[le - 1] == '|') le--;
    }
    int n = 0;
    size_t i = ls;
    for (;;) {
        while (i < le && blank(t[i]) && t[i] != sep) i++;
        size_t a = i, b;
        if (sep != '|' && i < le && t[i] == '"') { /* a quoted cell: to its closing quote */
            a = ++i;
            while (i < le && !(t[i] == '"' && (i + 1 >= le || t[i + 1] != '"'))) i += t[i] == '"' ? 2 : 1;
            b = i < le ? i : le;
            while (i < le && t[i] != sep) i++;
        } else {
            while (i < le && t[i] != sep) i++;
            b = i;
            while (b > a && blank(t[b - 1])) b--;
        }
        if (b - a > limit) return -1 - n;
        if (n < max) cells[n] = (cell){ a, b };
        n++;
        if (i >= le) break;
        i++; /* past the separator */
    }
    return n;
}

/* whether word w[0..n) (lowercase letters and digits) names a secret */
static int secret_word(const char *w, size_t n)
{
    typedef struct { const char *w; size_t n; } word;
#define W(s) { s, sizeof s - 1 }
    static const word whole[] = { W("password"), W("passwd"), W("passphrase"), W("passcode"), W("pwd"), W("pass"), W("pw"),
                                  W("secret"), W("token"), W("apikey"), W("pin"), W("ssn"), W("cvv"), W("cvc"), W("otp") };
    /* joined to other words ("dbpassword"): the longer ones only */
    static const word tails[] = { W("password"), W("passwd"), W("passphrase"), W("secret"), W("token"), W("apikey") };
#undef W
    if (n < 2) return 0;
    for (size_t k = 0; k < sizeof whole / sizeof *whole; k++)
        if (whole[k].n == n && memcmp(whole[k].w, w, n) == 0) return 1;
    for (size_t k = 0; k < sizeof tails / sizeof *tails; k++)
        if (n > tails[k].n && memcmp(tails[k].w, w + n - tails[k].n, tails[k].n) == 0) return 1;
    return 0;
}

/* whether a header cell names a secret: one of its words does, or two
 * adjacent ones ("api key", "API_KEY", "apiKey", "card number"): 2 when
 * that is all the cell holds ("Password:"), 1 when other words are beside
 * it ("user password"); 0 too for a cell too long or of too many words to
 * be a header's */
static int names_secret(const char *t, cell c)
{
    static const char pairs[] = "|api key|access key|secret key|private key|card number|credit card|social security|auth token|security code|";
    if (c.b - c.a > HEADER_CELL_BYTES) return 0;
    char w[HEADER_CELL_BYTES + 1];
    size_t n = 0, words = 0;
    for (size_t i = c.a; i < c.b; i++) { /* lowercase, every run of other bytes one space; camelCase split */
        unsigned char ch = (unsigned char)t[i];
        if (isalnum(ch)) {
            if (isupper(ch) && i > c.a && islower((unsigned char)t[i - 1]) && n && w[n - 1] != ' ') w[n++] = ' ';
            if (n == 0 || w[n - 1] == ' ') words++;
            w[n++] = (char)tolower(ch);
        } else if (n && w[n - 1] != ' ') {
            w[n++] = ' ';
        }
        if (n >= HEADER_CELL_BYTES) return 0;
    }
    if (words == 0 || words > HEADER_CELL_WORDS) return 0;
    w[n] = 0;
    /* each word, and each with the next */
    for (size_t s = 0; s < n;) {
        size_t e = s;
        while (e < n && w[e] != ' ') e++;
        if (secret_word(w + s, e - s)) return words == 1 ? 2 : 1;
        if (e < n) { /* the pair "|w1 w2|" in pairs */
            size_t e2 = e + 1;
            while (e2 < n && w[e2] != ' ') e2++;
            char pair[HEADER_CELL_BYTES + 3];
            pair[0] = '|', memcpy(pair + 1, w + s, e2 - s), pair[e2 - s + 1] = '|', pair[e2 - s + 2] = 0;
            if (strstr(pairs, pair)) return words == 2 ? 2 : 1;
        }
        s = e + 1;
    }
    return 0;
}

/* a markdown table's rule row: bars, dashes, colons and blanks only */
static int rule_row(const char *t, size_t ls, size_t le)
{
    int dash = 0;
    for (size_t i = ls; i < le; i++) {
        if (t[i] == '-') dash = 1;
        else if (t[i] != '|' && t[i] != ':' && !blank(t[i])) return 0;
    }
    return dash;
}

/* a cell without blanks inside: a key-value row's value, not a clause */
static int one_token(const char *t, cell c)
{
    for (size_t i = c.a; i < c.b; i++)
        if (blank(t[i])) return 0;
    return 1;
}

static cp_status mark(const char *t, cell c, int (*placeholder)(const char *, size_t), cp_spans *out, cp_error *err)
{
    if (c.b - c.a < 3 || placeholder(t + c.a, c.b - c.a)) return CP_OK;
    return cp_spans_add(out, (uint32_t)c.a, (uint32_t)c.b, "secret", 0.9f, err);
}

cp_status cp_find_table_secrets(const char *t, size_t len, int (*placeholder)(const char *, size_t), cp_spans *out,
                                cp_error *err)
{
    cell cells[MAX_COLS];
    uint64_t cols = 0; /* the open table's secret columns; 0: no table open */
    char sep = 0;
    int width = 0; /* the open table's cells a row */
    for (size_t ls = 0; ls < len;) {
        const char *nl = memchr(t + ls, '\n', len - ls);
        size_t le = nl ? (size_t)(nl - t) : len, next = nl ? le + 1 : len;
        out->steps += 2 * (next - ls) + 1;
        char s = separator_of(t, ls, le);
        if (cols && s == sep) { /* a row of the open table: as many cells as its header */
            if (rule_row(t, ls, le)) {
                ls = next;
                continue;
            }
            int n = split(t, ls, le, sep, cells, MAX_COLS, SIZE_MAX);
            if (n == width) {
                for (int k = 0; k < n && k < MAX_COLS; k++)
                    if (cols >> k & 1) {
                        cp_status rc = mark(t, cells[k], placeholder, out, err);
                        if (rc) return rc;
                    }
                ls = next;
                continue;
            }
        }
        cols = 0;
        if (s) { /* a header, or a key-value row? */
            /* a cell past a header's length ends the split, unless the first
             * names a secret and this is the second (a long value) */
            int n = split(t, ls, le, s, cells, MAX_COLS, HEADER_CELL_BYTES), header = n >= 2;
            if (n == -2 && names_secret(t, cells[0])) n = split(t, ls, le, s, cells, MAX_COLS, SIZE_MAX), header = 0;
            size_t end = le;
            while (end > ls && blank(t[end - 1])) end--;
            if (end > ls && (t[end - 1] == '.' || t[end - 1] == '!' || t[end - 1] == '?')) header = 0; /* a sentence */
            uint64_t named = 0;
            for (int k = 0; k < n && k < MAX_COLS; k++)
                if (cells[k].b - cells[k].a <= HEADER_CELL_BYTES && names_secret(t, cells[k])) named |= (uint64_t)1 << k;
            /* "password,hunter2" (its value may be long), "Password;correct horse battery" (a cell that is only the
             * name may have a passphrase after it) */
            if (n == 2 && named == 1 && (one_token(t, cells[1]) || names_secret(t, cells[0]) == 2)) {
                cp_status rc = mark(t, cells[1], placeholder, out, err);
                if (rc) return rc;
            }
            if (header && named) cols = named, sep = s, width = n;
        }
        ls = next;
    }
    return CP_OK;
}
