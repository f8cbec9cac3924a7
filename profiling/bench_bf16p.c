/* bf16 compute over bf16 weights at a serving step's row counts: for each
 * of the 0.5B shape's matrices, in one process
 * and alternating call by call on distinct copies of W (cycled past the
 * L3, as a step streams them):
 *   - bf16p:  bf16p_gemm on W packed once (gemm_bf16_packed.h), the
 *             batch-invariant register-blocked vdpbf16ps kernel;
 *   - onednn: oneDNN's bf16 matmul on its own packed layout (what
 *             CP_CPU_ISA=amx runs at every n on packed matrices);
 *   - dp:     bf16_gemm_small_dp, the vdpbf16ps dot kernel on plain W
 *             (n <= 64; the backend runs it on amx's plain
 *             matrices at small n where the CPU has AVX512_BF16);
 *   - f32:    exact f32 compute from bf16 W (auto's: dot kernels to 64
 *             rows, sgemm on widened blocks above);
 *   - plain:  bf16p_gemm_plain on the plain W, the same bits (what the
 *             tied LM head runs; timed on the LM head only).
 * ms per call, GFLOP/s, bf16p / onednn and bf16p / dp time ratios, then one
 * step's matmuls (24 layers and the LM head, which runs over at most 64
 * rows) per kernel and their ratios.  Best of R by wall time.
 * usage: bench_bf16p [--reps R] [--rows n,n,...] [--only SHAPE_INDEX] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/cpu/gemm_bf16_packed.h"
#include "../kernels/cpu/gemm_dnnl.h"
#include "../kernels/dtype.h"
#include "bench_clock.h"
#include "bench_gemm_common.h"

enum { COPIES = 7, MAXN = 512, K_BF16P = 0, K_DNNL, K_DP, K_F32, K_PLAIN, NK_ };
static const char *const kname[NK_] = { "bf16p", "onednn", "dp", "f32", "plain" };

int main(int argc, char **argv)
{
    int reps = 6, rows[16] = { 1, 4, 16, 32, 48, 64, 512 }, nrows = 7, only = -1;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0) only = atoi(argv[++i]);
        else if (strcmp(argv[i], "--rows") == 0) {
            nrows = 0;
            for (char *t = strtok(argv[++i], ","); t && nrows < 16; t = strtok(NULL, ",")) rows[nrows++] = atoi(t);
        }
    }
    for (int i = 0; i < nrows; i++)
        if (rows[i] < 1 || rows[i] > MAXN) return fprintf(stderr, "bench_bf16p: rows in [1, %d]\n", MAXN), 2;
    if (reps < 1) reps = 1;
    cpu_features f;
    cpu_features_detect(&f);
    if (!f.avx512_bf16) return fprintf(stderr, "bench_bf16p: this CPU has no AVX512_BF16\n"), 2;
    cp_error err = { 0 };
    cp_dnnl_mm *dnnl = NULL;
    if (cp_dnnl_mm_create(&dnnl, &err)) return fprintf(stderr, "bench_bf16p: %s\n", err.msg), 1;
    const bench_shape sh[] = { { "gate/up 4864x896", 4864, 896, 2 }, { "down 896x4864", 896, 4864, 1 }, { "q/o 896x896", 896, 896, 2 },
                         { "k/v 128x896", 128, 896, 2 }, { "lm head 151936x896", 151936, 896, 0 } };
    const int nsh = (int)(sizeof sh / sizeof sh[0]), layers = 24;
    printf("bench_bf16p: %d threads, best of %d, %d copies of W cycled (1 of the LM head); oneDNN isa %s\n", omp_get_max_threads(), reps,
           COPIES, cp_dnnl_mm_isa());
    printf("%-20s %5s %9s %9s %9s %9s | %8s %8s %8s %8s | %12s %9s\n", "matrix", "rows", "bf16p ms", "onednn ms", "dp ms", "f32 ms",
           "bf16p GF", "onednn GF", "dp GF", "f32 GF", "bf16p/onednn", "bf16p/dp");
    double step[NK_][16] = { { 0 } };
    for (int s = 0; s < nsh; s++) {
        if (only >= 0 && s != only) continue;
        const int N = sh[s].out, K = sh[s].in;
        const int copies = sh[s].per_layer ? COPIES : 1;
        const size_t NKe = (size_t)N * K, pb = bf16p_bytes(N, K);
        size_t db = cp_dnnl_mm_packed_bytes(dnnl, K, N, &err);
        if (!db) return fprintf(stderr, "bench_bf16p: %s\n", err.msg), 1;
        uint16_t *w = bench_xmalloc("bench_bf16p", NKe * copies * 2);
        char *wp = bench_xmalloc("bench_bf16p", pb * copies), *wd = bench_xmalloc("bench_bf16p", db * copies);
        float *tmp = bench_xmalloc("bench_bf16p", NKe * sizeof(float));
        for (int c = 0; c < copies; c++) {
            bench_fill(tmp, NKe, 7 + c);
            for (size_t i = 0; i < NKe; i++) w[c * NKe + i] = cp_f32_to_bf16(tmp[i]);
            bf16p_pack(wp + c * pb, w + c * NKe, N, K);
            if (cp_dnnl_mm_pack(dnnl, wd + c * db, db, w + c * NKe, K, N, &err)) return fprintf(stderr, "bench_bf16p: %s\n", err.msg), 1;
        }
        free(tmp);
        float *x = bench_xmalloc("bench_bf16p", (size_t)MAXN * K * 4), *y = bench_xmalloc("bench_bf16p", (size_t)MAXN * N * 4);
        size_t scr_b = bf16_gemm_blocked_scratch(K, N) * sizeof(float);
        if (bf16p_scratch(MAXN, K) > scr_b) scr_b = bf16p_scratch(MAXN, K);
        if (bf16_dp_scratch(MAXN, K) > scr_b) scr_b = bf16_dp_scratch(MAXN, K);
        if (bf16p_plain_scratch(MAXN, K) > scr_b) scr_b = bf16p_plain_scratch(MAXN, K);
        void *scr = bench_xmalloc("bench_bf16p", scr_b);
        bench_fill(x, (size_t)MAXN * K, 3);
        for (int r = 0; r < nrows; r++) {
            const int n = rows[r];
            if (!sh[s].per_layer && n > 64) continue; /* the LM head runs over the decoders' rows only */
            double best[NK_] = { 1e30, 1e30, 1e30, 1e30, 1e30 };
            for (int rep = 0; rep < reps * copies; rep++) {
                for (int k = 0; k < NK_; k++) { /* each call on another copy: none finds W in the L3 from the call before */
                    const int c = (rep * NK_ + k) % copies;
                    if ((k == K_DP && n > 64) || (k == K_PLAIN && sh[s].per_layer)) continue;
                    double t = now_s();
                    if (k == K_BF16P) bf16p_gemm(y, N, x, wp + c * pb, n, K, N, 0, scr);
                    else if (k == K_DNNL) {
                        if (cp_dnnl_mm_run_packed(dnnl, y, N, x, wd + c * db, n, K, N, 0, &err))
                            return fprintf(stderr, "bench_bf16p: %s\n", err.msg), 1;
                    } else if (k == K_DP) bf16_gemm_small_dp(y, N, x, w + c * NKe, n, K, N, 0, scr);
                    else if (k == K_PLAIN) bf16p_gemm_plain(y, N, x, w + c * NKe, n, K, N, 0, scr);
                    else if (n <= BF16_SMALL_N) bf16_gemm_small(CPU_ISA_AVX512, y, N, x, w + c * NKe, n, K, N, 0);
                    else bf16_gemm_blocked(y, N, x, w + c * NKe, n, K, N, 0, scr);
                    t = now_s() - t;
                    if (t < best[k]) best[k] = t;
                }
            }
            const double fl = 2.0 * n * (double)NKe / 1e9;
            printf("%-20s %5d %9.3f %9.3f %9.3f %9.3f | %8.1f %8.1f %8.1f %8.1f | %11.2fx %8.2fx\n", sh[s].name, n, best[0] * 1e3,
                   best[1] * 1e3, n <= 64 ? best[2] * 1e3 : 0.0, best[3] * 1e3, fl / best[0], fl / best[1], n <= 64 ? fl / best[2] : 0.0,
                   fl / best[3], best[0] / best[1], n <= 64 ? best[0] / best[2] : 0.0);
            if (!sh[s].per_layer)
                printf("%-20s %5d plain (tied head, rows in lanes) %9.3f ms, %8.1f GF: plain/bf16p %.2fx, plain/dp %.2fx, plain/onednn %.2fx\n",
                       sh[s].name, n, best[K_PLAIN] * 1e3, fl / best[K_PLAIN], best[K_PLAIN] / best[0], best[K_PLAIN] / best[2],
                       best[K_PLAIN] / best[1]);
            const double times = sh[s].per_layer ? sh[s].per_layer * layers : 1;
            for (int k = 0; k < NK_; k++) step[k][r] += (k == K_PLAIN ? (sh[s].per_layer ? best[0] : best[k]) : best[k]) * times;
        }
        free(w), free(wp), free(wd), free(x), free(y), free(scr);
    }
    /* "tied": the layers packed, the LM head plain (what
     * a tied model such as Qwen2.5-0.5B runs on the avx512bf16 path) */
    printf("\none step's matmuls (24 layers, the LM head to 64 rows), ms; tied = bf16p layers + plain head (rows in lanes):\n"
           "%5s %9s %9s %9s %9s %9s %13s %12s %9s %9s\n", "rows", kname[0], "tied", kname[1], kname[2], kname[3], "bf16p/onednn",
           "tied/onednn", "tied/dp", "tied/f32");
    for (int r = 0; r < nrows; r++)
        printf("%5d %9.1f %9.1f %9.1f %9.1f %9.1f %12.2fx %11.2fx %8.2fx %8.2fx\n", rows[r], step[0][r] * 1e3, step[K_PLAIN][r] * 1e3,
               step[1][r] * 1e3, rows[r] <= 64 ? step[2][r] * 1e3 : 0.0, step[3][r] * 1e3, step[0][r] / step[1][r],
               step[K_PLAIN][r] / step[1][r], rows[r] <= 64 ? step[K_PLAIN][r] / step[2][r] : 0.0, step[K_PLAIN][r] / step[3][r]);
    cp_dnnl_mm_destroy(dnnl);
    return 0;
}
