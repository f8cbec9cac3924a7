/* KV pool and retriever: invariants under random operations, eviction
 * policies, pins, dedup, quotas, TTL, every kind of match, sensitive tokens,
 * forced hash collisions, flooded buckets, and threads. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../pool/pool.h"
#include "helpers.h"

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
static fixture make_pool(size_t blocks, cp_evict_policy pol, void (*tweak)(cp_pool_opts *))
{
    fixture f;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&f.be, &err), CP_OK);
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

static void drop_pool(fixture *f)
{
    cp_error err = { 0 };
    cr_assert_eq(cp_pool_check(f->p, &err), CP_OK, "%s", err.msg);
    cp_pool_free(f->p);
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
    cp_insert in = { .tenant = tenant, .scope = sc, .fingerprint = FP, .tokens = t, .len = n };
    return cp_pool_insert(f->p, &in, id, dd, &err);
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
    cr_assert_eq(atomic_load(&cp_pool_segment(f.p, ia)->refcount), 2); /* pinned twice: two matches */
    cp_pool_release(f.p, &m);
    cr_assert_eq(atomic_load(&cp_pool_segment(f.p, ia)->refcount), 0);
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
Test(pool, random_operations_keep_invariants, .timeout = 120)
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
        cp_insert in = { .tenant = (uint32_t)a->id, .scope = CP_SCOPE_SHARED, .fingerprint = FP, .tokens = s, .len = 64 };
        cp_status rc = cp_pool_insert(a->f->p, &in, &id, &dd, &err);
        if (rc != CP_OK && rc != CP_ERANGE) return (void *)1;
        memcpy(req, s, sizeof s);
        seq(req + 64, 192, (uint32_t)k);
        cp_lookup q = { .tenant = (uint32_t)a->id, .fingerprint = FP, .tokens = req, .n = 256 };
        if (cp_pool_lookup(a->f->p, &q, &m, &err) != CP_OK) return (void *)1;
        for (size_t i = 0; i < m.n; i++) {
            const cp_segment *sg = cp_pool_segment(a->f->p, m.v[i].seg);
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
    cp_insert in = { .tenant = 1, .scope = CP_SCOPE_SHARED, .fingerprint = FP, .tokens = s, .len = 40, .start_pos = 7, .kv = &src };
    uint32_t id;
    int dd;
    cr_assert_eq(cp_pool_insert(f.p, &in, &id, &dd, &err), CP_OK, "%s", err.msg);
    const cp_segment *sg = cp_pool_segment(f.p, id);
    cr_assert_eq(sg->start_pos, 7);
    cr_assert_eq(sg->n_blocks, 3);
    for (uint32_t t = 0; t < 40; t++) {
        const float *kr = cp_pool_kv_row(f.p, sg, 0, 0, t), *vr = cp_pool_kv_row(f.p, sg, 0, 1, t);
        cr_assert(kr[0] == t * 10.0f && kr[1] == t * 10.0f + 1 && vr[0] == -(t * 10.0f) && vr[1] == -(t * 10.0f) - 1, "token %u", t);
    }
    drop_pool(&f);
}
