/* KV pool and retriever: invariants under random operations, eviction
 * policies, pins, dedup, quotas, TTL, every kind of match, sensitive tokens,
 * forced hash collisions, flooded buckets, and threads; and the pool's own
 * privacy checks: sensitive tokens refused in shared segments, private
 * segments for their owner only, private bytes zeroed when they go. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../pool/pool.h"
#include "../pool/pool_internal.h" /* the lock, for the test that lookups never need it exclusively */
#include "helpers.h"

static const uint8_t NO_SENS[1024]; /* a shared insert's mask: nothing sensitive */

static double fake_time;
static double fake_clock(void *ctx)
{
    (void)ctx;
    return fake_time;
}

static const uint8_t FP[32] = { 1, 2, 3, 4, 5 };

typedef struct fixture {
    cp_backend *be;
    cp_pool *p;
} fixture;

/* 1 layer x 1 kv head x head_dim 2, f32, 16 tokens a block: 256 bytes a block */
static fixture make_pool_on(cp_backend *be, size_t blocks, cp_evict_policy pol, void (*tweak)(cp_pool_opts *))
{
    fixture f;
    cp_error err = { 0 };
    f.be = be;
    cp_kv_layout l = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 2, .dtype = CP_F32, .block_tokens = 16 };
    memcpy(l.fingerprint, FP, 32);
    cp_pool_opts o;
    cp_pool_opts_default(&o);
    o.budget_bytes = blocks * cp_kv_block_bytes(&l);
    o.policy = pol;
    o.clock = fake_clock;
    if (tweak) tweak(&o);
    cr_assert_eq(cp_pool_create(&l, f.be, &o, &f.p, &err), CP_OK, "%s", err.msg);
    return f;
}

static fixture make_pool(size_t blocks, cp_evict_policy pol, void (*tweak)(cp_pool_opts *))
{
    cp_backend *be;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK);
    return make_pool_on(be, blocks, pol, tweak);
}

static void drop_pool_only(fixture *f)
{
    cp_error err = { 0 };
    cr_assert_eq(cp_pool_check(f->p, &err), CP_OK, "%s", err.msg);
    cp_pool_free(f->p);
}

static void drop_pool(fixture *f)
{
    drop_pool_only(f);
    cp_backend_destroy(f->be);
}

static void seq(int32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % 50000);
    }
}

static cp_status put(fixture *f, uint32_t tenant, cp_scope sc, const int32_t *t, uint32_t n, uint32_t *id, int *dd)
{
    cp_error err = { 0 };
    cp_insert in = { .tenant = tenant, .scope = sc, .fingerprint = FP, .tokens = t, .len = n, .sensitive = NO_SENS };
    return cp_pool_insert(f->p, &in, id, dd, &err);
}

/* is this exact sequence stored, in any scope?  Reads the segment table
 * directly (single-threaded tests): unlike a lookup, it touches nothing, so
 * it does not change what is evicted next.  (Ids are reused after an
 * eviction, so an id alone does not say a segment is still there.) */
static int stored(fixture *f, const int32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < f->p->n_segs; i++) {
        const cp_segment *s = f->p->segs[i];
        if (s && s->len == n && memcmp(s->tokens, t, n * sizeof *t) == 0) return 1;
    }
    return 0;
}

/* is this exact sequence stored (shared)? */
static int present(fixture *f, const int32_t *t, uint32_t n)
{
    cp_error err = { 0 };
    cp_matches m = { 0 };
    cp_lookup q = { .tenant = 0, .fingerprint = FP, .tokens = t, .n = n };
    cr_assert_eq(cp_pool_lookup(f->p, &q, &m, &err), CP_OK);
    int yes = m.n == 1 && m.v[0].len == n;
    cp_pool_release(f->p, &m);
    cp_matches_free(&m);
    return yes;
}

static void look(fixture *f, uint32_t tenant, int priv, const int32_t *t, size_t n, const uint8_t *sens, cp_matches *m)
{
    cp_error err = { 0 };
    cp_lookup q = { .tenant = tenant, .fingerprint = FP, .tokens = t, .n = n, .sensitive = sens, .private_only = priv };
    cr_assert_eq(cp_pool_lookup(f->p, &q, m, &err), CP_OK, "%s", err.msg);
}

Test(pool, retriever_finds_planted_segments_everywhere)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    int32_t a[40], b[20], c[70], req[400];
    seq(a, 40, 1), seq(b, 20, 2), seq(c, 70, 3);
    uint32_t ia, ib, ic;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, a, 40, &ia, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, b, 20, &ib, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, c, 70, &ic, &dd), CP_OK);
    /* request: a at 0, b adjacent, noise, c, a again at the very end */
    seq(req, 400, 99);
    size_t n = 0;
    memcpy(req, a, sizeof a), n = 40;
    memcpy(req + n, b, sizeof b), n += 20;
    n += 30;
    size_t c_at = n;
    memcpy(req + n, c, sizeof c), n += 70;
    n += 11;
    size_t a2 = n;
    memcpy(req + n, a, sizeof a), n += 40;
    cp_matches m = { 0 };
    look(&f, 7, 0, req, n, NULL, &m);
    cr_assert_eq(m.n, 4, "found %zu matches", m.n);
    cp_match want[] = { { 0, 40, ia }, { 40, 20, ib }, { (uint32_t)c_at, 70, ic }, { (uint32_t)a2, 40, ia } };
    for (int i = 0; i < 4; i++)
        cr_assert(m.v[i].pos == want[i].pos && m.v[i].len == want[i].len && m.v[i].seg == want[i].seg,
                  "match %d: pos %u len %u seg %u", i, m.v[i].pos, m.v[i].len, m.v[i].seg);
    cr_assert_eq(cp_pool_pins(f.p, ia), 2); /* pinned twice: two matches */
    cp_pool_release(f.p, &m);
    cr_assert_eq(cp_pool_pins(f.p, ia), 0);
    cp_pool_release(f.p, &m); /* a second release does nothing */
    cr_assert_eq(cp_pool_pins(f.p, ia), 0);
    /* every prefix length >= w (c is indexed by its first 64 tokens) is a prefix hit */
    for (uint32_t k = 64; k < 70; k++) {
        memcpy(req, c, k * sizeof(int32_t));
        req[k] = -5; /* no token id matches this */
        look(&f, 7, 0, req, k + 1, NULL, &m);
        cr_assert(m.n == 1 && m.v[0].pos == 0 && m.v[0].len == k && m.v[0].seg == ic, "prefix %u: %zu matches", k, m.n);
        cp_pool_release(f.p, &m);
    }
    /* shorter than the smallest window: nothing */
    look(&f, 7, 0, c, 15, NULL, &m);
    cr_assert_eq(m.n, 0);
    cp_matches_free(&m);
    drop_pool(&f);
}

Test(pool, overlapping_candidates_cover_the_most)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    /* x = 0..59, y = x[40..] + more: the best cover cuts x at 40 and takes y */
    int32_t x[60], y[80], req[200];
    seq(req, 200, 5);
    memcpy(x, req, sizeof x);
    memcpy(y, req + 40, sizeof y);
    uint32_t ix, iy;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, x, 60, &ix, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, y, 80, &iy, &dd), CP_OK);
    cp_matches m = { 0 };
    look(&f, 1, 0, req, 120, NULL, &m);
    cr_assert_eq(m.n, 2);
    cr_assert(m.v[0].pos == 0 && m.v[0].len == 40 && m.v[0].seg == ix, "first: %u+%u", m.v[0].pos, m.v[0].len);
    cr_assert(m.v[1].pos == 40 && m.v[1].len == 80 && m.v[1].seg == iy);
    cp_pool_release(f.p, &m);
    cp_matches_free(&m);
    drop_pool(&f);
}

Test(pool, never_matches_across_a_sensitive_token)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    int32_t s[100];
    seq(s, 100, 11);
    uint32_t id;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s, 100, &id, &dd), CP_OK);
    uint8_t sens[100] = { 0 };
    cp_matches m = { 0 };
    for (int at = 0; at < 100; at += 7) {
        memset(sens, 0, sizeof sens);
        sens[at] = 1;
        look(&f, 1, 0, s, 100, sens, &m);
        /* a match may only be the part before the sensitive token, if it
         * holds the segment's whole index window (64 tokens) */
        if (at >= 64) cr_assert(m.n == 1 && m.v[0].pos == 0 && m.v[0].len == (uint32_t)at, "at %d", at);
        else cr_assert_eq(m.n, 0, "sensitive at %d still matched", at);
        for (size_t i = 0; i < m.n; i++) cr_assert(m.v[i].pos + m.v[i].len <= (uint32_t)at || m.v[i].pos > (uint32_t)at);
        cp_pool_release(f.p, &m);
    }
    /* changing the sensitive token's value changes nothing */
    int32_t other[100];
    memcpy(other, s, sizeof s);
    memset(sens, 0, sizeof sens);
    sens[80] = 1;
    cp_matches m2 = { 0 };
    look(&f, 1, 0, s, 100, sens, &m);
    other[80] = 12345678;
    look(&f, 1, 0, other, 100, sens, &m2);
    cr_assert(m.n == m2.n && m.n == 1 && m.v[0].len == m2.v[0].len);
    cp_pool_release(f.p, &m);
    cp_pool_release(f.p, &m2);
    cp_matches_free(&m), cp_matches_free(&m2);
    drop_pool(&f);
}

static void weak(cp_pool_opts *o) { o->weak_hash_mod = 7; }

Test(pool, hash_collisions_are_rejected_by_verification)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, weak);
    /* with a modulus of 7 almost everything collides */
    int32_t s[32], r[32];
    seq(s, 32, 21);
    seq(r, 32, 22);
    uint32_t id;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s, 32, &id, &dd), CP_OK);
    cp_matches m = { 0 };
    int fooled = 0;
    for (uint32_t k = 0; k < 200; k++) {
        seq(r, 32, 1000 + k);
        look(&f, 1, 0, r, 32, NULL, &m);
        for (size_t i = 0; i < m.n; i++) /* whatever is returned is real */
            fooled |= memcmp(r + m.v[i].pos, s, m.v[i].len * sizeof(int32_t)) != 0;
        cp_pool_release(f.p, &m);
    }
    cr_assert(!fooled, "a collision was served");
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert_gt(st.verify_failures, 0, "the weak hash never collided: the test proves nothing");
    look(&f, 1, 0, s, 32, NULL, &m); /* the real one still matches */
    cr_assert(m.n == 1 && m.v[0].len == 32);
    cp_pool_release(f.p, &m);
    cp_matches_free(&m);
    drop_pool(&f);
}

Test(pool, flooded_bucket_stays_capped)
{
    fixture f = make_pool(40000, CP_EVICT_LRU, NULL);
    int32_t t[20];
    seq(t, 20, 77);
    int dd;
    uint32_t id;
    for (uint32_t k = 0; k < 10000; k++) { /* same first 16 tokens, different tails */
        t[16] = (int32_t)k, t[17] = (int32_t)(k >> 8);
        cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, t, 20, &id, &dd), CP_OK);
    }
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert_leq(st.segments, CP_POOL_BUCKET_CAP, "%zu segments behind one key", st.segments);
    cr_assert_eq(st.evictions_bucket, 10000 - st.segments);
    cp_matches m = { 0 };
    look(&f, 1, 0, t, 20, NULL, &m); /* the newest is there */
    cr_assert(m.n == 1 && m.v[0].len == 20);
    cp_pool_release(f.p, &m);
    cp_matches_free(&m);
    drop_pool(&f);
}

Test(pool, scopes_dedup_and_fingerprint)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    int32_t s[32];
    seq(s, 32, 8);
    uint32_t a, b, c, d;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_PRIVATE, s, 32, &a, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_PRIVATE, s, 32, &b, &dd), CP_OK);
    cr_assert(dd && a == b, "same tenant, same tokens: stored once");
    cr_assert_eq(put(&f, 2, CP_SCOPE_PRIVATE, s, 32, &c, &dd), CP_OK);
    cr_assert(!dd && c != a, "another tenant's private copy is its own");
    cr_assert_eq(put(&f, 3, CP_SCOPE_SHARED, s, 32, &d, &dd), CP_OK);
    cr_assert(!dd);
    cp_matches m = { 0 };
    look(&f, 2, 1, s, 32, NULL, &m); /* tenant 2's private pass sees only its own */
    cr_assert(m.n == 1 && m.v[0].seg == c);
    cp_pool_release(f.p, &m);
    look(&f, 9, 1, s, 32, NULL, &m); /* a stranger's private pass: nothing */
    cr_assert_eq(m.n, 0);
    look(&f, 9, 0, s, 32, NULL, &m); /* the shared pass: the shared copy */
    cr_assert(m.n == 1 && m.v[0].seg == d);
    cp_pool_release(f.p, &m);
    cp_matches_free(&m);
    uint8_t other[32] = { 9 };
    cp_error err = { 0 };
    cp_insert in = { .tenant = 1, .scope = CP_SCOPE_SHARED, .fingerprint = other, .tokens = s, .len = 32 };
    cr_assert_eq(cp_pool_insert(f.p, &in, &a, &dd, &err), CP_EINVAL);
    cp_lookup q = { .tenant = 1, .fingerprint = other, .tokens = s, .n = 32 };
    cr_assert_eq(cp_pool_lookup(f.p, &q, &m, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "fingerprint"), "%s", err.msg);
    drop_pool(&f);
}

/* budget of 6 blocks: three 32-token (2-block) segments */
Test(pool, lru_evicts_least_recently_used_and_never_pinned)
{
    fixture f = make_pool(6, CP_EVICT_LRU, NULL);
    int32_t s[4][32];
    uint32_t id[4];
    int dd;
    for (int i = 0; i < 4; i++) seq(s[i], 32, 40 + (uint32_t)i);
    for (int i = 0; i < 3; i++) {
        fake_time = i;
        cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s[i], 32, &id[i], &dd), CP_OK);
    }
    cp_matches m = { 0 };
    fake_time = 10;
    look(&f, 1, 0, s[0], 32, NULL, &m); /* 0 is now the most recent; keep it pinned */
    fake_time = 11;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s[3], 32, &id[3], &dd), CP_OK);
    cr_assert(!present(&f, s[1], 32), "segment 1 (least recently used) should be gone");
    cr_assert(present(&f, s[2], 32) && present(&f, s[0], 32) && present(&f, s[3], 32));
    /* everything else pinned too: a new insert is refused, nothing pinned goes */
    cp_matches m2 = { 0 }, m3 = { 0 };
    look(&f, 1, 0, s[2], 32, NULL, &m2);
    look(&f, 1, 0, s[3], 32, NULL, &m3);
    int32_t extra[32];
    seq(extra, 32, 999);
    uint32_t ie;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, extra, 32, &ie, &dd), CP_ERANGE);
    cr_assert(present(&f, s[0], 32) && present(&f, s[2], 32) && present(&f, s[3], 32));
    cp_pool_release(f.p, &m), cp_pool_release(f.p, &m2), cp_pool_release(f.p, &m3);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, extra, 32, &ie, &dd), CP_OK);
    cp_matches_free(&m), cp_matches_free(&m2), cp_matches_free(&m3);
    drop_pool(&f);
}

Test(pool, gdsf_keeps_the_valuable)
{
    fixture f = make_pool(6, CP_EVICT_GDSF, NULL);
    int32_t s[4][32];
    uint32_t id[4];
    int dd;
    for (int i = 0; i < 4; i++) seq(s[i], 32, 60 + (uint32_t)i);
    for (int i = 0; i < 3; i++) cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s[i], 32, &id[i], &dd), CP_OK);
    cp_matches m = { 0 };
    for (int k = 0; k < 5; k++) { /* 0 is hit often, 2 once, 1 never (though it is newer than 0) */
        look(&f, 1, 0, s[0], 32, NULL, &m);
        cp_pool_release(f.p, &m);
    }
    look(&f, 1, 0, s[2], 32, NULL, &m);
    cp_pool_release(f.p, &m);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s[3], 32, &id[3], &dd), CP_OK);
    cr_assert(!present(&f, s[1], 32), "the never-hit segment goes first");
    cr_assert(present(&f, s[0], 32) && present(&f, s[2], 32) && present(&f, s[3], 32));
    cp_matches_free(&m);
    drop_pool(&f);
}

static void quota(cp_pool_opts *o)
{
    o->quota_segments = 2;
    o->quota_window_s = 60;
    o->ttl_s = 100;
}

Test(pool, quotas_per_tenant_and_ttl)
{
    fake_time = 0;
    fixture f = make_pool(4096, CP_EVICT_LRU, quota);
    int32_t s[5][32];
    uint32_t id;
    int dd;
    for (int i = 0; i < 5; i++) seq(s[i], 32, 80 + (uint32_t)i);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s[0], 32, &id, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s[1], 32, &id, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s[2], 32, &id, &dd), CP_ERANGE, "tenant 1 is over quota");
    cr_assert_eq(put(&f, 2, CP_SCOPE_SHARED, s[2], 32, &id, &dd), CP_OK, "tenant 2 is not");
    fake_time = 61;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s[3], 32, &id, &dd), CP_OK, "a new window");
    cp_tenant_stats ts;
    cr_assert(cp_pool_tenant_stats(f.p, 1, &ts));
    cr_assert(ts.inserts == 3 && ts.insert_refusals == 1);
    fake_time = 150; /* the first three are idle for > 100 s, the fourth for 89 */
    cr_assert_eq(cp_pool_expire(f.p), 3);
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert(st.segments == 1 && st.evictions_ttl == 3 && st.quota_refusals == 1);
    drop_pool(&f);
}

/* 100 000 random operations with a small budget; invariants checked all
 * along (blocks, bytes, refcounts, heap, index). */
Test(pool, random_operations_keep_invariants, .timeout = TEST_TIMEOUT(120))
{
    fixture f = make_pool(200, CP_EVICT_GDSF, NULL);
    enum { N_BASE = 64 };
    static int32_t base[N_BASE][160];
    for (int i = 0; i < N_BASE; i++) seq(base[i], 160, 500 + (uint32_t)i);
    cp_matches held[8] = { { 0 } };
    uint32_t r = 12345;
    cp_error err = { 0 };
    int32_t req[600];
    uint8_t sens[600];
    for (int op = 0; op < 100000; op++) {
        r = r * 1103515245u + 12345u;
        uint32_t x = r >> 8;
        switch (x % 4) {
        case 0: { /* insert a slice of a base sequence */
            uint32_t b = x / 4 % N_BASE, len = 16 + x / 256 % 140, id;
            int dd;
            cp_status rc = put(&f, x / 64 % 5, (x >> 3) & 1 ? CP_SCOPE_SHARED : CP_SCOPE_PRIVATE, base[b], len, &id, &dd);
            cr_assert(rc == CP_OK || rc == CP_ERANGE, "insert: %s", cp_status_name(rc));
            break;
        }
        case 1:
        case 2: { /* a lookup, held in a slot (pinning) until the slot is reused */
            size_t n = 0;
            while (n + 160 < sizeof req / sizeof req[0]) {
                uint32_t b = (r = r * 1103515245u + 12345u) >> 8;
                memcpy(req + n, base[b % N_BASE], 160 * sizeof(int32_t));
                n += 40 + b / 64 % 120;
            }
            for (size_t i = 0; i < n; i++) sens[i] = (r >> (i % 24)) % 97 == 0;
            cp_matches *m = &held[x / 4 % 8];
            cp_pool_release(f.p, m);
            look(&f, x / 64 % 5, (x >> 3) & 1, req, n, sens, m);
            for (size_t i = 0; i < m->n; i++) {
                cr_assert_leq(m->v[i].pos + m->v[i].len, n);
                for (uint32_t k = 0; k < m->v[i].len; k++) cr_assert(!sens[m->v[i].pos + k], "matched a sensitive token");
                if (i) cr_assert_geq(m->v[i].pos, m->v[i - 1].pos + m->v[i - 1].len, "overlapping matches");
            }
            break;
        }
        case 3: /* release one slot */
            cp_pool_release(f.p, &held[x / 4 % 8]);
            held[x / 4 % 8].n = 0;
            break;
        }
        if (op % 5000 == 0) cr_assert_eq(cp_pool_check(f.p, &err), CP_OK, "after op %d: %s", op, err.msg);
    }
    for (int i = 0; i < 8; i++) {
        cp_pool_release(f.p, &held[i]);
        cp_matches_free(&held[i]);
    }
    drop_pool(&f);
}

typedef struct thread_arg {
    fixture *f;
    int id;
} thread_arg;

static void *worker(void *argp)
{
    thread_arg *a = argp;
    int32_t s[64], req[256];
    cp_matches m = { 0 };
    cp_error err = { 0 };
    for (int k = 0; k < 400; k++) {
        seq(s, 64, (uint32_t)(a->id * 1000 + k % 50));
        uint32_t id;
        int dd;
        cp_insert in = { .tenant = (uint32_t)a->id, .scope = CP_SCOPE_SHARED, .fingerprint = FP, .tokens = s, .len = 64, .sensitive = NO_SENS };
        cp_status rc = cp_pool_insert(a->f->p, &in, &id, &dd, &err);
        if (rc != CP_OK && rc != CP_ERANGE) return (void *)1;
        memcpy(req, s, sizeof s);
        seq(req + 64, 192, (uint32_t)k);
        cp_lookup q = { .tenant = (uint32_t)a->id, .fingerprint = FP, .tokens = req, .n = 256 };
        if (cp_pool_lookup(a->f->p, &q, &m, &err) != CP_OK) return (void *)1;
        for (size_t i = 0; i < m.n; i++) {
            const cp_segment *sg = cp_pool_segment(a->f->p, &m, i);
            if (!sg || memcmp(sg->tokens, req + m.v[i].pos, m.v[i].len * sizeof(int32_t)) != 0) return (void *)1;
        }
        cp_pool_release(a->f->p, &m);
    }
    cp_matches_free(&m);
    return NULL;
}

Test(pool, eight_threads_lookups_and_inserts)
{
    fixture f = make_pool(300, CP_EVICT_LRU, NULL);
    pthread_t th[8];
    thread_arg args[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (thread_arg){ &f, i };
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    for (int i = 0; i < 8; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        cr_assert_null(ret, "thread %d saw a wrong match or an error", i);
    }
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert_gt(st.hit_segments, 0);
    /* lookups count by atomics under the shared lock: none lost */
    cr_assert_eq(st.lookups, 8 * 400, "%llu lookups counted", (unsigned long long)st.lookups);
    for (uint32_t i = 0; i < 8; i++) {
        cp_tenant_stats ts;
        cr_assert(cp_pool_tenant_stats(f.p, i, &ts));
        cr_assert_eq(ts.lookups, 400, "tenant %u: %llu lookups", i, (unsigned long long)ts.lookups);
    }
    drop_pool(&f);
}

Test(pool, kv_round_trip_through_blocks)
{
    fixture f = make_pool(64, CP_EVICT_LRU, NULL);
    /* K and V for 40 tokens: values encode (layer, kv, token, element) */
    float k[40 * 2], v[40 * 2];
    for (int t = 0; t < 40; t++)
        for (int e = 0; e < 2; e++) k[t * 2 + e] = (float)(t * 10 + e), v[t * 2 + e] = (float)(-t * 10 - e);
    const void *ks[1] = { k }, *vs[1] = { v };
    cp_kv_source src = { ks, vs, 2 };
    int32_t s[40];
    seq(s, 40, 3);
    cp_error err = { 0 };
    cp_insert in = { .tenant = 1, .scope = CP_SCOPE_SHARED, .fingerprint = FP, .tokens = s, .len = 40, .start_pos = 7, .kv = &src,
                     .sensitive = NO_SENS };
    uint32_t id;
    int dd;
    cr_assert_eq(cp_pool_insert(f.p, &in, &id, &dd, &err), CP_OK, "%s", err.msg);
    cp_matches m = { 0 };
    look(&f, 2, 0, s, 40, NULL, &m);
    cr_assert(m.n == 1 && m.v[0].seg == id);
    const cp_segment *sg = cp_pool_segment(f.p, &m, 0);
    cr_assert_not_null(sg);
    cr_assert_eq(sg->start_pos, 7);
    cr_assert_eq(sg->n_blocks, 3);
    for (uint32_t t = 0; t < 40; t++) {
        const float *kr = cp_pool_kv_row(f.p, sg, 0, 0, t), *vr = cp_pool_kv_row(f.p, sg, 0, 1, t);
        cr_assert(kr[0] == t * 10.0f && kr[1] == t * 10.0f + 1 && vr[0] == -(t * 10.0f) && vr[1] == -(t * 10.0f) - 1, "token %u", t);
    }
    cp_pool_release(f.p, &m);
    cp_matches_free(&m);
    drop_pool(&f);
}

/* ---- promises the pool keeps by itself ------------------------------------ */

/* A prefix hit is served only if its token ids equal the segment's: with a
 * modulus of 7 most windows of random requests collide with the stored
 * segment's key and its prefix hashes, and every such candidate is a prefix
 * hit (the requests are shorter than the segment), so token ids are all that
 * stands between them and another segment's KV. */
Test(pool, prefix_hit_with_a_colliding_hash_is_rejected)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, weak);
    int32_t s[100], r[80];
    seq(s, 100, 31);
    uint32_t id;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s, 100, &id, &dd), CP_OK); /* indexed by its first 64 tokens */
    cp_matches m = { 0 };
    int fooled = 0;
    for (uint32_t k = 0; k < 200; k++) {
        seq(r, 80, 3000 + k);
        look(&f, 1, 0, r, 80, NULL, &m);
        for (size_t i = 0; i < m.n; i++) fooled |= m.v[i].len >= 100 || memcmp(r + m.v[i].pos, s, m.v[i].len * sizeof(int32_t)) != 0;
        cp_pool_release(f.p, &m);
    }
    cr_assert(!fooled, "a prefix hit with equal hashes but other token ids was served");
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert_gt(st.verify_failures, 0, "no prefix candidate collided: the test proves nothing");
    look(&f, 1, 0, s, 70, NULL, &m); /* a true prefix still hits */
    cr_assert(m.n == 1 && m.v[0].pos == 0 && m.v[0].len == 70 && m.v[0].seg == id);
    cp_pool_release(f.p, &m);
    cp_matches_free(&m);
    drop_pool(&f);
}

static void ttl100(cp_pool_opts *o) { o->ttl_s = 100; }

Test(pool, ttl_expiry_skips_pinned_segments)
{
    fake_time = 0;
    fixture f = make_pool(64, CP_EVICT_LRU, ttl100);
    int32_t a[32], b[32], c[32];
    seq(a, 32, 1), seq(b, 32, 2), seq(c, 32, 3);
    uint32_t ia, ib, ic;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, a, 32, &ia, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, b, 32, &ib, &dd), CP_OK);
    cp_matches m = { 0 };
    look(&f, 2, 0, a, 32, NULL, &m); /* a request is using a */
    cr_assert(m.n == 1 && m.v[0].seg == ia);
    fake_time = 150; /* both idle for 150 s > 100 */
    cr_assert_eq(cp_pool_expire(f.p), 1, "only the unpinned one expires");
    cr_assert(stored(&f, a, 32) && !stored(&f, b, 32));
    cr_assert_not_null(cp_pool_segment(f.p, &m, 0));
    fake_time = 300; /* an insert runs the expiry too */
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, c, 32, &ic, &dd), CP_OK);
    cr_assert(stored(&f, a, 32), "an insert's expiry pass freed a pinned segment");
    cp_pool_release(f.p, &m);
    fake_time = 301;
    cr_assert_eq(cp_pool_expire(f.p), 1, "released, it expires");
    cr_assert(!stored(&f, a, 32) && stored(&f, c, 32));
    cp_matches_free(&m);
    drop_pool(&f);
}

/* 16 segments behind one index key; 15 pinned (and the least recently
 * used), the 16th touched last: a 17th insert evicts the 16th, never a
 * pinned one. */
Test(pool, full_bucket_evicts_only_an_unpinned_member)
{
    fake_time = 0;
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    int32_t t[17][20];
    uint32_t id[17];
    int dd;
    for (int k = 0; k < 17; k++) {
        seq(t[k], 20, 77); /* the same first 16 tokens */
        for (int j = 16; j < 20; j++) t[k][j] = 100000 + k * 4 + j;
    }
    for (int k = 0; k < 16; k++) {
        fake_time = k;
        cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, t[k], 20, &id[k], &dd), CP_OK);
    }
    cp_matches m[16] = { { 0 } };
    fake_time = 20;
    for (int k = 0; k < 15; k++) {
        look(&f, 1, 0, t[k], 20, NULL, &m[k]);
        cr_assert(m[k].n == 1 && m[k].v[0].seg == id[k] && m[k].v[0].len == 20);
    }
    fake_time = 100;
    look(&f, 1, 0, t[15], 20, NULL, &m[15]);
    cp_pool_release(f.p, &m[15]);
    fake_time = 101;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, t[16], 20, &id[16], &dd), CP_OK);
    for (int k = 0; k < 15; k++) cr_assert(stored(&f, t[k], 20) && cp_pool_pins(f.p, id[k]) == 1, "pinned segment %d was evicted from its bucket", k);
    cr_assert(!stored(&f, t[15], 20) && stored(&f, t[16], 20), "the unpinned member should have given way");
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert_eq(st.evictions_bucket, 1);
    for (int k = 0; k < 16; k++) {
        cp_pool_release(f.p, &m[k]);
        cp_matches_free(&m[k]);
    }
    drop_pool(&f);
}

/* GDSF, 256-byte blocks of 16 tokens.  Size: a 16-token segment fills its
 * block (16 tokens / 256 bytes), a 17-token one wastes most of its second
 * (17 / 512): with the size term the 17-token one goes first; counting
 * tokens alone (no size) would keep it and evict the 16-token one. */
Test(pool, gdsf_victim_depends_on_size)
{
    fixture f = make_pool(3, CP_EVICT_GDSF, NULL);
    int32_t a[16], b[17], c[16];
    seq(a, 16, 1), seq(b, 17, 2), seq(c, 16, 3);
    uint32_t ia, ib, ic;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, a, 16, &ia, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, b, 17, &ib, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, c, 16, &ic, &dd), CP_OK); /* needs one block */
    cr_assert(stored(&f, a, 16) && !stored(&f, b, 17) && stored(&f, c, 16), "the segment with the fewest tokens per byte goes");
    drop_pool(&f);
}

/* Clock: x is hit 3 times (priority 4 units), then never again, while one
 * new, never-hit segment after another is inserted (1 unit above the clock
 * each).  The clock rises with each eviction, so after a few rounds the new
 * ones are worth more than x's old hits and x goes.  Without the clock (or
 * without raising it) x would stay forever and the new ones would evict
 * each other. */
Test(pool, gdsf_victim_depends_on_the_clock)
{
    fixture f = make_pool(4, CP_EVICT_GDSF, NULL);
    int32_t x[16], y[16];
    seq(x, 16, 5);
    uint32_t ix, iy;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, x, 16, &ix, &dd), CP_OK);
    cp_matches m = { 0 };
    for (int k = 0; k < 3; k++) {
        look(&f, 1, 0, x, 16, NULL, &m);
        cp_pool_release(f.p, &m);
    }
    for (uint32_t k = 0; k < 4; k++) { /* fills the pool, then one eviction */
        seq(y, 16, 100 + k);
        cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, y, 16, &iy, &dd), CP_OK);
    }
    cr_assert(stored(&f, x, 16), "x's hits should outweigh a fresh segment at first");
    for (uint32_t k = 4; k < 16; k++) {
        seq(y, 16, 100 + k);
        cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, y, 16, &iy, &dd), CP_OK);
    }
    cr_assert(!stored(&f, x, 16), "the inflation clock should have aged x out");
    cp_matches_free(&m);
    drop_pool(&f);
}

/* ---- zeroing: a CPU backend that lets the test read the slab ---------------- */

typedef struct spy {
    cp_backend be; /* first: the pool calls through this copy */
    cp_backend *cpu;
    const float *slab; /* the pool's one allocation */
    size_t slab_floats;
    size_t priv_at_free, shared_at_free; /* canaries still in the slab when it was freed */
} spy;

static const float PRIV_CANARY = 7777.25f, SHARED_CANARY = 3333.5f;

static size_t count_float(const float *v, size_t n, float x)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += v[i] == x;
    return c;
}

static cp_status spy_alloc(cp_backend *be, size_t bytes, void **out, cp_error *err)
{
    spy *s = (spy *)be;
    cp_status rc = s->cpu->alloc(s->cpu, bytes, out, err);
    if (rc == CP_OK) s->slab = *out, s->slab_floats = bytes / sizeof(float);
    return rc;
}

static void spy_free(cp_backend *be, void *ptr)
{
    spy *s = (spy *)be;
    if (ptr == s->slab) {
        s->priv_at_free = count_float(s->slab, s->slab_floats, PRIV_CANARY);
        s->shared_at_free = count_float(s->slab, s->slab_floats, SHARED_CANARY);
        s->slab = NULL;
    }
    s->cpu->free(s->cpu, ptr);
}

static void spy_init(spy *s)
{
    cp_error err = { 0 };
    memset(s, 0, sizeof *s);
    cr_assert_eq(cp_backend_cpu_create(&s->cpu, &err), CP_OK);
    s->be = *s->cpu;
    s->be.alloc = spy_alloc;
    s->be.free = spy_free;
}

/* inserts n tokens whose K and V are all `canary` */
static cp_status put_kv(fixture *f, uint32_t tenant, cp_scope sc, const int32_t *t, uint32_t n, float canary, uint32_t *id)
{
    static float kv[64 * 2];
    for (size_t i = 0; i < 64 * 2; i++) kv[i] = canary;
    const void *ks[1] = { kv }, *vs[1] = { kv };
    cp_kv_source src = { ks, vs, 2 };
    cp_error err = { 0 };
    cp_insert in = { .tenant = tenant, .scope = sc, .fingerprint = FP, .tokens = t, .len = n, .sensitive = NO_SENS, .kv = &src };
    int dd;
    return cp_pool_insert(f->p, &in, id, &dd, &err);
}

Test(pool, private_blocks_are_zeroed_on_eviction)
{
    spy sp;
    spy_init(&sp);
    fake_time = 0;
    fixture f = make_pool_on(&sp.be, 6, CP_EVICT_LRU, ttl100);
    int32_t p[32], s[32], x[32], q[32];
    seq(p, 32, 1), seq(s, 32, 2), seq(x, 32, 3), seq(q, 32, 4);
    uint32_t ip, is, ix, iq;
    int dd;
    cr_assert_eq(put_kv(&f, 1, CP_SCOPE_PRIVATE, p, 32, PRIV_CANARY, &ip), CP_OK);
    fake_time = 1;
    cr_assert_eq(put_kv(&f, 2, CP_SCOPE_SHARED, s, 32, SHARED_CANARY, &is), CP_OK);
    cr_assert_eq(count_float(sp.slab, sp.slab_floats, PRIV_CANARY), 32 * 2 * 2, "the instrument does not see the private KV");
    fake_time = 2;
    cr_assert_eq(put(&f, 3, CP_SCOPE_SHARED, x, 32, &ix, &dd), CP_OK); /* fits */
    fake_time = 3;
    cr_assert_eq(put(&f, 3, CP_SCOPE_SHARED, q, 32, &iq, &dd), CP_OK); /* evicts p (LRU); its blocks are reused unwritten */
    cr_assert(!stored(&f, p, 32) && stored(&f, s, 32));
    cr_assert_eq(count_float(sp.slab, sp.slab_floats, PRIV_CANARY), 0, "an evicted private segment left its KV in the slab");
    cr_assert_eq(count_float(sp.slab, sp.slab_floats, SHARED_CANARY), 32 * 2 * 2);
    /* and through the TTL */
    cr_assert_eq(put_kv(&f, 1, CP_SCOPE_PRIVATE, p, 32, PRIV_CANARY, &ip), CP_OK); /* evicts s */
    fake_time = 200;
    cr_assert_eq(cp_pool_expire(f.p), 3);
    cr_assert_eq(count_float(sp.slab, sp.slab_floats, PRIV_CANARY), 0, "an expired private segment left its KV in the slab");
    drop_pool_only(&f);
    cp_backend_destroy(sp.cpu);
}

Test(pool, private_blocks_are_zeroed_when_the_pool_is_freed)
{
    spy sp;
    spy_init(&sp);
    fixture f = make_pool_on(&sp.be, 16, CP_EVICT_LRU, NULL);
    int32_t p[32], s[32];
    seq(p, 32, 1), seq(s, 32, 2);
    uint32_t ip, is;
    cr_assert_eq(put_kv(&f, 1, CP_SCOPE_PRIVATE, p, 32, PRIV_CANARY, &ip), CP_OK);
    cr_assert_eq(put_kv(&f, 2, CP_SCOPE_SHARED, s, 32, SHARED_CANARY, &is), CP_OK);
    drop_pool_only(&f);
    cp_backend_destroy(sp.cpu);
    cr_assert_null(sp.slab, "the slab was not handed back");
    cr_assert_eq(sp.shared_at_free, 32 * 2 * 2, "the instrument does not see the slab's bytes at free");
    cr_assert_eq(sp.priv_at_free, 0, "private KV was still in the slab handed back to the backend");
}

/* ---- privacy at insertion and access ---------------------------------------- */

Test(pool, shared_insert_with_a_sensitive_token_is_refused_and_counted)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    int32_t s[40];
    seq(s, 40, 9);
    uint8_t sens[40] = { 0 };
    sens[23] = 1;
    uint32_t id;
    int dd;
    cp_error err = { 0 };
    cp_insert in = { .tenant = 4, .scope = CP_SCOPE_SHARED, .fingerprint = FP, .tokens = s, .len = 40, .sensitive = sens };
    cr_assert_eq(cp_pool_insert(f.p, &in, &id, &dd, &err), CP_EPERM);
    cr_assert(strstr(err.msg, "sensitive"), "%s", err.msg);
    in.sensitive = NULL; /* no mask: the pool cannot check, so it refuses */
    cr_assert_eq(cp_pool_insert(f.p, &in, &id, &dd, &err), CP_EPERM);
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert(st.privacy_refusals == 2 && st.segments == 0 && st.inserts == 0, "%llu refusals, %zu segments",
              (unsigned long long)st.privacy_refusals, st.segments);
    cp_tenant_stats ts;
    cr_assert(cp_pool_tenant_stats(f.p, 4, &ts));
    cr_assert(ts.privacy_refusals == 2 && ts.insert_refusals == 2);
    cr_assert(!present(&f, s, 40));
    /* the same tokens stored clean first: a sensitive copy is still refused, not passed off as a dedup hit */
    cr_assert_eq(put(&f, 4, CP_SCOPE_SHARED, s, 40, &id, &dd), CP_OK);
    in.sensitive = sens;
    cr_assert_eq(cp_pool_insert(f.p, &in, &id, &dd, &err), CP_EPERM);
    /* private: the owner's secrets are its own */
    in.scope = CP_SCOPE_PRIVATE;
    cr_assert_eq(cp_pool_insert(f.p, &in, &id, &dd, &err), CP_OK, "%s", err.msg);
    /* the leaky baseline says so explicitly, and is counted */
    int32_t g[40];
    seq(g, 40, 10);
    cp_insert lk = { .tenant = 5, .scope = CP_SCOPE_SHARED, .fingerprint = FP, .tokens = g, .len = 40, .sensitive = sens, .leaky_baseline = 1 };
    cr_assert_eq(cp_pool_insert(f.p, &lk, &id, &dd, &err), CP_OK);
    lk.sensitive = NULL;
    cr_assert_eq(cp_pool_insert(f.p, &lk, &id, &dd, &err), CP_EPERM, "the baseline still passes its mask");
    cp_pool_stats_get(f.p, &st);
    cr_assert(st.privacy_refusals == 4 && st.sensitive_shared == 1 && st.segments == 3);
    drop_pool(&f);
}

/* Tenant 1's private segment, looked for by tenant 2 every way a lookup can
 * be asked: never returned. */
Test(pool, private_segment_is_never_returned_to_another_tenant)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    int32_t s[48];
    seq(s, 48, 12);
    uint32_t id;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_PRIVATE, s, 48, &id, &dd), CP_OK);
    cp_error err = { 0 };
    cp_matches m = { 0 };
    for (int priv = 0; priv <= 2; priv++)
        for (int mode = 0; mode < 3; mode++) {
            cp_lookup q = { .tenant = 2, .fingerprint = FP, .tokens = s, .n = 48, .private_only = priv, .prefix_only = mode == 1,
                            .whole_only = mode == 2 };
            cr_assert_eq(cp_pool_lookup(f.p, &q, &m, &err), CP_OK);
            cr_assert_eq(m.n, 0, "tenant 2 got tenant 1's private segment (private_only %d, mode %d)", priv, mode);
            q.tenant = 1;
            q.private_only = 0; /* the owner's shared pass does not see it either */
            cr_assert_eq(cp_pool_lookup(f.p, &q, &m, &err), CP_OK);
            cr_assert_eq(m.n, 0);
        }
    look(&f, 1, 1, s, 48, NULL, &m); /* the owner's private pass does */
    cr_assert(m.n == 1 && m.v[0].seg == id);
    cr_assert_not_null(cp_pool_segment(f.p, &m, 0));
    /* access checks the owner too: the same pin presented as tenant 2's */
    cp_matches forged = m;
    forged.tenant = 2;
    cr_assert_null(cp_pool_segment(f.p, &forged, 0), "another tenant read a private segment through a pin");
    cp_pool_release(f.p, &m);
    cp_matches_free(&m);
    drop_pool(&f);
}

/* cp_pool_segment is valid only while the caller holds its pin. */
Test(pool, segment_access_needs_a_live_pin)
{
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    int32_t s[32];
    seq(s, 32, 13);
    uint32_t id;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s, 32, &id, &dd), CP_OK);
    cp_matches a = { 0 }, b = { 0 };
    look(&f, 1, 0, s, 32, NULL, &a);
    look(&f, 2, 0, s, 32, NULL, &b);
    cr_assert(a.n == 1 && b.n == 1);
    cr_assert_not_null(cp_pool_segment(f.p, &a, 0));
    cr_assert_null(cp_pool_segment(f.p, &a, 1), "past the matches");
    cp_pool_release(f.p, &a);
    cr_assert_null(cp_pool_segment(f.p, &a, 0), "read after release (another request still pins it, this one does not)");
    cp_matches forged = b;
    cp_pool_release(f.p, &b);
    cr_assert_null(cp_pool_segment(f.p, &forged, 0), "read of an unpinned segment");
    fixture g = make_pool(64, CP_EVICT_LRU, NULL);
    look(&f, 1, 0, s, 32, NULL, &a);
    cr_assert_null(cp_pool_segment(g.p, &a, 0), "a pin of another pool");
    /* looking up into matches that still hold pins would leak them */
    cp_error err = { 0 };
    cp_lookup q = { .tenant = 1, .fingerprint = FP, .tokens = s, .n = 32 };
    cr_assert_eq(cp_pool_lookup(f.p, &q, &a, &err), CP_EINVAL);
    cr_assert_eq(cp_pool_pins(f.p, id), 1);
    cp_pool_release(f.p, &a);
    cp_matches_free(&a), cp_matches_free(&b);
    drop_pool(&g);
    drop_pool(&f);
}

/* ---- refused inserts ---------------------------------------------------------- */

static void one_window_bucket2(cp_pool_opts *o)
{
    o->windows[0] = 16;
    o->n_windows = 1;
    o->bucket_cap = 2;
}

/* per id: its pins (-1: none there) and who is there (the first bytes of its SHA-256) */
static void live_set(fixture *f, int64_t *v, int n)
{
    for (int i = 0; i < n; i++) {
        v[2 * i] = cp_pool_pins(f->p, (uint32_t)i);
        v[2 * i + 1] = 0;
        if (v[2 * i] >= 0) memcpy(&v[2 * i + 1], f->p->segs[i]->sha, sizeof v[0]);
    }
}

/* 6 blocks: a, b (20 tokens, same first 16: one bucket, now full) and c,
 * 2 blocks each; b and c pinned, so only a's 2 blocks can be freed. */
Test(pool, refused_insert_leaves_the_pool_unchanged)
{
    fixture f = make_pool(6, CP_EVICT_LRU, one_window_bucket2);
    int32_t a[20], b[20], c[32], d[64], e[64];
    seq(a, 20, 1), seq(c, 32, 3), seq(d, 64, 4), seq(e, 64, 5);
    memcpy(b, a, sizeof b), b[19] = -1;
    memcpy(d, a, 16 * sizeof(int32_t)); /* d falls in a and b's bucket */
    uint32_t ia, ib, ic, id;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, a, 20, &ia, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, b, 20, &ib, &dd), CP_OK);
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, c, 32, &ic, &dd), CP_OK);
    cp_matches mb = { 0 }, mc = { 0 };
    look(&f, 1, 0, b, 20, NULL, &mb);
    look(&f, 1, 0, c, 32, NULL, &mc);
    cr_assert(mb.n == 1 && mb.v[0].seg == ib && mc.n == 1 && mc.v[0].seg == ic);
    int64_t before[32], after[32];
    cp_pool_stats s0, s1;
    live_set(&f, before, 16);
    cp_pool_stats_get(f.p, &s0);
    /* e needs 4 blocks, only 2 can be had */
    cr_assert_eq(put(&f, 2, CP_SCOPE_SHARED, e, 64, &id, &dd), CP_ERANGE);
    live_set(&f, after, 16);
    cr_assert_arr_eq(before, after, sizeof before, "a refused insert evicted something");
    /* d too, and its full bucket's victim (a) must not be given up first */
    cr_assert_eq(put(&f, 2, CP_SCOPE_SHARED, d, 64, &id, &dd), CP_ERANGE);
    live_set(&f, after, 16);
    cr_assert_arr_eq(before, after, sizeof before, "a refused insert gave up its bucket's victim");
    cp_pool_stats_get(f.p, &s1);
    cr_assert(s1.segments == s0.segments && s1.bytes_used == s0.bytes_used && s1.insert_refusals == s0.insert_refusals + 2);
    cr_assert(s1.evictions_lru == 0 && s1.evictions_bucket == 0);
    cp_pool_release(f.p, &mb), cp_pool_release(f.p, &mc);
    cr_assert_eq(put(&f, 2, CP_SCOPE_SHARED, d, 64, &id, &dd), CP_OK, "unpinned, there is room");
    cp_matches_free(&mb), cp_matches_free(&mc);
    drop_pool(&f);
}

static void quota2(cp_pool_opts *o)
{
    o->quota_segments = 2;
    o->quota_window_s = 60;
}

static void quota2k(cp_pool_opts *o)
{
    o->quota_bytes = 2048; /* 8 blocks */
    o->quota_window_s = 60;
}

/* A tenant facing a full pool cannot keep trying for free: refused
 * attempts use its quota window as stored ones would, and evict nothing.
 * Both quotas give out after the same attempts: two 4-block inserts use 2
 * segments, or 2048 bytes, of the window. */
static void refused_inserts_charged(void (*quota)(cp_pool_opts *))
{
    fake_time = 0;
    fixture f = make_pool(6, CP_EVICT_LRU, quota);
    int32_t s[3][32], big[64], small[16];
    for (int i = 0; i < 3; i++) seq(s[i], 32, 50 + (uint32_t)i);
    seq(big, 64, 60), seq(small, 16, 61);
    uint32_t id[3], x;
    int dd;
    for (int i = 0; i < 3; i++) cr_assert_eq(put(&f, (uint32_t)i + 1, CP_SCOPE_SHARED, s[i], 32, &id[i], &dd), CP_OK);
    cp_matches m0 = { 0 }, m1 = { 0 };
    look(&f, 1, 0, s[0], 32, NULL, &m0);
    look(&f, 2, 0, s[1], 32, NULL, &m1);
    /* tenant 9: two 4-block attempts, refused for room (only s[2]'s 2 blocks are unpinned) */
    cr_assert_eq(put(&f, 9, CP_SCOPE_SHARED, big, 64, &x, &dd), CP_ERANGE);
    seq(big, 64, 62);
    cr_assert_eq(put(&f, 9, CP_SCOPE_SHARED, big, 64, &x, &dd), CP_ERANGE);
    /* its quota is spent: a 1-block insert that would fit is refused */
    cr_assert_eq(put(&f, 9, CP_SCOPE_SHARED, small, 16, &x, &dd), CP_ERANGE);
    cr_assert(stored(&f, s[2], 32), "the attacker flushed another tenant's segment");
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert(st.quota_refusals == 1 && st.insert_refusals == 2, "quota %llu, room %llu", (unsigned long long)st.quota_refusals,
              (unsigned long long)st.insert_refusals);
    cp_tenant_stats ts;
    cr_assert(cp_pool_tenant_stats(f.p, 9, &ts));
    cr_assert(ts.inserts == 0 && ts.insert_refusals == 3);
    cr_assert_eq(put(&f, 4, CP_SCOPE_SHARED, small, 16, &x, &dd), CP_OK, "the room was there: tenant 9's refusal was its quota");
    fake_time = 61; /* a new window */
    seq(small, 16, 63);
    cr_assert_eq(put(&f, 9, CP_SCOPE_SHARED, small, 16, &x, &dd), CP_OK);
    cp_pool_release(f.p, &m0), cp_pool_release(f.p, &m1);
    cp_matches_free(&m0), cp_matches_free(&m1);
    drop_pool(&f);
}

Test(pool, refused_inserts_are_charged_to_the_segment_quota) { refused_inserts_charged(quota2); }
Test(pool, refused_inserts_are_charged_to_the_byte_quota) { refused_inserts_charged(quota2k); }

/* ---- concurrency and the key filter ------------------------------------------- */

typedef struct lookup_job {
    fixture *f;
    const int32_t *t;
    uint32_t tenant;
    _Atomic int done;
    size_t found;
} lookup_job;

static void *lookup_thread(void *argp)
{
    lookup_job *j = argp;
    cp_matches m = { 0 };
    cp_error err = { 0 };
    cp_lookup q = { .tenant = j->tenant, .fingerprint = FP, .tokens = j->t, .n = 32 };
    if (cp_pool_lookup(j->f->p, &q, &m, &err) == CP_OK) j->found = m.n;
    cp_pool_release(j->f->p, &m);
    cp_matches_free(&m);
    atomic_store(&j->done, 1);
    return NULL;
}

/* While this thread holds the pool's read lock, a lookup in another thread
 * (a hit, by a tenant the pool has not seen) must complete: it never needs
 * the lock exclusively. */
Test(pool, lookups_never_take_the_write_lock)
{
    fixture f = make_pool(64, CP_EVICT_GDSF, NULL);
    int32_t s[32];
    seq(s, 32, 14);
    uint32_t id;
    int dd;
    cr_assert_eq(put(&f, 1, CP_SCOPE_SHARED, s, 32, &id, &dd), CP_OK);
    lookup_job j = { .f = &f, .t = s, .tenant = 777 };
    pthread_rwlock_rdlock(&f.p->lock);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, lookup_thread, &j), 0);
    for (int k = 0; k < 2000 && !atomic_load(&j.done); k++) nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
    int done = atomic_load(&j.done);
    pthread_rwlock_unlock(&f.p->lock);
    pthread_join(th, NULL);
    cr_assert(done, "the lookup waited for the write lock");
    cr_assert_eq(j.found, 1);
    cp_tenant_stats ts;
    cr_assert(cp_pool_tenant_stats(f.p, 777, &ts) && ts.lookups == 1 && ts.hit_segments == 1);
    drop_pool(&f);
}

/* A pool of 4096 one-block segments fed about 2 x 65 536 distinct ones: the
 * index grows at first, then stays the same size while keys come and go.
 * The filter must keep passing every live key (cp_pool_check, often enough
 * to see keys that were live at a rebuild) and shed the removed ones' bits
 * (cp_pool_check bounds the bits set by live + removed-since-rebuild, which
 * a rebuild keeps under max(live, 65 536)); its false-positive rate on
 * absent keys is printed. */
Test(pool, key_filter_stays_useful_under_churn, .timeout = TEST_TIMEOUT(30))
{
    fixture f = make_pool(4096, CP_EVICT_LRU, NULL);
    int32_t t[16];
    uint32_t id;
    int dd;
    cp_error err = { 0 };
    for (uint32_t k = 0; k < 140000; k++) {
        seq(t, 16, 900000 + k);
        cr_assert_eq(put(&f, k % 4, CP_SCOPE_SHARED, t, 16, &id, &dd), CP_OK);
        if (k % 2000 == 0) cr_assert_eq(cp_pool_check(f.p, &err), CP_OK, "after %u inserts: %s", k, err.msg);
    }
    cr_assert(present(&f, t, 16), "the newest segment is missed: its key fell out of the filter");
    static int32_t noise[4096];
    for (uint32_t r = 0; r < 8; r++) {
        seq(noise, 4096, 5000 + r);
        cp_matches m = { 0 };
        look(&f, 1, 0, noise, 4096, NULL, &m);
        cp_pool_release(f.p, &m);
        cp_matches_free(&m);
    }
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    double fp = (double)st.filter_false_positives / (double)st.filter_absent_probes;
    printf("pool: key filter after %llu evictions: %.3f%% false positives over %llu absent probes\n",
           (unsigned long long)st.evictions_lru, 100 * fp, (unsigned long long)st.filter_absent_probes);
    cr_assert_gt(st.filter_absent_probes, 100000);
    cr_assert_lt(fp, 0.5);
    drop_pool(&f);
}

/* ---- erasure: cp_pool_purge --------------------------------------------------- */

Test(pool, purge_removes_exactly_the_tenants_private_segments_and_zeroes_them)
{
    spy sp;
    spy_init(&sp);
    fixture f = make_pool_on(&sp.be, 16, CP_EVICT_LRU, NULL);
    int32_t a1[32], a2[32], b1[32], sh[32];
    seq(a1, 32, 1), seq(a2, 32, 2), seq(b1, 32, 3), seq(sh, 32, 4);
    uint32_t id;
    cr_assert_eq(put_kv(&f, 1, CP_SCOPE_PRIVATE, a1, 32, PRIV_CANARY, &id), CP_OK);
    cr_assert_eq(put_kv(&f, 1, CP_SCOPE_PRIVATE, a2, 32, PRIV_CANARY, &id), CP_OK);
    cr_assert_eq(put_kv(&f, 2, CP_SCOPE_PRIVATE, b1, 32, 1.5f, &id), CP_OK);
    cr_assert_eq(put_kv(&f, 1, CP_SCOPE_SHARED, sh, 32, SHARED_CANARY, &id), CP_OK); /* created by 1, owned by no one */
    cr_assert_eq(count_float(sp.slab, sp.slab_floats, PRIV_CANARY), 2 * 32 * 2 * 2);
    cr_assert_eq(cp_pool_purge(f.p, 1), 2, "two private segments of tenant 1");
    cr_assert(!stored(&f, a1, 32) && !stored(&f, a2, 32), "a purged segment is still stored");
    cr_assert(stored(&f, b1, 32) && stored(&f, sh, 32), "purge took another tenant's or a shared segment");
    cr_assert_eq(count_float(sp.slab, sp.slab_floats, PRIV_CANARY), 0, "a purged segment left its KV in the slab");
    cr_assert_eq(count_float(sp.slab, sp.slab_floats, 1.5f), 32 * 2 * 2, "tenant 2's KV was touched");
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert_eq(st.segments, 2);
    cr_assert_eq(st.purged, 2);
    cr_assert_eq(cp_pool_purge(f.p, 1), 0, "nothing left to purge");
    cr_assert_eq(cp_pool_purge(f.p, 9), 0, "an unknown tenant stored nothing");
    /* the tenant can store the same text again afterwards (not a dedup into the dead) */
    int dd = 1;
    cr_assert_eq(put(&f, 1, CP_SCOPE_PRIVATE, a1, 32, &id, &dd), CP_OK);
    cr_assert_eq(dd, 0);
    drop_pool_only(&f);
    cp_backend_destroy(sp.cpu);
}

Test(pool, purge_of_a_pinned_segment_frees_it_at_its_last_release)
{
    spy sp;
    spy_init(&sp);
    fixture f = make_pool_on(&sp.be, 16, CP_EVICT_LRU, NULL);
    int32_t a[32];
    seq(a, 32, 5);
    uint32_t id;
    cr_assert_eq(put_kv(&f, 1, CP_SCOPE_PRIVATE, a, 32, PRIV_CANARY, &id), CP_OK);
    cp_matches m = { 0 };
    look(&f, 1, 1, a, 32, NULL, &m); /* a request reading it */
    cr_assert_eq(m.n, 1);
    cr_assert_eq(cp_pool_purge(f.p, 1), 1, "a pinned segment is purged too");
    /* dead: the reader keeps its KV, nobody finds it again */
    const cp_segment *s = cp_pool_segment(f.p, &m, 0);
    cr_assert_not_null(s, "the pin holder lost its segment under it");
    cr_assert_eq(*(const float *)cp_pool_kv_row(f.p, s, 0, 0, 0), PRIV_CANARY);
    cp_matches m2 = { 0 };
    look(&f, 1, 1, a, 32, NULL, &m2);
    cr_assert_eq(m2.n, 0, "a purged segment was found by a new lookup");
    cp_pool_release(f.p, &m2);
    cp_matches_free(&m2);
    cr_assert_eq(cp_pool_pins(f.p, id), 1);
    cp_error err = { 0 };
    cr_assert_eq(cp_pool_check(f.p, &err), CP_OK, "%s", err.msg);
    cp_pool_release(f.p, &m); /* the last pin: now it goes */
    cp_matches_free(&m);
    cr_assert_eq(cp_pool_pins(f.p, id), -1, "the purged segment outlived its last pin");
    cr_assert_eq(count_float(sp.slab, sp.slab_floats, PRIV_CANARY), 0, "its KV stayed in the slab");
    cp_pool_stats st;
    cp_pool_stats_get(f.p, &st);
    cr_assert_eq(st.segments, 0);
    cr_assert_eq(st.bytes_used, 0);
    drop_pool_only(&f);
    cp_backend_destroy(sp.cpu);
}
