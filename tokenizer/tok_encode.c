/* encode: added tokens -> normalizers -> added tokens (normalized ones) ->
 * pre-tokenizers -> BPE -> offsets back to the input -> post-processors. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "utf8.h"

void cp_encoding_free(cp_encoding *e)
{
    tk_wipe(e->ids, e->cap * sizeof *e->ids); /* a prompt's ids */
    free(e->ids);
    free(e->start);
    free(e->end);
    memset(e, 0, sizeof *e);
}

cp_status cp_encoding_push(cp_encoding *e, int32_t id, uint32_t start, uint32_t end, cp_error *err)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 256;
        int32_t *ids = tk_grow(e->ids, e->cap * sizeof *ids, cap * sizeof *ids);
        if (ids) e->ids = ids;
        uint32_t *s = ids ? realloc(e->start, cap * sizeof *s) : NULL;
        if (s) e->start = s;
        uint32_t *en = s ? realloc(e->end, cap * sizeof *en) : NULL;
        if (en) e->end = en;
        if (!en) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory for %zu tokens", cap);
        e->cap = cap;
    }
    e->ids[e->n] = id;
    e->start[e->n] = start;
    e->end[e->n] = end;
    e->n++;
    return CP_OK;
}

/* Arena range [s, e) -> input range, widened to whole characters. */
static void to_input(const tk_arena *a, const char *text, size_t len, uint32_t s, uint32_t e, uint32_t *o0, uint32_t *o1)
{
    uint32_t x = a->a0[s], y = e > s ? a->a1[e - 1] : x;
    if (y < x) y = x;
    while (x > 0 && x < len && ((unsigned char)text[x] & 0xc0) == 0x80) x--;
    while (y < len && y > x && ((unsigned char)text[y] & 0xc0) == 0x80) y++;
    *o0 = x;
    *o1 = y;
}

static cp_status post_template(const tk_post *p, cp_encoding *seq, size_t first, size_t len, cp_error *err)
{
    /* rebuild [first, n) as the template: specials get empty ranges at the
     * start (before the sequence) or end (after it) of the text */
    cp_encoding tmp = { 0 };
    cp_status rc = CP_OK;
    int after = 0;
    for (int i = 0; i < p->n_items && rc == CP_OK; i++) {
        if (p->items[i] < 0) {
            for (size_t k = first; k < seq->n && rc == CP_OK; k++) rc = cp_encoding_push(&tmp, seq->ids[k], seq->start[k], seq->end[k], err);
            after = 1;
            continue;
        }
        int s = p->items[i];
        uint32_t at = after ? (uint32_t)len : 0;
        for (int k = 0; k < p->special_n[s] && rc == CP_OK; k++) rc = cp_encoding_push(&tmp, p->special_ids[s][k], at, at, err);
    }
    seq->n = first;
    for (size_t k = 0; k < tmp.n && rc == CP_OK; k++) rc = cp_encoding_push(seq, tmp.ids[k], tmp.start[k], tmp.end[k], err);
    cp_encoding_free(&tmp);
    return rc;
}

/* ByteLevel trim_offsets: drop leading and trailing spaces from a token's
 * range unless the token is nothing but spaces. */
static void post_trim(const cp_tokenizer *t, cp_encoding *e, size_t first, const char *text)
{
    for (size_t k = first; k < e->n; k++) {
        if (t->is_special[e->ids[k]]) continue;
        uint32_t s = e->start[k], en = e->end[k];
        while (s < en && text[s] == ' ') s++;
        if (s == en) continue;
        while (en > s && text[en - 1] == ' ') en--;
        e->start[k] = s;
        e->end[k] = en;
    }
}

cp_status cp_tokenize(const cp_tokenizer *t, const char *text, size_t len, int flags, cp_encoding *enc, cp_error *err)
{
    return cp_tokenize_ex(t, text, len, flags, NULL, enc, err);
}

cp_status cp_tokenize_ex(const cp_tokenizer *t, const char *text, size_t len, int flags, const uint8_t *special_ok,
                         cp_encoding *enc, cp_error *err)
{
    if (len > UINT32_MAX / 2) return cp_fail(err, CP_ERANGE, "tokenizer: input of %zu bytes is too long", len);
    size_t bad = cp_utf8_validate(text, len);
    if (bad < len) return cp_fail(err, CP_EFORMAT, "tokenizer: input is not valid UTF-8 (byte %zu)", bad);
    size_t first = enc->n;
    tk_arena a = { 0 };
    tk_splits s1 = { 0 }, s2 = { 0 };
    tk_matcher m = { 0 };
    tk_cache cache = { 0 };
    cp_status rc = cp_regex_matcher_init(&m, 0, err);
    if (rc == CP_OK) rc = tk_arena_reserve(&a, len + 16, err);
    if (rc == CP_OK && len > 0) {
        memcpy(a.s, text, len);
        for (size_t i = 0; i < len; i++) a.a0[i] = (uint32_t)i, a.a1[i] = (uint32_t)i + 1;
        a.len = len;
        rc = tk_splits_push(&s1, (tk_split){ 0, len, -1, 0 }, err);
    }
#define NEXT_STAGE(call)              \
    if (rc == CP_OK) {                \
        s2.n = 0;                     \
        rc = (call);                  \
        tk_splits tmp = s1;           \
        s1 = s2;                      \
        s2 = tmp;                     \
    }
    NEXT_STAGE(tk_match_added(t, &a, &s1, &s2, 0, flags, special_ok, err));
    if (rc == CP_OK) rc = tk_normalize(t, &m, &a, &s1, err);
    NEXT_STAGE(tk_match_added(t, &a, &s1, &s2, 1, flags, special_ok, err));
    for (int i = 0; i < t->n_pres; i++) NEXT_STAGE(tk_pretokenize(t, &m, &a, &t->pres[i], &s1, &s2, err));
#undef NEXT_STAGE
    for (size_t k = 0; k < s1.n && rc == CP_OK; k++) {
        const tk_split *sp = &s1.v[k];
        size_t before = enc->n;
        if (sp->token >= 0) rc = cp_encoding_push(enc, sp->token, (uint32_t)sp->off, (uint32_t)(sp->off + sp->len), err);
        else rc = tk_bpe(t, &a, sp, &cache, enc, err);
        for (size_t j = before; j < enc->n && rc == CP_OK; j++) to_input(&a, text, len, enc->start[j], enc->end[j], &enc->start[j], &enc->end[j]);
    }
    /* templates add tokens only when asked; offset trimming always runs */
    for (int i = 0; i < t->n_posts && rc == CP_OK; i++) {
        if (t->posts[i].kind == POST_TEMPLATE) {
            if (flags & CP_TOK_ADD_SPECIAL) rc = post_template(&t->posts[i], enc, first, len, err);
        } else if (t->posts[i].trim_offsets) {
            post_trim(t, enc, first, text);
        }
    }
    if (rc != CP_OK) enc->n = first;
    cp_regex_matcher_free(&m);
    tk_cache_free(&cache);
    tk_arena_free(&a);
    free(s1.v);
    free(s2.v);
    return rc;
}
