/* KV pool: lookup time against request length with 100 000 segments
 * indexed (it should grow linearly: ms per 1k tokens stays flat), lookups
 * from 8 threads at once, the insert and evict rates, and the key filter's
 * false-positive rate after a million inserts and evictions. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../pool/pool.h"

#include "bench_clock.h"

static uint32_t rng = 2463534242u;
static const uint8_t no_sensitive[256]; /* the per-token mask a shared insert carries: none sensitive */
static uint32_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return rng;
}

#define CHECK(x)                                                              \
    do {                                                                      \
        if ((x) != CP_OK) {                                                   \
            fprintf(stderr, "bench_pool: %s\n", err.msg);                     \
            return 1;                                                         \
        }                                                                     \
    } while (0)

/* 8 threads looking up at once: lookups share the pool, so the rate should
 * grow with threads rather than serialize */
typedef struct lookup_arg {
    cp_pool *p;
    const int32_t *req; /* n_req requests of req_len tokens */
    size_t n_req, req_len;
    int reps;
    int failed;
} lookup_arg;

static void *lookup_worker(void *argp)
{
    lookup_arg *a = argp;
    cp_error err = { 0 };
    cp_matches m = { 0 };
    for (int r = 0; r < a->reps; r++)
        for (size_t i = 0; i < a->n_req; i++) {
            cp_lookup q = { .tenant = (uint32_t)i, .fingerprint = cp_pool_layout(a->p)->fingerprint, .tokens = a->req + i * a->req_len,
                            .n = a->req_len };
            if (cp_pool_lookup(a->p, &q, &m, &err) != CP_OK) {
                a->failed = 1;
                return NULL;
            }
            cp_pool_release(a->p, &m);
        }
    cp_matches_free(&m);
    return NULL;
}

/* lookups per second from `threads` threads, each looking up every request `reps` times */
static double lookup_rate(cp_pool *p, const int32_t *req, size_t n_req, size_t req_len, int threads, int reps)
{
    pthread_t th[8];
    lookup_arg a[8];
    double t0 = now_s();
    for (int i = 0; i < threads; i++) {
        a[i] = (lookup_arg){ p, req, n_req, req_len, reps, 0 };
        if (pthread_create(&th[i], NULL, lookup_worker, &a[i])) return -1;
    }
    int failed = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        failed |= a[i].failed;
    }
    return failed ? -1 : (double)threads * reps * n_req / (now_s() - t0);
}

int main(int argc, char **argv)
{
    cp_error err = { 0 };
    cp_backend *be;
    CHECK(cp_backend_cpu_create(&be, &err));
    /* a small KV row keeps 100k segments in memory: the index is what is measured */
    cp_kv_layout l = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 1, .dtype = CP_F32, .block_tokens = 16 };
    cp_pool_opts o;
    cp_pool_opts_default(&o);
    o.budget_bytes = (size_t)1 << 30;
    cp_pool *p;
    CHECK(cp_pool_create(&l, be, &o, &p, &err));
    enum { N_SEG = 100000, MAXLEN = 256 };
    int32_t *seg_tokens = malloc((size_t)N_SEG * MAXLEN * sizeof(int32_t));
    uint32_t *seg_len = malloc(N_SEG * sizeof(uint32_t));
    if (!seg_tokens || !seg_len) return 1;
    for (size_t i = 0; i < (size_t)N_SEG * MAXLEN; i++) seg_tokens[i] = (int32_t)(next() % 50000);
    double t0 = now_s();
    for (uint32_t s = 0; s < N_SEG; s++) {
        seg_len[s] = 16 + next() % (MAXLEN - 16);
        cp_insert in = { .tenant = s % 8, .scope = CP_SCOPE_SHARED, .sensitive = no_sensitive, .fingerprint = l.fingerprint,
                         .tokens = seg_tokens + (size_t)s * MAXLEN, .len = seg_len[s] };
        uint32_t id;
        int dd;
        CHECK(cp_pool_insert(p, &in, &id, &dd, &err));
    }
    double t_ins = now_s() - t0;
    printf("pool: %d segments (16..255 tokens) inserted at %.0f inserts/s (%.1f us each)\n", N_SEG, N_SEG / t_ins,
           t_ins / N_SEG * 1e6);

    printf("%-10s %10s %14s %10s %10s\n", "n tokens", "lookup ms", "ms / 1k tok", "matches", "covered");
    int32_t *req = malloc((size_t)65536 * sizeof(int32_t));
    cp_matches m = { 0 };
    for (size_t n = 1024; n <= 65536; n *= 2) {
        /* half planted segments, half noise */
        size_t at = 0;
        while (at < n) {
            if (next() % 2) {
                uint32_t s = next() % N_SEG, k = seg_len[s];
                if (at + k > n) k = (uint32_t)(n - at);
                memcpy(req + at, seg_tokens + (size_t)s * MAXLEN, k * sizeof(int32_t));
                at += k;
            } else {
                for (uint32_t k = 0; k < 100 && at < n; k++) req[at++] = (int32_t)(next() % 50000);
            }
        }
        double best = 1e30;
        size_t covered = 0;
        for (int rep = 0; rep < 5; rep++) {
            cp_lookup q = { .tenant = 1, .fingerprint = l.fingerprint, .tokens = req, .n = n };
            double t = now_s();
            CHECK(cp_pool_lookup(p, &q, &m, &err));
            t = now_s() - t;
            if (t < best) best = t;
            covered = 0;
            for (size_t i = 0; i < m.n; i++) covered += m.v[i].len;
            cp_pool_release(p, &m);
        }
        printf("%-10zu %10.3f %14.4f %10zu %9.1f%%\n", n, best * 1e3, best * 1e3 / (n / 1024.0), m.n, 100.0 * covered / n);
    }
    cp_matches_free(&m);

    /* the same pool from 1 and 8 threads: 1k-token requests, half planted */
    enum { N_REQ = 64, REQ_LEN = 1024 };
    int32_t *reqs = malloc((size_t)N_REQ * REQ_LEN * sizeof(int32_t));
    if (!reqs) return 1;
    for (size_t r = 0; r < N_REQ; r++)
        for (size_t at = 0; at < REQ_LEN;) {
            int32_t *q = reqs + r * REQ_LEN;
            if (next() % 2) {
                uint32_t s = next() % N_SEG, k = seg_len[s];
                if (at + k > REQ_LEN) k = (uint32_t)(REQ_LEN - at);
                memcpy(q + at, seg_tokens + (size_t)s * MAXLEN, k * sizeof(int32_t));
                at += k;
            } else {
                for (uint32_t k = 0; k < 100 && at < REQ_LEN; k++) q[at++] = (int32_t)(next() % 50000);
            }
        }
    double r1 = lookup_rate(p, reqs, N_REQ, REQ_LEN, 1, 8), r8 = lookup_rate(p, reqs, N_REQ, REQ_LEN, 8, 8);
    if (r1 < 0 || r8 < 0) {
        fprintf(stderr, "bench_pool: a threaded lookup failed\n");
        return 1;
    }
    printf("pool: 1k-token lookups: %.0f/s from 1 thread, %.0f/s from 8 threads (%.2fx)\n", r1, r8, r8 / r1);
    free(reqs);
    cp_pool_free(p);

    /* eviction: a pool that holds ~1000 segments, fed 100 000 */
    o.budget_bytes = (size_t)1000 * 9 * cp_kv_block_bytes(&l);
    CHECK(cp_pool_create(&l, be, &o, &p, &err));
    t0 = now_s();
    for (uint32_t s = 0; s < N_SEG; s++) {
        cp_insert in = { .tenant = s % 8, .scope = CP_SCOPE_SHARED, .sensitive = no_sensitive, .fingerprint = l.fingerprint,
                         .tokens = seg_tokens + (size_t)s * MAXLEN, .len = seg_len[s] };
        uint32_t id;
        int dd;
        CHECK(cp_pool_insert(p, &in, &id, &dd, &err));
    }
    double t_ev = now_s() - t0;
    cp_pool_stats st;
    cp_pool_stats_get(p, &st);
    printf("pool: inserts into a full pool (GDSF): %.0f inserts/s with %llu evictions (%.1f us per insert)\n", N_SEG / t_ev,
           (unsigned long long)(st.evictions_gdsf + st.evictions_lru), t_ev / N_SEG * 1e6);
    cp_pool_free(p);

    /* the key filter under churn: a million distinct segments through a pool
     * that holds about a thousand, then noise lookups (every probe is for an
     * absent key): the share the filter lets through is its false-positive rate */
    o.budget_bytes = (size_t)1000 * 2 * cp_kv_block_bytes(&l);
    CHECK(cp_pool_create(&l, be, &o, &p, &err));
    int32_t churn[32];
    size_t n_churn = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000; /* bench_pool [inserts through the filter] */
    t0 = now_s();
    for (size_t s = 0; s < n_churn; s++) {
        for (int k = 0; k < 32; k++) churn[k] = (int32_t)(next() % 50000);
        cp_insert in = { .tenant = (uint32_t)s % 8, .scope = CP_SCOPE_SHARED, .sensitive = no_sensitive, .fingerprint = l.fingerprint, .tokens = churn, .len = 32 };
        uint32_t id;
        int dd;
        CHECK(cp_pool_insert(p, &in, &id, &dd, &err));
    }
    double t_churn = now_s() - t0;
    int32_t *noise = malloc((size_t)4096 * sizeof(int32_t));
    if (!noise) return 1;
    for (int r = 0; r < 64; r++) {
        for (int k = 0; k < 4096; k++) noise[k] = (int32_t)(next() % 50000);
        cp_lookup q = { .tenant = 1, .fingerprint = l.fingerprint, .tokens = noise, .n = 4096 };
        CHECK(cp_pool_lookup(p, &q, &m, &err));
        cp_pool_release(p, &m);
    }
    cp_matches_free(&m);
    cp_pool_stats_get(p, &st);
    printf("pool: key filter after %zu inserts and %llu evictions (%.1f us per insert): %.2f%% false positives over %llu absent "
           "probes (%zu segments live)\n",
           n_churn, (unsigned long long)(st.evictions_gdsf + st.evictions_lru), t_churn / n_churn * 1e6,
           100.0 * (double)st.filter_false_positives / (double)st.filter_absent_probes, (unsigned long long)st.filter_absent_probes,
           st.segments);
    free(noise);
    cp_pool_free(p);
    cp_backend_destroy(be);
    free(seg_tokens), free(seg_len), free(req);
    return 0;
}
