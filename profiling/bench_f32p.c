/* The f32-weight GEMMs at the row counts a serving step has: 1 (decode),
 * 16 (a decode batch), 64, 256, 512 (prefill chunks), over one layer of
 * the 0.5B shape (q, k, v, o, gate, up, down).  In one process,
 * alternating provider by provider each rep:
 *   - dot:   f32_gemm_dot, the batch-invariant dot kernels on row-major W;
 *   - f32p:  f32p_gemm, the batch-invariant register-blocked kernel on W
 *            packed at load (what the AVX-512 backend runs now);
 *   - sgemm: OpenBLAS cblas_sgemm (not batch-invariant: for reference).
 * Prints ms per layer (best of R by wall time: a shared machine's stalls
 * only ever add) and f32p's speed against each.
 * usage: bench_f32p [--reps R] */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/gemm_f32.h"
#include "bench_clock.h"

static float *buf(size_t n, unsigned seed)
{
    float *p = aligned_alloc(64, (n * sizeof *p + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "bench_f32p: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = (float)((seed = seed * 1103515245u + 12345u) >> 9) / 8388608.0f - 0.5f;
    return p;
}

enum { NMAT = 7, MAXN = 512 };

int main(int argc, char **argv)
{
    int reps = 5;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[++i]);
    cpu_features f;
    cpu_features_detect(&f);
    if (!f.avx512) {
        printf("bench_f32p: no AVX-512 here: f32p does not run\n");
        return 0;
    }
    static const int ins[NMAT] = { 896, 896, 896, 896, 896, 896, 4864 }, outs[NMAT] = { 896, 128, 128, 896, 4864, 4864, 896 };
    static const int rows[] = { 1, 16, 64, 256, 512 };
    float *w[NMAT], *p[NMAT];
    for (int m = 0; m < NMAT; m++) {
        w[m] = buf((size_t)outs[m] * ins[m], 7u + (unsigned)m);
        p[m] = buf(f32p_bytes(outs[m], ins[m]) / 4, 1);
        f32p_pack(p[m], w[m], outs[m], ins[m]);
    }
    float *x = buf((size_t)MAXN * 4864, 3), *y = buf((size_t)MAXN * 4864, 5);
    printf("bench_f32p: one 0.5B layer's 7 f32 matmuls, %d threads, best of %d, ms\n", omp_get_max_threads(), reps);
    printf("%6s %10s %10s %10s %12s %12s\n", "rows", "dot", "f32p", "sgemm", "dot/f32p", "sgemm/f32p");
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
        const int n = rows[r];
        double best[3] = { 1e30, 1e30, 1e30 };
        for (int rep = 0; rep < reps; rep++)
            for (int k = 0; k < 3; k++) {
                double t0 = now_s();
                for (int m = 0; m < NMAT; m++) {
                    if (k == 0) f32_gemm_dot(CPU_ISA_AVX512, y, outs[m], x, w[m], n, ins[m], outs[m], 0);
                    else if (k == 1) f32p_gemm(y, outs[m], x, p[m], n, ins[m], outs[m], 0);
                    else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, outs[m], ins[m], 1.0f, x, ins[m], w[m], ins[m], 0.0f, y, outs[m]);
                }
                double t = now_s() - t0;
                if (t < best[k]) best[k] = t;
            }
        printf("%6d %10.2f %10.2f %10.2f %11.2fx %11.2fx\n", n, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, best[0] / best[1],
               best[2] / best[1]);
    }
    for (int m = 0; m < NMAT; m++) free(w[m]), free(p[m]);
    free(x), free(y);
    return 0;
}
