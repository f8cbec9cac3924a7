/* The annotator's attention export on the CPU, per layer: what an
 * exporting prefill (cacheprune, in-context / strict) adds to the
 * attention every mode runs.  Its output rows come from the pair kernel
 * (cpu_attention_rows, batch-invariant), and so do the export and the
 * sensitive mass, from the same scores (what the backend runs).  Beside
 * them, the general kernels' export, which the backend runs only for a
 * call without output rows.  Timed side by side, interleaved, best of
 * CP_EXPORT_REPS (9):
 *
 *   rows        cpu_attention_rows: the output rows (every mode)
 *   fused       cpu_attention_rows with the export and the mass: an
 *               exporting prefill's attention
 *   export      the general kernels' export-only call (out NULL)
 *   export+PV   the same call with output rows (V and the probabilities
 *               rounded, PV per head: the general kernels' full attention)
 *
 * and, on a CPU with AMX, the tile kernel the amx path runs
 * (cp_amx_attention): its rows alone and with the export and the mass.
 *
 * in this process's CPU time (all threads; steadier than wall time on a
 * machine shared with other work), wall time on a second line,
 * on oneDNN's bf16 products (the amx and avx512bf16 paths) and on the f32
 * BLAS ones (the other paths), for cp-books-6m's heads (8 / 4 x 32) and
 * qwen2.5-0.5b's (14 / 2 x 64), a plain prefill (every row computed) and
 * a reuse prefill (the last quarter of the rows plus every eighth row
 * before them computed, the rest of the keys placed).  The overhead is
 * fused / rows: an exporting layer's attention against a plain one's
 * (with the general kernels' export beside the rows: (rows + export) /
 * rows).
 *
 * usage: bench_export [TOKENS ...]   (default 512 1024) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/cpu/attn_dnnl.h"
#include "../kernels/cpu/gemm_amx.h"
#include "../kernels/cpu/ops_cpu.h"
#include "bench_clock.h"

/* this process's CPU time in ms (all threads) */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct shape {
    const char *name;
    int heads, kv, hd;
} shape;

static void *alloc_or_die(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_export: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static float *rand_buf(size_t n, uint32_t seed, float amp)
{
    float *p = alloc_or_die(n * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = amp * (((float)(seed >> 8) / 16777216.0f) * 2.0f - 1.0f);
    }
    return p;
}

enum { K_ROWS, K_FUSED, K_EXPORT, K_FULL, N_K };

/* one run of kernel k on a (dnnl: oneDNN's products, else BLAS); 0 on
 * success */
static int run(int k, int dnnl, cp_dnnl_attn *at, cp_attn_args a, float *out, float *S, int threads)
{
    cp_error err = { 0 };
    if (k == K_ROWS) {
        a.out = out, a.export_a = NULL, a.sens_mass = NULL, a.sens_cols = NULL;
        cpu_attention_rows(&a, S, threads, CPU_ATTN_AUTO);
        return 0;
    }
    if (k == K_FUSED) {
        a.out = out;
        cpu_attention_rows(&a, S, threads, CPU_ATTN_AUTO);
        return 0;
    }
    a.out = k == K_FULL ? out : NULL;
    if (dnnl) return cp_dnnl_attention(at, &a, &err) != CP_OK;
    cpu_attention_general(&a, S);
    return 0;
}

static void bench(const shape *sh, int T, int reuse, cp_dnnl_attn *at, int reps)
{
    int n = 0;
    int32_t *kp = alloc_or_die((size_t)T * sizeof *kp), *qp = alloc_or_die((size_t)T * sizeof *qp);
    for (int j = 0; j < T; j++) {
        kp[j] = j;
        if (!reuse || j >= T - T / 4 || j % 8 == 0) qp[n++] = j;
    }
    const size_t qd = (size_t)sh->heads * sh->hd, kvd = (size_t)sh->kv * sh->hd;
    float *q = rand_buf((size_t)n * qd, 1, 2.0f), *k = rand_buf((size_t)T * kvd, 2, 1.0f), *v = rand_buf((size_t)T * kvd, 3, 1.0f);
    float *out = alloc_or_die((size_t)n * qd * sizeof *out), *ex = alloc_or_die((size_t)n * T * sizeof *ex);
    float *mass = alloc_or_die((size_t)n * sizeof *mass);
    uint8_t *sens = alloc_or_die((size_t)T);
    for (int j = 0; j < T; j++) sens[j] = j % 11 == 0;
    const int threads = omp_get_max_threads();
    cp_attn_args a = { .q = q, .k = k, .v = v, .q_pos = qp, .k_pos = kp, .n = n, .n_keys = T, .n_heads = sh->heads,
                       .n_kv_heads = sh->kv, .head_dim = sh->hd, .export_a = ex, .export_ld = T,
                       .export_weight = 1.0f / sh->heads, .sens_cols = sens, .sens_mass = mass };
    size_t sf = cpu_attention_rows_scratch_floats(&a, threads, CPU_ATTN_AUTO), sg = cpu_attention_general_scratch_floats(&a);
    cp_attn_args e = a;
    e.out = NULL;
    if (cpu_attention_general_scratch_floats(&e) > sg) sg = cpu_attention_general_scratch_floats(&e);
    float *S = alloc_or_die((sf > sg ? sf : sg) * sizeof *S);
    for (int dnnl = 0; dnnl < 2; dnnl++) {
        if (dnnl && !at) {
            printf("  %-13s %5d keys %4d rows  oneDNN bf16: unavailable\n", sh->name, T, n);
            continue;
        }
        double best[2][N_K];
        for (int i = 0; i < N_K; i++) best[0][i] = best[1][i] = 1e30;
        int failed = 0;
        for (int r = 0; r <= reps && !failed; r++) /* r 0: warm-up (primitives made) */
            for (int kk = 0; kk < N_K && !failed; kk++) {
                double c = cpu_ms(), t = now_ms();
                failed = run(kk, dnnl, at, a, out, S, threads);
                t = now_ms() - t, c = cpu_ms() - c;
                if (r > 0 && c < best[0][kk]) best[0][kk] = c;
                if (r > 0 && t < best[1][kk]) best[1][kk] = t;
            }
        if (failed) {
            printf("  %-13s %5d keys %4d rows  %s: the export failed\n", sh->name, T, n, dnnl ? "oneDNN bf16" : "BLAS f32");
            continue;
        }
        for (int w = 0; w < 2; w++) {
            const double *b = best[w];
            printf("  %-13s %5d keys %4d rows  %-11s %-4s rows %7.3f ms  fused %7.3f ms (%.2fx)  general export %7.3f ms  "
                   "export+PV %7.3f ms  (rows + export) / rows %.2fx\n",
                   sh->name, T, n, dnnl ? "oneDNN bf16" : "BLAS f32", w ? "wall" : "CPU", b[K_ROWS], b[K_FUSED], b[K_FUSED] / b[K_ROWS],
                   b[K_EXPORT], b[K_FULL], (b[K_ROWS] + b[K_EXPORT]) / b[K_ROWS]);
        }
    }
    if (cp_amx_ready(&(cp_error){ 0 }) == CP_OK) {
        void *ts = alloc_or_die(cp_amx_attn_scratch(&a, threads));
        double best[2][2] = { { 1e30, 1e30 }, { 1e30, 1e30 } };
        int failed = 0;
        for (int r = 0; r <= reps && !failed; r++)
            for (int kk = 0; kk < 2 && !failed; kk++) {
                cp_attn_args t = a;
                t.out = out;
                if (!kk) t.export_a = NULL, t.sens_mass = NULL, t.sens_cols = NULL;
                cp_error err = { 0 };
                double c = cpu_ms(), w = now_ms();
                failed = cp_amx_attention(&t, ts, threads, &err) != CP_OK;
                w = now_ms() - w, c = cpu_ms() - c;
                if (r > 0 && c < best[0][kk]) best[0][kk] = c;
                if (r > 0 && w < best[1][kk]) best[1][kk] = w;
            }
        for (int w = 0; w < 2 && !failed; w++)
            printf("  %-13s %5d keys %4d rows  %-11s %-4s rows %7.3f ms  fused %7.3f ms (%.2fx)\n", sh->name, T, n, "AMX tiles", w ? "wall" : "CPU",
                   best[w][0], best[w][1], best[w][1] / best[w][0]);
        if (failed) printf("  %-13s %5d keys %4d rows  AMX tiles: failed\n", sh->name, T, n);
        free(ts);
    }
    free(kp), free(qp), free(q), free(k), free(v), free(out), free(ex), free(mass), free(sens), free(S);
}

int main(int argc, char **argv)
{
    static const shape shapes[] = { { "cp-books-6m", 8, 4, 32 }, { "qwen2.5-0.5b", 14, 2, 64 } };
    const char *r = getenv("CP_EXPORT_REPS");
    const int reps = r && atoi(r) > 0 ? atoi(r) : 9;
    cp_error err = { 0 };
    cp_dnnl_mm *mm = NULL;
    cp_dnnl_attn *at = NULL;
    if (cp_dnnl_mm_create(&mm, &err) != CP_OK || cp_dnnl_attn_create(&at, mm, &err) != CP_OK) {
        fprintf(stderr, "bench_export: oneDNN unavailable (%s): BLAS only\n", err.msg);
        at = NULL;
    }
    printf("attention export, one layer, %d threads, best of %d (ms)\n", omp_get_max_threads(), reps);
    int def[] = { 512, 1024 }, nt = argc > 1 ? argc - 1 : 2;
    for (int i = 0; i < nt; i++) {
        const int T = argc > 1 ? atoi(argv[i + 1]) : def[i];
        if (T < 16 || T > 65536) {
            fprintf(stderr, "bench_export: TOKENS must be 16..65536, got '%s'\n", argv[i + 1]);
            return 2;
        }
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int reuse = 0; reuse < 2; reuse++) bench(&shapes[s], T, reuse, at, reps);
    }
    cp_dnnl_attn_destroy(at);
    cp_dnnl_mm_destroy(mm);
    return 0;
}
