/* The BPE model.  Merges are applied lowest rank first through a binary heap
 * of candidate pairs over a linked list of symbols: O(n log n) per
 * pre-token, however long (Metaspace with split=false hands the model whole
 * paragraphs).  Short pre-tokens are cached. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "utf8.h"

typedef struct sym {
    int32_t id;
    uint32_t start, end; /* arena offsets */
    int32_t prev, next;  /* -1 at the ends */
} sym;

typedef struct cand {
    int32_t rank;
    uint32_t pos; /* left symbol's start: equal ranks merge left to right */
    int32_t left, right, left_id, right_id, merged;
} cand;

static int cand_less(const cand *a, const cand *b) { return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos); }

typedef struct heap {
    cand *v;
    size_t n, cap;
} heap;

static int heap_push(heap *h, cand c)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        cand *v = realloc(h->v, cap * sizeof *v);
        if (!v) return 0;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
    return 1;
}

static cand heap_pop(heap *h)
{
    cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &last;
        if (l < h->n && cand_less(&h->v[l], best)) m = l, best = &h->v[l];
        if (r < h->n && cand_less(&h->v[r], best)) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static int try_pair(const cp_tokenizer *t, heap *h, const sym *s, int32_t l)
{
    if (l < 0) return 1;
    int32_t r = s[l].next, rank, merged;
    if (r < 0 || !cp_pairmap_get(&t->merges, s[l].id, s[r].id, &rank, &merged)) return 1;
    return heap_push(h, (cand){ rank, s[l].start, l, r, s[l].id, s[r].id, merged });
}

/* ---- cache ---------------------------------------------------------------- */

#define CACHE_MAX_PIECE 64
#define CACHE_MAX_TOKS (1u << 22) /* a call's cache stops growing here */

static int cache_get(const tk_cache *c, const char *key, size_t klen, uint32_t off, cp_encoding *out, cp_error *err, cp_status *rc)
{
    int32_t at;
    if (!cp_strmap_get(&c->map, key, klen, &at)) return 0;
    const tk_cache_tok *v = &c->toks[at];
    int32_t n = v[0].id;
    for (int32_t i = 1; i <= n && *rc == CP_OK; i++) *rc = cp_encoding_push(out, v[i].id, off + v[i].start, off + v[i].end, err);
    return 1;
}

static void cache_put(tk_cache *c, const char *key, size_t klen, const sym *s, int32_t first, uint32_t off, int32_t n)
{
    if (c->len + (size_t)n + 1 > CACHE_MAX_TOKS) return; /* full: the rest of the call runs uncached */
    if (c->len + (size_t)n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 4096;
        tk_cache_tok *v = tk_grow(c->toks, c->cap * sizeof *v, cap * sizeof *v);
        if (!v) return; /* the cache is an optimisation: skip it */
        c->toks = v;
        c->cap = cap;
    }
    cp_error ignore;
    if (cp_strmap_put(&c->map, key, klen, (int32_t)c->len, &ignore) != CP_OK) return;
    tk_cache_tok *v = &c->toks[c->len];
    v[0].id = n;
    int32_t k = 1;
    for (int32_t i = first; i >= 0; i = s[i].next, k++)
        v[k] = (tk_cache_tok){ s[i].id, (uint16_t)(s[i].start - off), (uint16_t)(s[i].end - off) };
    c->len += (size_t)n + 1;
}

void tk_cache_free(tk_cache *c)
{
    cp_strmap_free_wiped(&c->map, tk_wipe);
    tk_wipe(c->toks, c->cap * sizeof *c->toks); /* a prompt's ids */
    free(c->toks);
    *c = (tk_cache){ 0 };
}

/* ---- the model ---------------------------------------------------------------- */

/* Initial symbols: bytes through the byte-level map, or characters (with
 * byte fallback, then unk).  Returns the count, or -1 with err set. */
static int32_t initial_symbols(const cp_tokenizer *t, const tk_arena *a, const tk_split *sp, sym *s, cp_error *err)
{
    int32_t n = 0;
    const unsigned char *u = (const unsigned char *)a->s;
#define ADD_SYM(ID, S, E)                                            \
    do {                                                             \
        s[n] = (sym){ (ID), (uint32_t)(S), (uint32_t)(E), n - 1, n + 1 }; \
        n++;                                                         \
    } while (0)
    size_t end = sp->off + sp->len;
    for (size_t i = sp->off; i < end;) {
        if (sp->bytelevel) {
            int32_t id = t->byte_level_id[u[i]];
            if (id < 0) id = t->unk_id;
            if (id < 0) {
                cp_fail(err, CP_EFORMAT, "%s: byte 0x%02x has no byte-level token and there is no unk_token", t->where, u[i]);
                return -1;
            }
            ADD_SYM(id, i, i + 1);
            i++;
            continue;
        }
        uint32_t cp;
        int l = cp_utf8_len(u + i, end - i, &cp);
        if (l == 0) l = 1; /* cannot happen: input was validated */
        int32_t id;
        if (cp_strmap_get(&t->vocab, a->s + i, (size_t)l, &id)) {
            ADD_SYM(id, i, i + l);
        } else {
            int ok = t->byte_fallback;
            for (int k = 0; k < l && ok; k++) ok = t->byte_fallback_id[u[i + k]] >= 0;
            if (ok) {
                /* one piece per byte, each with the whole character's range */
                for (int k = 0; k < l; k++) ADD_SYM(t->byte_fallback_id[u[i + k]], i, i + l);
            } else if (t->unk_id >= 0) {
                if (t->fuse_unk && n > 0 && s[n - 1].id == t->unk_id) s[n - 1].end = (uint32_t)(i + l);
                else ADD_SYM(t->unk_id, i, i + l);
            } else {
                cp_fail(err, CP_EFORMAT, "%s: a character at byte %zu is not in the vocabulary and there is no unk_token",
                        t->where, i);
                return -1;
            }
        }
        i += (size_t)l;
    }
#undef ADD_SYM
    if (n > 0) s[n - 1].next = -1;
    return n;
}

cp_status tk_bpe(const cp_tokenizer *t, const tk_arena *a, const tk_split *sp, tk_cache *cache, cp_encoding *out, cp_error *err)
{
    if (sp->len == 0) return CP_OK;
    cp_status rc = CP_OK;
    char key[CACHE_MAX_PIECE + 1];
    int cacheable = sp->len <= CACHE_MAX_PIECE;
    if (cacheable) {
        key[0] = (char)sp->bytelevel;
        memcpy(key + 1, a->s + sp->off, sp->len);
        if (cache_get(cache, key, sp->len + 1, (uint32_t)sp->off, out, err, &rc)) return rc;
    }
    if (t->ignore_merges) { /* a whole pre-token in the vocabulary is one token */
        int32_t id;
        int found;
        if (sp->bytelevel) {
            char *m = malloc(sp->len * 2 + 1);
            if (!m) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory");
            size_t k = 0;
            for (size_t i = 0; i < sp->len; i++) k += (size_t)cp_utf8_encode(tk_byte_to_cp((uint8_t)a->s[sp->off + i]), m + k);
            found = cp_strmap_get(&t->vocab, m, k, &id);
            tk_wipe(m, k);
            free(m);
        } else {
            found = cp_strmap_get(&t->vocab, a->s + sp->off, sp->len, &id);
        }
        if (found) return cp_encoding_push(out, id, (uint32_t)sp->off, (uint32_t)(sp->off + sp->len), err);
    }
    /* never more than one initial symbol per byte */
    sym stack_syms[CACHE_MAX_PIECE];
    sym *s = sp->len <= CACHE_MAX_PIECE ? stack_syms : malloc(sp->len * sizeof *s);
    if (!s) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory for a %zu-byte pre-token", sp->len);
    int32_t n = initial_symbols(t, a, sp, s, err);
    heap h = { 0 };
    if (n < 0) rc = err->code;
    for (int32_t i = 0; i + 1 < n && rc == CP_OK; i++)
        if (!try_pair(t, &h, s, i)) rc = cp_fail(err, CP_ENOMEM, "tokenizer: out of memory for merges");
    while (h.n && rc == CP_OK) {
        cand c = heap_pop(&h);
        sym *l = &s[c.left];
        if (l->id != c.left_id || l->next != c.right || s[c.right].id != c.right_id) continue; /* stale */
        sym *r = &s[c.right];
        l->id = c.merged;
        l->end = r->end;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = c.left;
        r->id = -1;
        if (!try_pair(t, &h, s, l->prev) || !try_pair(t, &h, s, c.left))
            rc = cp_fail(err, CP_ENOMEM, "tokenizer: out of memory for merges");
    }
    free(h.v);
    int32_t count = 0;
    for (int32_t i = n > 0 ? 0 : -1; i >= 0 && rc == CP_OK; i = s[i].next, count++)
        rc = cp_encoding_push(out, s[i].id, s[i].start, s[i].end, err);
    if (rc == CP_OK && cacheable && n > 0) cache_put(cache, key, sp->len + 1, s, 0, (uint32_t)sp->off, count);
    if (s != stack_syms) free(s);
    return rc;
}
