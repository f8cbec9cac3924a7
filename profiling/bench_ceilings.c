/* bench_forward's kernel-level measurements: the GEMM and GEMV ceilings
 * of the machine's libraries (OpenBLAS, oneDNN) at a model's shapes, next
 * to the backend's own kernels at the same shapes (bf16 crossover, the
 * skinny per-dtype table, the int8 prefill and packed tables, the
 * attention A/B) -- bench_ceilings.h; bench_forward.c runs the model. */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <immintrin.h>
#include <omp.h>

#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/cpu/gemm_dnnl.h"
#include "../kernels/cpu/gemm_i8.h"
#include "../kernels/cpu/gemm_i8_prefill.h"
#include "../kernels/cpu/attn_dnnl.h"
#include "../kernels/cpu/ops_cpu.h"
#include "../kernels/q8.h"

#include "bench_ceilings.h"
#include "bench_clock.h"

int openblas_get_num_threads(void);

float *rand_buf(size_t n, uint64_t seed)
{
    float *p = malloc(n * sizeof *p);
    if (!p) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((seed >> 40) / 16777216.0 - 0.5);
    }
    return p;
}

/* Best of `reps` sgemm runs at the shape of the largest prefill GEMM. */
double sgemm_gflops(int M, int N, int K, int reps)
{
    float *a = rand_buf((size_t)M * K, 1), *b = rand_buf((size_t)N * K, 2), *c = rand_buf((size_t)M * N, 3);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
        t = now_s() - t;
        if (t < best) best = t;
    }
    free(a), free(b), free(c);
    return 2.0 * M * N * K / best / 1e9;
}

/* The same products through oneDNN's f32 GEMM (dnnl_sgemm: its own
 * cpuid-dispatched kernels), best of `reps` after one warm-up: the
 * alternative to OpenBLAS for f32 weights, at M rows (the prefill's, and
 * 1 for decode's matrix-vector product).  0 where oneDNN refuses. */
double dnnl_sgemm_gflops(int M, int N, int K, int reps)
{
    float *a = rand_buf((size_t)M * K, 1), *b = rand_buf((size_t)N * K, 2), *c = rand_buf((size_t)M * N, 3);
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t = now_s();
        if (dnnl_sgemm('N', 'T', M, N, K, 1, a, K, b, K, 0, c, N) != dnnl_success) {
            best = 1e30;
            break;
        }
        t = now_s() - t;
        if (r > 0 && t < best) best = t;
    }
    free(a), free(b), free(c);
    return best < 1e29 ? 2.0 * M * N * K / best / 1e9 : 0;
}

/* OpenBLAS's f32 matrix-vector product (decode's), GFLOP/s, best of reps */
double sgemv_gflops(int N, int K, int reps)
{
    float *x = rand_buf((size_t)K, 1), *w = rand_buf((size_t)N * K, 2), *y = rand_buf((size_t)N, 3);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1, w, K, x, 1, 0, y, 1);
        t = now_s() - t;
        if (t < best) best = t;
    }
    free(x), free(w), free(y);
    return 2.0 * N * K / best / 1e9;
}

static uint16_t *rand_bf16(size_t n, uint64_t seed)
{
    float *f = rand_buf(n, seed);
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) h[i] = cp_f32_to_bf16(f[i]);
    free(f);
    return h;
}

/* Best of `reps` runs of the bf16-weight GEMMs at the same shape: f32
 * compute on widened blocks (the non-AMX path) and oneDNN's bf16 matmul
 * (activations rounded to bf16 included: what the amx path pays). */
void bf16_gemm_gflops(int M, int N, int K, int reps, double *widened, double *onednn, const char **impl)
{
    float *a = rand_buf((size_t)M * K, 1), *c = rand_buf((size_t)M * N, 3);
    uint16_t *b = rand_bf16((size_t)N * K, 2);
    float *scr = malloc(bf16_gemm_blocked_scratch(K, N) * sizeof(float));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        bf16_gemm_blocked(c, N, a, b, M, K, N, 0, scr);
        t = now_s() - t;
        if (t < best) best = t;
    }
    *widened = 2.0 * M * N * K / best / 1e9;
    cp_dnnl_mm *g = NULL;
    cp_error err = { 0 };
    *onednn = 0;
    *impl = "unavailable";
    if (cp_dnnl_mm_create(&g, &err) == CP_OK) {
        best = 1e30;
        for (int r = 0; r < reps + 1; r++) { /* the first creates the primitive */
            double t = now_s();
            if (cp_dnnl_mm_run(g, c, N, a, b, M, K, N, 0, &err)) {
                fprintf(stderr, "bench: oneDNN: %s\n", err.msg);
                best = 1e30;
                break;
            }
            t = now_s() - t;
            if (r > 0 && t < best) best = t;
        }
        if (best < 1e29) *onednn = 2.0 * M * N * K / best / 1e9;
        static char buf[96];
        snprintf(buf, sizeof buf, "%s", cp_dnnl_mm_last_impl(g));
        *impl = buf;
        cp_dnnl_mm_destroy(g);
    }
    free(a), free(b), free(c), free(scr);
}

/* decode's kernel: GB/s of weights streamed by one matrix-vector product
 * (f32 sgemv, or the bf16 dot kernel of the given ISA) */
double gemv_gbs(int N, int K, cpu_isa isa, int bf16)
{
    float *x = rand_buf((size_t)K, 4), *y = rand_buf((size_t)N, 5), *w32 = bf16 ? NULL : rand_buf((size_t)N * K, 6);
    uint16_t *w16 = bf16 ? rand_bf16((size_t)N * K, 6) : NULL;
    double best = 1e30;
    for (int r = 0; r < 10; r++) {
        double t = now_s();
        if (bf16) bf16_gemm_small(isa, y, N, x, w16, 1, K, N, 0);
        else cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w32, K, x, 1, 0.0f, y, 1);
        t = now_s() - t;
        if (t < best) best = t;
    }
    free(x), free(y), free(w32), free(w16);
    return (double)N * K * (bf16 ? 2 : 4) / best / 1e9;
}

/* The two f32-compute kernels over bf16 weights at small and large n: the
 * measurement behind BF16_SMALL_N (gemm_bf16.h) and behind using sgemm on
 * widened blocks rather than a hand AVX-512 kernel for prefill. */
void bf16_kernel_crossover(int N, int K, cpu_isa isa)
{
    static const int ns[] = { 1, 2, 4, 8, 16, 64, 256 };
    uint16_t *w = rand_bf16((size_t)N * K, 2);
    float *x = rand_buf((size_t)256 * K, 1), *y = rand_buf((size_t)256 * N, 3);
    float *scr = malloc(bf16_gemm_blocked_scratch(K, N) * sizeof(float));
    printf("\n%-34s %12s %12s\n", "bf16 weights, f32 compute: n rows", "dot GFLOP/s", "sgemm-on-widened");
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        int n = ns[i];
        double bd = 1e30, bb = 1e30;
        for (int r = 0; r < 3; r++) {
            double t = now_s();
            bf16_gemm_small(isa, y, N, x, w, n, K, N, 0);
            t = now_s() - t;
            if (t < bd) bd = t;
            t = now_s();
            bf16_gemm_blocked(y, N, x, w, n, K, N, 0, scr);
            t = now_s() - t;
            if (t < bb) bb = t;
        }
        double fl = 2.0 * n * N * K / 1e9;
        printf("  n = %-28d %12.1f %12.1f\n", n, fl / bd, fl / bb);
    }
    free(w), free(x), free(y), free(scr);
}

/* The FMA peak of this process's threads, GFLOP/s: 12 independent zmm FMA
 * chains per thread in registers (no memory) -- what an exact
 * f32 kernel over more than a few rows is bound by.  0 without AVX-512. */
__attribute__((target("avx512f"))) static double fma_chains(long iters)
{
    __m512 a[12], b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    float s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    return s;
}

/* Each thread's rate by its own CPU time (so a thread descheduled on a
 * shared machine does not count the time it waited), best of 20 short runs,
 * summed over the threads. */
static double fma_peak_gflops(void)
{
    cpu_features f;
    cpu_features_detect(&f);
    if (!f.avx512) return 0;
    const long iters = 300000;
    double total = 0, sink = 0;
#pragma omp parallel reduction(+ : total, sink)
    {
        double best = 1e30;
        for (int r = 0; r < 20; r++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
            sink += fma_chains(iters);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
            double t = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            if (t > 0 && t < best) best = t;
        }
        total += (double)iters * 12 * 32 / best / 1e9; /* 16 lanes x 2 flops */
    }
    if (sink == 1234.5) printf(" ");
    return total;
}

/* Skinny GEMMs (decode and the batched decode: 1..16 rows) on the MLP's
 * N x K shape per weight dtype, as the backend runs them, with copies of
 * W cycled so every call streams W from memory (the set is past any L3):
 * ms per call and the weight bytes streamed per second. */
void skinny_table(int N, int K, cpu_isa isa, q8_isa qk)
{
    enum { COPIES = 16 };
    static const int ns[] = { 1, 2, 4, 8, 16, 64, 256 }; /* 64, 256: where prefill chunks start */
    size_t NK = (size_t)N * K;
    float *w32 = rand_buf(NK * COPIES, 2), *x = rand_buf((size_t)256 * K, 1), *y = rand_buf((size_t)256 * N, 3);
    uint16_t *w16 = malloc(NK * COPIES * 2);
    /* int8 as the backend runs it: on vnni the matrix packed at load and
     * the register-blocked kernel at every n,
     * elsewhere the row-major blob and the dot kernels */
    const int packed = qk == Q8_VNNI, threads = openblas_get_num_threads();
    size_t qb = cp_q8_bytes_in(N, K, packed ? CP_Q8_PANELS : CP_Q8_ROWS), qs = q8p_scratch(256, K, threads);
    char *w8 = aligned_alloc(64, (qb * COPIES + 63) & ~(size_t)63), *row8 = aligned_alloc(64, (cp_q8_bytes(N, K) + 63) & ~(size_t)63);
    void *scr = aligned_alloc(64, ((qs > q8_scratch(256, K) ? qs : q8_scratch(256, K)) + 63) & ~(size_t)63);
    float *wide = malloc(bf16_gemm_blocked_scratch(K, N) * sizeof(float));
    if (!w16 || !w8 || !row8 || !scr || !wide) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    for (size_t i = 0; i < NK * COPIES; i++) w16[i] = cp_f32_to_bf16(w32[i]);
    for (int c = 0; c < COPIES; c++) {
        char *b = packed ? row8 : w8 + (size_t)c * qb;
        cp_q8_quantize_rows((int8_t *)(b + cp_q8_off_data(N)), (float *)(void *)(b + cp_q8_off_scales()),
                            (int32_t *)(void *)(b + cp_q8_off_sums(N)), w32 + (size_t)c * NK, N, K);
        *(cp_q8_head *)(void *)b = (cp_q8_head){ CP_Q8_MAGIC, N, K, cp_q8_ld(K), CP_Q8_ROWS };
        if (packed) cp_q8_pack_blob(w8 + (size_t)c * qb, row8);
    }
    free(row8);
    cpu_features f;
    cpu_features_detect(&f);
    void *dps = aligned_alloc(64, (bf16_dp_scratch(256, K) + 63) & ~(size_t)63);
    if (!dps) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    printf("\n%-20s %-38s %-38s %-38s %-38s\n", "skinny GEMM", "f32 (sgemv / sgemm)", "bf16 (f32 compute)", "int8",
           f.avx512_bf16 ? "bf16 (vdpbf16ps, bf16 compute)" : "bf16 vdpbf16ps: no AVX512_BF16");
    printf("%-20s", "rows");
    for (int d = 0; d < 4; d++) printf(" %9s %9s %9s        ", "ms", "GB/s", "GFLOP/s");
    printf("\n");
    double r1[4] = { 1, 1, 1, 1 }, r16[4] = { 1, 1, 1, 1 }; /* ms at 1 and 16 rows, per column */
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        int n = ns[i];
        double best[4] = { 1e30, 1e30, 1e30, 1e30 };
        for (int r = 0; r < (n > 16 ? COPIES : 3 * COPIES); r++) {
            int c = r % COPIES;
            double t = now_s();
            if (n == 1) cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w32 + c * NK, K, x, 1, 0.0f, y, 1);
            else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, N, K, 1, x, K, w32 + c * NK, K, 0, y, N);
            t = now_s() - t;
            best[0] = t < best[0] ? t : best[0];
            t = now_s();
            if (n <= BF16_SMALL_N) bf16_gemm_small(isa, y, N, x, w16 + c * NK, n, K, N, 0);
            else bf16_gemm_blocked(y, N, x, w16 + c * NK, n, K, N, 0, wide);
            t = now_s() - t;
            best[1] = t < best[1] ? t : best[1];
            t = now_s();
            if (packed) q8p_gemm(y, N, x, w8 + (size_t)c * qb, n, K, N, 0, scr, threads);
            else q8_gemm(qk, y, N, x, w8 + (size_t)c * qb, n, K, N, 0, scr);
            t = now_s() - t;
            best[2] = t < best[2] ? t : best[2];
            if (!f.avx512_bf16) continue;
            t = now_s();
            bf16_gemm_small_dp(y, N, x, w16 + c * NK, n, K, N, 0, dps);
            t = now_s() - t;
            best[3] = t < best[3] ? t : best[3];
        }
        for (int d = 0; d < 4; d++) {
            if (n == 1) r1[d] = best[d];
            if (n == 16) r16[d] = best[d];
        }
        double bytes[4] = { NK * 4.0, NK * 2.0, (double)qb, NK * 2.0 }, fl = 2.0 * n * NK;
        printf("  n = %-16d", n);
        for (int d = 0; d < (f.avx512_bf16 ? 4 : 3); d++) printf(" %9.3f %9.1f %9.1f        ", best[d] * 1e3, bytes[d] / best[d] / 1e9, fl / best[d] / 1e9);
        printf("\n");
    }
    printf("(W %d x %d, %d copies cycled; bf16: %s dot kernels to n = %d, sgemm on widened blocks above; int8: %s)\n", N, K,
           COPIES, cpu_isa_name(isa), BF16_SMALL_N, packed ? "avx512vnni register-blocked kernel on panels packed at load" : q8_isa_name(qk));
    /* the target: a 16-row step <= ~2.5x a 1-row step; exact f32 compute
     * is bound below by B / (FMA peak / 16 rows) (docs/RESULTS.md, where a
     * decode token's time goes) */
    double peak = fma_peak_gflops();
    printf("16 rows / 1 row (target <= 2.5x): bf16 f32 compute %.2fx, int8 %.2fx", r16[1] / r1[1], r16[2] / r1[2]);
    if (f.avx512_bf16) printf(", bf16 vdpbf16ps %.2fx", r16[3] / r1[3]);
    printf("\n");
    if (peak > 0) {
        double gb1 = (double)NK * 2 / r1[1] / 1e9; /* the 1-row GEMV's bytes a second */
        printf("FMA peak (in-run, %d threads) %.1f GFLOP/s: bf16 f32 compute at 16 rows %.1f %% of it; "
               "its 16 / 1 floor at the 1-row GEMV's %.1f GB/s: %.2fx\n",
               omp_get_max_threads(), peak, 100 * 2.0 * 16 * NK / r16[1] / 1e9 / peak, gb1, gb1 / (peak / 16.0));
    }
    free(w32), free(x), free(y), free(w16), free(w8), free(scr), free(wide), free(dps);
}

/* One layer's causal attention over T tokens: the f32 attention against
 * oneDNN's bf16 one (attn_dnnl.c), A/B interleaved, best of 3. */
static void attention_ab(const cp_config *c, int T)
{
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    float *q = rand_buf((size_t)T * qd, 9), *kk = rand_buf((size_t)T * kvd, 10), *vv = rand_buf((size_t)T * kvd, 11),
          *o = rand_buf((size_t)T * qd, 12);
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    if (!pos) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    for (int i = 0; i < T; i++) pos[i] = i;
    cp_attn_args a = { .q = q, .k = kk, .v = vv, .q_pos = pos, .k_pos = pos, .out = o, .n = T, .n_keys = T,
                       .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim };
    float *scr = malloc(cpu_attention_scratch_floats(&a) * sizeof(float));
    cp_dnnl_mm *mm = NULL;
    cp_dnnl_attn *at = NULL;
    cp_error err = { 0 };
    int have = cp_dnnl_mm_create(&mm, &err) == CP_OK && cp_dnnl_attn_create(&at, mm, &err) == CP_OK;
    double bf = 1e30, bd = 1e30;
    if (have && cp_dnnl_attention(at, &a, &err)) have = 0; /* the first call makes the primitives */
    for (int r = 0; r < 3; r++) {
        double t = now_s();
        cpu_attention(&a, scr);
        t = now_s() - t;
        bf = t < bf ? t : bf;
        if (!have) continue;
        t = now_s();
        cp_dnnl_attention(at, &a, &err);
        t = now_s() - t;
        bd = t < bd ? t : bd;
    }
    double fl = 2.0 * T * (T + 1) * c->head_dim * c->n_heads;
    if (have)
        printf("attention, 1 layer, %d tokens: f32 %.2f ms (%.1f GFLOP/s causal), oneDNN bf16 %.2f ms (%.1f), %.2fx\n", T, bf * 1e3,
               fl / bf / 1e9, bd * 1e3, fl / bd / 1e9, bf / bd);
    else
        printf("attention, 1 layer, %d tokens: f32 %.2f ms; oneDNN bf16 unavailable (%s)\n", T, bf * 1e3, err.msg);
    cp_dnnl_attn_destroy(at);
    cp_dnnl_mm_destroy(mm);
    free(q), free(kk), free(vv), free(o), free(pos), free(scr);
}

/* The int8 prefill GEMMs at T rows on the model's four matrix shapes:
 * gemm_i8.c's dot kernels (what every batch ran before) against the
 * register-blocked prefill kernel (gemm_i8_prefill.c), A/B interleaved,
 * best of 3 each, as int8 GOP/s (2 per multiply-add) and the share of the
 * in-run vpdpbusd ceiling. */
void prefill_i8_table(const cp_config *c, int T, int threads)
{
    const int H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim, inter = c->intermediate;
    const struct { const char *name; int out, in, count; } sh[] = {
        { "q / o", qd, H, 2 }, { "k / v", kvd, H, 2 }, { "gate / up", inter, H, 2 }, { "down", H, inter, 1 },
    };
    double peak = 2 * q8p_peak_ops(threads, 0.3) / 1e9;
    printf("\n%-34s %10.1f  (vpdpbusd on registers, %d threads)\n", "int8 ceiling GOP/s (in-run)", peak, threads);
    printf("%-20s %10s %10s %10s %10s %8s %8s\n", "int8 GEMM, T rows", "dot ms", "prefill ms", "dot GOP/s", "pre GOP/s", "speedup",
           "of peak");
    double tot_old = 0, tot_new = 0;
    for (size_t s = 0; s < sizeof sh / sizeof *sh; s++) {
        int N = sh[s].out, K = sh[s].in;
        float *w = rand_buf((size_t)N * K, 2), *x = rand_buf((size_t)T * K, 1), *y = rand_buf((size_t)T * N, 3);
        size_t qb = cp_q8_bytes(N, K), sb = q8p_scratch(T, K, threads), so = q8_scratch(T, K);
        char *b = aligned_alloc(64, (qb + 63) & ~(size_t)63);
        void *scr = aligned_alloc(64, ((sb > so ? sb : so) + 63) & ~(size_t)63);
        if (!w || !x || !y || !b || !scr) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
        cp_q8_quantize_rows((int8_t *)(b + cp_q8_off_data(N)), (float *)(void *)(b + cp_q8_off_scales()),
                            (int32_t *)(void *)(b + cp_q8_off_sums(N)), w, N, K);
        *(cp_q8_head *)(void *)b = (cp_q8_head){ CP_Q8_MAGIC, N, K, cp_q8_ld(K), CP_Q8_ROWS };
        double bo = 1e30, bn = 1e30;
        for (int r = 0; r < 3; r++) {
            double t = now_s();
            q8_gemm(Q8_VNNI, y, N, x, b, T, K, N, 0, scr);
            t = now_s() - t;
            bo = t < bo ? t : bo;
            t = now_s();
            q8p_gemm(y, N, x, b, T, K, N, 0, scr, threads);
            t = now_s() - t;
            bn = t < bn ? t : bn;
        }
        double ops = 2.0 * T * N * K;
        printf("  %-18s %10.2f %10.2f %10.1f %10.1f %7.2fx %7.1f%%\n", sh[s].name, bo * 1e3, bn * 1e3, ops / bo / 1e9, ops / bn / 1e9,
               bo / bn, 100 * ops / bn / 1e9 / peak);
        tot_old += sh[s].count * bo, tot_new += sh[s].count * bn;
        free(w), free(x), free(y), free(b), free(scr);
    }
    printf("  %-18s %10.2f %10.2f %21s %7.2fx  (one layer's 7 matrices; x %d layers)\n", "a layer", tot_old * 1e3, tot_new * 1e3, "",
           tot_old / tot_new, c->n_layers);
    attention_ab(c, T);
}

/* An A/B of the int8 matmul, one run, interleaved: the dispatch on a
 * row-major blob (the dot kernels up to Q8P_MIN_ROWS rows,
 * the prefill kernel repacking W per call past them) against the
 * register-blocked kernel straight on the matrix packed at load
 * (CP_Q8_PANELS), at the batch sizes serving runs, on the 0.5B shapes.
 * Enough copies of each matrix that a pass streams >= 256 MB (DRAM, as a
 * decode step does, not L3); best of 5 passes each; the outputs compared
 * bit for bit in the same run.  only_n: that batch size alone (0: all);
 * reps: passes each (5). */
void packed_i8_table(int threads, int only_n, int reps)
{
    const struct { const char *name; int out, in, nmax; } sh[] = {
        { "896x896 (q, o)", 896, 896, 512 }, { "128x896 (k, v)", 128, 896, 512 }, { "4864x896 (gate, up)", 4864, 896, 512 },
        { "896x4864 (down)", 896, 4864, 512 }, { "151936x896 (head)", 151936, 896, 64 },
    };
    static const int ns[] = { 1, 4, 16, 32, 48, 64, 256, 512 };
    printf("\nint8 matmul A/B, %d threads: old = row-major (dot kernels n <= %d, per-call repack past), new = packed at load\n", threads,
           Q8P_MIN_ROWS);
    printf("%-22s %5s %10s %10s %8s %10s %s\n", "shape", "n", "old ms", "new ms", "old/new", "new GB/s", "bits");
    for (size_t s = 0; s < sizeof sh / sizeof *sh; s++) {
        const int N = sh[s].out, K = sh[s].in, nmax = sh[s].nmax;
        size_t qb = cp_q8_bytes(N, K), pb = cp_q8_bytes_in(N, K, CP_Q8_PANELS);
        int copies = (int)((256u << 20) / pb) + 1;
        if (copies > 64) copies = 64;
        float *w = rand_buf((size_t)N * K, 2), *x = rand_buf((size_t)nmax * K, 1);
        float *yo = aligned_alloc(64, ((size_t)nmax * N * 4 + 63) & ~(size_t)63), *yn = aligned_alloc(64, ((size_t)nmax * N * 4 + 63) & ~(size_t)63);
        size_t sb = q8p_scratch(nmax, K, threads), so = q8_scratch(nmax, K);
        void *scr = aligned_alloc(64, ((sb > so ? sb : so) + 63) & ~(size_t)63);
        char *rows = aligned_alloc(64, (qb + 63) & ~(size_t)63), *pk = aligned_alloc(64, ((size_t)copies * pb + 63) & ~(size_t)63);
        char *ro = aligned_alloc(64, ((size_t)copies * qb + 63) & ~(size_t)63);
        if (!w || !x || !yo || !yn || !scr || !rows || !pk || !ro) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
        cp_q8_quantize_rows((int8_t *)(rows + cp_q8_off_data(N)), (float *)(void *)(rows + cp_q8_off_scales()),
                            (int32_t *)(void *)(rows + cp_q8_off_sums(N)), w, N, K);
        *(cp_q8_head *)(void *)rows = (cp_q8_head){ CP_Q8_MAGIC, N, K, cp_q8_ld(K), CP_Q8_ROWS };
        for (int c = 0; c < copies; c++) {
            memcpy(ro + (size_t)c * qb, rows, qb);
            cp_q8_pack_blob(pk + (size_t)c * pb, rows);
        }
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
            const int n = ns[a];
            if (n > nmax || (only_n && n != only_n)) continue;
            double bo = 1e30, bn = 1e30;
            for (int r = 0; r < reps; r++) {
                double t = now_s();
                for (int c = 0; c < copies; c++) {
                    const void *b = ro + (size_t)c * qb;
                    if (q8p_takes(Q8_VNNI, n)) q8p_gemm(yo, N, x, b, n, K, N, 0, scr, threads);
                    else q8_gemm(Q8_VNNI, yo, N, x, b, n, K, N, 0, scr);
                }
                t = (now_s() - t) / copies;
                bo = t < bo ? t : bo;
                t = now_s();
                for (int c = 0; c < copies; c++) q8p_gemm(yn, N, x, pk + (size_t)c * pb, n, K, N, 0, scr, threads);
                t = (now_s() - t) / copies;
                bn = t < bn ? t : bn;
            }
            int same = memcmp(yo, yn, (size_t)n * N * 4) == 0;
            printf("%-22s %5d %10.3f %10.3f %7.2fx %10.1f %s\n", sh[s].name, n, bo * 1e3, bn * 1e3, bo / bn, (double)pb / bn / 1e9,
                   same ? "equal" : "DIFFER");
        }
        free(w), free(x), free(yo), free(yn), free(scr), free(rows), free(pk), free(ro);
    }
}
