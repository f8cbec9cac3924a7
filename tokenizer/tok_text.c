/* The working text of one encode call: an arena of bytes, each aligned to
 * the range of the input it stands for, and splits that view into it. */
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

void tk_wipe(void *p, size_t n)
{
    if (p && n) OPENSSL_cleanse(p, n);
}

void *tk_grow(void *p, size_t old_bytes, size_t new_bytes)
{
    void *q = malloc(new_bytes ? new_bytes : 1);
    if (!q) return NULL;
    if (p) memcpy(q, p, old_bytes < new_bytes ? old_bytes : new_bytes);
    tk_wipe(p, old_bytes);
    free(p);
    return q;
}

cp_status tk_arena_reserve(tk_arena *a, size_t extra, cp_error *err)
{
    if (a->len + extra <= a->cap) return CP_OK;
    size_t cap = a->cap ? a->cap : 256;
    while (cap < a->len + extra) cap *= 2;
    char *s = tk_grow(a->s, a->cap, cap);
    if (s) a->s = s;
    uint32_t *a0 = s ? realloc(a->a0, cap * sizeof *a0) : NULL;
    if (a0) a->a0 = a0;
    uint32_t *a1 = a0 ? realloc(a->a1, cap * sizeof *a1) : NULL;
    if (a1) a->a1 = a1;
    if (!a1) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory for %zu bytes of working text", cap);
    a->cap = cap;
    return CP_OK;
}

cp_status tk_arena_put(tk_arena *a, const char *s, size_t n, uint32_t a0, uint32_t a1, size_t *at, cp_error *err)
{
    cp_status rc = tk_arena_reserve(a, n, err);
    if (rc) return rc;
    *at = a->len;
    memcpy(a->s + a->len, s, n);
    for (size_t i = 0; i < n; i++) {
        a->a0[a->len + i] = a0;
        a->a1[a->len + i] = a1;
    }
    a->len += n;
    return CP_OK;
}

cp_status tk_arena_copy(tk_arena *a, size_t from, size_t n, size_t *at, cp_error *err)
{
    cp_status rc = tk_arena_reserve(a, n, err); /* may move the buffers: index after */
    if (rc) return rc;
    *at = a->len;
    memcpy(a->s + a->len, a->s + from, n);
    memcpy(a->a0 + a->len, a->a0 + from, n * sizeof *a->a0);
    memcpy(a->a1 + a->len, a->a1 + from, n * sizeof *a->a1);
    a->len += n;
    return CP_OK;
}

void tk_arena_free(tk_arena *a)
{
    tk_wipe(a->s, a->cap);
    free(a->s);
    free(a->a0);
    free(a->a1);
    memset(a, 0, sizeof *a);
}

cp_status tk_splits_push(tk_splits *s, tk_split v, cp_error *err)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        tk_split *p = realloc(s->v, cap * sizeof *p);
        if (!p) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory for %zu pre-tokens", cap);
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = v;
    return CP_OK;
}
