/* Normalizers (NFC, Prepend, Replace) and added-token matching. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"
#include "utf8.h"

/* ---- added tokens ---------------------------------------------------------- */

static int is_word_char(const char *s, size_t n)
{
    uint32_t cp;
    if (!cp_utf8_len((const unsigned char *)s, n, &cp)) return 0;
    if (cp == '_') return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static int is_space_at(const char *s, size_t n, size_t *clen)
{
    uint32_t cp;
    int l = cp_utf8_len((const unsigned char *)s, n, &cp);
    if (!l) return 0;
    *clen = (size_t)l;
    if (cp == ' ' || (cp >= 9 && cp <= 13)) return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/* start of the character that ends just before byte i (i > lo) */
static size_t prev_char(const char *s, size_t lo, size_t i)
{
    do i--;
    while (i > lo && ((unsigned char)s[i] & 0xc0) == 0x80);
    return i;
}

cp_status tk_match_added(const cp_tokenizer *t, tk_arena *a, const tk_splits *in, tk_splits *out, int normalized_phase,
                         int flags, const uint8_t *special_ok, cp_error *err)
{
    cp_status rc = CP_OK;
    for (size_t k = 0; k < in->n && rc == CP_OK; k++) {
        tk_split sp = in->v[k];
        if (sp.token >= 0 || t->n_added == 0) {
            rc = tk_splits_push(out, sp, err);
            continue;
        }
        const char *s = a->s;
        size_t end = sp.off + sp.len, cur = sp.off, i = sp.off;
        while (i < end && rc == CP_OK) {
            unsigned char b = (unsigned char)s[i];
            const tk_added *hit = NULL;
            for (int c = 0; c < t->added_by_byte_n[b] && !hit; c++) {
                const tk_added *ad = &t->added[t->added_by_byte[b][c]];
                if (ad->normalized != normalized_phase) continue;
                if (ad->special && ((flags & CP_TOK_NO_SPECIAL_TEXT) || (special_ok && !special_ok[a->a0[i]]))) continue;
                if (ad->len > end - i || memcmp(s + i, ad->content, ad->len) != 0) continue;
                if (ad->single_word && ((i > sp.off && is_word_char(s + prev_char(s, sp.off, i), end - prev_char(s, sp.off, i))) ||
                                        (i + ad->len < end && is_word_char(s + i + ad->len, end - i - ad->len))))
                    continue;
                hit = ad;
            }
            if (!hit) {
                i++;
                continue;
            }
            size_t ms = i, me = i + hit->len, cl;
            if (hit->lstrip)
                while (ms > cur) {
                    size_t p = prev_char(s, cur, ms);
                    if (!is_space_at(s + p, ms - p, &cl)) break;
                    ms = p;
                }
            if (hit->rstrip)
                while (me < end && is_space_at(s + me, end - me, &cl)) me += cl;
            if (ms > cur) rc = tk_splits_push(out, (tk_split){ cur, ms - cur, -1, sp.bytelevel }, err);
            if (rc == CP_OK) rc = tk_splits_push(out, (tk_split){ ms, me - ms, hit->id, 0 }, err);
            cur = i = me;
        }
        if (rc == CP_OK && cur < end) rc = tk_splits_push(out, (tk_split){ cur, end - cur, -1, sp.bytelevel }, err);
    }
    return rc;
}

/* ---- normalizers -------------------------------------------------------------- */

static int all_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* NFC.  Composition stays inside an extended grapheme cluster, so each
 * cluster is normalized on its own: unchanged clusters keep exact byte
 * alignment, changed ones map every output byte to the cluster's range. */
static cp_status nfc(tk_arena *a, tk_split *sp, cp_error *err)
{
    if (all_ascii(a->s + sp->off, sp->len)) return CP_OK;
    utf8proc_uint8_t *whole = NULL;
    utf8proc_ssize_t wn = utf8proc_map((const utf8proc_uint8_t *)a->s + sp->off, (utf8proc_ssize_t)sp->len, &whole,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (wn < 0) return cp_fail(err, CP_EFORMAT, "tokenizer: NFC failed: %s", utf8proc_errmsg(wn));
    int same = (size_t)wn == sp->len && memcmp(whole, a->s + sp->off, sp->len) == 0;
    tk_wipe(whole, (size_t)wn);
    free(whole);
    if (same) return CP_OK;

    size_t start = a->len, end = sp->off + sp->len, i = sp->off;
    cp_status rc = CP_OK;
    while (i < end && rc == CP_OK) {
        /* one cluster [i, j) */
        utf8proc_int32_t state = 0, c1, c2;
        size_t j = i;
        int l = (int)utf8proc_iterate((const utf8proc_uint8_t *)a->s + j, (utf8proc_ssize_t)(end - j), &c1);
        j += (size_t)l;
        while (j < end) {
            l = (int)utf8proc_iterate((const utf8proc_uint8_t *)a->s + j, (utf8proc_ssize_t)(end - j), &c2);
            if (utf8proc_grapheme_break_stateful(c1, c2, &state)) break;
            c1 = c2;
            j += (size_t)l;
        }
        size_t at;
        if (all_ascii(a->s + i, j - i)) {
            rc = tk_arena_copy(a, i, j - i, &at, err);
        } else {
            utf8proc_uint8_t *o = NULL;
            utf8proc_ssize_t on = utf8proc_map((const utf8proc_uint8_t *)a->s + i, (utf8proc_ssize_t)(j - i), &o,
                                               UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (on < 0) return cp_fail(err, CP_EFORMAT, "tokenizer: NFC failed: %s", utf8proc_errmsg(on));
            if ((size_t)on == j - i && memcmp(o, a->s + i, j - i) == 0) rc = tk_arena_copy(a, i, j - i, &at, err);
            else rc = tk_arena_put(a, (const char *)o, (size_t)on, a->a0[i], a->a1[j - 1], &at, err);
            tk_wipe(o, (size_t)on);
            free(o);
        }
        i = j;
    }
    if (rc) return rc;
    sp->off = start;
    sp->len = a->len - start;
    return CP_OK;
}

static cp_status prepend(tk_arena *a, tk_split *sp, const char *text, cp_error *err)
{
    if (sp->len == 0) return CP_OK;
    size_t at, at2;
    uint32_t anchor = a->a0[sp->off];
    cp_status rc = tk_arena_put(a, text, strlen(text), anchor, anchor, &at, err);
    if (rc == CP_OK) rc = tk_arena_copy(a, sp->off, sp->len, &at2, err);
    if (rc == CP_OK) sp->off = at, sp->len = a->len - at;
    return rc;
}

static cp_status replace(tk_arena *a, tk_matcher *m, tk_split *sp, const tk_norm *n, cp_error *err)
{
    size_t start = a->len, pos = 0, from = 0, at, ms, me;
    int found;
    cp_status rc;
    size_t clen = strlen(n->text);
    while (1) {
        /* the arena may move as it grows: take the subject pointer afresh */
        if ((rc = find_span(&n->pattern, m, a->s + sp->off, sp->len, from, &ms, &me, &found, err))) return rc;
        if (!found) break;
        if (me == ms) { /* an empty match replaces nothing: step one character */
            if (me >= sp->len) break;
            from = me + 1;
            while (from < sp->len && ((unsigned char)a->s[sp->off + from] & 0xc0) == 0x80) from++;
            continue;
        }
        if (ms > pos && (rc = tk_arena_copy(a, sp->off + pos, ms - pos, &at, err))) return rc;
        if ((rc = tk_arena_put(a, n->text, clen, a->a0[sp->off + ms], a->a1[sp->off + me - 1], &at, err))) return rc;
        pos = from = me;
    }
    if (pos == 0 && a->len == start) return CP_OK; /* no match */
    if (pos < sp->len && (rc = tk_arena_copy(a, sp->off + pos, sp->len - pos, &at, err))) return rc;
    sp->off = start;
    sp->len = a->len - start;
    return CP_OK;
}

cp_status tk_normalize(const cp_tokenizer *t, tk_matcher *m, tk_arena *a, tk_splits *s, cp_error *err)
{
    for (size_t k = 0; k < s->n; k++) {
        tk_split *sp = &s->v[k];
        if (sp->token >= 0) continue;
        for (int i = 0; i < t->n_norms; i++) {
            const tk_norm *n = &t->norms[i];
            cp_status rc = n->kind == NORM_NFC ? nfc(a, sp, err)
                         : n->kind == NORM_PREPEND ? prepend(a, sp, n->text, err)
                                                   : replace(a, m, sp, n, err);
            if (rc) return rc;
        }
    }
    return CP_OK;
}
