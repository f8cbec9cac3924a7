/* The detector chain, span bookkeeping, the token mask, inline markers. */
#include "detect.h"

#include <openssl/crypto.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/log.h"
#include "../../tokenizer/utf8.h"

cp_status cp_spans_add(cp_spans *s, uint32_t start, uint32_t end, const char *type, float score, cp_error *err)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        cp_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return cp_fail(err, CP_ENOMEM, "detector: out of memory for %zu spans", cap);
        s->v = v;
        s->cap = cap;
    }
    cp_span *x = &s->v[s->n++];
    x->start = start;
    x->end = end;
    snprintf(x->type, sizeof x->type, "%s", type);
    x->score = score;
    return CP_OK;
}

void cp_spans_free(cp_spans *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int by_start(const void *a, const void *b)
{
    const cp_span *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->end != y->end) return x->end > y->end ? -1 : 1;
    return x->score > y->score ? -1 : x->score < y->score;
}

void cp_spans_resolve(cp_spans *s)
{
    if (s->n < 2) return;
    qsort(s->v, s->n, sizeof *s->v, by_start);
    /* In this order (start up, end down, score down) every span that could
     * hold span i comes before it: i lies inside an earlier span exactly
     * when the furthest end seen so far reaches end_i (of two equal ranges,
     * the first, higher-scored, stands).  One pass: with the free-text
     * recognizer a long message has thousands of spans. */
    size_t k = 1;
    uint32_t reach = s->v[0].end;
    for (size_t i = 1; i < s->n; i++) {
        if (reach >= s->v[i].end) continue; /* inside an earlier span */
        reach = s->v[i].end;
        s->v[k++] = s->v[i];
    }
    s->n = k;
}

void cp_chain_init(cp_detect_chain *c)
{
    memset(c, 0, sizeof *c);
    /* system prompts and documents are shared text, but a key or a card
     * number in one is as private as in a user turn; a system prompt may
     * also carry a user's profile (an e-mail, a diagnosis), while a
     * document's contact lines and figures are public */
    c->policy[CP_ROLE_SYSTEM] = CP_POLICY_FORMATS;
    c->policy[CP_ROLE_USER] = CP_POLICY_SCAN;
    c->policy[CP_ROLE_ASSISTANT] = CP_POLICY_SCAN;
    c->policy[CP_ROLE_DOCUMENT] = CP_POLICY_SECRETS;
}

cp_status cp_chain_add(cp_detect_chain *c, cp_detector *d, cp_error *err)
{
    if (c->n == (int)(sizeof c->d / sizeof c->d[0])) {
        d->destroy(d);
        return cp_fail(err, CP_ERANGE, "detector chain: more than %zu detectors", sizeof c->d / sizeof c->d[0]);
    }
    c->d[c->n++] = d;
    return CP_OK;
}

void cp_chain_free(cp_detect_chain *c)
{
    for (int i = 0; i < c->n; i++) c->d[i]->destroy(c->d[i]);
    c->n = 0;
}

cp_status cp_chain_set_policy(cp_detect_chain *c, const char *spec, cp_error *err)
{
    const char *p = spec;
    while (*p) {
        const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        char role[32], val[32];
        if (!eq || eq - p >= (long)sizeof role || end - eq - 1 >= (long)sizeof val)
            return cp_fail(err, CP_EINVAL, "policy: expected role=scan|formats|secrets|public|sensitive, got '%.*s'", (int)(end - p), p);
        memcpy(role, p, (size_t)(eq - p));
        role[eq - p] = 0;
        memcpy(val, eq + 1, (size_t)(end - eq - 1));
        val[end - eq - 1] = 0;
        cp_role r;
        cp_status rc = cp_role_from_name(role, &r, err);
        if (rc) return cp_fail_wrap(err, "policy");
        if (strcmp(val, "scan") == 0) c->policy[r] = CP_POLICY_SCAN;
        else if (strcmp(val, "secrets") == 0) c->policy[r] = CP_POLICY_SECRETS;
        else if (strcmp(val, "formats") == 0) c->policy[r] = CP_POLICY_FORMATS;
        else if (strcmp(val, "public") == 0) c->policy[r] = CP_POLICY_PUBLIC;
        else if (strcmp(val, "sensitive") == 0) c->policy[r] = CP_POLICY_SENSITIVE;
        else return cp_fail(err, CP_EINVAL, "policy: '%s' for role %s is not scan, formats, secrets, public or sensitive", val, role);
        p = comma ? comma + 1 : end;
    }
    return CP_OK;
}

/* The detectors a policy runs, on one valid UTF-8 text, failing closed. */
/* text with the bytes blank[] marks as spaces (malloc'd), for a detector
 * that works elsewhere; NULL: out of memory */
static char *blanked(const char *text, size_t len, const uint8_t *blank)
{
    char *b = malloc(len ? len : 1);
    if (b)
        for (size_t k = 0; k < len; k++) b[k] = blank[k] ? ' ' : text[k];
    return b;
}

/* blank (NULL: none): per byte of text, whether the client marked it
 * sensitive -- a detector that works elsewhere (a plugin's process, which
 * keeps what it is sent) gets those bytes as spaces; the ones in this
 * process see the text whole (a card half marked is still a card to them) */
static cp_status detect_into(cp_detect_chain *c, const char *text, size_t len, cp_role role, cp_role_policy pol,
                             const uint8_t *blank, cp_spans *out, cp_error *err)
{
    char *away = NULL; /* the blanked copy, made for the first detector that works elsewhere */
    cp_status result = CP_OK;
    for (int i = 0; i < c->n && result == CP_OK; i++) {
        cp_status (*detect)(cp_detector *, const char *, size_t, cp_role, cp_spans *, cp_error *) =
            pol == CP_POLICY_SECRETS                       ? c->d[i]->detect_secrets
            : pol == CP_POLICY_FORMATS && c->d[i]->free_text ? NULL
                                                             : c->d[i]->detect;
        if (!detect) continue;
        size_t before = out->n;
        cp_error derr = { 0 };
        const char *seen = text;
        if (blank && c->d[i]->elsewhere) {
            if (!away && !(away = blanked(text, len, blank))) {
                result = cp_fail(err, CP_ENOMEM, "detector: out of memory for a %zu-byte message's blanked copy", len);
                break;
            }
            seen = away;
        }
        cp_status rc = detect(c->d[i], seen, len, role, out, &derr);
        if (rc == CP_ENOMEM) {
            result = cp_fail(err, rc, "%s", derr.msg);
            break;
        }
        int bad = rc != CP_OK;
        for (size_t k = before; k < out->n && !bad; k++) bad = out->v[k].start > out->v[k].end || out->v[k].end > len;
        if (bad) {
            /* fail closed; the log names the detector and reason, not the text */
            out->n = before;
            out->wholly = 1;
            c->failures++;
            cp_warn("detector '%s' failed (%s): message of %zu bytes treated as wholly sensitive", c->d[i]->name,
                    rc != CP_OK ? derr.msg : "span out of range", len);
        }
    }
    if (away) OPENSSL_cleanse(away, len);
    free(away);
    return result;
}

/* What the detectors see in place of the character at t[i]: returns the
 * bytes it takes (0: the character is seen as it is) and sets *to the one
 * ASCII byte it is seen as, or -1 for none.
 * - Spaces of other widths are a space, hyphens, dashes and the minus sign
 *   a hyphen: a card grouped with no-break, narrow or thin spaces or en
 *   dashes ("4111\u00a01111...", what a word processor or a locale's
 *   number format pastes) was no card to the recognizers.
 * - Invisible format characters are taken out: the soft hyphen, the
 *   Mongolian vowel separator, zero-width space, non-joiner and joiner,
 *   the direction marks, embeddings and isolates, the word joiner and
 *   invisible operators, the byte-order mark.  Text pasted from a web page
 *   or a chat carries them, and one inside a key word
 *   ("pass\u200bword: X") hides the secret from every recognizer.
 * - Fullwidth forms (U+FF01-U+FF5E, what a CJK input method types) are
 *   their ASCII letters and signs, the ideographic space a space:
 *   "ｐａｓｓｗｏｒｄ：X" is "password:X". */
static inline size_t folded_at(const unsigned char *t, size_t len, size_t i, int *to)
{
    *to = -1;
    if (t[i] == 0xC2) {
        if (i + 1 >= len) return 0;
        if (t[i + 1] == 0xA0) return *to = ' ', 2; /* U+00A0 no-break space */
        return t[i + 1] == 0xAD ? 2 : 0;
    }
    if (i + 2 >= len) return 0;
    const unsigned a = t[i], b = t[i + 1], c = t[i + 2];
    if (a == 0xE2 && b == 0x80) {
        if (c <= 0x8A || c == 0xAF) return *to = ' ', 3;          /* U+2000-U+200A, U+202F: spaces of a width */
        if (c >= 0x90 && c <= 0x95) return *to = '-', 3;          /* U+2010-U+2015: hyphens and dashes */
        return (c >= 0x8B && c <= 0x8F) || (c >= 0xAA && c <= 0xAE) ? 3 : 0;
    }
    if (a == 0xE2 && b == 0x81 && c == 0x9F) return *to = ' ', 3; /* U+205F medium mathematical space */
    if (a == 0xE2 && b == 0x88 && c == 0x92) return *to = '-', 3; /* U+2212 minus sign */
    if (a == 0xE2 && b == 0x81) return (c >= 0xA0 && c <= 0xA4) || (c >= 0xA6 && c <= 0xA9) ? 3 : 0;
    if (a == 0xEF && b == 0xBC && c >= 0x81) return *to = 0x20 + (int)(c & 0x3F), 3; /* U+FF01-U+FF3F */
    if (a == 0xEF && b == 0xBD && c <= 0x9E) return *to = 0x60 + (int)(c & 0x3F), 3; /* U+FF40-U+FF5E */
    if (a == 0xE3 && b == 0x80 && c == 0x80) return *to = ' ', 3;                    /* U+3000 */
    return (a == 0xEF && b == 0xBB && c == 0xBF) || (a == 0xE1 && b == 0xA0 && c == 0x8E) ? 3 : 0;
}

/* The detectors on the text as folded_at has them see it (its first
 * folded character at byte `first`), each span mapped back to the
 * message's bytes: from the character its first byte came from to the end
 * of the one its last byte came from, so the invisible ones inside it are
 * covered too.  The copy held the message: wiped. */
static cp_status detect_folded(cp_detect_chain *c, const char *text, size_t len, size_t first, cp_role role, cp_role_policy pol,
                               const uint8_t *blank, cp_spans *out, cp_error *err)
{
    char *f = malloc(len ? len : 1);
    uint32_t *at = malloc((len + 1) * sizeof *at), *past = malloc((len + 1) * sizeof *past);
    if (!f || !at || !past) {
        free(f), free(at), free(past);
        return cp_fail(err, CP_ENOMEM, "detector: out of memory for a %zu-byte message's folded copy", len);
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        int to = -1;
        size_t k = i >= first ? folded_at((const unsigned char *)text, len, i, &to) : 0;
        if (k) {
            if (to >= 0) at[n] = (uint32_t)i, past[n] = (uint32_t)(i + k), f[n++] = (char)to;
            i += k;
            continue;
        }
        at[n] = (uint32_t)i, past[n] = (uint32_t)(i + 1);
        f[n++] = text[i++];
    }
    at[n] = (uint32_t)len;
    size_t before = out->n;
    uint8_t *fblank = blank ? malloc(n ? n : 1) : NULL; /* blank[] in the folded text's coordinates */
    for (size_t k = 0; fblank && k < n; k++) fblank[k] = blank[at[k]];
    cp_status rc = blank && !fblank ? cp_fail(err, CP_ENOMEM, "detector: out of memory for a %zu-byte message's marks", len)
                                    : detect_into(c, f, n, role, pol, fblank, out, err);
    free(fblank);
    for (size_t k = before; k < out->n; k++) {
        cp_span *s = &out->v[k];
        uint32_t a = at[s->start], b = s->end > s->start ? past[s->end - 1] : a;
        s->start = a, s->end = b;
    }
    OPENSSL_cleanse(f, n);
    free(f), free(at), free(past);
    return rc;
}

static cp_status run_detectors(cp_detect_chain *c, const char *text, size_t len, cp_role role, cp_role_policy pol,
                               const uint8_t *blank, cp_spans *out, cp_error *err)
{
    /* detectors match with UTF checks off: invalid text fails closed here */
    size_t bad = cp_utf8_validate(text, len);
    if (bad < len) {
        out->wholly = 1;
        c->failures++;
        cp_warn("message of %zu bytes is not valid UTF-8 (byte %zu): treated as wholly sensitive", len, bad);
        return CP_OK;
    }
    if (len >= UINT32_MAX) return cp_fail(err, CP_ERANGE, "detector: a message of %zu bytes is past the 4 GB a span can address", len);
    cp_status rc = CP_OK;
    size_t first = 0; /* the first folded character: only bytes from 0xC2 up can start one */
    int to;
    while (first < len && ((unsigned char)text[first] < 0xC2 || !folded_at((const unsigned char *)text, len, first, &to))) first++;
    rc = first < len ? detect_folded(c, text, len, first, role, pol, blank, out, err) : detect_into(c, text, len, role, pol, blank, out, err);
    if (rc == CP_OK) cp_spans_resolve(out);
    return rc;
}

cp_status cp_chain_detect_marked(cp_detect_chain *c, const char *text, size_t len, cp_role role, const cp_spans *marked,
                                 cp_spans *out, cp_error *err)
{
    c->messages++;
    cp_role_policy pol = (unsigned)role < 4 ? c->policy[role] : CP_POLICY_SENSITIVE;
    if (pol == CP_POLICY_PUBLIC) return CP_OK;
    if (pol == CP_POLICY_SENSITIVE) {
        out->wholly = 1;
        return CP_OK;
    }
    uint8_t *blank = NULL; /* read before the detectors append to out, which may be marked itself */
    if (marked && marked->n) {
        if (!(blank = calloc(len ? len : 1, 1))) return cp_fail(err, CP_ENOMEM, "detector: out of memory for a %zu-byte message's marks", len);
        for (size_t k = 0; k < marked->n; k++)
            for (size_t b = marked->v[k].start; b < marked->v[k].end && b < len; b++) blank[b] = 1;
    }
    cp_status rc = run_detectors(c, text, len, role, pol, blank, out, err);
    free(blank);
    return rc;
}

cp_status cp_chain_detect(cp_detect_chain *c, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    return cp_chain_detect_marked(c, text, len, role, NULL, out, err);
}

cp_status cp_chain_detect_secrets(cp_detect_chain *c, const char *text, size_t len, cp_spans *out, cp_error *err)
{
    return run_detectors(c, text, len, CP_ROLE_DOCUMENT, CP_POLICY_SECRETS, NULL, out, err);
}

/* A token is hit when any span overlaps its bytes.  Per token and span
 * that is O(tokens x spans), and both grow with the message ("Dr. "
 * repeated: one span per word): instead count the covered bytes once
 * (a difference array over the spans' reach, then prefix sums), so a
 * token's test is one subtraction.  O(tokens + spans + bytes spanned). */
void cp_spans_to_mask(const cp_spans *s, uint32_t base, const cp_encoding *enc, size_t t0, size_t t1, int pad,
                      uint8_t *mask)
{
    if (t1 > enc->n) t1 = enc->n;
    if (t0 >= t1) return;
    uint8_t *hit = calloc(t1 - t0, 1);
    uint64_t lo = UINT64_MAX, hi = 0; /* the bytes any span covers, in enc's coordinates */
    for (size_t i = 0; i < s->n; i++) {
        uint64_t a = (uint64_t)s->v[i].start + base, b = (uint64_t)s->v[i].end + base;
        if (a >= b) continue; /* an empty span covers nothing */
        if (a < lo) lo = a;
        if (b > hi) hi = b;
    }
    /* cover[x - lo]: spans over byte x, then (prefix sums) covered bytes before x */
    uint32_t *cover = !s->wholly && lo < hi && hi - lo < UINT32_MAX ? calloc((size_t)(hi - lo) + 1, sizeof *cover) : NULL;
    if (!hit || (!s->wholly && lo < hi && !cover)) { /* cannot allocate the scratch: fail closed */
        memset(mask + t0, 1, t1 - t0);
        free(hit);
        free(cover);
        return;
    }
    if (cover) {
        size_t w = (size_t)(hi - lo);
        for (size_t i = 0; i < s->n; i++) {
            uint64_t a = (uint64_t)s->v[i].start + base, b = (uint64_t)s->v[i].end + base;
            if (a >= b) continue;
            cover[a - lo]++;
            cover[b - lo]--;
        }
        uint32_t depth = 0, covered = 0;
        for (size_t x = 0; x <= w; x++) { /* cover[x] becomes the covered bytes in [lo, lo + x) */
            uint32_t d = cover[x];
            cover[x] = covered;
            depth += d;
            covered += depth > 0;
        }
    }
    for (size_t k = t0; k < t1; k++) {
        if (s->wholly) {
            hit[k - t0] = 1;
            continue;
        }
        if (!cover) continue;
        uint64_t a = enc->start[k], b = enc->end[k];
        if (a == b) {
            /* an empty-range token (BOS, prefix \u2581) at a span's edge
             * overlaps nothing (its neighbours' padding covers it); one
             * inside a span is hit: both bytes around it covered */
            hit[k - t0] = a > lo && a < hi && cover[a + 1 - lo] - cover[a - 1 - lo] == 2;
            continue;
        }
        if (a > b || b <= lo || a >= hi) continue;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        hit[k - t0] = cover[b - lo] > cover[a - lo];
    }
    for (size_t k = t0; k < t1; k++) {
        if (!hit[k - t0]) continue;
        size_t lo_k = k - t0 >= (size_t)pad ? k - (size_t)pad : t0, hi_k = k + (size_t)pad + 1 < t1 ? k + (size_t)pad + 1 : t1;
        memset(mask + lo_k, 1, hi_k - lo_k);
    }
    free(hit);
    free(cover);
}

cp_status cp_strip_pii_markers(const char *text, size_t len, char **clean, size_t *clean_len, cp_spans *spans,
                               cp_error *err)
{
    static const char open[] = "<pii>", close[] = "</pii>";
    char *out = cp_malloc(len + 1, "cleaned text", err);
    if (!out) return CP_ENOMEM;
    size_t n = 0, i = 0;
    long start = -1;
    cp_status rc = CP_OK;
    while (i < len && rc == CP_OK) {
        if (len - i >= 5 && memcmp(text + i, open, 5) == 0) {
            if (start >= 0) rc = cp_fail(err, CP_EFORMAT, "nested <pii> marker at byte %zu", i);
            start = (long)n;
            i += 5;
        } else if (len - i >= 6 && memcmp(text + i, close, 6) == 0) {
            if (start < 0) rc = cp_fail(err, CP_EFORMAT, "</pii> without <pii> at byte %zu", i);
            else if ((size_t)start < n) rc = cp_spans_add(spans, (uint32_t)start, (uint32_t)n, "marked", 1.0f, err);
            start = -1;
            i += 6;
        } else {
            out[n++] = text[i++];
        }
    }
    if (rc == CP_OK && start >= 0) rc = cp_fail(err, CP_EFORMAT, "<pii> marker is never closed");
    if (rc) {
        free(out);
        return rc;
    }
    out[n] = 0;
    *clean = out;
    *clean_len = n;
    return CP_OK;
}
