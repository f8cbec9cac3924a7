/* The bf16-weight GEMMs (exact f32 compute) at the row counts a serving
 * step has: 1 (one decoder), 16 (a full decode batch), 17-64 (a decode
 * batch plus a prefill chunk), 128-512 (prefill).  For each of the 0.5B
 * shape's matrices it times, in one process and alternating call by call
 * on distinct copies of W (cycled past the L3, as a step streams them):
 *   - dot:     bf16_gemm_dot, one W row against 4 x rows at a time;
 *   - tiled:   bf16_gemm_tiled, 2 W rows x 4 x rows in registers;
 *   - blocked: bf16_gemm_blocked, sgemm on widened blocks of W;
 * and prints ms per call and, per row count, one step's matmuls (24 layers'
 * matrices and the LM head) under two dispatch rules: "old", dot to 16
 * rows and blocked above, and "new", bf16_gemm_small's choice to
 * BF16_SMALL_N and blocked above (the backend's rule), with new / old.
 * Best of R by wall time (a shared machine's stalls only ever add).
 * usage: bench_gemm_rows [--reps R] [--rows n,n,...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/dtype.h"
#include "bench_clock.h"
#include "bench_gemm_common.h"

enum { COPIES = 7, MAXN = 512 }; /* 7: prime to the 3 kernels, 61 MB of the largest layer matrix, past a 32 MB L3 */

int main(int argc, char **argv)
{
    int reps = 8, rows[16] = { 1, 16, 17, 32, 48, 64, 128 }, nrows = 7;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--rows") == 0) {
            nrows = 0;
            for (char *t = strtok(argv[++i], ","); t && nrows < 16; t = strtok(NULL, ",")) rows[nrows++] = atoi(t);
        }
    }
    for (int i = 0; i < nrows; i++)
        if (rows[i] < 1 || rows[i] > MAXN) return fprintf(stderr, "bench_gemm_rows: rows in [1, %d]\n", MAXN), 2;
    if (reps < 1) reps = 1;
    const bench_shape sh[] = { { "gate/up 4864x896", 4864, 896, 2 }, { "down 896x4864", 896, 4864, 1 }, { "q/o 896x896", 896, 896, 2 },
                         { "k/v 128x896", 128, 896, 2 }, { "lm head 151936x896", 151936, 896, 0 } };
    const int nsh = (int)(sizeof sh / sizeof sh[0]), layers = 24;
    cpu_features f;
    cpu_features_detect(&f);
    cpu_isa isa = f.avx512 ? CPU_ISA_AVX512 : f.avx2_fma ? CPU_ISA_AVX2 : CPU_ISA_GENERIC;
    printf("bench_gemm_rows: %s kernels, %d threads, best of %d, %d copies of W cycled\n", cpu_isa_name(isa), omp_get_max_threads(), reps,
           COPIES);
    printf("%-20s %5s %10s %10s %10s %10s\n", "matrix", "rows", "dot ms", "tiled ms", "blocked ms", "new / old");
    double step[2][16] = { { 0 } }, layer[2][16] = { { 0 } }, head[2][16] = { { 0 } };
    for (int s = 0; s < nsh; s++) {
        const int N = sh[s].out, K = sh[s].in;
        const int copies = sh[s].per_layer ? COPIES : 1; /* the LM head alone is past the L3 */
        size_t NK = (size_t)N * K;
        uint16_t *w = bench_xmalloc("bench_gemm_rows", NK * copies * 2);
        float *tmp = bench_xmalloc("bench_gemm_rows", NK * sizeof(float));
        for (int c = 0; c < copies; c++) {
            bench_fill(tmp, NK, 7 + c);
            for (size_t i = 0; i < NK; i++) w[c * NK + i] = cp_f32_to_bf16(tmp[i]);
        }
        free(tmp);
        float *x = bench_xmalloc("bench_gemm_rows", (size_t)MAXN * K * 4), *y = bench_xmalloc("bench_gemm_rows", (size_t)MAXN * N * 4);
        float *scr = bench_xmalloc("bench_gemm_rows", bf16_gemm_blocked_scratch(K, N) * sizeof(float));
        bench_fill(x, (size_t)MAXN * K, 3);
        for (int r = 0; r < nrows; r++) {
            const int n = rows[r];
            if (!sh[s].per_layer && n > 64) continue; /* the LM head runs over the decoders' rows only */
            double best[3] = { 1e30, 1e30, 1e30 };
            for (int rep = 0; rep < reps * copies; rep++) {
                for (int k = 0; k < 3; k++) { /* each call on another copy: none finds W in the L3 from the call before */
                    const uint16_t *wc = w + (size_t)((rep * 3 + k) % copies) * NK;
                    double t = now_s();
                    if (k == 0) bf16_gemm_dot(isa, y, N, x, wc, n, K, N, 0);
                    else if (k == 1) bf16_gemm_tiled(isa, y, N, x, wc, n, K, N, 0);
                    else bf16_gemm_blocked(y, N, x, wc, n, K, N, 0, scr);
                    t = now_s() - t;
                    if (t < best[k]) best[k] = t;
                }
            }
            /* what the backend runs at this n, before and now */
            double old = n <= 16 ? best[0] : best[2];
            double now = n > BF16_SMALL_N ? best[2] : n >= 2 && K >= BF16_TILE_MIN_IN ? best[1] : best[0];
            printf("%-20s %5d %10.3f %10.3f %10.3f %9.2fx\n", sh[s].name, n, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, now / old);
            double times = sh[s].per_layer ? sh[s].per_layer * layers : 1;
            step[0][r] += old * times, step[1][r] += now * times;
            double *part[2] = { sh[s].per_layer ? layer[0] : head[0], sh[s].per_layer ? layer[1] : head[1] };
            part[0][r] += old * times, part[1][r] += now * times;
        }
        free(w), free(x), free(y), free(scr);
    }
    printf("\none step's matmuls (24 layers, and the LM head over all rows up to 64), ms, as the backend runs them:\n%5s %10s %10s %10s\n",
           "rows", "old", "new", "new / old");
    for (int r = 0; r < nrows; r++)
        printf("%5d %10.1f %10.1f %9.2fx\n", rows[r], step[0][r] * 1e3, step[1][r] * 1e3, step[1][r] / step[0][r]);
    /* --step-tokens S at 16 decoders: a step of 16 + P rows whose LM head
     * covers the 16 decoders and the prompt's last row, against a pure
     * decode step of 16 (the target: at most about 2x) */
    int i16 = -1, i17 = -1;
    for (int r = 0; r < nrows; r++) i16 = rows[r] == 16 ? r : i16, i17 = rows[r] == 17 ? r : i17;
    if (i16 >= 0 && i17 >= 0) {
        printf("\na step of 16 decoders + P prompt tokens (layers at 16 + P rows, LM head at 17) vs a pure 16-row decode step, matmuls only:\n"
               "%5s %10s %10s %10s\n", "S", "P", "old", "new");
        for (int r = 0; r < nrows; r++) {
            if (rows[r] <= 17) continue;
            double v[2];
            for (int k = 0; k < 2; k++) v[k] = (layer[k][r] + head[k][i17]) / (layer[k][i16] + head[k][i16]);
            printf("%5d %10d %9.2fx %9.2fx\n", rows[r], rows[r] - 16, v[0], v[1]);
        }
    }
    return 0;
}
