/* Built-in recognizers: one PCRE2 pattern each (JIT, UTF + UCP), most with a
 * validator that rejects near-misses (Luhn, mod-97, SSN rules, octet
 * ranges, inet_pton, digit counts, entropy).  A matching error (match limit,
 * ...) is returned as an error: the chain fails closed. */
#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../../tokenizer/regex.h"
#include "../../tokenizer/utf8.h"
#include "detect.h"
#include "detect_cues.h"
#include "detect_match.h"
#include "detect_spelt.h"
#include "detect_table.h"

typedef struct ctx {
    const char *s; /* the message */
    size_t len;
    size_t ms, me; /* the span being validated */
    const char *m; /* s + ms */
    size_t n;      /* me - ms */
    size_t whole_start; /* start of the whole match (cue included) */
    const cp_regex_matcher *mt;
    size_t *span_start; /* a validator may move the span's start back (v_health_words) */
    size_t *span_end;   /* or its end on (v_keyvalue) */
    int shared;         /* the secrets-only scan of a shared role (a document): v_crypto */
} ctx;

/* A validator returns the span's score, or 0 to reject it. */
typedef float (*validator)(const ctx *c);

typedef struct recognizer {
    const char *type;
    const char *pattern;
    int group; /* capture group that is the span; 0 = the whole match */
    float score;
    validator check;
    /* the text must contain one of these bytes to be worth scanning, or with a
     * leading '|' one of these '|'-separated words (ASCII letters in any case);
     * NULL = always */
    const char *needle;
    int on_public;      /* also run on public roles (system prompts, documents): credentials and validated numbers */
} recognizer;

static int count_digits(const char *s, size_t n)
{
    int d = 0;
    for (size_t i = 0; i < n; i++) d += s[i] >= '0' && s[i] <= '9';
    return d;
}

/* the lowercase text just before the match (up to `span` bytes) holds a cue */
static int cue_before(const ctx *c, size_t span, const char *const *cues)
{
    size_t from = c->whole_start > span ? c->whole_start - span : 0, n = c->whole_start - from;
    char buf[96];
    if (n >= sizeof buf) n = sizeof buf - 1;
    for (size_t i = 0; i < n; i++) buf[i] = (char)tolower((unsigned char)c->s[c->whole_start - n + i]);
    buf[n] = 0;
    for (int i = 0; cues[i]; i++)
        if (strstr(buf, cues[i])) return 1;
    return 0;
}

/* ---- validators ------------------------------------------------------------ */

static float v_email(const ctx *c)
{
    const char *at = memchr(c->m, '@', c->n);
    for (size_t i = 0; !at && i + 3 <= c->n; i++) /* percent-encoded: the last "%40" (a name may hold a '%') */
        if (memcmp(c->m + i, "%40", 3) == 0 && !memchr(c->m + i + 3, '%', c->n - i - 3)) at = c->m + i;
    if (!at || at == c->m || at[-1] == '.' || c->m[0] == '.') return 0;
    for (const char *p = c->m; p + 1 < c->m + c->n; p++)
        if (p[0] == '.' && p[1] == '.') return 0;
    return 0.99f;
}

static int luhn(const char *s, size_t n)
{
    int sum = 0, dbl = 0;
    for (size_t i = n; i-- > 0;) {
        if (s[i] < '0' || s[i] > '9') continue;
        int d = s[i] - '0';
        if (dbl && (d *= 2) > 9) d -= 9;
        sum += d;
        dbl = !dbl;
    }
    return sum % 10 == 0;
}

static float v_card(const ctx *c)
{
    static const char *const cues[] = { "card", "cc ", "cc#", "credit", "debit", "visa", "mastercard", "amex", "maestro", NULL };
    int d = count_digits(c->m, c->n);
    char sep = 0;
    int mixed = 0, group = 0, groups_of_4 = 1;
    for (size_t i = 0; i < c->n; i++) {
        char ch = c->m[i];
        if (ch >= '0' && ch <= '9') {
            group++;
            continue;
        }
        mixed |= sep && ch != sep;
        groups_of_4 &= group == 4;
        sep = ch, group = 0;
    }
    groups_of_4 &= group == 4;
    if (mixed && !(groups_of_4 && d == 16)) return 0; /* mixed separators: only as 4 x 4 digits */
    int same = 1;
    for (size_t i = 1; i < c->n; i++) same &= c->m[i] == c->m[0];
    if (same || !luhn(c->m, c->n)) return 0;
    if (d >= 13 && d <= 19) return 0.95f;
    /* 12-digit Maestro-style numbers only with a card cue: 1 in 10 random
     * 12-digit numbers passes Luhn */
    if (d == 12 && cue_before(c, 40, cues)) return 0.9f;
    return 0;
}

/* a phone's name just before the number: "tel:", "Mein Handy:", "\u624b\u673a\u53f7\u7801\uff1a" */
static const char *const phone_cues[] = { "tel", "phone", "handy", "mobile", "mobil", "cell", "call", "whatsapp", "fax",
                                          "t\xc3\xa9l\xc3\xa9phone", "portable", "\xe6\x90\xba\xe5\xb8\xaf" /* \u643a\u5e2f */,
                                          "\xe9\x9b\xbb\xe8\xa9\xb1" /* \u96fb\u8a71 */, "\xe6\x89\x8b\xe6\x9c\xba" /* \u624b\u673a */,
                                          "\xe7\x94\xb5\xe8\xaf\x9d" /* \u7535\u8bdd */, "\xec\xa0\x84\xed\x99\x94" /* \uc804\ud654 */, NULL };

static float v_phone(const ctx *c)
{
    static const char *const not_phone[] = { "isbn", "issn", "doi", NULL };
    size_t n = c->n;
    const char *x = NULL;
    for (size_t i = 0; i < n; i++)
        if (c->m[i] == 'x' || c->m[i] == 'e') { /* extension: not counted */
            x = c->m + i;
            break;
        }
    size_t core = x ? (size_t)(x - c->m) : n;
    int d = count_digits(c->m, core), seps = 0, dots = 0;
    for (size_t i = 0; i < core; i++) seps += c->m[i] == ' ' || c->m[i] == '-' || c->m[i] == '.' || c->m[i] == '(';
    for (size_t i = 0; i < core; i++) dots += c->m[i] == '.';
    if (d < 7 || d > 15) return 0;
    if (c->m[0] != '+' && seps == 0 && d < 10) return 0; /* a bare number: too weak */
    if (seps == 1 && dots == 1) return 0;                 /* a decimal: 3.14159265358979, build 20240517.3 */
    if (cue_before(c, 16, not_phone)) return 0;           /* a book's or a paper's number */
    const int cued = cue_before(c, 24, phone_cues);
    if (c->me < c->len && (c->s[c->me] == ':' || c->s[c->me] == '/' || c->s[c->me] == '%')) return 0; /* time, date, percent */
    /* a ':' before it is a time's or a field's, unless a phone's name is the field ("tel:+1...") */
    if (c->ms > 0 && (c->s[c->ms - 1] == '$' || c->s[c->ms - 1] == '/' || (c->s[c->ms - 1] == ':' && !cued))) return 0;
    /* dates: 2000-04-16 ... */
    if (core >= 10 && isdigit((unsigned char)c->m[0]) && isdigit((unsigned char)c->m[3]) && c->m[4] == '-' && c->m[7] == '-')
        return 0;
    /* the ddd-dd-dddd shape is the SSN recognizer's (validated there) */
    if (core == 11 && c->m[3] == '-' && c->m[6] == '-' && d == 9) return 0;
    /* three or more 4-digit groups: card or account formatting, not a phone -- unless a phone's
     * name stands before it (Germany's mobiles: 0151 4872 0936) */
    int quads = 0, run = 0;
    for (size_t i = 0; i <= core; i++) {
        if (i < core && isdigit((unsigned char)c->m[i])) {
            run++;
            continue;
        }
        quads += run == 4;
        run = 0;
    }
    if (quads >= 3 && !cued) return 0;
    /* a dotted quad is an IP address */
    if (dots == 3 && seps == 3 && d <= 12) return 0;
    return c->m[0] == '+' ? 0.8f : 0.6f;
}

static float v_ssn(const ctx *c)
{
    static const char *const cues[] = { "ssn", "social security", "soc sec", "social", "itin", "taxpayer", NULL };
    char dgt[9];
    int k = 0;
    char s1 = 0, s2 = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (isdigit((unsigned char)c->m[i])) {
            if (k < 9) dgt[k] = c->m[i];
            k++;
        } else if (k == 3) s1 = c->m[i];
        else if (k == 5) s2 = c->m[i];
    }
    if (k != 9) return 0;
    int area = (dgt[0] - '0') * 100 + (dgt[1] - '0') * 10 + (dgt[2] - '0');
    int group = (dgt[3] - '0') * 10 + (dgt[4] - '0');
    int serial = atoi((char[5]){ dgt[5], dgt[6], dgt[7], dgt[8], 0 });
    /* 9xx is no SSN, but an ITIN when its group is one the IRS issues */
    const int itin = area >= 900 && ((group >= 50 && group <= 65) || (group >= 70 && group <= 88) || (group >= 90 && group <= 92) || group >= 94);
    if (area == 0 || area == 666 || (area >= 900 && !itin) || group == 0 || serial == 0) return 0;
    if (s1 != s2) return 0; /* 123-45 6789 */
    if (!s1) return cue_before(c, 30, cues) ? 0.9f : 0; /* 9 bare digits only with a cue */
    return cue_before(c, 30, cues) ? 0.95f : 0.85f;
}

static float v_ipv4(const ctx *c)
{
    const char *p = c->m, *end = c->m + c->n;
    for (int part = 0; part < 4; part++) {
        int v = 0, len = 0;
        const char *st = p;
        while (p < end && isdigit((unsigned char)*p)) v = v * 10 + (*p++ - '0'), len++;
        if (len == 0 || len > 3 || v > 255 || (len > 1 && *st == '0')) return 0;
        if (part < 3 && (p >= end || *p++ != '.')) return 0;
    }
    /* no one's address: this host (0.0.0.0), loopback (127/8), the documentation ranges of RFC 5737 */
    static const char *const reserved[] = { "0.", "127.", "192.0.2.", "198.51.100.", "203.0.113.", NULL };
    for (int i = 0; reserved[i]; i++)
        if (strncmp(c->m, reserved[i], strlen(reserved[i])) == 0) return 0;
    return 0.9f;
}

static float v_ipv6(const ctx *c)
{
    char buf[64];
    unsigned char addr[16];
    if (c->n >= sizeof buf) return 0;
    int colons = 0;
    for (size_t i = 0; i < c->n; i++) colons += c->m[i] == ':';
    if (colons < 2) return 0;
    memcpy(buf, c->m, c->n);
    buf[c->n] = 0;
    return inet_pton(AF_INET6, buf, addr) == 1 ? 0.9f : 0;
}

static const struct { char cc[3]; int len; } iban_lengths[] = {
    { "AD", 24 }, { "AE", 23 }, { "AL", 28 }, { "AT", 20 }, { "AZ", 28 }, { "BA", 20 }, { "BE", 16 }, { "BG", 22 },
    { "BH", 22 }, { "BR", 29 }, { "BY", 28 }, { "CH", 21 }, { "CR", 22 }, { "CY", 28 }, { "CZ", 24 }, { "DE", 22 },
    { "DK", 18 }, { "DO", 28 }, { "EE", 20 }, { "EG", 29 }, { "ES", 24 }, { "FI", 18 }, { "FO", 18 }, { "FR", 27 },
    { "GB", 22 }, { "GE", 22 }, { "GI", 23 }, { "GL", 18 }, { "GR", 27 }, { "GT", 28 }, { "HR", 21 }, { "HU", 28 },
    { "IE", 22 }, { "IL", 23 }, { "IQ", 23 }, { "IS", 26 }, { "IT", 27 }, { "JO", 30 }, { "KW", 30 }, { "KZ", 20 },
    { "LB", 28 }, { "LC", 32 }, { "LI", 21 }, { "LT", 20 }, { "LU", 20 }, { "LV", 21 }, { "MC", 27 }, { "MD", 24 },
    { "ME", 22 }, { "MK", 19 }, { "MR", 27 }, { "MT", 31 }, { "MU", 30 }, { "NL", 18 }, { "NO", 15 }, { "PK", 24 },
    { "PL", 28 }, { "PS", 29 }, { "PT", 25 }, { "QA", 29 }, { "RO", 24 }, { "RS", 22 }, { "SA", 24 }, { "SC", 31 },
    { "SE", 24 }, { "SI", 19 }, { "SK", 24 }, { "SM", 27 }, { "ST", 25 }, { "SV", 28 }, { "TL", 23 }, { "TN", 24 },
    { "TR", 26 }, { "UA", 29 }, { "VA", 22 }, { "VG", 24 }, { "XK", 20 },
};

static float v_iban(const ctx *c)
{
    char b[40];
    int n = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->m[i] == ' ' || c->m[i] == '-') continue;
        if (n == (int)sizeof b - 1) return 0;
        b[n++] = (char)toupper((unsigned char)c->m[i]);
    }
    int want = 0;
    for (size_t i = 0; i < sizeof iban_lengths / sizeof iban_lengths[0]; i++)
        if (b[0] == iban_lengths[i].cc[0] && b[1] == iban_lengths[i].cc[1]) want = iban_lengths[i].len;
    if (!want || n != want) return 0;
    /* mod 97 of the rearranged number, letters as 10..35, digit by digit */
    int r = 0;
    for (int k = 0; k < n; k++) {
        char ch = b[(k + 4) % n];
        if (isdigit((unsigned char)ch)) r = (r * 10 + (ch - '0')) % 97;
        else if (ch >= 'A' && ch <= 'Z') r = (r * 100 + (ch - 'A' + 10)) % 97;
        else return 0;
    }
    return r == 1 ? 0.99f : 0;
}

static float shannon_bits(const char *s, size_t n)
{
    int cnt[256] = { 0 };
    for (size_t i = 0; i < n; i++) cnt[(unsigned char)s[i]]++;
    double h = 0;
    for (int i = 0; i < 256; i++)
        if (cnt[i]) h -= (double)cnt[i] / n * log2((double)cnt[i] / n);
    return (float)h;
}

/* whether s[0..n) is one of the words of a NULL-ended list, in any case */
static int one_of(const char *const *words, const char *s, size_t n)
{
    for (int i = 0; words[i]; i++)
        if (strlen(words[i]) == n && strncasecmp(words[i], s, n) == 0) return 1;
    return 0;
}

/* a value that is a placeholder or code, not a secret: "example", "changeme",
 * "YOUR_API_KEY", "aaaaaaaa" (one character repeated), "os.environ",
 * "settings.API_KEY" (dotted names without a digit), an environment
 * variable's name (capitals and '_' only) */
static int placeholder_or_code(const char *v, size_t n)
{
    static const char *const words[] = { "example", "changeme", "change_me", "password", "passwd", "secret", "none", "null",
                                         "true", "false", "undefined", "required", "optional", "string", "redacted", "hidden",
                                         "placeholder", "todo", "tbd", "empty", "dummy", "sample", "test", "value", "xxxx",
                                         "xxxxxxxx", "****", "********", "...", "env", NULL };
    if (one_of(words, v, n)) return 1;
    if (n >= 4 && (strncasecmp(v, "your", 4) == 0 || strncasecmp(v, "xxx", 3) == 0)) return 1;
    size_t same = 1;
    while (same < n && v[same] == v[0]) same++;
    if (n && same == n) return 1; /* one character repeated: "aaaaaaaa", "00000000" */
    if (n && (v[0] == '!' || v[0] == '$' || v[0] == '%' || v[0] == '@')) return 1; /* a tag, a variable, a template */
    int digit = 0, lower = 0, dot = 0, ident = 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)v[i];
        digit |= isdigit(ch) != 0, lower |= islower(ch) != 0, dot |= ch == '.';
        ident &= isalnum(ch) || ch == '_' || ch == '.';
    }
    if (ident && !digit && dot && v[0] != '.' && v[n - 1] != '.') return 1; /* a dotted name: code */
    if (ident && !digit && !lower && !dot) return 1;                        /* A_CONSTANT_NAME */
    return 0;
}

/* Authorization / Bearer values: a digit, or both cases (base64), and no placeholder */
static float v_credential(const ctx *c)
{
    int digit = 0, upper = 0, lower = 0;
    for (size_t i = 0; i < c->n; i++) {
        unsigned char ch = (unsigned char)c->m[i];
        digit |= isdigit(ch) != 0, upper |= isupper(ch) != 0, lower |= islower(ch) != 0;
    }
    if (placeholder_or_code(c->m, c->n)) return 0;
    return digit || (upper && lower) ? 0.9f : 0;
}

#define KEYVALUE_MAX 256 /* the longest value the key = value pattern takes: {4,256} below */

/* "key = value": passwords at any entropy, other keys only when the value
 * looks random (>= 3 bits per character over >= 8 characters); never code
 * or a placeholder */
static float v_keyvalue(const ctx *c)
{
    if (c->me < c->len && (c->s[c->me] == '(' || c->s[c->me] == '[')) return 0; /* a call or an index: code */
    size_t kstart = 0, kend = 0;
    cp_regex_group(c->mt, 1, &kstart, &kend);
    char key[128];
    size_t kn = kend - kstart < sizeof key - 1 ? kend - kstart : sizeof key - 1;
    for (size_t i = 0; i < kn; i++) key[i] = (char)tolower((unsigned char)c->s[kstart + i]);
    key[kn] = 0;
    if (placeholder_or_code(c->m, c->n)) return 0; /* "example", "YOUR_API_KEY", "${VAR}" */
    int foreign = 0; /* the pattern's only non-ASCII key words are passwords (contraseña, пароль) */
    for (size_t i = 0; i < kn; i++) foreign |= (unsigned char)key[i] >= 0x80;
    float score = 0;
    int digit = 0, alpha = 0, digits_only = 1;
    for (size_t i = 0; i < c->n; i++) {
        const unsigned char ch = (unsigned char)c->m[i];
        digit |= isdigit(ch) != 0, alpha |= isalpha(ch) != 0, digits_only &= isdigit(ch) != 0;
    }
    const char *last = key + kn; /* the key's last part: "api_key" -> "key", "GITHUB_TOKEN" -> "token", "stripeKey" -> "key" */
    while (last > key && isalnum((unsigned char)last[-1])) {
        const size_t at = kstart + (size_t)(--last - key); /* the key as written: a capital after a small letter starts a part */
        if (last > key && isupper((unsigned char)c->s[at]) && islower((unsigned char)c->s[at - 1])) break;
    }
    const int named = strcmp(last, "token") == 0 || strcmp(last, "key") == 0 || strcmp(last, "apikey") == 0;
    if (strstr(key, "pass") || strstr(key, "pwd") || strcmp(key, "pw") == 0 || strstr(key, "wort") || strstr(key, "senha") ||
        strstr(key, "secret") || named || foreign)
        score = c->n >= 4 ? 0.9f : 0;
    /* a token or key: random-looking, or letters and digits (Lightning1991), or a code of digits */
    else if ((c->n >= 8 && shannon_bits(c->m, c->n) >= 3.0f) || (c->n >= 6 && digit && (alpha || digits_only)))
        score = 0.85f;
    /* a value the pattern cut at its 256 bytes runs on to its end (a long
     * token or key: the rest of it is as secret as its start) */
    if (score > 0 && c->n == KEYVALUE_MAX) {
        size_t e = c->me;
        while (e < c->len && !isspace((unsigned char)c->s[e]) && !strchr("\"',;`<>()[]{}*|", c->s[e])) e++;
        *c->span_end = e;
    }
    return score;
}

/* "my password is X", "the vault code was X": X unless it is a word prose
 * puts there ("the password is required") */
static float v_phrase_secret(const ctx *c)
{
    static const char *const prose[] = { "required", "incorrect", "correct", "wrong", "invalid", "expired", "empty", "blank",
                                         "missing", "weak", "strong", "secure", "insecure", "reset", "changed", "stored",
                                         "saved", "encrypted", "hashed", "case", "not", "too", "the", "your", "our", "their",
                                         "his", "her", "its", "still", "now", "also", "being", "set", "sent", "shown",
                                         "hidden", "valid", "same", "different", "long", "short", "protected", "needed",
                                         "optional", "mandatory", "below", "above", "attached", "included", "unknown",
                                         "known", "written", "printed", "displayed", "visible", "available", "sensitive",
                                         "private", "secret", "confidential", "easy", "hard", "simple", "complex", "only",
                                         "just", "that", "this", "what", "which", "where", "in", "on", "at", "for", "from", "to", "out",
                                         "with", "and", "or", "but", "a", "an", "no", "none", "nothing", "something",
                                         NULL };
    /* the value's first word decides, with the one after it: "required for
     * login" and "incorrect, try again" are prose, "correct horse battery
     * staple" a passphrase */
    static const char *const joins[] = { "for", "to", "and", "or", "in", "on", "at", "by", "when", "if", "but", "so", "because",
                                         "with", "please", "again", "now", "here", "there", "yet", "already", "below", "above",
                                         "later", NULL };
    /* a value that opens with these is a clause, whatever follows ("the secret is to keep going") */
    static const char *const clause[] = { "to", "that", "in", "on", "at", "for", "from", "with", "the", "a", "an", "not", NULL };
    size_t w = 0, w2 = 0, s2;
    while (w < c->n && (isalnum((unsigned char)c->m[w]) || c->m[w] == '-' || c->m[w] == '_' || (unsigned char)c->m[w] >= 0x80)) w++;
    int stop = w < c->n && !isspace((unsigned char)c->m[w]); /* punctuation right after it: the clause goes on */
    for (s2 = w; s2 < c->n && isspace((unsigned char)c->m[s2]); s2++) {}
    while (s2 + w2 < c->n && isalpha((unsigned char)c->m[s2 + w2])) w2++;
    const int joined = stop || s2 >= c->n || one_of(joins, c->m + s2, w2);
    if ((joined && one_of(prose, c->m, w)) || (!stop && s2 < c->n && one_of(clause, c->m, w))) return 0;
    return placeholder_or_code(c->m, c->n) ? 0 : 0.9f;
}

static int has_any(const char *s, size_t n, const char *needles);

/* whether the match's line, up to `back` bytes before the match, holds
 * one of needles (has_any's form): a cue that may stand anywhere before
 * the value, looked for from the value back (a pattern that started at
 * the cue and skipped ahead to the value tried every cue's whole reach:
 * "wifi " repeated cost ~50 steps a byte) */
static int line_before_has(const ctx *c, size_t back, const char *needles)
{
    size_t a = c->whole_start;
    while (a > 0 && c->whole_start - a < back && c->s[a - 1] != '\n') a--;
    return has_any(c->s + a, c->whole_start - a, needles);
}

/* a Wi-Fi key on a line that names the network: after "password",
 * "passphrase" or "psk" any value but a word prose puts there; after
 * "key" 8 bytes or more (WPA's least), and a plain lowercase word only
 * where a ':' or '=' stands before it or no word follows it ("key
 * bluebird", not "the key management is") */
static float v_wifi_key(const ctx *c)
{
    if (!line_before_has(c, 80, "|wifi|wi-fi|wlan|wpa|ssid")) return 0;
    if (strncasecmp(c->s + c->whole_start, "key", 3) != 0) return v_phrase_secret(c);
    if (c->n < 8) return 0;
    int plain = 1, sep = 0;
    for (size_t i = 0; i < c->n; i++) plain &= islower((unsigned char)c->m[i]) != 0;
    for (size_t i = c->whole_start + 3; i < c->ms; i++) sep |= c->s[i] == ':' || c->s[i] == '=';
    size_t after = c->me;
    while (after < c->len && (c->s[after] == ' ' || c->s[after] == '\t')) after++;
    const int clause = after < c->len && isalpha((unsigned char)c->s[after]); /* another word follows on the line */
    return (plain && !sep && clause) || placeholder_or_code(c->m, c->n) ? 0 : 0.9f;
}

/* a value that is not a placeholder or code */
static float v_placeholder_not(const ctx *c) { return placeholder_or_code(c->m, c->n) ? 0 : 0.9f; }

/* an identity document's or an account's number after its name: four
 * digits or more ("passport number X12345678", not "account settings");
 * a passport's may be mostly letters (Germany's C7HKRJ2T9): after a
 * passport's name, six characters or more with two digits */
static float v_id_number(const ctx *c)
{
    int digits = 0, alnum = 0;
    for (size_t i = 0; i < c->n; i++) digits += isdigit((unsigned char)c->m[i]) != 0, alnum += isalnum((unsigned char)c->m[i]) != 0;
    const char *cue = c->s + c->whole_start;
    const int passport = strncasecmp(cue, "pass", 4) == 0 || strncasecmp(cue, "reisepass", 9) == 0 || strncasecmp(cue, "pasaporte", 9) == 0;
    return digits >= 4 || (passport && digits >= 2 && alnum >= 6) ? 0.85f : 0;
}

/* a .pgpass line (host:port:database:user:password): not an IPv6
 * address, whose groups are all hexadecimal */
static float v_pgpass(const ctx *c)
{
    const char *s = c->s + c->whole_start, *e = c->s + c->me;
    int hex = 1, run = 0;
    for (const char *p = s; p < e && hex; p++) {
        if (*p == ':') run = 0;
        else hex = isxdigit((unsigned char)*p) && ++run <= 4;
    }
    return hex ? 0 : v_placeholder_not(c);
}

/* a command-line password: the flag (group 1) counts only on a line that
 * names a client taking it -- "-p" with the value attached for mysql
 * (where "-p DB" names the database), apart for mongo, RDP clients and
 * container registry logins (docker run's "-p" is a port); "--password
 * X", sshpass and htpasswd on any line */
static float v_client_password(const ctx *c)
{
    static const struct { const char *flag, *clients; } takes[] = {
        { "-a", "|redis|keydb" }, { "-w", "|ldap" }, { "-k", "|openssl" }, { "-P", "|sqlcmd|bcp|osql|isql" },
        { "-pass", "|openssl" }, { "-passin", "|openssl" }, { "-passout", "|openssl" }, { "/p:", "|freerdp|rdesktop" },
    };
    size_t fs = 0, fe = 0;
    cp_regex_group(c->mt, 1, &fs, &fe);
    const char *f = c->s + fs;
    const size_t fl = fe - fs;
    if (placeholder_or_code(c->m, c->n)) return 0;
    if (fl == 2 && memcmp(f, "-p", 2) == 0) {
        const int attached = c->ms == fe;
        return line_before_has(c, 160, attached ? "|mysql|mariadb"
                                                : "|mongo|freerdp|rdesktop|docker login|podman login|registry login|nerdctl login|"
                                                  "buildah login|skopeo login|oras login")
                   ? 0.9f
                   : 0;
    }
    for (size_t k = 0; k < sizeof takes / sizeof *takes; k++)
        if (strlen(takes[k].flag) == fl && memcmp(takes[k].flag, f, fl) == 0) return line_before_has(c, 160, takes[k].clients) ? 0.9f : 0;
    return 0.9f; /* --password, --pass, sshpass, htpasswd */
}

/* a health word's span takes up to three words before it on its line and
 * in its sentence ("I'm eleven weeks pregnant": the fact is the words
 * around the word); a plain loop, not a regex prefix, which would try the
 * words at every position of the message */
static float v_health_words(const ctx *c)
{
    size_t at = c->ms;
    for (int words = 0; words < 3 && at > 0; words++) {
        size_t j = at;
        while (j > 0 && (c->s[j - 1] == ' ' || c->s[j - 1] == '\t')) j--;
        if (j == at || j == 0) break; /* no space before: the sentence or line starts here */
        size_t k = j;
        while (k > 0 && (isalnum((unsigned char)c->s[k - 1]) || c->s[k - 1] == '\'' || c->s[k - 1] == '-' ||
                         (unsigned char)c->s[k - 1] >= 0x80))
            k--;
        if (k == j || j - k > 32) break;
        at = k;
    }
    *c->span_start = at;
    return 0.8f;
}

/* a provider's key by its prefix: letters and digits both in the rest */
static float v_prefixed_key(const ctx *c)
{
    int alpha = 0, digit = 0;
    for (size_t i = 0; i < c->n; i++) alpha |= isalpha((unsigned char)c->m[i]) != 0, digit |= isdigit((unsigned char)c->m[i]) != 0;
    return alpha && digit ? 0.95f : 0;
}

/* a token no one writes by hand: 20 or more letters and digits mixing
 * capitals, small letters and digits that change class at least every
 * third character (base64 / base62 keys: AWS secret keys, Azure account
 * keys, signatures, bot tokens), 32 or more hex digits (keys, tokens), or
 * 16 or more base32 capitals and digits (TOTP seeds).  An identifier
 * ("SHA256WithRSAEncryption", "Mistral-7B-Instruct",
 * "getUserByIdFromDatabase2", "Utf8StringToUtf16Converter") changes class
 * too rarely or is mostly words (runs of three small letters or more,
 * with their capital: 40 % of its letters and digits or more; a random
 * token has few); '+', '/', '_' and '-' join parts and count for no class.
 * Digests named as such are left alone, and documents (public text, full
 * of them) are not scanned for these. */
static float v_random_token(const ctx *c)
{
    /* a digest named as one (a commit, a checksum, a content hash, a trace
     * id, an inline image) is public: it names content, it unlocks nothing */
    static const char *const digest[] = { "sha", "md5", "h1:", "base64,", "integrity", "digest", "commit", "checksum", "hash",
                                          "fingerprint", "trace", "build", "etag", "revision", "rev ", NULL };
    if (cue_before(c, 24, digest)) return 0;
    size_t n = 0, up = 0, lo = 0, dg = 0, changes = 0, wordish = 0, run = 0;
    int prev = -1, hex_lo = 1, hex_up = 1, b32 = 1, capital = 0;
    for (size_t i = 0; i < c->n && c->m[i] != '='; i++) {
        const unsigned char ch = (unsigned char)c->m[i];
        const int k = isupper(ch) ? 0 : islower(ch) ? 1 : isdigit(ch) ? 2 : -1;
        if (k < 0) {
            hex_lo = hex_up = b32 = 0;
            continue;
        }
        n++, up += k == 0, lo += k == 1, dg += k == 2;
        changes += prev >= 0 && k != prev;
        if (k == 1) {
            if (run++ == 0) capital = prev == 0;
        } else {
            wordish += run >= 3 ? run + (size_t)capital : 0, run = 0;
        }
        prev = k;
        hex_lo &= isdigit(ch) || (ch >= 'a' && ch <= 'f');
        hex_up &= isdigit(ch) || (ch >= 'A' && ch <= 'F');
        b32 &= (ch >= 'A' && ch <= 'Z') || (ch >= '2' && ch <= '7');
    }
    if ((hex_lo || hex_up) && n >= 32 && dg && (up || lo) && changes * 4 >= n) return 0.8f;
    if (b32 && n >= 16 && up && dg && changes * 4 >= n) return 0.8f;
    wordish += run >= 3 ? run + (size_t)capital : 0;
    return n >= 20 && up && lo && dg && changes * 3 >= n && wordish * 5 < n * 2 ? 0.8f : 0;
}

/* an amount of money after a cue word in its sentence, within 48 bytes
 * ("my salary is $87,500", "I earn \xc2\xa342k", "we owe 4000 dollars"): a
 * person's earnings, savings or debts.  An amount alone ("$5 for coffee")
 * is not a person's; a cue counts at a word's start ("learn", "power"
 * hold none). */
static float v_money(const ctx *c)
{
    static const char *const cues[] = { "salar", "wage", "income", "earn", "bonus", "net worth", "balance", "saving", "debt", "owe",
                                        "mortgage", "gehalt", "kontostand", "einkommen", "salaire", "saldo", "sueldo", "stipendio",
                                        "make", "made", "gross", "net pay", "take-home", "take home", NULL };
    size_t from = c->whole_start;
    while (from > 0 && c->whole_start - from < 48) {
        const char p = c->s[from - 1];
        if (p == '\n' || p == '!' || p == '?' || (p == '.' && c->s[from] == ' ')) break; /* the sentence's start */
        from--;
    }
    char buf[64];
    const size_t n = c->whole_start - from;
    for (size_t i = 0; i < n; i++) buf[i] = (char)tolower((unsigned char)c->s[from + i]);
    buf[n] = 0;
    /* and the speaker's or someone's own: "my", "our", "I", "we", "his" ...
     * ("income grew 18 % to $1.1M", "average salary $72,000" are no one's) */
    static const char *const whose[] = { "my", "our", "i", "we", "his", "her", "their", "your", "mein", "meine", "mon", "ma",
                                         "mes", "mi", "mis", "mio", "mia", "ich", "je", "yo", "employee", NULL };
    int cued = 0, owned = 0;
    for (int i = 0; cues[i] && !cued; i++)
        for (const char *p = strstr(buf, cues[i]); p && !cued; p = strstr(p + 1, cues[i]))
            cued = p == buf || !isalpha((unsigned char)p[-1]);
    for (size_t i = 0; i < n && !owned; i++) {
        if (i > 0 && isalpha((unsigned char)buf[i - 1])) continue;
        size_t w = i;
        while (w < n && isalpha((unsigned char)buf[w])) w++;
        owned = w > i && one_of(whose, buf + i, w - i);
    }
    /* or a named person's: "Ravi Subramaniam's base salary" */
    owned |= strstr(buf, "'s ") != NULL || strstr(buf, "\xe2\x80\x99s ") != NULL;
    return cued && owned ? 0.8f : 0;
}

/* a card's security code or expiry: an expiry only with a card named on
 * its line ("Offer valid until 12/25", "the milk expires 05/24" are not) */
static float v_card_detail(const ctx *c)
{
    if (!memchr(c->m, '/', c->n) && !memchr(c->m, '-', c->n)) return 0.85f;
    return line_before_has(c, 160, "|card|visa|mastercard|amex|maestro|cvv|cvc|credit|debit") ? 0.85f : 0;
}

/* a MAC address: with a hex letter (not numbers in groups: scores, a
 * date) and a network word on its line (not a hexdump's bytes); twelve
 * digits without separators only after a MAC's name */
static float v_mac(const ctx *c)
{
    /* twelve bare hex digits are as often a short hash: only right after a MAC's own name */
    static const char *const bare[] = { "mac", "hw addr", "hwaddr", "ether", "bssid", "hardware address", "physical address", NULL };
    int letter = 0, digit = 0;
    for (size_t i = 0; i < c->n; i++) letter |= isalpha((unsigned char)c->m[i]) != 0, digit |= isdigit((unsigned char)c->m[i]) != 0;
    if (c->n == 12 && !(digit && cue_before(c, 24, bare))) return 0;
    return letter && line_before_has(c, 160, "|mac|ether|hw|bssid|addr|device|wifi|wi-fi|wlan|eth|lan|router|nic|adapter|"
                                             "interface|port|switch|laptop|phone") ? 0.85f : 0;
}

/* "jdoe [at] example [dot] org", "priya_r at yahoo dot co dot in",
 * "m.kowalski(at)firma.pl": an address written so machines miss it.  A
 * bracketed at is one; a plain " at " only with an address's marks -- a
 * '.', '_', '+' or digit in a name that has letters and is no version
 * number, or a spelt "dot" ("look at example.com", "inbox at gmail.com",
 * "3.12 at python.org" are prose) -- and a domain that ends in letters. */
static float v_obfuscated_email(const ctx *c)
{
    size_t ls, le, ds, de;
    if (!cp_regex_group(c->mt, 1, &ls, &le) || !cp_regex_group(c->mt, 2, &ds, &de)) return 0;
    const char *s = c->s;
    size_t tld = de; /* the last label: letters */
    while (tld > ds && isalpha((unsigned char)s[tld - 1])) tld--;
    if (de - tld < 2 || (tld > ds && isalnum((unsigned char)s[tld - 1]))) return 0;
    int bracketed = 0, marks = 0, letter = 0, version = 1;
    for (size_t i = le; i < ds; i++) bracketed |= s[i] == '[' || s[i] == '(' || s[i] == '{' || s[i] == '<';
    for (size_t i = ls; i < le; i++) {
        const unsigned char ch = (unsigned char)s[i];
        marks |= ch == '.' || ch == '_' || ch == '+' || isdigit(ch) || ch == ' ';
        letter |= isalpha(ch) && !(i == ls && (ch == 'v' || ch == 'V'));
        version &= isdigit(ch) || ch == '.' || (i == ls && (ch == 'v' || ch == 'V'));
    }
    for (size_t i = ds; i < de; i++) marks |= s[i] == ' ' || s[i] == '[' || s[i] == '(';
    /* "3.12 at python.org", "v2.4.1 at github.com": a version, not a name */
    return bracketed || (marks && letter && !version) ? 0.9f : 0;
}

/* whether the line before the match, up to `back` bytes, holds one of
 * words (lowercase) as a word of its own: not inside another ("pan" is
 * not in "company", "nie" not in "niece") */
static int cue_word_before(const ctx *c, size_t back, const char *const *words)
{
    size_t a = c->whole_start;
    while (a > 0 && c->whole_start - a < back && c->s[a - 1] != '\n') a--;
    const size_t n = c->whole_start - a;
    char buf[168];
    if (n >= sizeof buf) a += n - (sizeof buf - 1);
    const size_t m = c->whole_start - a;
    for (size_t i = 0; i < m; i++) buf[i] = (char)tolower((unsigned char)c->s[a + i]);
    buf[m] = 0;
    for (int k = 0; words[k]; k++) {
        const size_t wl = strlen(words[k]);
        for (const char *p = strstr(buf, words[k]); p; p = strstr(p + 1, words[k])) {
            const int open = p == buf || !isalnum((unsigned char)p[-1]);
            const int shut = !isalnum((unsigned char)p[wl - 1]) || !isalnum((unsigned char)p[wl]);
            if (open && shut) return 1;
        }
    }
    return 0;
}

/* the letters and digits of s[0..n), upper-cased, into out (at most cap - 1); returns their count */
static size_t alnum_upper(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++)
        if (isalnum((unsigned char)s[i])) out[k++] = (char)toupper((unsigned char)s[i]);
    out[k] = 0;
    return k;
}

/* the Dutch BSN's 11-test: 9*d1 + 8*d2 + ... + 2*d8 - d9 is a multiple of 11 */
static int bsn_ok(const char *s)
{
    int t = 0;
    for (int i = 0; i < 8; i++) t += (9 - i) * (s[i] - '0');
    t -= s[8] - '0';
    return t % 11 == 0 && t != 0;
}

/* a US bank routing number (ABA): 3, 7, 1 weights, a multiple of 10 */
static int aba_ok(const char *s)
{
    int t = 0;
    for (int i = 0; i < 9; i++) t += (i % 3 == 0 ? 3 : i % 3 == 1 ? 7 : 1) * (s[i] - '0');
    return t % 10 == 0;
}

/* the Italian codice fiscale's check letter: odd positions by a table, even by value */
static int codice_fiscale_ok(const char *s)
{
    static const unsigned char odd[26] = { 1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23 };
    int t = 0;
    for (int i = 0; i < 15; i++) {
        const int v = isdigit((unsigned char)s[i]) ? s[i] - '0' : s[i] - 'A';
        t += i % 2 == 0 ? odd[v] : v; /* a digit's odd value is its letter's: 0 as A, 1 as B ... */
    }
    return s[15] == 'A' + t % 26;
}

/* a Spanish NIE (X/Y/Z and 7 digits) or DNI (8 digits): the letter is the number mod 23 */
static int nie_dni_ok(const char *s, size_t n)
{
    if (n != 9) return 0;
    long v = s[0] == 'X' ? 0 : s[0] == 'Y' ? 1 : s[0] == 'Z' ? 2 : s[0] - '0';
    for (int i = 1; i < 8; i++) v = v * 10 + (s[i] - '0');
    return s[8] == "TRWAGMYFPDXBNJZSQVHLCKE"[v % 23];
}

/* a French NIR and its key: 97 - the 13-digit number mod 97 (Corsica's
 * departments 2A and 2B count as 19 and 18) */
static int nir_ok(const char *s, size_t n)
{
    if (n != 15) return 0;
    char d[16];
    memcpy(d, s, 15);
    if (d[5] == '2' && (d[6] == 'A' || d[6] == 'B')) d[5] = '1', d[6] = d[6] == 'A' ? '9' : '8';
    long long v = 0;
    for (int i = 0; i < 15; i++) {
        if (!isdigit((unsigned char)d[i])) return 0;
        if (i < 13) v = v * 10 + (d[i] - '0');
    }
    return 97 - v % 97 == (d[13] - '0') * 10 + (d[14] - '0');
}

/* a VIN's check digit (its 9th character): letters transliterated, weighted, mod 11 (10 is X) */
static int vin_ok(const char *s)
{
    static const char w[17] = { 8, 7, 6, 5, 4, 3, 2, 10, 0, 9, 8, 7, 6, 5, 4, 3, 2 };
    static const char tr[26] = { 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 0, 7, 0, 9, 2, 3, 4, 5, 6, 7, 8, 9 };
    int t = 0, letter = 0, digit = 0;
    for (int i = 0; i < 17; i++) {
        const int l = s[i] >= 'A' && s[i] <= 'Z';
        letter |= l, digit |= !l;
        t += (l ? tr[s[i] - 'A'] : s[i] - '0') * w[i];
    }
    return letter && digit && s[8] == (t % 11 == 10 ? 'X' : '0' + t % 11);
}

/* a national or bank identifier found by its shape (the group that
 * matched says which), its checksum where it has one, and its name on
 * the line before it: the value is matched first and the cue looked for
 * from it back, so no cue's reach is scanned twice */
static float v_national_id(const ctx *c)
{
    static const char *const nino[] = { "national insurance", "nino", "ni no", "ni number", "ni #", "ni#", NULL };
    static const char *const aadhaar[] = { "aadhaar", "aadhar", "uid", "uidai", NULL };
    static const char *const pan[] = { "pan", "permanent account number", NULL };
    static const char *const bsn[] = { "bsn", "burgerservicenummer", "sofinummer", "sofi", NULL };
    static const char *const aba[] = { "aba", "routing", "rtn", "transit", NULL };
    static const char *const cf[] = { "codice fiscale", "cf", "c.f", "fiscal code", "tax code", NULL };
    static const char *const nie[] = { "nie", "dni", "nif", "n.i.e", "extranjero", "identidad", NULL };
    static const char *const nir[] = { "s\xc3\xa9" "cu", "secu", "s\xc3\xa9" "curit\xc3\xa9 sociale", "securite sociale", "nir",
                                       "insee", "carte vitale", "social security", NULL };
    static const char *const vin[] = { "vin", "vehicle", "chassis", "fahrgestellnummer", NULL };
    size_t gs = 0, ge = 0;
    int g = 1;
    while (g <= 9 && !(cp_regex_group(c->mt, g, &gs, &ge) && ge > gs)) g++;
    char v[24];
    const size_t n = alnum_upper(c->m, c->n, v, sizeof v);
    const size_t back = 120;
    switch (g) {
    case 1: /* a UK National Insurance number: no BG, GB, KN, NK, NT, TN or ZZ prefix */
        if (strstr("BG GB KN NK NT TN ZZ", (char[3]){ v[0], v[1], 0 })) return 0;
        return cue_word_before(c, back, nino) ? 0.9f : 0;
    case 2: /* not Verhoeff-checked: numbers people give as theirs fail it as often as not */
        return cue_word_before(c, back, aadhaar) ? 0.85f : 0;
    case 4: return cue_word_before(c, back, pan) ? 0.9f : 0;
    case 5: return (bsn_ok(v) && cue_word_before(c, back, bsn)) || (aba_ok(v) && cue_word_before(c, back, aba)) ? 0.9f : 0;
    case 6: return codice_fiscale_ok(v) && cue_word_before(c, back, cf) ? 0.95f : 0;
    case 7: return nie_dni_ok(v, n) && cue_word_before(c, back, nie) ? 0.95f : 0;
    case 8: return nir_ok(v, n) && cue_word_before(c, back, nir) ? 0.95f : 0;
    case 9: return vin_ok(v) && cue_word_before(c, back, vin) ? 0.9f : 0;
    default: return 0;
    }
}

/* a vehicle's plate after its name: letters and digits both, 4 to 10 of them */
static float v_plate(const ctx *c)
{
    char v[24];
    const size_t n = alnum_upper(c->m, c->n, v, sizeof v);
    int letter = 0, digit = 0;
    for (size_t i = 0; i < n; i++) letter |= isalpha((unsigned char)v[i]) != 0, digit |= isdigit((unsigned char)v[i]) != 0;
    return letter && digit && n >= 4 && n <= 10 ? 0.85f : 0;
}

/* a numbered recovery phrase ("1. orbit 2. siren ... 12. harvest"): the
 * numbers run 1, 2, 3 ... without a gap, and there are 12, 15, 18, 21 or
 * 24 words -- the lengths a BIP-39 mnemonic has */
static float v_seed_list(const ctx *c)
{
    int want = 1;
    for (size_t i = 0; i < c->n;) {
        if (!isdigit((unsigned char)c->m[i])) {
            i++;
            continue;
        }
        int v = 0;
        while (i < c->n && isdigit((unsigned char)c->m[i])) v = v * 10 + (c->m[i++] - '0');
        if (v != want++) return 0;
    }
    const int words = want - 1;
    return words % 3 == 0 && words >= 12 && words <= 24 ? 0.9f : 0;
}

/* a password set in words ("so I set it to Velvet$Orca88"): capitals,
 * small letters, digits and a sign all in it -- what a password policy
 * asks for, and what a setting's value (a model name, a locale, a flag)
 * rarely has */
static float v_set_password(const ctx *c)
{
    int up = 0, lo = 0, dg = 0, sign = 0;
    for (size_t i = 0; i < c->n; i++) {
        const unsigned char ch = (unsigned char)c->m[i];
        up |= isupper(ch) != 0, lo |= islower(ch) != 0, dg |= isdigit(ch) != 0, sign |= ch && strchr("!@#$%^&*?~+", ch) != NULL;
    }
    return up && lo && dg && sign && !placeholder_or_code(c->m, c->n) ? 0.85f : 0;
}

/* a place by its coordinates: a latitude and a longitude in range
 * (decimal degrees with a place, a map or a home named before them on
 * the line: a pair of numbers alone is as often a measurement), or
 * degrees, minutes and seconds with their hemispheres */
static float v_coordinates(const ctx *c)
{
    size_t as = 0, ae = 0, os = 0, oe = 0;
    if (!cp_regex_group(c->mt, 1, &as, &ae) || ae <= as) return 0.85f; /* the DMS branch */
    cp_regex_group(c->mt, 2, &os, &oe);
    const double lat = strtod(c->s + as, NULL), lon = strtod(c->s + os, NULL);
    if (fabs(lat) > 90 || fabs(lon) > 180 || (fabs(lat) < 1 && fabs(lon) < 1)) return 0;
    return line_before_has(c, 120, "|house|home|live|address|locat|coordinat|gps|lat|lng|lon|maps|geo|place|here|pin|"
                                   "apartment|flat|office|meet|pick|drop|where|driver")
               ? 0.85f
               : 0;
}

/* base58check: the address's 25 bytes end with the first 4 of a double SHA-256 of the rest */
static int base58check_ok(const char *s, size_t n)
{
    static const char alpha[] = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
    unsigned char b[25] = { 0 };
    for (size_t i = 0; i < n; i++) {
        const char *p = strchr(alpha, s[i]);
        if (!p || !*p) return 0;
        unsigned carry = (unsigned)(p - alpha);
        for (int k = 24; k >= 0; k--) {
            carry += 58u * b[k];
            b[k] = (unsigned char)carry;
            carry >>= 8;
        }
        if (carry) return 0; /* more than 25 bytes */
    }
    unsigned char h1[32], h2[32];
    unsigned l1 = 0, l2 = 0;
    if (!EVP_Digest(b, 21, h1, &l1, EVP_sha256(), NULL) || !EVP_Digest(h1, 32, h2, &l2, EVP_sha256(), NULL)) return 0;
    return memcmp(h2, b + 21, 4) == 0;
}

/* bech32 / bech32m (BIP-173 / BIP-350) over "bc1...": the polymod of the expanded prefix and the data */
static int bech32_ok(const char *s, size_t n)
{
    static const char set[] = "qpzry9x8gf2tvdw0s3jn54khce6mua7l";
    static const uint32_t gen[5] = { 0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3 };
    uint32_t chk = 1;
    const int pre[5] = { 3, 3, 0, 2, 3 }; /* "bc": high bits, a zero, low bits */
    for (size_t i = 0; i < 5 + n - 3; i++) {
        int v;
        if (i < 5) v = pre[i];
        else {
            const char *p = strchr(set, tolower((unsigned char)s[3 + i - 5]));
            if (!p || !*p) return 0;
            v = (int)(p - set);
        }
        const uint32_t top = chk >> 25;
        chk = ((chk & 0x1ffffff) << 5) ^ (uint32_t)v;
        for (int k = 0; k < 5; k++)
            if (top >> k & 1) chk ^= gen[k];
    }
    return chk == 1 || chk == 0x2bc830a3;
}

/* a wallet address: a Bitcoin one whose checksum holds is one wherever it
 * stands (documents too); one that fails it, and an Ethereum address
 * (0x and 40 hex digits; its mixed-case checksum needs Keccak), only in
 * the private roles.  A digest named as one ("commit 9fce..."), or one
 * digit repeated (the zero address), is no wallet. */
static float v_crypto(const ctx *c)
{
    static const char *const digest[] = { "sha", "md5", "commit", "checksum", "hash", "digest", "fingerprint", "revision", "rev ",
                                          NULL };
    if (c->n > 2 && c->m[0] == '0') {
        int letter = 0, digit = 0;
        for (size_t i = 2; i < c->n; i++) letter |= isalpha((unsigned char)c->m[i]) != 0, digit |= isdigit((unsigned char)c->m[i]) != 0;
        return !c->shared && letter && digit && !cue_before(c, 24, digest) ? 0.85f : 0;
    }
    const int valid = c->m[0] == 'b' || c->m[0] == 'B' ? bech32_ok(c->m, c->n) : base58check_ok(c->m, c->n);
    if (valid) return 0.95f;
    return !c->shared && v_prefixed_key(c) > 0 ? 0.85f : 0;
}

static float v_person(const ctx *c)
{
    static const char *const stop[] = { "Sir", "Madam", "Customer", "Friend", "Friends", "Team", "All", "Colleague",
                                        "Colleagues", "Hiring", "Manager", "User", "Member", "Members", "Reader", "ID", NULL };
    for (int i = 0; stop[i]; i++) {
        size_t l = strlen(stop[i]);
        if (c->n >= l && memcmp(c->m, stop[i], l) == 0 && (c->n == l || !isalpha((unsigned char)c->m[l]))) return 0;
    }
    return 0.75f;
}

/* English months, and the French, German, Spanish and Italian ones that
 * do not begin like them ("7 juin 1983", "3. Oktober 1990") */
#define MONTH "(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|f\\x{00E9}v|fev|avr|mai|juin|juil|ao\\x{00FB}t|aout|d\\x{00E9}c|" \
              "m\\x{00E4}rz|maerz|okt|dez|ene|abr|ago|dic|gen|mag|giu|lug|set|ott)\\p{L}*\\.?"
#define DATE "(\\d{4}-\\d{1,2}-\\d{1,2}|\\d{1,2}[/.-]\\d{1,2}[/.-]\\d{2,4}|\\d{1,2}[/. -]" MONTH "[/. -]\\d{2,4}|(?:the\\s+)?\\d{1,2}(?:st|nd|rd|th)?\\s+(?:(?:of|de)\\s+)?" MONTH ",?\\s+(?:de\\s+)?\\d{4}|" MONTH "\\s+\\d{1,2}(?:st|nd|rd|th)?,?\\s+\\d{4}|" \
             "(?:19|20)\\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\\d|3[01])(?!\\d))"
#define NAME "(\\p{Lu}[\\p{L}'\\x{2019}-]+(?:\\s+\\p{Lu}\\.)?(?:[ \\t]+\\p{Lu}[\\p{L}'\\x{2019}-]+){0,2})"
/* the pieces of the Japanese and Chinese address rules: a digit, ASCII or
 * full-width; the dashes between Japanese block numbers; a run of kanji and
 * katakana (hiragana is the particles that end one) */
#define CJK_DIGIT "[0-9\\x{FF10}-\\x{FF19}]"
#define JA_DASH "[-\\x{FF0D}\\x{2212}\\x{2010}\\x{30FC}]"
#define JA_RUN "[\\p{Han}\\p{Katakana}\\x{30FC}]"

static const recognizer recognizers[] = {
    /* an address, or one percent-encoded in a URL's query (name%40example.com) */
    { "email", "(?<![\\w.%+-])[A-Za-z0-9._%+-]{1,64}(?:@|%40)[A-Za-z0-9-]{1,63}(?:\\.[A-Za-z0-9-]{1,63})*\\.[A-Za-z]{2,24}(?![\\w-])",
      0, 0.99f, v_email, "@%", 0 },
    { "url_credentials", "\\b[A-Za-z][A-Za-z0-9+.-]{1,15}://[^\\s/:@]{0,128}:[^\\s/@]{1,128}@[^\\s/?#]{1,255}", 0, 0.95f, NULL,
      "@", 1 },
    { "card", "(?<![\\d])(?<![\\d][./-])\\d(?:[ ./-]?\\d){11,18}(?![\\d]|[./-]\\d)", 0, 0.95f, v_card, "0123456789", 1 },
    { "ssn", "(?<![\\d-])\\d{3}([- ]?)\\d{2}\\1\\d{4}(?![\\d-])", 0, 0.85f, v_ssn, "0123456789", 1 },
    { "ip", "(?<![\\d.])\\d{1,3}\\.\\d{1,3}\\.\\d{1,3}\\.\\d{1,3}(?![\\d]|\\.\\d)", 0, 0.9f, v_ipv4, ".", 0 },
    { "ip", "(?<![\\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?::\\d{1,3}(?:\\.\\d{1,3}){3})?(?![\\w:])", 0, 0.9f,
      v_ipv6, ":", 0 },
    /* in groups of four split by spaces, or in a bank's own groups split by '-' (IE91-BOFI-900017-48263915) */
    { "iban", "(?i)(?<![A-Z0-9])[A-Z]{2}\\d{2}(?:(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?|(?:-[A-Z0-9]{1,10}+){2,8})(?![A-Z0-9])",
      0, 0.99f, v_iban, "0123456789", 1 },
    { "phone",
      /* ASCII letters only around it: Japanese and Chinese write a number between kana and hanzi (\u643a\u5e2f\u306f090-...\u3067\u3059) */
      "(?<![A-Za-z0-9_+.-])(?:\\+\\d{1,3}[ .-]?(?:\\(0\\)[ ]?)?(?:\\(\\d{1,4}\\)[ .-]?)?|\\(\\d{1,4}\\)[ ]?)?\\d{1,4}+(?:[ .-]?\\d{1,4}+){1,5}"
      "(?:[ ]?(?:x|ext\\.?)[ ]?\\d{1,5})?(?![A-Za-z0-9_-]|\\.\\d)",
      0, 0.6f, v_phone, "0123456789", 0 },
    { "dob",
      "(?i)\\b(?:DOB|D\\.O\\.B\\.?|date of birth|birth ?date|born(?: on)?|birthday|n(?:\\x{00E9}|e)e?[ \\t]+le|geboren[ \\t]+am|"
      "geburtsdatum|fecha[ \\t]+de[ \\t]+nacimiento|nacid[oa][ \\t]+el|nat[oa][ \\t]+il|data[ \\t]+di[ \\t]+nascita)\\b"
      "(?:[ \\t]+(?:is|was))?[\\s:,=-]*" DATE, 1, 0.85f, NULL,
      "0123456789", 0 },
    { "address",
      "\\b\\d{1,6}[ \\t]+(?:\\p{Lu}[\\p{L}'.-]*[ \\t]+){1,4}(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|"
      "Court|Ct|Way|Place|Pl|Terrace|Parkway|Pkwy|Circle|Cir|Highway|Hwy|Square|Sq|Trail|Crescent)\\b\\.?"
      "(?:,?[ \\t]+(?:Apt\\.?|Apartment|Suite|Ste\\.?|Unit|#)[ \\t]*[\\w-]+)?",
      0, 0.7f, NULL, "0123456789", 0 },
    /* a Japanese address to its block numbers: 東京都新宿区西新宿2-8-1, 大阪市北区梅田3丁目1番1号,
     * 山下町279-25: a run of kanji and katakana that holds a prefecture, city, ward, town or
     * village (particles in hiragana end it), then three numbers joined by dashes, two after a
     * town or village, or chome and ban.  Tried once a run, at its start (a match inside a run
     * would be tried at every character of it). */
    { "address",
      "(?<!" JA_RUN ")(?=" JA_RUN "{0,22}\\p{Han}[\\x{90FD}\\x{9053}\\x{5E9C}\\x{770C}\\x{5E02}\\x{533A}\\x{753A}\\x{6751}\\x{90E1}])" JA_RUN "{2,24}+"
      "(?:" CJK_DIGIT "{1,4}" JA_DASH CJK_DIGIT "{1,4}" JA_DASH CJK_DIGIT "{1,4}|"
      "(?<=[\\x{753A}\\x{6751}])" CJK_DIGIT "{1,4}" JA_DASH CJK_DIGIT "{1,4}|"
      CJK_DIGIT "{1,4}\\x{4E01}\\x{76EE}" CJK_DIGIT "{1,4}\\x{756A}(?:\\x{5730})?(?:" CJK_DIGIT "{1,4}\\x{53F7})?)",
      0, 0.75f, NULL, "\xe5\xe6\xe7\xe9", 0 },
    /* a Chinese address to its house number: 北京市朝阳区建国路88号, 上海市浦东新区世纪大道100号
     * (a district, county or city, then a road, street or lane and its number with 号); its
     * first characters are no pronoun, verb or particle (我住在 / 寄到 before it stay unmarked).
     * Tried only where a number follows within 13 characters: a pass over plain text is a
     * look ahead a position, not every split of it into units. */
    { "address",
      "(?=\\p{Han}{2,13}+" CJK_DIGIT ")(?:(?![\\x{6211}\\x{4F60}\\x{4ED6}\\x{5979}\\x{4F4F}\\x{5728}\\x{662F}\\x{7684}\\x{4E86}\\x{5230}\\x{53BB}\\x{6765}\\x{4ECE}"
      "\\x{4E8E}\\x{548C}\\x{4E0E}\\x{53CA}\\x{5BC4}\\x{9001}])\\p{Han}){1,4}?[\\x{533A}\\x{53BF}\\x{5E02}]\\p{Han}{1,8}?(?:\\x{8DEF}|\\x{8857}|\\x{5927}\\x{9053}|\\x{9053}|\\x{5DF7}|"
      "\\x{80E1}\\x{540C}|\\x{5F04})" CJK_DIGIT "{1,5}\\x{53F7}(?:" CJK_DIGIT "{1,4}(?:\\x{53F7}\\x{697C}|"
      "\\x{5BA4}|\\x{5355}\\x{5143}|\\x{680B}|\\x{5C42}))*",
      0, 0.75f, NULL, "\xe5\xe6\xe7\xe9", 0 },
    { "secret", "\\b(?:AKIA|ASIA)[0-9A-Z]{16}\\b", 0, 0.99f, NULL, "A", 1 },
    { "secret", "\\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})\\b", 0, 0.99f, NULL, "_", 1 },
    { "secret", "\\beyJ[A-Za-z0-9_-]{8,}\\.eyJ[A-Za-z0-9_-]{8,}\\.[A-Za-z0-9_-]{8,}", 0, 0.95f, NULL, "e", 1 },
    /* providers' keys by their prefixes, wherever they stand (Stripe, OpenAI, Anthropic, Slack,
     * Discord, Google, GitLab, GitHub, Hugging Face, npm, Twilio, SendGrid) */
    { "secret",
      "(?<![A-Za-z0-9_-])(?:[sr]k_(?:live|test)_[A-Za-z0-9]{10,247}|sk-(?:proj-|ant-|svcacct-|admin-)?[A-Za-z0-9_-]{20,250}|"
      "xox[abposre]-[A-Za-z0-9-]{10,250}|AIza[0-9A-Za-z_-]{35}|glpat-[A-Za-z0-9_-]{20,64}|hf_[A-Za-z0-9]{30,64}|"
      "npm_[A-Za-z0-9]{36}|whsec_[A-Za-z0-9+/=]{20,128}|github_pat_[A-Za-z0-9_]{22,255}|SK[0-9a-fA-F]{32}|"
      "SG\\.[A-Za-z0-9_-]{16,64}\\.[A-Za-z0-9_-]{16,128}|"
      "(?:https?://)?hooks\\.slack\\.com/(?:services|workflows)/[A-Za-z0-9/_-]{20,200}|(?:https?://)?discord(?:app)?\\.com/api/webhooks/[0-9]{5,30}/[A-Za-z0-9_-]{20,200})"
      "(?![A-Za-z0-9_-])",
      0, 0.95f, v_prefixed_key, NULL, 1 },
    /* a credential a header or a tool carries: Authorization / Proxy-Authorization (any
     * scheme), a bare "Bearer X", Cookie / Set-Cookie values, curl -u user:password */
    { "secret",
      "(?i)(?:\\b(?:proxy-)?auth(?:orization)?[ \\t]*[:=][ \\t]*(?:bearer|token|basic|digest|apikey|api-key|key)?[ \\t]*|\\bbearer[ \\t]+)"
      "([A-Za-z0-9._~+/=:-]{8,512})",
      1, 0.9f, v_credential, "|auth|bearer", 1 },
    { "secret", "(?i)\\b(?:set-)?cookie[ \\t]*:[ \\t]*([^\\r\\n]{4,1024})", 1, 0.9f, NULL, "|cookie", 1 },
    { "secret", "(?:^|[ \\t])(?:-u|--user)[ \\t]+[\"']?([^\\s:\"']{1,64}:[^\\s\"']{3,128})", 1, 0.9f, NULL, ":", 1 },
    /* a password on a client's command line, by the flag that client takes (v_client_password
     * checks the client named before it on the line): mysql -pX, mongo -p X, docker login -p X, redis-cli -a X,
     * ldapsearch -w X, sqlcmd -P X, openssl -k X / -pass pass:X, xfreerdp /p:X, any --password X;
     * sshpass -p X and htpasswd -b FILE USER X wherever they stand */
    { "secret",
      "(?|(?<=[ \\t])(-p)([^\\s\"'-][^\\s\"']{2,127})"
      "|(?<=[ \\t])(-[pawkP]|--pass(?:word)?)[ \\t]+([^\\s\"'-][^\\s\"']{2,127})"
      "|(?<=[ \\t])(-pass(?:in|out)?)[ \\t]+pass:([^\\s\"']{3,127})"
      "|(?<=[ \\t])(/p:)([^\\s\"']{3,127})"
      "|\\b(sshpass)[ \\t]+-p[ \\t]*([^\\s\"']{3,128})"
      "|\\b(htpasswd)[ \\t]+-[a-zA-Z]*b[a-zA-Z]*[ \\t]+[^\\s]+[ \\t]+[^\\s]+[ \\t]+([^\\s\"']{3,128}))",
      2, 0.9f, v_client_password,
      "|mysql|mariadb|sshpass|mongo|redis|keydb|ldap|sqlcmd|bcp|osql|isql|openssl|freerdp|rdesktop|htpasswd|--pass|login", 1 },
    /* a .netrc entry: machine HOST login USER password X */
    { "secret", "(?i)\\bmachine\\s+\\S+\\s+login\\s+\\S+\\s+password\\s+([^\\s\"']{3,128})", 1, 0.9f, v_placeholder_not,
      "|machine", 1 },
    /* a Wi-Fi network's key, however the line names it: "WiFi: HomeNet / key X", "WPA2 passphrase X"
     * (the network named earlier on the line: v_wifi_key) */
    { "secret",
      "(?i)\\b(?:key|password|pass|passphrase|psk|schl\\x{00FC}ssel)\\b[ \\t]*(?:is\\b|[:=])?[ \\t]*[\"']?([^\\s\"',;]{4,63})",
      1, 0.9f, v_wifi_key, "|wifi|wi-fi|wlan|wpa|ssid", 1 },
    /* PEM private keys: find_keys below (a lazy [\s\S]*? to the END line
     * rescanned the rest of the message from every BEGIN line: 53 s per MB
     * of headers without an END) */
    { "secret",
      "(?i)\\b(?:pin(?: number| code)?|passcode|door code|access code|security code|otp(?: code)?|one[- ]time (?:code|pin|passcode|password)|"
      "(?:2fa|mfa|verification|authentication|auth|login|sms) code)(?:\\s+(?:is|was))?\\s*[:=]?\\s*(\\d{4,8})\\b", 1,
      0.9f, NULL, "0123456789", 1 },
    { "card", "(?i)\\b(?:cvv2?|cvc2?|csc|cid)[ \\t]*(?:is|code)?[ \\t]*[:#=]?[ \\t]*(\\d{3,4})\\b", 1, 0.9f, NULL, "|cvv|cvc|csc|cid", 1 },
    /* "password X" with no separator, X holding a digit: "username admin, password hunter2x" */
    { "secret",
      "(?i)\\b(?:password|passwd|pwd|passwort|kennwort|wachtwoord|senha|parola|contrase\\x{00F1}a|clave|"
      "\\x{043F}\\x{0430}\\x{0440}\\x{043E}\\x{043B}\\x{044C})[ \\t]+(?=[^\\s\"',;]*\\d)([^\\s\"',;]{6,128})",
      1, 0.9f, v_phrase_secret, "|passw|pwd|kennwort|wachtwoord|senha|parola|contrase|clave|\xd0\xbf\xd0\xb0\xd1\x80|\xd0\x9f\xd0\xb0\xd1\x80", 1 },
    /* key = value, the key a word or an identifier holding one (DB_PASSWORD=, OPENAI_API_KEY:,
     * aws_secret_access_key =) */
    { "secret",
      "(?i)(?<![A-Za-z0-9_.])([-_]{0,2}(?:[A-Za-z0-9]{1,32}[_.-]){0,4}?"
      "(?:[a-z]{1,8}(?=passw|pwd))?" /* a short word joined to a password: PGPASSWORD, rootpassword */
      /* the key words, factored by first letter (a plain alternation was tried whole at every word) */
      "(?:a(?:pi[ _-]?key|pikey|ccess[_-]?(?:token|key)|uth(?:[_-]?token)?|ctivation[ _-]?key)|"
      "s(?:ecret(?:[_-]?(?:access[_-]?)?key)?|ession(?:[_-]?(?:id|key|token))?|enha|erial[ _-]?key|id)|token|"
      "c(?:lient[_-]?secret|redentials?|ontrase\\x{00F1}a)|p(?:rivate[_-]?key|roduct[ _-]?key|hpsessid|ass(?:word|wd|phrase|wort)?|wd?)|"
      "licen[cs]e[ _-]?key|jsessionid|mot[ \\t]+de[ \\t]+passe|"
      "kennwort|wachtwoord|\\x{043F}\\x{0430}\\x{0440}\\x{043E}\\x{043B}\\x{044C})"
      "(?:[_.-][A-Za-z0-9]{1,32}){0,4})"
      "\\b[\"'*]{0,2}[ \\t\\x{00A0}]*(?:[:=\\x{FF1D}]|=>|->|[-\\x{2013}](?=[ \\t\\x{00A0}]))[\\s\\x{00A0}*]*[\"'`]?"
      "([^\\s\"',;`<>()\\[\\]{}*|]{4,256})",
      2, 0.85f, v_keyvalue, "|key|token|secret|pass|pw|auth|credential|sess|senha|contrase|wachtwoord|kennwort|sid=|sid:|sid |"
      "sid\"|sid'|"
      "\xd0\xbf\xd0\xb0\xd1\x80|\xd0\x9f\xd0\x90\xd0\xa0", 1 }, /* the last two: the first letters of "пароль", "ПАРОЛЬ" */
    /* key = value, the key a camelCase identifier ending in a key word (apiSecret, stripeKey,
     * dbPassword, csrfToken): case-sensitive, so apart from the key = value pattern above */
    { "secret",
      "(?<![A-Za-z0-9_.$])([a-z][a-z0-9]{0,23}+(?=[A-Z])(?:[A-Z][a-z0-9]{0,23}+){0,3}?(?:Key|Secret|Token|Password|Passwd|Pwd|Pass|Auth|"
      "Credentials?|SessionId|Sid))\\b[\"']?[ \\t]*(?:[:=]|=>)[ \\t]*[\"'`]?([^\\s\"',;`<>()\\[\\]{}*|]{4,256})",
      2, 0.85f, v_keyvalue, "|key|secret|token|passw|pwd|pass|auth|credential|sess|sid", 1 },
    /* <password>X</password>, | password | X |: markup that names the value */
    { "secret", "(?i)<(?:password|passwd|secret|token|api[_-]?key)>[ \\t]*([^<\\s]{4,256})[ \\t]*</",
      1, 0.9f, NULL, "<", 1 },
    { "secret", "(?i)\\|[ \\t]*(?:password|passwd|pwd|secret|token|api[_ -]?key)[ \\t]*\\|[ \\t]*([^|\\s]{4,256})[ \\t]*\\|",
      1, 0.9f, v_phrase_secret, "|password|passwd|pwd|secret|token|api", 1 },
    /* in prose: "my password is X", "the vault code was X", "passphrase: X" */
    { "secret",
      "(?i)\\b(?:password|passwd|passphrase|pass ?code|pass ?word|pw|pwd|pin(?: number)?|login|maiden name|"
      "security (?:answer|question answer)|(?:vault|safe|alarm|gate|lock|door|entry|garage|access|"
      "security|wi-?fi|recovery|backup|verification|unlock|locker|padlock)[ \\t]+(?:code|key|password|pin|combination)|"
      "combination|(?:secret|code|safe|magic)[ \\t]+word|mot de passe|contrase\\x{00F1}a|passwort|kennwort|wachtwoord|senha|"
      "clave|parola|code secret|secret(?: key)?|api[ _-]?key|sess(?:ion)[ _-]?id|(?:2fa|mfa|totp|otp)[ \\t]+(?:seed|secret|key|code)|"
      "(?:license|licence|product|activation|serial|registration)[ \\t]+key)"
      /* then "is" (or "for the router is" / "for the router:" / "de la oficina es") */
      "(?:[ \\t]+(?:for|of|to|de|del|della|di|do|da|du|des|f\\x{00FC}r|von|van)[ \\t]+[^.!?:\\n]{1,40}?"
      "(?:[ \\t]*:|[\\s\\x{00A0}]+(?:ist|lautet|est|es|is|was|are|\\x{00E8}|\\x{00E9})[\\s\\x{00A0}]*:?)"
      "|[\\s\\x{00A0}]+(?:ist|lautet|est|es|is|was|are|\\x{00E8}|\\x{00E9})[\\s\\x{00A0}]*:?)[\\s\\x{00A0}]*"
      "[\"'\\x{201C}]?([^\\s\"',;\\x{201D}][^.!?\\n\"\\x{201D}]{0,78}[^\\s\"',;.!?:)\\x{201D}]|[^\\s\"',;.!?:)\\x{201D}]{2})",
      1, 0.9f, v_phrase_secret,
      "|pass|pw|pin|login|maiden|security|code|key|combination|contrase|senha|wachtwoord|kennwort|secret|sessionid|ion id|ion_id|ion-id|clave|parola|"
      "safe word|"
      "2fa|mfa|otp|"
      "magic word", 1 },
    /* what recovers an account or a wallet: the rest of the line after the cue */
    { "secret",
      "(?i)\\b(?:(?:seed phrase|recovery (?:phrase|words|seed)|seed words|wallet seed|backup phrase|mnemonic(?: phrase| words)?|"
      "secret phrase|backup codes?|recovery codes?|private key|wallet key)(?:[ \\t]+(?:is|are|was|were)\\b[ \\t]*:?|[ \\t]*[:=])|"
      "seed[ \\t]*[:=](?=[ \\t]*(?:[a-z]{3,8}[ \\t]+){11}[a-z]{3,8}))[\\s\\x{00A0}]*([^\\s][^\\n]{7,300})",
      1, 0.9f, v_phrase_secret, "|phrase|mnemonic|code|key|words|seed", 1 },
    /* a password hash in crypt(3)'s form ($1$, $2b$ bcrypt, $5$, $6$, $y$, $apr1$, $argon2id$, ...):
     * an htpasswd or shadow line's, a config's -- crackable, so as secret as the password */
    { "secret",
      "(?<![\\w$])\\$(?:1|2[abxy]?|5|6|7|y|gy|apr1|argon2(?:id|i|d)|scrypt|pbkdf2(?:-sha(?:1|256|512))?)\\$[A-Za-z0-9./+=,$-]{8,512}+",
      0, 0.95f, NULL, "$", 1 },
    /* a .pgpass line, host:port:database:user:password (v_pgpass: not an IPv6 address) */
    { "secret", "(?<![^\\s])[A-Za-z0-9.*_\\[\\]-]{1,255}+:(?:\\d{1,5}|\\*):[^\\s:]{1,255}+:[^\\s:]{1,255}+:([^\\s:]{4,256}+)(?![^\\s])",
      1, 0.9f, v_pgpass, ":", 1 },
    /* an HTML form's secret field: <input type="password" ... value="X">, <input name="csrf_token" value="X">
     * (value before or after) */
    { "secret",
      "(?i)<input\\b(?|[^>]{0,200}?\\b(?:type[ \\t]*=[ \\t]*[\"']?password\\b|name[ \\t]*=[ \\t]*[\"']?[\\w.-]{0,32}?"
      "(?:pass|pwd|secret|token|key|sess|csrf|auth)[\\w.-]{0,32})[^>]{0,200}?\\bvalue[ \\t]*=[ \\t]*[\"']([^\"'\\s]{4,256})[\"']"
      "|[^>]{0,200}?\\bvalue[ \\t]*=[ \\t]*[\"']([^\"'\\s]{4,256})[\"'][^>]{0,200}?\\b(?:type[ \\t]*=[ \\t]*[\"']?password\\b|"
      "name[ \\t]*=[ \\t]*[\"']?[\\w.-]{0,32}?(?:pass|pwd|secret|token|key|sess|csrf|auth)))",
      1, 0.9f, v_placeholder_not, "|input", 1 },
    /* a Terraform / HCL variable that names a secret, and its default */
    { "secret",
      "(?i)\\bvariable[ \\t]+\"[\\w-]{0,32}?(?:pass|pwd|secret|token|key|credential)[\\w-]{0,32}\"[ \\t]*\\{[^}]{0,256}?"
      "\\bdefault[ \\t]*=[ \\t]*\"([^\"\\n]{4,256})\"",
      1, 0.9f, v_placeholder_not, "|variable", 1 },
    /* a password named in Chinese, Japanese or Korean: 密码是X, パスワードはX, 비밀번호는 X */
    { "secret",
      "(?:\\x{5BC6}\\x{7801}|\\x{5BC6}\\x{78BC}|\\x{53E3}\\x{4EE4}|\\x{30D1}\\x{30B9}\\x{30EF}\\x{30FC}\\x{30C9}|\\x{6697}\\x{8A3C}\\x{756A}\\x{53F7}|"
      "\\x{BE44}\\x{BC00}\\x{BC88}\\x{D638}|\\x{C554}\\x{D638})[ \\t]*(?:\\x{662F}|\\x{4E3A}|\\x{70BA}|\\x{306F}|\\x{B294}|\\x{C740}|[:=\\x{FF1A}])?[ \\t]*"
      "[\"'\\x{300C}\\x{201C}]?([^\\s\\x{FF0C}\\x{3002}\\x{3001},.;\\x{FF1B}!\\x{FF01}?\\x{FF1F}\\x{300D}\\x{201D}\"']{4,128})",
      1, 0.9f, v_placeholder_not, "|\xe5\xaf\x86|\xe5\x8f\xa3\xe4\xbb\xa4|\xe3\x83\x91\xe3\x82\xb9|\xe6\x9a\x97\xe8\xa8\xbc|\xeb\xb9\x84\xeb\xb0\x80|\xec\x95\x94\xed\x98\xb8", 1 },
    /* a security question's answer: what recovers an account */
    { "secret", "(?i)\\bsecurity[ \\t]+question\\b[^\\n]{0,100}?\\banswer[ \\t]*(?:is\\b|[:=-])[ \\t]*([^\\s][^\\n]{1,60})",
      1, 0.9f, v_phrase_secret, "|security", 1 },
    /* an identity document's or an account's number after its name: passport, driving licence,
     * national id / insurance, Aadhaar, DNI, medical record, bank routing and account numbers */
    { "id",
      "(?i)\\b(?:passport|reisepass|pasaporte|passeport|driver'?s?[ \\t]+licen[cs]e|driving[ \\t]+licen[cs]e|"
      "dl(?=[ \\t]*(?:#|no\\b|num|:))|f(?:\\x{00FC}|ue)hrerschein|"
      "national[ \\t]+(?:insurance|id(?:entity)?(?:[ \\t]+card)?)|social[ \\t]+insurance|aadhaa?r|dni|nie|nif|mrn|"
      "medical[ \\t]+record|patient[ \\t]+id|health[ \\t]+(?:card|insurance)|medicare|medicaid|personalausweis|ausweis|vin|"
      "(?:licen[cs]e|number)[ \\t]+plate|plate|routing|account|acct|sort[ \\t]+code|"
      "member(?:ship)?[ \\t]+(?:id|number))(?:[ \\t_]*-?(?:number|nummer|nr\\.?|no\\.?|num|#|id))?(?:[ \\t]+(?:is|was))?"
      "[\"']?[ \\t]*[:#=]?[ \\t]*[\"']?" /* and a JSON or an attribute's quotes: "passport_number":"X", mrn="X" */
      "((?=[A-Z]{0,5}-?[0-9]|(?-i:[A-Z]{1,4})[ ][0-9])[A-Z0-9](?:-?[A-Z0-9]|[ ](?=[0-9])){4,24}(?:[ ][A-Z](?![\\w-]))?)(?![\\w-])",
      1, 0.85f, v_id_number,
      "|passport|reisepass|pasaporte|passeport|licen|national|social|aadha|dni|nie|nif|mrn|medical|patient|health|routing|"
      "account|acct|sort code|member|medicare|medicaid|ausweis|vin |vin:|vin#| plate|dl#|dl:|dl no|hrerschein", 1 },
    /* a wallet address: Bitcoin (bech32 bc1..., or base58 from 1 or 3), Ethereum (0x and 40
     * hex digits); v_crypto checks the Bitcoin checksums, which let it stand in documents too */
    { "crypto", "(?<![A-Za-z0-9])(?:bc1[ac-hj-np-z02-9]{25,87}|[13][a-km-zA-HJ-NP-Z1-9]{25,34}|0x[0-9a-fA-F]{40})(?![A-Za-z0-9])",
      0, 0.85f, v_crypto, "013", 1 },
    /* health: a condition or a drug named, with up to three words before it ("I have HIV",
     * "eleven weeks pregnant") */
    { "health",
      /* factored by first letter: an alternation of whole words would be tried word by word at every letter */
      "(?i)\\b(?:a(?:ids|lzheimer'?s|norexia|utism|dhd|bortion|ddiction|lcohol(?:ism|[ \\t]+(?:dependence|use disorder|abuse))|"
      "nxiety disorder|ntiretrovirals?)|"
      "b(?:ipolar(?:[ \\t]+(?:ii|i|1|2)\\b)?(?: disorder)?|ulimia)|c(?:hlamydia|ancer|hemotherapy)|d(?:iabet(?:es|ic)|epression|ementia)|"
      "epilepsy|fluoxetine|gonorrho?ea|h(?:iv(?:[ \\t-]positive)?|epatitis [bc]|erpes|pv)|in(?:fertility|sulin)|l(?:euka?emia|ymphoma|ithium|exapro)|"
      "m(?:ultiple sclerosis|iscarriage|ethadone)|o(?:cd|verdose)|p(?:tsd|arkinson'?s|regnan(?:t|cy)|rozac|rep)|"
      "s(?:yphilis|chizophrenia|uicidal|elf-harm|ertraline|uboxone)|t(?:umou?r|ruvada)|zoloft)\\b",
      0, 0.8f, v_health_words, NULL, 0 },
    /* and what follows a diagnosis cue, up to four words (not a leading article or pronoun, not
     * a trailing time or clause word) */
    { "health",
      "(?i)\\b(?:diagnosed with|diagnosis(?: of|:)|tested positive for|suffer(?:s|ed|ing)? from|being treated for|treated for|"
      "(?:on|taking) medication for|prescribed|living with)[ \\t]+"
      "((?!(?:my|his|her|their|our|your|a|an|the|some|it|them|him|me|us|that|this)\\b)[\\p{L}\\d'-]+"
      "(?:[ \\t]+(?!(?:last|this|in|on|at|when|after|before|and|but|so|since|yesterday|today|recently|a|an|the|for|by|"
      "because|while|until|which|that|who|was|is|and)\\b)[\\p{L}\\d'-]+){0,3})",
      1, 0.8f, NULL, "|diagnos|positive|suffer|treated|medication|prescribed|living with", 0 },
    /* a token no one writes by hand (v_random_token): a key or a signature whatever names it,
     * or nothing does ("aws secret wJalr...", "AZURE_STORAGE_KEY=q7L2...==") */
    { "secret", "(?<![A-Za-z0-9+/_.-])[A-Za-z0-9+/_-]{16,}+={0,2}(?![A-Za-z0-9+/=_-])", 0, 0.8f, v_random_token, "0123456789", 0 },
    /* a MAC address: six hex pairs split by ':' or '-' (the same), three dotted quads of hex, or twelve bare hex digits */
    { "id",
      "(?<![0-9A-Fa-f:.-])(?:[0-9A-Fa-f]{2}([:-])[0-9A-Fa-f]{2}(?:\\1[0-9A-Fa-f]{2}){4}|[0-9A-Fa-f]{4}\\.[0-9A-Fa-f]{4}\\.[0-9A-Fa-f]{4}|"
      "[0-9A-Fa-f]{12})(?![0-9A-Fa-f:-]|\\.[0-9A-Fa-f])",
      /* the network words v_mac looks for: a dotted or bare one is in a message without ':' or '-' */
      0, 0.85f, v_mac, "|mac|ether|hw|bssid|addr|device|wifi|wi-fi|wlan|eth|lan|router|nic|adapter|interface|port|switch|laptop|phone", 0 },
    /* an e-mail address written so machines miss it (v_obfuscated_email) */
    { "email",
      "(?i)(?<![\\w.+-])([a-z0-9][a-z0-9._%+-]{0,63}+(?:[ \\t]+(?:dot|underscore|dash|hyphen)[ \\t]+[a-z0-9][a-z0-9_%+-]{0,63}+){0,3})"
      "(?:[ \\t]*(?:\\[at\\]|\\(at\\)|\\{at\\}|<at>)[ \\t]*|[ \\t]+at[ \\t]+)"
      "([a-z0-9][a-z0-9-]{0,62}+(?:[ \\t]*(?:\\[dot\\]|\\(dot\\)|\\{dot\\}|<dot>)[ \\t]*[a-z0-9][a-z0-9-]{0,62}+|"
      "[ \\t]+dot[ \\t]+[a-z0-9][a-z0-9-]{0,62}+|\\.[a-z0-9][a-z0-9-]{0,62}+){1,4})(?![\\w-]|\\.\\w)"
      /* a "domain" another " at " follows is the name ("me at m dot okafor at hey dot com") */
      "(?![ \\t]+at[ \\t])",
      /* cues: a bracketed at, a spelt dot, a mail provider or a domain's ending (" at " alone is in every text) */
      0, 0.9f, v_obfuscated_email,
      "|[at]|(at)|{at}|<at>|dot|gmail|googlemail|yahoo|hotmail|outlook|proton|icloud|gmx|aol|yandex|zoho|fastmail|"
      ".com|.org|.net|.edu|.gov|.co.|.io|.de|.fr|.pl|.uk|.nl|.es|.it|.ru|.jp|.cn|.br|.au|.ca|.ch|.in", 0 },
    /* money a person earns, owns or owes: an amount with its currency, after a cue in its
     * sentence (v_money, which looks back from the amount: a pattern that started at the cue and
     * skipped ahead to an amount tried each cue's whole reach) */
    { "money",
      /* every branch opens with a currency sign or a digit (a currency code before the number is
       * looked behind for): a branch opening with a letter was tried at every word */
      "(?i)(?<![\\w$\\x{20AC}\\x{00A3}\\x{00A5}\\x{20B9}.,])(?:(?:[$\\x{20AC}\\x{00A3}\\x{00A5}\\x{20B9}]|(?<=\\b(?:usd|eur|gbp|chf|inr|jpy|cad|aud)[ \\t]))"
      "[ \\t]?\\d{1,3}(?:[,.' ]?\\d{3})*+(?:[.,]\\d{1,2})?(?:[ \\t]?[km]\\b)?|"
      "\\d{1,3}(?:[,.' ]?\\d{3})*+(?:[.,]\\d{1,2})?(?:[ \\t]?[km])?[ \\t]?(?:[$\\x{20AC}\\x{00A3}\\x{00A5}\\x{20B9}]|(?:dollars?|euros?|pounds?|usd|eur|gbp)\\b)|"
      /* thousands with no currency, by the year or month: "I earn 87k a year" */
      "\\d{1,3}(?:[.,]\\d)?k(?=[ \\t]+(?:a|per)[ \\t]+(?:year|yr|month)\\b|[ \\t]*/[ \\t]*(?:yr|year|mo|month)\\b))",
      0, 0.8f, v_money,
      "|salar|wage|income| earn|earns|earned|earning|bonus|worth|balance|saving|debt| owe|owes|owed|mortgage|gehalt|kontostand|"
      "einkommen|salaire|saldo|sueldo|stipendio| make| made|gross|net pay|take-home|take home", 0 },
    /* a date of birth in Chinese, Japanese or Korean: 1990年7月14日生まれ, 生年月日：1990年7月14日 */
    { "dob",
      "(?|(?:\\x{751F}\\x{5E74}\\x{6708}\\x{65E5}|\\x{51FA}\\x{751F}\\x{65E5}\\x{671F}|\\x{C0DD}\\x{B144}\\x{C6D4}\\x{C77C})[:\\x{FF1A}\\s]*"
      "(\\d{4}\\x{5E74}\\d{1,2}\\x{6708}\\d{1,2}\\x{65E5})|(\\d{4}\\x{5E74}\\d{1,2}\\x{6708}\\d{1,2}\\x{65E5})\\s*(?:\\x{751F}\\x{307E}\\x{308C}|"
      "\\x{306B}\\x{751F}\\x{307E}\\x{308C}|\\x{51FA}\\x{751F}))",
      1, 0.85f, NULL, "|\xe5\xb9\xb4", 0 },
    /* a bank's SWIFT / BIC code after its name */
    { "id", "(?i:\\b(?:swift|bic)(?:[ \\t/-]*(?:code|bic|no\\.?|number)[ \\t]*[:#=-]?|[ \\t]*[:#=]))[ \\t]*\\b([A-Z]{6}[A-Z0-9]{2}(?:[A-Z0-9]{3})?)\\b",
      1, 0.85f, NULL, "|swift|bic", 0 },
    /* a card's security code in words ("the security code on the back is 482": CVV / CVC above)
     * and its expiry, after their names */
    { "card",
      "(?i)\\b(?|(?:security[ \\t]+code|card[ \\t]+verification(?:[ \\t]+(?:value|code))?)\\b[^\\d\\n]{0,24}?(\\d{3,4})|"
      "(?:exp(?:iry|iration|ires)?(?:[ \\t]+date)?|valid[ \\t]+(?:thru|through|until))\\b[ \\t:.-]*((?:0[1-9]|1[0-2])[ \\t]*[/-][ \\t]*(?:20)?\\d{2}))\\b",
      1, 0.85f, v_card_detail, "|security code|verification|expir|exp |exp:|exp.|valid thru|valid through|valid until", 0 },
    /* a postcode after its name: a UK one, or a US ZIP */
    { "address",
      "(?i:\\b(?:post[ \\t]?code|postal[ \\t]+code|zip(?:[ \\t]?code)?)\\b(?:[ \\t]+(?:is|was))?[ \\t]*[:#-]?[ \\t]*)"
      "([A-Z]{1,2}\\d[A-Z\\d]?[ \\t]?\\d[A-Z]{2}|\\d{5}(?:-\\d{4})?)\\b",
      1, 0.8f, NULL, "|post|zip", 0 },
    /* a national or bank identifier by its shape, its checksum where it has one and its name
     * before it on the line (v_national_id, which tells them apart by the group that matched):
     * a UK National Insurance number, an Aadhaar number, an Indian PAN, a Dutch BSN or a US ABA
     * routing number (nine digits), an Italian codice fiscale, a Spanish NIE or DNI, a French
     * NIR with its key, a VIN */
    { "id",
      "(?i)(?<![\\w-])(?:([a-ceghj-pr-tw-z][a-ceghj-npr-tw-z] ?\\d{2} ?\\d{2} ?\\d{2} ?[a-d])|([2-9]\\d{3}([ -]?)\\d{4}\\3\\d{4})|"
      "([a-z]{3}[abcfghljpt][a-z]\\d{4}[a-z])|(\\d{9})|([a-z]{6}\\d{2}[abcdehlmprst]\\d{2}[a-z]\\d{3}[a-z])|"
      "([xyz]-?\\d{7}-?[a-z]|\\d{8}-?[a-z])|([12] ?\\d{2} ?\\d{2} ?(?:\\d{2}|2[ab]) ?\\d{3} ?\\d{3} ?\\d{2})|([a-hj-npr-z0-9]{17}))(?![\\w-])",
      0, 0.9f, v_national_id,
      "|national insurance|nino|ni no|ni number|ni #|ni#|aadha|uid|pan|permanent account|bsn|burgerservice|sofi|aba|routing|rtn|"
      "transit|codice|cf|c.f|fiscal code|tax code|nie|dni|nif|n.i.e|extranjero|identidad|s\xc3\xa9" "cu|secu|nir|insee|vitale|"
      "social security|vin|vehicle|chassis|fahrgestell", 1 },
    /* a vehicle's plate after its name: Kennzeichen M-XY 4821, reg plate LK19 ZTP,
     * immatriculation AB-482-CD (capitals, so a lowercase word after the name is prose) */
    { "id",
      "(?i:\\b(?:kennzeichen|nummernschild|immatriculation|plaque(?:[ \\t]+d'immatriculation)?|matr(?:\\x{00ED}|i)cula|targa|"
      "(?:licen[cs]e|number|reg(?:istration)?|car|vehicle|rego)[ \\t]+plate(?:[ \\t]+(?:number|no\\.?))?|plate[ \\t]+(?:number|no\\.?|#)|"
      "reg(?:istration)?[ \\t]+(?:number|no\\.?|mark))(?:[ \\t]+(?:is|was|ist|est|es))?[ \\t]*[:#=]?[ \\t]*)"
      "([A-Z0-9]{1,4}(?:[ -][A-Z0-9]{1,4}){0,3})(?![\\w-])",
      1, 0.85f, v_plate, "|kennzeichen|nummernschild|immatricul|plaque|matr|targa|plate|reg", 0 },
    /* a recovery phrase written as a numbered list: 1. orbit 2. siren ... 12. harvest */
    { "secret", "(?<![\\w.])1[.)][ \\t]*[a-z]{3,8}+(?:\\s+(?:1\\d|2[0-4]|[2-9])[.)][ \\t]*[a-z]{3,8}+){11,23}(?!\\w)", 0, 0.9f,
      v_seed_list, "|1.|1)", 1 },
    /* a password set in words, no password named: "so I set it to Velvet$Orca88" (v_set_password) */
    { "secret",
      "(?i:\\b(?:set|changed|change|reset|updated|update)[ \\t]+(?:it|mine|(?:my|the)[ \\t]+pass(?:word|code)?)(?:[ \\t]+back)?[ \\t]+to)"
      "[ \\t]+[\"']?([^\\s\"',;()<>\\[\\]{}/\\\\:=.]{8,64}+)(?![^\\s\"',;()<>\\[\\]{}/\\\\:=.])",
      1, 0.85f, v_set_password, "|set|chang|updat", 1 },
    /* a place by its coordinates: 47.6205, -122.3493 (v_coordinates) or 35°41'22.2"N 139°41'30.1"E */
    { "location",
      "(?<![\\w.,-])(?:(-?\\d{1,2}\\.\\d{4,8}),[ \\t]?(-?\\d{1,3}\\.\\d{4,8})(?![\\w.]|,[ \\t]?-?\\d)|"
      "\\d{1,2}\\x{00B0}[ \\t]?\\d{1,2}['\\x{2032}][ \\t]?\\d{1,2}(?:\\.\\d{1,4})?(?:\"|\\x{2033}|'')[ \\t]?[NS][, \\t]*"
      "\\d{1,3}\\x{00B0}[ \\t]?\\d{1,2}['\\x{2032}][ \\t]?\\d{1,2}(?:\\.\\d{1,4})?(?:\"|\\x{2033}|'')[ \\t]?[EW](?!\\w))",
      0, 0.85f, v_coordinates, ".\xc2", 0 },
    { "person",
      "(?:(?i:\\bmy name is|\\bname is|\\bname:)|\\b(?:Mr|Mrs|Ms|Dr|Prof)\\.?|\\bMiss|\\b(?i:patient)|\\bDear)[ \\t]+" NAME, 1,
      0.75f, v_person, NULL, 0 },
};

#define N_REC (sizeof recognizers / sizeof recognizers[0])

typedef struct builtin {
    cp_regex re[N_REC];
    cp_regex_matcher m;
    int counted; /* compiled with auto-callouts: every step counted and budgeted */
    cp_cue_set cues; /* the recognizers' cue words, each owned by its recognizers' bits */
} builtin;

_Static_assert(N_REC <= 64, "a recognizer's cue words name it by one bit of a 64-bit mask");

static void builtin_destroy(cp_detector *d)
{
    builtin *b = d->impl;
    for (size_t i = 0; i < N_REC; i++) cp_regex_free(&b->re[i]);
    cp_regex_matcher_free(&b->m);
    free(b);
    free(d);
}

/* the end of a "-----KIND [A-Z0-9]+ ...PRIVATE KEY-----" line starting at
 * t[i], or 0 if none starts there; *steps counts the bytes read.  A word
 * cannot contain '-', so a failed check never reads past the next marker. */
static size_t key_marker(const char *t, size_t len, size_t i, const char *kind, uint64_t *steps)
{
    static const char tail[] = "PRIVATE KEY-----", pgp_tail[] = "PRIVATE KEY BLOCK-----";
    size_t k = strlen(kind), j = i + k;
    if (len - i < k || memcmp(t + i, kind, k) != 0) return 0;
    for (;;) {
        if (len - j >= sizeof tail - 1 && memcmp(t + j, tail, sizeof tail - 1) == 0) return j + sizeof tail - 1;
        if (len - j >= sizeof pgp_tail - 1 && memcmp(t + j, pgp_tail, sizeof pgp_tail - 1) == 0) return j + sizeof pgp_tail - 1;
        size_t w = j;
        while (w < len && ((t[w] >= 'A' && t[w] <= 'Z') || (t[w] >= '0' && t[w] <= '9'))) w++;
        *steps += w - j + 1;
        if (w == j || w >= len || t[w] != ' ') return 0;
        j = w + 1;
    }
}

/* the next marker line of `kind` at or after `from`: [*ms, return) or 0 */
static size_t next_marker(const char *t, size_t len, size_t from, const char *kind, size_t *ms, uint64_t *steps)
{
    while (from < len) {
        const char *p = memchr(t + from, '-', len - from);
        if (!p) break;
        size_t i = (size_t)(p - t), e = key_marker(t, len, i, kind, steps);
        *steps += i - from + 1;
        if (e) {
            *ms = i;
            return e;
        }
        from = i + 1;
    }
    *steps += 1;
    return 0;
}

/* PEM private keys, BEGIN line to END line, in one pass: each key's END
 * line is searched from its BEGIN line and the next key after that END
 * line, so no byte is read twice.  A key without its END line (cut off, or
 * pasted in part) is still a key: the span runs to the end of the message. */
static cp_status find_keys(const char *t, size_t len, cp_spans *out, cp_error *err)
{
    size_t from = 0, hs, fs;
    while (from < len) {
        size_t he = next_marker(t, len, from, "-----BEGIN ", &hs, &out->steps);
        if (!he) break;
        size_t fe = next_marker(t, len, he, "-----END ", &fs, &out->steps), end = fe ? fe : len;
        cp_status rc = cp_spans_add(out, (uint32_t)hs, (uint32_t)end, "secret", 0.99f, err);
        if (rc) return rc;
        from = end;
    }
    return CP_OK;
}

/* whether s holds word w (w lowercase; s's ASCII letters in any case): its
 * first letter found by memchr in either case, the rest compared */
static int has_word_from(const char *s, size_t n, const char *w, size_t wl, int first)
{
    for (const char *p = s, *end = s + n; (size_t)(end - p) >= wl && (p = memchr(p, first, (size_t)(end - p) - wl + 1)); p++) {
        size_t k = 1;
        while (k < wl && tolower((unsigned char)p[k]) == (unsigned char)w[k]) k++;
        if (k == wl) return 1;
    }
    return 0;
}

static int has_word(const char *s, size_t n, const char *w, size_t wl)
{
    if (wl == 0 || wl > n) return 0;
    const int lo = (unsigned char)w[0], up = toupper(lo);
    return has_word_from(s, n, w, wl, lo) || (up != lo && has_word_from(s, n, w, wl, up));
}

static int has_any(const char *s, size_t n, const char *needles)
{
    if (!needles) return 1;
    if (needles[0] == '|') {
        for (const char *w = needles + 1; *w;) {
            const char *e = strchr(w, '|');
            size_t wl = e ? (size_t)(e - w) : strlen(w);
            if (has_word(s, n, w, wl)) return 1;
            w += wl + (e != NULL);
        }
        return 0;
    }
    for (const char *p = needles; *p; p++)
        if (memchr(s, *p, n)) return 1;
    return 0;
}

/* one recognizer's matches over the message */
static cp_status run_recognizer(builtin *b, size_t r, const char *text, size_t len, int shared, cp_spans *out, cp_error *err)
{
    const recognizer *rec = &recognizers[r];
    size_t from = 0, ws, we, ms, me;
    int found;
    /* total over the recognizer's matches in this message: each is linear
     * by design, and if one is not on some input, that input fails closed */
    cp_step_budget budget = cp_step_budget_for(len);
    while (from <= len) {
        cp_status rc = b->counted ? cp_regex_find_counted(&b->re[r], &b->m, &budget, text, len, from, 0, &found, err)
                                  : cp_regex_find(&b->re[r], &b->m, text, len, from, 0, &found, err);
        if (rc) {
            out->steps += budget.limit - budget.left;
            return cp_fail_wrap(err, "recognizer %s", rec->type);
        }
        if (!found) break;
        cp_regex_group(&b->m, 0, &ws, &we);
        if (cp_regex_group(&b->m, rec->group, &ms, &me) && me > ms) {
            size_t start = ms, end = me;
            ctx c = { text, len, ms, me, text + ms, me - ms, ws, &b->m, &start, &end, shared };
            float score = rec->check ? rec->check(&c) : rec->score;
            ms = start, me = end;
            if (me > we) we = me; /* resume after a span a validator grew */
            if (score > 0 && (rc = cp_spans_add(out, (uint32_t)ms, (uint32_t)me, rec->type, score, err))) return rc;
        }
        /* resume after this match (or one character on, if empty) */
        from = we > ws ? we : ws + 1;
        while (from < len && cp_utf8_continues((unsigned char)text[from])) from++;
    }
    out->steps += budget.limit - budget.left;
    return CP_OK;
}

static cp_status builtin_scan(builtin *b, const char *text, size_t len, int secrets_only, cp_spans *out, cp_error *err)
{
    const uint64_t cued = cp_cue_set_scan(&b->cues, text, len); /* the recognizers whose cue words the message holds */
    out->steps += len;
    cp_status rc = CP_OK;
    for (size_t r = 0; r < N_REC && rc == CP_OK; r++) {
        const recognizer *rec = &recognizers[r];
        if (secrets_only && !rec->on_public) continue;
        const char *nd = rec->needle;
        if (nd && nd[0] == '|' ? !(cued >> r & 1) : nd && !has_any(text, len, nd)) continue;
        rc = run_recognizer(b, r, text, len, secrets_only, out, err);
    }
    if (rc == CP_OK && memchr(text, '-', len)) rc = find_keys(text, len, out, err);
    if (rc == CP_OK) rc = cp_find_table_secrets(text, len, placeholder_or_code, out, err); /* a table's secret column */
    if (rc == CP_OK && !secrets_only) rc = cp_find_spelt_numbers(text, len, out, err); /* five five five, one two three ... */
    return rc;
}

static cp_status builtin_detect(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    (void)role;
    return builtin_scan(d->impl, text, len, 0, out, err);
}

static cp_status builtin_detect_secrets(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    (void)role;
    return builtin_scan(d->impl, text, len, 1, out, err);
}

static cp_status make_builtin(int counted, cp_detector **out, cp_error *err)
{
    *out = NULL;
    cp_detector *d = cp_calloc(1, sizeof *d, "detector", err);
    builtin *b = d ? cp_calloc(1, sizeof *b, "detector", err) : NULL;
    if (!b) {
        free(d);
        return CP_ENOMEM;
    }
    d->name = "builtin";
    d->detect = builtin_detect;
    d->detect_secrets = builtin_detect_secrets;
    d->destroy = builtin_destroy;
    d->impl = b;
    b->counted = counted;
    cp_cue_set_init(&b->cues);
    cp_status rc = cp_regex_matcher_init(&b->m, 12, err); /* v_national_id reads group 9 */
    for (size_t i = 0; i < N_REC && rc == CP_OK; i++) { /* the '|'-separated cue words, each for its recognizer's bit */
        const char *w = recognizers[i].needle;
        if (!w || w[0] != '|') continue;
        for (w++; *w && rc == CP_OK;) {
            const char *e = strchr(w, '|');
            size_t wl = e ? (size_t)(e - w) : strlen(w);
            rc = cp_cue_set_add(&b->cues, w, wl, (uint64_t)1 << i, err);
            w += wl + (e != NULL);
        }
    }
    for (size_t i = 0; i < N_REC && rc == CP_OK; i++) {
        char where[64];
        snprintf(where, sizeof where, "built-in recognizer %s", recognizers[i].type);
        const char *pat = recognizers[i].pattern;
        rc = counted ? cp_regex_compile_counted(&b->re[i], pat, strlen(pat), where, err)
                     : cp_regex_compile(&b->re[i], pat, strlen(pat), 0, where, err);
    }
    if (rc) {
        builtin_destroy(d);
        return rc;
    }
    *out = d;
    return CP_OK;
}

cp_status cp_detector_builtin(cp_detector **out, cp_error *err) { return make_builtin(0, out, err); }

cp_status cp_detector_builtin_counted(cp_detector **out, cp_error *err) { return make_builtin(1, out, err); }
