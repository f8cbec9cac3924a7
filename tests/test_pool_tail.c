/* Tail-block eviction: a victim of the budget gives up only the
 * tail blocks an insert needs and stays as the segment of its first tokens.
 * The pool fills to the block (f32 and bf16 KV); a truncated segment is
 * found, verified and deduplicated as the shorter segment, never as the
 * longer one, its KV is the untruncated prefix's, freed private blocks are
 * zeroed; pinned segments are never touched; the fallbacks to a whole
 * eviction (a remainder already stored, a full bucket) keep the tables
 * consistent; and a random simulation checks the KV a lookup serves
 * against what was inserted. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../pool/pool.h"
#include "../pool/pool_internal.h" /* the segment table and the clock, read directly */
#include "helpers.h"

static const uint8_t NO_SENS[1024];
static const uint8_t FP[32] = { 7, 1, 2, 5 };

static double fake_time;
static double fake_clock(void *ctx)
{
    (void)ctx;
    return fake_time;
}

typedef struct tweaks {
    int whole, bucket_cap, min_window; /* min_window: windows {min_window, 64} instead of the default */
} tweaks;

/* 1 layer x 1 kv head x head_dim 2, 16 tokens a block: 256 bytes a block
 * in f32, 128 in bf16; a fixed hash base, so two pools key alike */
static cp_pool *make_on(cp_backend *be, cp_dtype dt, size_t budget, cp_evict_policy pol, tweaks tw)
{
    cp_error err = { 0 };
    cp_kv_layout l = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 2, .dtype = dt, .block_tokens = 16 };
    memcpy(l.fingerprint, FP, 32);
    cp_pool_opts o;
    cp_pool_opts_default(&o);
    o.budget_bytes = budget;
    o.policy = pol;
    o.clock = fake_clock;
    o.hash_base = 1000003;
    o.whole_eviction = tw.whole;
    if (tw.bucket_cap) o.bucket_cap = tw.bucket_cap;
    if (tw.min_window) o.windows[0] = tw.min_window, o.windows[1] = 64, o.n_windows = 2;
    cp_pool *p;
    cr_assert_eq(cp_pool_create(&l, be, &o, &p, &err), CP_OK, "%s", err.msg);
    return p;
}

static cp_backend *cpu(void)
{
    cp_backend *be;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK);
    return be;
}

static void checked_free(cp_pool *p)
{
    cp_error err = { 0 };
    cr_assert_eq(cp_pool_check(p, &err), CP_OK, "%s", err.msg);
    cp_pool_free(p);
}

static void seq(int32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % 50000);
    }
}

/* K row of token t of a segment: (its id, t); V row: (t, -id).  Exact in f32. */
static void kv_of(const int32_t *tok, uint32_t n, float *k, float *v)
{
    for (uint32_t t = 0; t < n; t++) k[2 * t] = (float)tok[t], k[2 * t + 1] = (float)t, v[2 * t] = (float)t, v[2 * t + 1] = -(float)tok[t];
}

/* inserts with KV from kv_of (with_kv) or none; *id */
static cp_status put(cp_pool *p, uint32_t tenant, cp_scope sc, const int32_t *t, uint32_t n, int with_kv, uint32_t *id, int *dd)
{
    static float k[2 * 1024], v[2 * 1024];
    cr_assert_leq(n, 1024);
    kv_of(t, n, k, v);
    const void *ks[1] = { k }, *vs[1] = { v };
    cp_kv_source src = { ks, vs, 2 };
    cp_error err = { 0 };
    cp_insert in = { .tenant = tenant, .scope = sc, .fingerprint = FP, .tokens = t, .len = n, .sensitive = NO_SENS,
                     .kv = with_kv ? &src : NULL };
    return cp_pool_insert(p, &in, id, dd, &err);
}

static void look(cp_pool *p, uint32_t tenant, int priv, int whole, const int32_t *t, size_t n, cp_matches *m)
{
    cp_error err = { 0 };
    cp_lookup q = { .tenant = tenant, .fingerprint = FP, .tokens = t, .n = n, .private_only = priv, .whole_only = whole };
    cr_assert_eq(cp_pool_lookup(p, &q, m, &err), CP_OK, "%s", err.msg);
}

/* the stored segment with exactly these tokens, or NULL (touches nothing) */
static const cp_segment *stored(const cp_pool *p, const int32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < p->n_segs; i++) {
        const cp_segment *s = p->segs[i];
        if (s && s->len == n && memcmp(s->tokens, t, n * sizeof *t) == 0) return s;
    }
    return NULL;
}

static size_t n_free(const cp_pool *p) { return p->slab.n_free; }

/* ---- the pool fills to the block ---------------------------------------- */

/* 300 shared inserts of 16-400 tokens (1-25 blocks) into 64 f32 blocks
 * (16 KiB), and the same stream into the same budget in bf16 (128 blocks).
 * Golden, from pool_make_room's rule: an insert that fits takes its blocks from
 * the free ones; one that does not leaves none free (the last victim gave up
 * exactly the missing blocks), so once full the pool stays full to the byte.
 * With whole eviction (the pool's whole-eviction option) the same stream
 * leaves slack. */
static void fill_stream(cp_dtype dt, int whole, size_t *min_after_full, uint64_t *truncations, size_t *blocks)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, dt, 64 * 256, CP_EVICT_GDSF, (tweaks){ .whole = whole });
    size_t bb = p->slab.block_bytes, budget = p->st.bytes_budget;
    *blocks = p->slab.n_blocks;
    *min_after_full = budget;
    int full = 0;
    uint32_t r = 99;
    int32_t t[400];
    for (int i = 0; i < 300; i++) {
        r = r * 1103515245u + 12345u;
        uint32_t len = 16 + (r >> 8) % 385, need = (len + 15) / 16, id;
        seq(t, len, 7000 + (uint32_t)i);
        size_t free_before = n_free(p), used_before = p->st.bytes_used;
        int dd;
        cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, t, len, 0, &id, &dd), CP_OK);
        if (need <= free_before) cr_assert_eq(p->st.bytes_used, used_before + need * bb, "insert %d fit: only its blocks are taken", i);
        else if (!whole)
            cr_assert_eq(p->st.bytes_used, budget, "insert %d made room: %zu of %zu bytes held, not full", i, p->st.bytes_used, budget);
        full |= need > free_before;
        if (full && p->st.bytes_used < *min_after_full) *min_after_full = p->st.bytes_used;
        if (i % 50 == 0) { /* hits, so the victims are not simply the oldest */
            cp_matches m = { 0 };
            look(p, 2, 0, 0, t, len, &m);
            cp_pool_release(p, &m);
            cp_matches_free(&m);
        }
    }
    *truncations = p->st.truncations;
    checked_free(p);
    cp_backend_destroy(be);
}

Test(pool, tail_eviction_fills_the_pool_to_the_block_f32_and_bf16)
{
    size_t min_f32, min_bf16, min_whole, nb_f32, nb_bf16, nb;
    uint64_t tr_f32, tr_bf16, tr_whole;
    fill_stream(CP_F32, 0, &min_f32, &tr_f32, &nb_f32);
    fill_stream(CP_BF16, 0, &min_bf16, &tr_bf16, &nb_bf16);
    fill_stream(CP_F32, 1, &min_whole, &tr_whole, &nb);
    cr_assert_eq(nb_f32, 64);
    cr_assert_eq(nb_bf16, 128, "bf16 KV: twice the blocks in one budget");
    cr_assert_eq(min_f32, 64 * 256, "f32: full to the byte after every insert once full");
    cr_assert_eq(min_bf16, 64 * 256, "bf16: full to the byte after every insert once full");
    cr_assert(tr_f32 > 0 && tr_bf16 > 0, "the stream never truncated (%llu, %llu)", (unsigned long long)tr_f32,
              (unsigned long long)tr_bf16);
    cr_assert_eq(tr_whole, 0, "whole_eviction truncated");
    cr_assert_leq(min_whole, 64 * 256 - 2 * 256, "the whole-eviction pool should show slack on this stream (the instrument)");
}

/* ---- a truncated segment is its prefix ------------------------------------------ */

/* 8 blocks.  A: 100 tokens (7 blocks, the last holding 4), B needs 2 with 1
 * free: A gives up 1 block and is the 96-token segment of its first tokens. */
Test(pool, truncated_segment_is_found_as_its_prefix_only)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 8 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    int32_t a[100], b[32];
    seq(a, 100, 1), seq(b, 32, 2);
    uint32_t ia, ib, id;
    int dd;
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 100, 1, &ia, &dd), CP_OK);
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, b, 32, 1, &ib, &dd), CP_OK);
    cp_pool_stats st;
    cp_pool_stats_get(p, &st);
    cr_assert(st.truncations == 1 && st.truncated_blocks == 1 && st.evictions_lru == 0, "truncations %llu",
              (unsigned long long)st.truncations);
    cr_assert(st.segments == 2 && st.bytes_used == 8 * 256);
    cr_assert_null(stored(p, a, 100), "the 100-token segment is still there");
    const cp_segment *sa = stored(p, a, 96);
    cr_assert(sa && sa->id == ia && sa->n_blocks == 6);
    cp_tenant_stats ts;
    cr_assert(cp_pool_tenant_stats(p, 1, &ts) && ts.bytes == 8 * 256, "the tenant's bytes follow its segments: %zu", ts.bytes);

    /* identical to the 96-token segment inserted alone (same hash base) */
    cp_pool *q = make_on(be, CP_F32, 64 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    uint32_t iq;
    cr_assert_eq(put(q, 1, CP_SCOPE_SHARED, a, 96, 0, &iq, &dd), CP_OK);
    const cp_segment *sq = q->segs[iq];
    cr_assert(memcmp(sa->sha, sq->sha, 32) == 0 && sa->key == sq->key && sa->window == sq->window && sa->len == sq->len &&
              sa->n_blocks == sq->n_blocks);
    checked_free(q);

    /* the request of all 100 tokens: a 96-token hit, never 100 */
    cp_matches m = { 0 };
    look(p, 2, 0, 0, a, 100, &m);
    cr_assert(m.n == 1 && m.v[0].pos == 0 && m.v[0].len == 96 && m.v[0].seg == ia, "n %zu len %u", m.n, m.n ? m.v[0].len : 0);
    const cp_segment *sg = cp_pool_segment(p, &m, 0);
    cr_assert(sg && sg->len == 96);
    for (uint32_t t = 0; t < 96; t++) { /* its KV is the untruncated prefix's, row for row */
        const float *kr = cp_pool_kv_row(p, sg, 0, 0, t), *vr = cp_pool_kv_row(p, sg, 0, 1, t);
        cr_assert(kr[0] == (float)a[t] && kr[1] == (float)t && vr[0] == (float)t && vr[1] == -(float)a[t], "token %u", t);
    }
    cp_pool_release(p, &m);
    /* a chunk cache's whole-only lookup finds it whole at 96, as the shorter segment */
    look(p, 2, 0, 1, a, 100, &m);
    cr_assert(m.n == 1 && m.v[0].len == 96);
    cp_pool_release(p, &m);
    /* dedup: the 96 tokens are it; the 100 tokens are a new segment */
    cr_assert_eq(put(p, 3, CP_SCOPE_SHARED, a, 96, 0, &id, &dd), CP_OK);
    cr_assert(dd == 1 && id == ia, "the remainder is not deduplicated as its own tokens");
    fake_time = 2;
    cr_assert_eq(put(p, 3, CP_SCOPE_SHARED, a, 100, 0, &id, &dd), CP_OK);
    cr_assert(dd == 0, "the old full length was deduplicated against the truncated segment");
    cp_matches_free(&m);
    checked_free(p);
    cp_backend_destroy(be);
}

/* The LRU victim keeps its place at the top: the next insert takes from it
 * again; GDSF's clock rises to the victim's priority as on an eviction. */
Test(pool, truncated_victim_is_taken_from_first_next_time)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 8 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    int32_t a[64], b[64], c[16], d[16];
    seq(a, 64, 1), seq(b, 64, 2), seq(c, 16, 3), seq(d, 16, 4);
    uint32_t id;
    int dd;
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 64, 0, &id, &dd), CP_OK);
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, b, 64, 0, &id, &dd), CP_OK);
    fake_time = 2;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, c, 16, 0, &id, &dd), CP_OK);
    cr_assert(stored(p, a, 48) && stored(p, b, 64));
    fake_time = 3;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, d, 16, 0, &id, &dd), CP_OK);
    cr_assert(stored(p, a, 32) && stored(p, b, 64), "the second cut should come from the same victim");
    /* 64 -> 32 tokens moved it from window 64 to window 32: found there, at 32 */
    cp_matches m = { 0 };
    look(p, 2, 0, 0, a, 64, &m);
    cr_assert(m.n == 1 && m.v[0].len == 32, "n %zu len %u", m.n, m.n ? m.v[0].len : 0);
    cp_pool_release(p, &m);
    cp_matches_free(&m);
    checked_free(p);

    p = make_on(be, CP_F32, 8 * 256, CP_EVICT_GDSF, (tweaks){ 0 });
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 64, 0, &id, &dd), CP_OK);
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, b, 64, 0, &id, &dd), CP_OK);
    cr_assert_float_eq(p->gdsf_clock, 0, 0);
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, c, 16, 0, &id, &dd), CP_OK);
    const cp_segment *sa = stored(p, a, 48);
    cr_assert(sa && p->st.truncations == 1);
    cr_assert_float_eq(p->gdsf_clock, sa->priority, 0, "the clock did not age on the truncation");
    cr_assert(p->gdsf_clock > 0);
    checked_free(p);
    cp_backend_destroy(be);
}

/* ---- pins ------------------------------------------------------------------------ */

/* 8 blocks: A (64 tokens, oldest, pinned), B (48): C needs 2 with 1 free.
 * A would do with one block less, but it is pinned: B gives the block. */
Test(pool, pinned_segment_is_never_truncated)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 8 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    int32_t a[64], b[48], c[32], x[48];
    seq(a, 64, 11), seq(b, 48, 12), seq(c, 32, 13), seq(x, 48, 14);
    uint32_t ia, ib, id;
    int dd;
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 64, 1, &ia, &dd), CP_OK);
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, b, 48, 1, &ib, &dd), CP_OK);
    cp_matches m = { 0 };
    look(p, 2, 0, 0, a, 64, &m); /* pins A; at time 1 it is still older than B by id order */
    cr_assert(m.n == 1 && m.v[0].len == 64);
    fake_time = 2;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, c, 32, 1, &id, &dd), CP_OK);
    const cp_segment *sa = p->segs[ia];
    cr_assert(sa->len == 64 && sa->n_blocks == 4, "the pinned segment was cut to %u tokens", sa->len);
    cr_assert(stored(p, b, 32) && !stored(p, b, 48), "B should have given its tail block");
    for (uint32_t t = 0; t < 64; t++) {
        const float *kr = cp_pool_kv_row(p, sa, 0, 0, t);
        cr_assert(kr[0] == (float)a[t] && kr[1] == (float)t, "the pinned segment's KV changed at %u", t);
    }
    /* everything else pinned: an insert that needs more than the free
     * blocks is refused, and the pinned segments stay whole */
    cp_matches m2 = { 0 }, m3 = { 0 };
    look(p, 2, 0, 0, b, 32, &m2);
    look(p, 2, 0, 0, c, 32, &m3);
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, x, 48, 0, &id, &dd), CP_ERANGE);
    cr_assert(sa->len == 64 && stored(p, b, 32) && stored(p, c, 32));
    cp_pool_release(p, &m), cp_pool_release(p, &m2), cp_pool_release(p, &m3);
    cp_matches_free(&m), cp_matches_free(&m2), cp_matches_free(&m3);
    checked_free(p);
    cp_backend_destroy(be);
}

/* ---- whole eviction where a remainder cannot stand ------------------------------- */

/* X (32 tokens) is A's (64) first half: A cut by 2 blocks would be a second
 * X, so it goes whole; likewise when the remainder is the very segment
 * being inserted (private, its owner's). */
Test(pool, remainder_already_stored_goes_whole)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 6 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    int32_t a[64], c[32];
    seq(a, 64, 21), seq(c, 32, 22);
    uint32_t ix, id;
    int dd;
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 64, 0, &id, &dd), CP_OK);
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 32, 0, &ix, &dd), CP_OK);
    cr_assert_eq(dd, 0);
    fake_time = 2;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, c, 32, 0, &id, &dd), CP_OK);
    cr_assert(!stored(p, a, 64) && stored(p, a, 32) == p->segs[ix] && stored(p, c, 32));
    cr_assert(p->st.truncations == 0 && p->st.evictions_lru == 1 && p->st.segments == 2);
    checked_free(p);

    /* private A of tenant 1 (64 tokens, 4 of 5 blocks); tenant 1 inserts A's
     * first 32: A is the victim, its cut would be the insert itself */
    p = make_on(be, CP_F32, 5 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    int32_t f[16];
    seq(f, 16, 23);
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_PRIVATE, a, 64, 0, &id, &dd), CP_OK);
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_PRIVATE, f, 16, 0, &id, &dd), CP_OK);
    fake_time = 2;
    cr_assert_eq(put(p, 1, CP_SCOPE_PRIVATE, a, 32, 0, &id, &dd), CP_OK);
    cr_assert_eq(dd, 0);
    cr_assert(!stored(p, a, 64) && stored(p, a, 32) == p->segs[id] && p->st.truncations == 0 && p->st.segments == 2);
    checked_free(p);

    /* another tenant's private copy is no duplicate: tenant 2's A is cut to
     * the 32 tokens tenant 1 holds privately too */
    p = make_on(be, CP_F32, 6 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    fake_time = 0;
    cr_assert_eq(put(p, 2, CP_SCOPE_PRIVATE, a, 64, 0, &id, &dd), CP_OK);
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_PRIVATE, a, 32, 0, &ix, &dd), CP_OK);
    fake_time = 2;
    cr_assert_eq(put(p, 3, CP_SCOPE_SHARED, c, 32, 0, &id, &dd), CP_OK);
    cr_assert(p->st.truncations == 1 && p->st.segments == 3 && !stored(p, a, 64));
    int owners = 0;
    for (uint32_t i = 0; i < p->n_segs; i++)
        if (p->segs[i] && p->segs[i]->len == 32 && memcmp(p->segs[i]->tokens, a, sizeof a / 2) == 0) owners |= 1 << p->segs[i]->tenant;
    cr_assert_eq(owners, (1 << 1) | (1 << 2), "both tenants' private copies of the 32 tokens should be there");
    checked_free(p);
    cp_backend_destroy(be);
}

/* bucket cap 2.  A (80 tokens, window 64) cut to 48 tokens would move into
 * the bucket of its first 32 tokens, which Y1 and Y2 (A's first 40 and 50)
 * fill: A goes whole.  And when the insert itself takes the bucket's last
 * place, likewise. */
Test(pool, remainder_into_a_full_bucket_goes_whole)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 12 * 256, CP_EVICT_LRU, (tweaks){ .bucket_cap = 2 });
    int32_t a[80], c[32];
    seq(a, 80, 31), seq(c, 32, 32);
    uint32_t id;
    int dd;
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 80, 0, &id, &dd), CP_OK); /* 5 blocks */
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 40, 0, &id, &dd), CP_OK); /* 3 */
    fake_time = 2;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 50, 0, &id, &dd), CP_OK); /* 4: full */
    fake_time = 3;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, c, 32, 0, &id, &dd), CP_OK);
    cr_assert(!stored(p, a, 80) && !stored(p, a, 48) && stored(p, a, 40) && stored(p, a, 50) && stored(p, c, 32));
    cr_assert_eq(p->st.truncations, 0);
    checked_free(p);

    p = make_on(be, CP_F32, 9 * 256, CP_EVICT_LRU, (tweaks){ .bucket_cap = 2 });
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 80, 0, &id, &dd), CP_OK); /* 5 blocks */
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 40, 0, &id, &dd), CP_OK); /* 3: one free */
    fake_time = 2;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 45, 0, &id, &dd), CP_OK); /* 3 blocks, into Y1's bucket */
    cr_assert(!stored(p, a, 80) && !stored(p, a, 48) && stored(p, a, 40) && stored(p, a, 45));
    cr_assert_eq(p->st.truncations, 0);
    checked_free(p); /* checks no bucket holds more than its cap */
    cp_backend_destroy(be);
}

/* windows {32, 64}: A (48 tokens, 3 blocks) cut by 2 would keep 16 tokens,
 * shorter than any window (a segment the pool would not take): A goes whole */
Test(pool, remainder_shorter_than_a_window_goes_whole)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 5 * 256, CP_EVICT_LRU, (tweaks){ .min_window = 32 });
    int32_t a[48], b[32], c[32];
    seq(a, 48, 51), seq(b, 32, 52), seq(c, 32, 53);
    uint32_t id;
    int dd;
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, a, 48, 0, &id, &dd), CP_OK);
    fake_time = 1;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, b, 32, 0, &id, &dd), CP_OK); /* full */
    fake_time = 2;
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, c, 32, 0, &id, &dd), CP_OK);
    cr_assert(!stored(p, a, 48) && !stored(p, a, 16) && stored(p, b, 32) && stored(p, c, 32));
    cr_assert(p->st.truncations == 0 && p->st.evictions_lru == 1);
    checked_free(p);
    cp_backend_destroy(be);
}

/* A purged segment whose last pin is gone but that is not reaped yet (a
 * release drops its pins under the read lock and reaps after; an insert may
 * take the write lock between): pool_make_room frees it whole, never re-keys it
 * back into the index and the dedup table.  The in-between state is made
 * by hand here. */
Test(pool, purged_segment_awaiting_reap_is_never_truncated)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 6 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    int32_t a[64], b[32], c[32];
    seq(a, 64, 61), seq(b, 32, 62), seq(c, 32, 63);
    uint32_t ia, id;
    int dd;
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_PRIVATE, a, 64, 1, &ia, &dd), CP_OK);
    fake_time = 1;
    cr_assert_eq(put(p, 2, CP_SCOPE_SHARED, b, 32, 0, &id, &dd), CP_OK); /* full */
    cp_matches m = { 0 };
    look(p, 1, 1, 0, a, 64, &m);
    cr_assert(m.n == 1);
    cr_assert_eq(cp_pool_purge(p, 1), 1);
    cp_segment *s = p->segs[ia];
    cr_assert(!s->live);
    atomic_fetch_sub(&s->refcount, 1); /* the release's first half, without its reap */
    atomic_fetch_sub(&p->pinned_blocks, s->n_blocks);
    m.pinned = 0;
    fake_time = 2;
    cr_assert_eq(put(p, 2, CP_SCOPE_SHARED, c, 32, 0, &id, &dd), CP_OK); /* 2 blocks: a would do by its tail */
    cr_assert_eq(p->st.truncations, 0, "a purged segment was truncated");
    cr_assert(!stored(p, a, 64) && !stored(p, a, 32));
    look(p, 1, 1, 0, a, 64, &m);
    cr_assert_eq(m.n, 0, "the purged tokens are found again");
    cp_pool_release(p, &m);
    cp_matches_free(&m);
    checked_free(p);
    cp_backend_destroy(be);
}

/* 511 pairs of 48-token segments, each pair sharing its first 32 tokens
 * (one key: 511 keys, 3066 blocks, full), then a 32-token insert: the
 * oldest is cut to 16 tokens under a new key while its partner keeps the
 * old one, and the insert adds its own: 513 keys, so the insert must have
 * grown the index for both (cp_pool_check: at most half full) */
Test(pool, index_stays_half_empty_across_a_truncation)
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 3066 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    int32_t t[48];
    uint32_t id;
    int dd;
    for (uint32_t i = 0; i < 511; i++) {
        seq(t, 48, 20000 + i);
        fake_time = 2 * i;
        cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, t, 48, 0, &id, &dd), CP_OK);
        seq(t + 32, 16, 90000 + i);
        fake_time = 2 * i + 1;
        cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, t, 48, 0, &id, &dd), CP_OK);
    }
    cr_assert(p->idx_n == 511 && n_free(p) == 0);
    fake_time = 5000;
    seq(t, 32, 7);
    cr_assert_eq(put(p, 1, CP_SCOPE_SHARED, t, 32, 0, &id, &dd), CP_OK);
    cr_assert(p->st.truncations == 1 && p->idx_n == 513, "truncations %llu, %zu keys", (unsigned long long)p->st.truncations, p->idx_n);
    checked_free(p);
    cp_backend_destroy(be);
}

/* ---- zeroing ------------------------------------------------------------------------ */

typedef struct spy {
    cp_backend be; /* first: the pool calls through this copy */
    cp_backend *cpu;
    const float *slab;
    size_t slab_floats;
} spy;

static cp_status spy_alloc(cp_backend *be, size_t bytes, void **out, cp_error *err)
{
    spy *s = (spy *)be;
    cp_status rc = s->cpu->alloc(s->cpu, bytes, out, err);
    if (rc == CP_OK) s->slab = *out, s->slab_floats = bytes / sizeof(float);
    return rc;
}

/* floats of the slab that hold one of these tokens' K (token) or V (-token) value */
static size_t count_tokens(const spy *s, const int32_t *t, uint32_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < s->slab_floats; i++)
        for (uint32_t j = 0; j < n; j++) c += s->slab[i] == (float)t[j] || s->slab[i] == -(float)t[j]; /* K row, V row */
    return c;
}

/* A private 64-token segment cut by 2 blocks: its last 32 tokens' KV is
 * gone from the slab (the insert that took the blocks wrote nothing) */
Test(pool, truncated_private_tail_is_zeroed)
{
    spy sp;
    cp_error err = { 0 };
    memset(&sp, 0, sizeof sp);
    cr_assert_eq(cp_backend_cpu_create(&sp.cpu, &err), CP_OK);
    sp.be = *sp.cpu;
    sp.be.alloc = spy_alloc;
    cp_pool *p = make_on(&sp.be, CP_F32, 5 * 256, CP_EVICT_LRU, (tweaks){ 0 });
    int32_t a[64], c[32];
    for (int i = 0; i < 64; i++) a[i] = 30000 + i; /* values nothing else in the slab takes */
    seq(c, 32, 41);
    uint32_t id;
    int dd;
    fake_time = 0;
    cr_assert_eq(put(p, 1, CP_SCOPE_PRIVATE, a, 64, 1, &id, &dd), CP_OK);
    cr_assert_eq(count_tokens(&sp, a + 32, 32), 2 * 32, "the instrument does not see the tail's KV (K and V rows)");
    fake_time = 1;
    cr_assert_eq(put(p, 2, CP_SCOPE_SHARED, c, 32, 0, &id, &dd), CP_OK); /* 1 free, needs 2: a gives 1 */
    fake_time = 2;
    cr_assert_eq(put(p, 2, CP_SCOPE_SHARED, c + 16, 16, 0, &id, &dd), CP_OK); /* a gives another */
    cr_assert(stored(p, a, 32) && p->st.truncations == 2);
    cr_assert_eq(count_tokens(&sp, a + 32, 32), 0, "a truncated private tail left its KV in the slab");
    cr_assert_eq(count_tokens(&sp, a, 32), 2 * 32, "the kept prefix lost KV");
    checked_free(p);
    cp_backend_destroy(sp.cpu);
}

/* ---- random simulation --------------------------------------------------------------- */

/* 20 000 operations on a 120-block pool: inserts of prefixes of 40 base
 * sequences (so truncated remainders meet stored prefixes), lookups held
 * as pins, releases, purges.  Every served match must be the request's
 * tokens with the KV kv_of gave them at insert; every 500 operations the
 * pool's own check (blocks owned once, bytes, heap, index, dedup and each
 * segment's identity). */
Test(pool, tail_eviction_random_simulation_serves_the_inserted_kv, .timeout = TEST_TIMEOUT(60))
{
    cp_backend *be = cpu();
    cp_pool *p = make_on(be, CP_F32, 120 * 256, CP_EVICT_GDSF, (tweaks){ .bucket_cap = 4 });
    enum { N_BASE = 40, L = 200 };
    static int32_t base[N_BASE][L];
    for (int i = 0; i < N_BASE; i++) seq(base[i], L, 900 + (uint32_t)i);
    cp_matches held[6] = { { 0 } };
    int32_t req[700];
    uint32_t r = 4242;
    cp_error err = { 0 };
    size_t served = 0;
    for (int op = 0; op < 20000; op++) {
        r = r * 1103515245u + 12345u;
        uint32_t x = r >> 8, tenant = x / 64 % 3;
        switch (x % 5) {
        case 0:
        case 1: {
            uint32_t b = x / 8 % N_BASE, len = 16 + x / 512 % (L - 15), id;
            int dd;
            cp_status rc = put(p, tenant, (x >> 4) & 1 ? CP_SCOPE_SHARED : CP_SCOPE_PRIVATE, base[b], len, 1, &id, &dd);
            cr_assert(rc == CP_OK || rc == CP_ERANGE, "insert: %s", cp_status_name(rc));
            break;
        }
        case 2:
        case 3: {
            size_t n = 0;
            while (n + L < sizeof req / sizeof req[0]) {
                uint32_t b = (r = r * 1103515245u + 12345u) >> 8;
                memcpy(req + n, base[b % N_BASE], L * sizeof(int32_t));
                n += 20 + b / 64 % 180;
            }
            int slot = (int)(x / 8 % 6), priv = (x >> 4) & 1;
            cp_pool_release(p, &held[slot]);
            look(p, tenant, priv, 0, req, n, &held[slot]);
            for (size_t i = 0; i < held[slot].n; i++) {
                const cp_match *mt = &held[slot].v[i];
                const cp_segment *sg = cp_pool_segment(p, &held[slot], i);
                cr_assert(sg && mt->len <= sg->len && mt->pos + mt->len <= n);
                cr_assert(priv ? sg->scope == CP_SCOPE_PRIVATE && sg->tenant == tenant : sg->scope == CP_SCOPE_SHARED);
                for (uint32_t t = 0; t < mt->len; t++) {
                    const float *kr = cp_pool_kv_row(p, sg, 0, 0, t), *vr = cp_pool_kv_row(p, sg, 0, 1, t);
                    int32_t tok = req[mt->pos + t];
                    cr_assert(sg->tokens[t] == tok && kr[0] == (float)tok && kr[1] == (float)t && vr[0] == (float)t && vr[1] == -(float)tok,
                              "op %d: match %zu token %u serves the wrong KV", op, i, t);
                }
                served += mt->len;
            }
            break;
        }
        case 4:
            if (x / 8 % 50 == 0) cp_pool_purge(p, tenant); /* pinned ones die at their release */
            else {
                cp_pool_release(p, &held[x / 8 % 6]);
                held[x / 8 % 6].n = 0;
            }
            break;
        }
        if (op % 500 == 0) cr_assert_eq(cp_pool_check(p, &err), CP_OK, "after op %d: %s", op, err.msg);
    }
    for (int i = 0; i < 6; i++) {
        cp_pool_release(p, &held[i]);
        cp_matches_free(&held[i]);
    }
    cp_pool_stats st;
    cp_pool_stats_get(p, &st);
    cr_assert(st.truncations > 100, "the simulation truncated only %llu times", (unsigned long long)st.truncations);
    cr_assert(served > 10000, "the simulation served only %zu tokens", served);
    checked_free(p);
    cp_backend_destroy(be);
}
