/* make bench: prefill and decode throughput of the CPU backend on a synth
 * qwen2.5-0.5b, next to the BLAS's own sgemm rate measured in the same run
 * (the ceiling) and the time to stream the weights once (decode's floor).
 * Ratios, not absolute times, are what to compare across machines.
 *
 * --dtype f32|bf16|auto loads the weights so (one dtype per process, so the
 * peak RSS is that dtype's); with bf16 the run also prints the bf16 GEMM
 * ceilings of the same shape — f32 compute from bf16 weights (our blocked
 * sgemm) and oneDNN's bf16 matmul — and which path the backend chose.
 * --dtype int8: the int8 kernels (kernels/cpu/gemm_i8.h).  Every run
 * measures the machine's stream-read bandwidth on a large buffer and
 * states decode as a share of it: bytes of weights a token streams over
 * the time a token takes. */
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
#include "../model/model.h"
#include "../model/synth.h"

char *openblas_get_corename(void);
char *openblas_get_config(void);
int openblas_get_num_threads(void);

#include "bench_clock.h"

static void die(const char *what, const cp_error *err)
{
    fprintf(stderr, "bench: %s: %s\n", what, err->msg);
    exit(1);
}

static float *rand_buf(size_t n, uint64_t seed)
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
static double sgemm_gflops(int M, int N, int K, int reps)
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
static double dnnl_sgemm_gflops(int M, int N, int K, int reps)
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
static double sgemv_gflops(int N, int K, int reps)
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
static void bf16_gemm_gflops(int M, int N, int K, int reps, double *widened, double *onednn, const char **impl)
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
static double gemv_gbs(int N, int K, cpu_isa isa, int bf16)
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
static void bf16_kernel_crossover(int N, int K, cpu_isa isa)
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
static void skinny_table(int N, int K, cpu_isa isa, q8_isa qk)
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
static void prefill_i8_table(const cp_config *c, int T, int threads)
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
static void packed_i8_table(int threads, int only_n, int reps)
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

static void cpu_name(char *out, size_t cap)
{
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) snprintf(out, cap, "%s", v + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
}

/* threads in this process: one OpenMP pool serves our loops, OpenBLAS and
 * oneDNN when this stays at OMP_NUM_THREADS (+ the main thread's count) */
static int thread_count(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    if (f) fclose(f);
    return n;
}

/* FLOPs of a prefill of T tokens (LM head for the last position only). */
static double prefill_flops(const cp_config *c, int T)
{
    double H = c->hidden, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    double per_tok = 2 * (H * qd + 2 * H * kvd + qd * H + 3 * H * c->intermediate);
    double attn = 0;
    for (int i = 0; i < T; i++) attn += 4.0 * (i + 1) * c->head_dim * c->n_heads;
    return c->n_layers * (T * per_tok + attn) + 2 * H * c->vocab;
}

/* XOR of every 32-bit word, vectorized (omp simd: gcc 12's -O2 leaves a
 * reduction with a remainder scalar, which ran at a third of the memory's
 * speed), so the loop runs at memory speed. */
static uint32_t xor_words(const void *p, size_t n_words)
{
    const uint32_t *w = p;
    uint32_t x = 0;
#pragma omp parallel for simd reduction(^ : x) schedule(static)
    for (size_t i = 0; i < n_words; i++) x ^= w[i];
    return x;
}

/* bytes of one matrix as the model holds it */
static size_t mat_bytes(const cp_model *m, size_t rows, size_t cols)
{
    if (m->matrix_dtype == CP_I8) return cp_q8_bytes((int64_t)rows, (int64_t)cols);
    return rows * cols * cp_dtype_size(m->matrix_dtype);
}

/* Reads every weight byte a decode step reads once (the matrices of every
 * layer and the output head); *bytes gets their total. */
static double stream_weights_s(const cp_model *m, size_t *bytes)
{
    const cp_config *c = &m->cfg;
    size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim,
           inter = c->intermediate;
    double best = 1e30;
    uint32_t sink = 0;
    for (int r = 0; r < 3; r++) {
        size_t total = 0;
        double t = now_s();
        for (int l = 0; l < c->n_layers; l++) {
            const cp_layer_weights *w = &m->layers[l];
            const void *mats[] = { w->wq.data, w->wk.data, w->wv.data, w->wo.data, w->w_gate.data, w->w_up.data, w->w_down.data };
            size_t rows[] = { qd, kvd, kvd, H, inter, inter, H }, cols[] = { H, H, H, qd, H, H, inter };
            for (int k = 0; k < 7; k++) {
                size_t b = mat_bytes(m, rows[k], cols[k]);
                sink ^= xor_words(mats[k], b / 4);
                total += b;
            }
        }
        size_t b = mat_bytes(m, (size_t)c->vocab, H);
        sink ^= xor_words(m->lm_head.data, b / 4);
        total += b;
        t = now_s() - t;
        if (t < best) best = t;
        *bytes = total;
    }
    if (sink == 0x12345678u) printf(" ");
    return best;
}

/* One decode step's matmuls alone (1 row, the model's own weights through
 * the backend, in the forward's order, LM head last), seconds, best of 3:
 * with stream_weights_s and the decode time it splits a decode token into
 * its GEMVs (against the stream read) and everything else (norms, RoPE,
 * attention over the cache, the forward's own code); *lm_head_s is the LM
 * head's share. */
static double decode_matmuls_s(cp_backend *be, const cp_model *m, double *lm_head_s)
{
    const cp_config *c = &m->cfg;
    int H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim, inter = c->intermediate;
    int widest = c->vocab > inter ? c->vocab : inter;
    float *x = rand_buf((size_t)(inter > qd ? inter : qd), 7), *y = rand_buf((size_t)widest, 8);
    cp_error err = { 0 };
    double best = 1e30;
    *lm_head_s = 0;
    for (int r = 0; r < 3; r++) {
        double t = now_s();
        for (int l = 0; l < c->n_layers; l++) {
            const cp_layer_weights *w = &m->layers[l];
            be->matmul(be, y, qd, x, &w->wq, NULL, 1, H, qd, 0);
            be->matmul(be, y, kvd, x, &w->wk, NULL, 1, H, kvd, 0);
            be->matmul(be, y, kvd, x, &w->wv, NULL, 1, H, kvd, 0);
            be->matmul(be, y, H, x, &w->wo, NULL, 1, qd, H, 1);
            be->matmul(be, y, inter, x, &w->w_gate, NULL, 1, H, inter, 0);
            be->matmul(be, y, inter, x, &w->w_up, NULL, 1, H, inter, 0);
            be->matmul(be, y, H, x, &w->w_down, NULL, 1, inter, H, 1);
        }
        double tl = now_s();
        be->matmul(be, y, c->vocab, x, &m->lm_head, NULL, 1, H, c->vocab, 0);
        if (be->sync(be, &err)) die("decode matmuls", &err);
        double t1 = now_s();
        if (t1 - t < best) best = t1 - t, *lm_head_s = t1 - tl;
    }
    free(x), free(y);
    return best;
}

/* The machine's stream-read bandwidth, GB/s: best of 5 reads of a 512 MiB
 * buffer (far past every cache), the same reduction as above. */
static double stream_read_gbs(void)
{
    const size_t bytes = (size_t)512 << 20;
    uint32_t *buf = malloc(bytes), sink = 0;
    if (!buf) { fprintf(stderr, "bench: out of memory for the bandwidth buffer\n"); exit(1); }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < bytes / 4; i++) buf[i] = (uint32_t)i; /* touched by the threads that read it */
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t = now_s();
        sink ^= xor_words(buf, bytes / 4);
        t = now_s() - t;
        if (t < best) best = t;
    }
    if (sink == 0x12345678u) printf(" ");
    free(buf);
    return bytes / best / 1e9;
}

/* the process's CPU time, all threads */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

int main(int argc, char **argv)
{
    const char *dir = "build/synth-qwen2.5-0.5b";
    int T = 1024, n_decode = 16, decode_only = 0;
    cp_weight_dtype dtype = CP_WEIGHTS_F32;
    cp_dtype kv_dtype = CP_F32;
    if (argc == 2 && strcmp(argv[1], "--skinny") == 0) { /* the skinny-GEMM table alone, on the 0.5B MLP shape */
        cpu_features f;
        cpu_features_detect(&f);
        cpu_isa isa = f.avx512 ? CPU_ISA_AVX512 : f.avx2_fma ? CPU_ISA_AVX2 : CPU_ISA_GENERIC;
        skinny_table(4864, 896, isa, q8_isa_for(isa, 0, &f));
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--prefill-i8") == 0) { /* the int8 prefill GEMM table alone, 0.5B shapes, T rows */
        cp_config c = { .hidden = 896, .n_heads = 14, .n_kv_heads = 2, .head_dim = 64, .intermediate = 4864, .n_layers = 24 };
        prefill_i8_table(&c, argc > 2 ? atoi(argv[2]) : 1024, openblas_get_num_threads());
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--packed-i8") == 0) { /* the int8 matmul A/B alone [one n, its reps] */
        packed_i8_table(openblas_get_num_threads(), argc > 2 ? atoi(argv[2]) : 0, argc > 3 ? atoi(argv[3]) : 5);
        return 0;
    }
    for (int i = 1; i < argc; i += 2) {
        if (strcmp(argv[i], "--decode-only") == 0) { /* a flag: no value */
            decode_only = 1, i--;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench: %s needs a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
        else if (strcmp(argv[i], "--kv-dtype") == 0 && (strcmp(argv[i + 1], "f32") == 0 || strcmp(argv[i + 1], "bf16") == 0))
            kv_dtype = strcmp(argv[i + 1], "bf16") == 0 ? CP_BF16 : CP_F32;
        else if (strcmp(argv[i], "--tokens") == 0) T = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--decode") == 0) n_decode = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--dtype") == 0) {
            cp_error e = { 0 };
            if (cp_weight_dtype_from_name(argv[i + 1], &dtype, &e)) { fprintf(stderr, "bench: %s\n", e.msg); return 2; }
        } else {
            fprintf(stderr, "usage: bench_forward --skinny | [--dir DIR] [--tokens T] [--decode N] [--dtype f32|bf16|int8|auto] "
                            "[--kv-dtype f32|bf16] [--decode-only]\n");
            return 2;
        }
    }
    if (T < 2 || n_decode < 1) {
        fprintf(stderr, "bench: --tokens must be >= 2 and --decode >= 1\n");
        return 2;
    }
    cp_error err = { 0 };
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    struct stat sb;
    if (stat(cfg_path, &sb) != 0) {
        fprintf(stderr, "bench: writing synth qwen2.5-0.5b to %s ...\n", dir);
        cp_synth_opts so = { .shape = "qwen2.5-0.5b", .out_dir = dir, .seed = 1 };
        if (cp_synth(&so, &err)) die("synth", &err);
    }
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("BLAS: OpenBLAS core %s, %d threads, OPENBLAS_CORETYPE=%s\n  config: %s\n", openblas_get_corename(),
           openblas_get_num_threads(), coretype ? coretype : "(unset)", openblas_get_config());

    cp_backend *be;
    cp_model *m;
    if (cp_backend_cpu_create(&be, &err)) die("backend", &err);
    double t_load = now_s();
    cp_load_opts lo = { .dtype = dtype };
    if (cp_model_load(dir, be, &lo, &m, &err)) die("load", &err);
    t_load = now_s() - t_load;
    long rss_loaded = peak_rss_mb();
    const cp_config *c = &m->cfg;
    char cpu[160];
    cpu_name(cpu, sizeof cpu);
    cpu_features feat;
    cpu_features_detect(&feat);
    printf("CPU: %s (avx2 %d, avx512 %d, avx512_bf16 %d, amx_bf16 %d); oneDNN ISA %s; OMP_NUM_THREADS=%s\n", cpu, feat.avx2_fma,
           feat.avx512, feat.avx512_bf16, feat.amx_bf16, cp_dnnl_mm_isa(), getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "(unset)");
    char compute[1024];
    if (cp_cpu_compute_line(be, 0, compute, sizeof compute, &err) == CP_OK) printf("%s\n", compute);

    cp_state *s;
    if (cp_state_create_kv(m, T + n_decode, 1024, kv_dtype, &s, &err)) die("state", &err);
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 7919) % 20000);
    float *lg = malloc((size_t)c->vocab * sizeof(float));
    /* warm-up: thread pools, page faults of the scratch buffers */
    if (cp_forward(m, s, ids, NULL, 64, CP_LOGITS_LAST, lg, NULL, &err)) die("warm-up", &err);
    if (cp_state_reset(m, s, &err)) die("reset", &err);
    double t = now_s();
    const double cpu_p0 = cpu_s();
    if (cp_forward(m, s, ids, NULL, T, CP_LOGITS_LAST, lg, NULL, &err)) die("prefill", &err);
    double t_prefill = now_s() - t, cpu_prefill = cpu_s() - cpu_p0;
    int32_t tok = 1;
    t = now_s();
    const double cpu0 = cpu_s();
    for (int i = 0; i < n_decode; i++)
        if (cp_forward(m, s, &tok, NULL, 1, CP_LOGITS_LAST, lg, NULL, &err)) die("decode", &err);
    double t_decode = (now_s() - t) / n_decode, cpu_decode = (cpu_s() - cpu0) / n_decode;
    if (decode_only) { /* the A/B line: wall and all threads' CPU time a token (OMP_WAIT_POLICY=passive: no spinning counted) */
        printf("decode at context %d..%d (%s weights, %s KV, %d threads): %.3f ms/token wall, %.3f ms/token CPU, %.2f tok/s\n", T,
               T + n_decode, cp_dtype_name(m->matrix_dtype), cp_dtype_name(kv_dtype), thread_count(), t_decode * 1e3, cpu_decode * 1e3,
               1 / t_decode);
        free(ids), free(lg);
        cp_state_free(m, s);
        cp_model_free(m);
        cp_backend_destroy(be);
        return 0;
    }
    double fl = prefill_flops(c, T), gf = fl / t_prefill / 1e9;
    long rss_peak = peak_rss_mb(); /* before the ceilings' own buffers */
    int threads = thread_count();
    const char *path = be->describe(be);
    char path_now[256];
    snprintf(path_now, sizeof path_now, "%s", path);

    double ceiling = sgemm_gflops(T, c->intermediate, c->hidden, 3);
    double dnnl_f32 = dnnl_sgemm_gflops(T, c->intermediate, c->hidden, 3);
    double gemv_blas = sgemv_gflops(c->intermediate, c->hidden, 10), gemv_dnnl = dnnl_sgemm_gflops(1, c->intermediate, c->hidden, 10);
    size_t token_bytes = 0;
    double stream = stream_weights_s(m, &token_bytes), bw = stream_read_gbs(), t_lm = 0, t_mm = decode_matmuls_s(be, m, &t_lm);
    double c_wide = 0, c_dnnl = 0;
    const char *impl = "";
    bf16_gemm_gflops(T, c->intermediate, c->hidden, 3, &c_wide, &c_dnnl, &impl);
    cpu_isa best_isa = feat.avx512 ? CPU_ISA_AVX512 : feat.avx2_fma ? CPU_ISA_AVX2 : CPU_ISA_GENERIC;
    double gv32 = gemv_gbs(c->intermediate, c->hidden, best_isa, 0), gv16 = gemv_gbs(c->intermediate, c->hidden, best_isa, 1);

    printf("\nmodel: %s (%s, %d layers, hidden %d, %.2f GB of %s weights, loaded in %.1f s)\n", dir, c->arch_name,
           c->n_layers, c->hidden, m->weight_bytes / 1e9, cp_dtype_name(m->matrix_dtype), t_load);
    printf("matmul path: %s\n", path_now);
    printf("%-34s %12s %12s %10s\n", "measure", "value", "baseline", "ratio");
    printf("%-34s %12.1f %12s %10s  (OpenBLAS %s kernels)\n", "sgemm GFLOP/s (ceiling, in-run)", ceiling, "", "", openblas_get_corename());
    printf("%-34s %12.1f %12.1f %9.2fx  (dnnl_sgemm, %d rows)\n", "oneDNN f32 GEMM GFLOP/s", dnnl_f32, ceiling, dnnl_f32 / ceiling, T);
    printf("%-34s %12.1f %12.1f %9.2fx  (dnnl_sgemm vs OpenBLAS sgemv, 1 row)\n", "f32 GEMV GFLOP/s oneDNN vs OpenBLAS", gemv_dnnl,
           gemv_blas, gemv_dnnl / gemv_blas);
    printf("%-34s %12.1f %12.1f %9.2fx\n", "bf16 weights, f32 compute GFLOP/s", c_wide, ceiling, c_wide / ceiling);
    printf("%-34s %12.1f %12.1f %9.2fx  (%s)\n", "oneDNN bf16 matmul GFLOP/s", c_dnnl, ceiling, c_dnnl / ceiling, impl);
    printf("%-34s %12.1f %12.1f %9.2fx  (%s dot kernel vs sgemv)\n", "decode GEMV GB/s bf16 vs f32", gv16, gv32, gv16 / gv32,
           cpu_isa_name(best_isa));
    printf("%-34s %12.1f %12.1f %9.2fx\n", "prefill GFLOP/s vs sgemm", gf, ceiling, gf / ceiling);
    printf("%-34s %12.1f %12s %10s\n", "prefill tok/s", T / t_prefill, "", "");
    printf("%-34s %12.1f %12.1f %9.2fx\n", "decode ms/token vs weight stream", t_decode * 1e3, stream * 1e3,
           t_decode / stream);
    printf("%-34s %12.2f %12s %10s\n", "decode tok/s at context", 1 / t_decode, "", "");
    /* per second of all threads' CPU time (passive waits add none): at 1
     * thread the forward's own speed, whatever else the machine runs */
    printf("%-34s %12.1f %12s %10s\n", "prefill tok/CPU-s", T / cpu_prefill, "", "");
    printf("%-34s %12.2f %12s %10s\n", "decode tok/CPU-s", 1 / cpu_decode, "", "");
    printf("%-34s %12.1f %12s %10s  (%zu MiB buffer, best of 5)\n", "stream read GB/s (in-run)", bw, "", "", (size_t)512);
    printf("%-34s %12.1f %12.1f %9.1f%%  (%.1f MB of weights a token)\n", "decode GB/s vs stream read", token_bytes / t_decode / 1e9, bw,
           100 * token_bytes / t_decode / 1e9 / bw, token_bytes / 1e6);
    printf("%-34s %12.1f %12.1f %9.1f%%  (matmuls alone; LM head %.1f ms of them)\n", "decode GEMVs GB/s vs stream read",
           token_bytes / t_mm / 1e9, bw, 100 * token_bytes / t_mm / 1e9 / bw, t_lm * 1e3);
    printf("%-34s %12.1f %12.1f %9.1f%%  (the rest: norms, RoPE, attention at context, the forward's code)\n",
           "decode ms/token: GEMVs, rest", t_mm * 1e3, (t_decode - t_mm) * 1e3, 100 * (t_decode - t_mm) / t_decode);
    printf("%-34s %12ld %12s %10s\n", "peak RSS MB (load + prefill + decode)", rss_peak, "", "");
    printf("%-34s %12ld %12s %10s\n", "peak RSS MB after the load", rss_loaded, "", "");
    printf("%-34s %12d %12s %10s\n", "threads after prefill", threads, "", "");
    printf("(prefill of %d tokens = %.3f TFLOP; decode at context %d..%d)\n", T, fl / 1e12, T, T + n_decode);

    if (m->matrix_dtype == CP_BF16 && !getenv("CP_CPU_ISA")) bf16_kernel_crossover(c->intermediate, c->hidden, best_isa);
    if (m->matrix_dtype == CP_I8 || getenv("CP_BENCH_SKINNY"))
        skinny_table(c->intermediate, c->hidden, best_isa, q8_isa_for(best_isa, 0, &feat));
    if (m->matrix_dtype == CP_I8 && feat.avx512_vnni) prefill_i8_table(c, T, openblas_get_num_threads());

    /* kernel microbenchmarks: one layer's worth at T tokens */
    printf("\n%-34s %12s\n", "kernel (CPU, T tokens)", "ms");
    float *x = rand_buf((size_t)T * c->hidden, 5), *w = rand_buf((size_t)c->hidden, 6);
    t = now_s();
    cpu_rmsnorm(x, x, w, T, c->hidden, 1e-6f);
    printf("%-34s %12.3f\n", "rmsnorm", (now_s() - t) * 1e3);
    size_t gi = (size_t)T * c->intermediate;
    float *g = rand_buf(gi, 7), *u = rand_buf(gi, 8);
    t = now_s();
    cpu_swiglu(g, g, u, gi);
    printf("%-34s %12.3f\n", "swiglu", (now_s() - t) * 1e3);
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    float *q = rand_buf((size_t)T * qd, 9), *kk = rand_buf((size_t)T * kvd, 10), *vv = rand_buf((size_t)T * kvd, 11),
          *o = rand_buf((size_t)T * qd, 12);
    float *cs = rand_buf((size_t)T * c->head_dim / 2, 13), *sn = rand_buf((size_t)T * c->head_dim / 2, 14);
    t = now_s();
    cpu_rope(q, qd, cs, sn, T, c->n_heads, c->head_dim);
    printf("%-34s %12.3f\n", "rope (queries)", (now_s() - t) * 1e3);
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int i = 0; i < T; i++) pos[i] = i;
    cp_attn_args a = { .q = q, .k = kk, .v = vv, .q_pos = pos, .k_pos = pos, .out = o, .n = T, .n_keys = T,
                       .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim };
    float *scr = malloc(cpu_attention_scratch_floats(&a) * sizeof(float));
    t = now_s();
    cpu_attention(&a, scr);
    double ta = now_s() - t;
    printf("%-34s %12.3f  (%.1f GFLOP/s causal)\n", "attention prefill (1 layer)", ta * 1e3,
           2.0 * T * (T + 1) * c->head_dim * c->n_heads / ta / 1e9);
    free(x), free(w), free(g), free(u), free(q), free(kk), free(vv), free(o), free(cs), free(sn), free(pos), free(scr);
    free(ids), free(lg);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
    return 0;
}
