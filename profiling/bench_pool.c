/* KV pool: lookup time against request length with 100 000 segments
 * indexed (it should grow linearly: ms per 1k tokens stays flat), and the
 * insert and evict rates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../pool/pool.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint32_t rng = 2463534242u;
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

int main(void)
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
        cp_insert in = { .tenant = s % 8, .scope = CP_SCOPE_SHARED, .fingerprint = l.fingerprint,
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
    cp_pool_free(p);

    /* eviction: a pool that holds ~1000 segments, fed 100 000 */
    o.budget_bytes = (size_t)1000 * 9 * cp_kv_block_bytes(&l);
    CHECK(cp_pool_create(&l, be, &o, &p, &err));
    t0 = now_s();
    for (uint32_t s = 0; s < N_SEG; s++) {
        cp_insert in = { .tenant = s % 8, .scope = CP_SCOPE_SHARED, .fingerprint = l.fingerprint,
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
    cp_backend_destroy(be);
    free(seg_tokens), free(seg_len), free(req);
    return 0;
}
