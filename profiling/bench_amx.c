/* The AMX tile GEMMs (kernels/cpu/gemm_amx.h) beside the CPU backend's
 * other prefill GEMMs, one process, one run:
 *   - ceilings, in-run: AMX bf16 and int8 tile throughput on tile
 *     registers alone (no loads), vpdpbusd on zmm registers, and the
 *     stream-read bandwidth of a buffer past every cache;
 *   - the 0.5B shape's matrices (q/o 896x896, k/v 128x896, gate/up
 *     4864x896, down 896x4864) at T rows (default 1024), each kernel timed
 *     call by call in turn (interleaved, so a busy neighbour slows all of
 *     them alike), best and median of R:
 *       bf16:  amx (cp_amx_bf16_gemm on W packed in tile order), onednn
 *              (oneDNN's matmul on its own packed layout: what the amx
 *              path runs today), bf16p (the packed vdpbf16ps kernel);
 *       int8:  amx (cp_amx_i8_gemm on the panel blob in place), vnni
 *              (q8p_gemm, the int8 prefill kernel, same blob);
 *     as TFLOP/s (TOP/s for int8: 2 per multiply-add), the share of the
 *     tile ceiling by wall time and per CPU second (the call's FLOP per
 *     second of the process's CPU time over the ceiling's: how well a
 *     core is used while it runs, which other work on the machine taking
 *     the cores away does not lower), and each kernel's time over amx's;
 *     then one layer's seven matrices summed;
 *   - the layer's MLP (norm, gate / up, SwiGLU, down) in one region
 *     beside the fused forms in turn, their outputs compared bit for bit;
 *   - a prefill's attention at T tokens: cp_amx_attention beside oneDNN's
 *     bf16 attention and the f32 one.  The int8 outputs are compared bit for bit
 *     and the bf16 ones against oneDNN's (max relative difference).
 * usage: bench_amx [--rows T] [--reps R] [--threads N] */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/cpu/gemm_amx.h"
#include "../kernels/cpu/gemm_bf16_packed.h"
#include "../kernels/cpu/gemm_dnnl.h"
#include "../kernels/cpu/attn_dnnl.h"
#include "../kernels/cpu/gemm_i8_prefill.h"
#include "../kernels/cpu/ops_cpu.h"
#include "../kernels/dtype.h"
#include "../kernels/q8.h"
#include "bench_clock.h"
#include "bench_gemm_common.h"
#include "bench_args.h"

static const char *const PROG = "bench_amx";

static int die(const char *what, const cp_error *err)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, what, err->msg);
    return 1;
}

/* xor of n words, OpenMP threads: a read-only pass the compiler cannot drop */
static uint32_t xor_words(const uint32_t *w, size_t n)
{
    uint32_t x = 0;
#pragma omp parallel for simd reduction(^ : x) schedule(static)
    for (size_t i = 0; i < n; i++) x ^= w[i];
    return x;
}

/* stream-read GB/s: best of 5 passes over a 512 MiB buffer, touched first
 * by the threads that read it */
static double stream_read_gbs(void)
{
    const size_t bytes = (size_t)512 << 20;
    uint32_t *buf = bench_xmalloc(PROG, bytes), sink = 0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < bytes / 4; i++) buf[i] = (uint32_t)i;
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t = now_s();
        sink ^= xor_words(buf, bytes / 4);
        t = now_s() - t;
        if (t < best) best = t;
    }
    if (sink == 0x12345678u) printf(" ");
    free(buf);
    return (double)bytes / best / 1e9;
}

/* the process's CPU time, all threads */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A prefill's attention at T tokens on the 0.5B shape (14 query heads, 2
 * KV heads, head_dim 64, causal): cp_amx_attention (the amx path's),
 * oneDNN's bf16 attention, the f32 general one (cpu_attention, BLAS) and
 * the f32 pair kernel the other paths run (cpu_attention_rows),
 * interleaved, best and median of 5; the two QK^T / PV products' FLOP
 * (causal: about half the square) over the tile ceiling; max |diff| of
 * amx against oneDNN and f32. */
static void attention_table(cp_dnnl_mm *dnnl, int T, int threads, const cp_amx_ceiling *ce)
{
    const int H = 14, KV = 2, D = 64, qld = H * D, kld = KV * D;
    cp_error err = { 0 };
    cp_dnnl_attn *at = NULL;
    if (cp_dnnl_attn_create(&at, dnnl, &err)) {
        fprintf(stderr, "%s: oneDNN attention: %s (attention table skipped)\n", PROG, err.msg);
        return;
    }
    float *q = bench_xmalloc(PROG, (size_t)T * qld * 4), *k = bench_xmalloc(PROG, (size_t)T * kld * 4), *v = bench_xmalloc(PROG, (size_t)T * kld * 4);
    float *o[4];
    for (int i = 0; i < 4; i++) o[i] = bench_xmalloc(PROG, (size_t)T * qld * 4);
    int32_t *pos = bench_xmalloc(PROG, (size_t)T * 4);
    bench_fill(q, (size_t)T * qld, 11), bench_fill(k, (size_t)T * kld, 12), bench_fill(v, (size_t)T * kld, 13);
    for (int i = 0; i < T; i++) pos[i] = i;
    cp_attn_args a = { .q = q, .k = k, .v = v, .q_pos = pos, .k_pos = pos, .out = o[0], .n = T, .n_keys = T, .n_heads = H,
                       .n_kv_heads = KV, .head_dim = D };
    size_t sa = cp_amx_attn_scratch(&a, threads), sf = cpu_attention_scratch_floats(&a) * sizeof(float);
    const size_t sr = cpu_attention_rows_scratch_floats(&a, threads, CPU_ATTN_AUTO) * sizeof(float);
    if (sf > sa) sa = sf;
    if (sr > sa) sa = sr;
    void *scr = bench_xmalloc(PROG, sa);
    static const char *const name[4] = { "amx", "onednn", "f32", "f32 rows" };
    enum { R = 5 };
    double t[4][R + 1];
    for (int rep = 0; rep <= R; rep++)
        for (int k3 = 0; k3 < 4; k3++) {
            a.out = o[k3];
            const double t0 = now_s();
            if (k3 == 0 && cp_amx_attention(&a, scr, threads, &err)) { fprintf(stderr, "%s: amx attention: %s\n", PROG, err.msg); exit(1); }
            if (k3 == 1 && cp_dnnl_attention(at, &a, &err)) { fprintf(stderr, "%s: oneDNN attention: %s\n", PROG, err.msg); exit(1); }
            if (k3 == 2) cpu_attention(&a, scr);
            if (k3 == 3) cpu_attention_rows(&a, scr, threads, CPU_ATTN_AUTO);
            t[k3][rep] = now_s() - t0;
        }
    const double fl = 2.0 * 2.0 * H * D * ((double)T * (T + 1) / 2);
    printf("\nattention, %d tokens causal, %d / %d heads x %d (QK^T and PV: %.1f GFLOP)\n", T, H, KV, D, fl / 1e9);
    printf("  %-9s %9s %9s %9s %8s %9s\n", "kernel", "best ms", "med ms", "TFLOP/s", "of tile", "best/amx");
    double best[4];
    for (int k3 = 0; k3 < 4; k3++) {
        qsort(t[k3] + 1, R, sizeof(double), cmp_d);
        best[k3] = t[k3][1];
    }
    for (int k3 = 0; k3 < 4; k3++)
        printf("  %-9s %9.2f %9.2f %9.2f %7.1f%% %8.2fx\n", name[k3], best[k3] * 1e3, t[k3][1 + R / 2] * 1e3, fl / best[k3] / 1e12,
               100 * fl / best[k3] / ce->bf16_flops, best[k3] / best[0]);
    double d1 = 0, d2 = 0;
    for (size_t i = 0; i < (size_t)T * qld; i++) d1 = fmax(d1, fabs((double)o[0][i] - o[1][i])), d2 = fmax(d2, fabs((double)o[0][i] - o[2][i]));
    printf("  max |amx - onednn| %.3g, max |amx - f32| %.3g\n", d1, d2);
    for (int i = 0; i < 4; i++) free(o[i]);
    free(q), free(k), free(v), free(pos), free(scr);
    cp_dnnl_attn_destroy(at);
}

/* The layer's MLP at T rows in bf16 on the tiles: rmsnorm, gate and up,
 * SwiGLU, down accumulating -- in one region (cp_amx_bf16_mlp: SwiGLU in
 * the gate / up epilogue, written as down's staged A) beside the fused
 * forms in turn (norm -> gate, up in f32; swiglu -> down), interleaved,
 * best and median of R; the two give the same bits (compared). */
static void mlp_table(int T, int reps, int threads, double amx_bf)
{
    enum { H = 896, I = 4864 };
    cp_error err = { 0 };
    float *x = bench_xmalloc(PROG, (size_t)T * H * 4), *nw = bench_xmalloc(PROG, H * 4), *g = bench_xmalloc(PROG, (size_t)T * I * 4);
    float *u = bench_xmalloc(PROG, (size_t)T * I * 4), *y[2] = { bench_xmalloc(PROG, (size_t)T * H * 4), bench_xmalloc(PROG, (size_t)T * H * 4) };
    void *p[3];
    cp_amx_bf16_layout L[3];
    for (int o = 0; o < 3; o++) {
        const int rows = o < 2 ? I : H, cols = o < 2 ? H : I;
        float *wf = bench_xmalloc(PROG, (size_t)rows * cols * 4);
        uint16_t *w = bench_xmalloc(PROG, (size_t)rows * cols * 2);
        bench_fill(wf, (size_t)rows * cols, 40 + o);
        for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = cp_f32_to_bf16(wf[i]);
        if (cp_amx_bf16_pack(w, rows, cols, &p[o], &L[o], &err)) exit(die("amx pack", &err));
        free(wf), free(w);
    }
    bench_fill(x, (size_t)T * H, 50);
    for (int k = 0; k < H; k++) nw[k] = 1.0f;
    size_t sa = cp_amx_bf16_fused_scratch(T, H, threads), sd = cp_amx_bf16_fused_scratch(T, I, threads), sm = cp_amx_bf16_mlp_scratch(T, H, I, threads);
    if (sd > sa) sa = sd;
    if (sm > sa) sa = sm;
    void *scr = bench_xmalloc(PROG, sa);
    const cp_amx_bf16_mlp_w mw = { p[0], p[1], p[2], &L[0], &L[1], &L[2] };
    const q8p_src norm = { .kind = Q8P_SRC_NORM, .x = x, .norm_w = nw, .eps = 1e-5f }, sw = { .kind = Q8P_SRC_SWIGLU, .x = g, .up = u };
    const cp_amx_bf16_out gu[2] = { { .y = g, .ldy = I, .wp = p[0], .layout = &L[0] }, { .y = u, .ldy = I, .wp = p[1], .layout = &L[1] } };
    const cp_amx_bf16_out dn = { .y = y[1], .ldy = H, .wp = p[2], .layout = &L[2], .accumulate = 1 };
    double *t[2] = { bench_xmalloc(PROG, (size_t)(reps + 1) * sizeof(double)), bench_xmalloc(PROG, (size_t)(reps + 1) * sizeof(double)) };
    size_t differ = 0;
    for (int rep = 0; rep <= reps; rep++)
        for (int k = 0; k < 2; k++) {
            memset(y[k], 0, (size_t)T * H * 4);
            const double t0 = now_s();
            cp_status st = k == 0 ? cp_amx_bf16_mlp(&norm, &mw, y[0], H, 1, T, scr, threads, &err)
                                  : cp_amx_bf16_fused(&norm, gu, 2, T, H, scr, threads, &err);
            if (!st && k == 1) st = cp_amx_bf16_fused(&sw, &dn, 1, T, I, scr, threads, &err);
            if (st) exit(die("amx mlp", &err));
            t[k][rep] = now_s() - t0;
            if (rep == reps && k == 1)
                for (size_t i = 0; i < (size_t)T * H; i++) differ += memcmp(&y[0][i], &y[1][i], 4) != 0;
        }
    const double fl = 2.0 * T * 3.0 * H * I;
    printf("\nthe layer's MLP in bf16 at %d rows (norm, gate / up, SwiGLU, down; %.1f GFLOP): best and median of %d\n", T, fl / 1e9, reps);
    printf("  %-28s %9s %9s %9s %8s\n", "form", "best ms", "med ms", "TFLOP/s", "of tile");
    static const char *const form[2] = { "one region (SwiGLU epilogue)", "fused forms in turn" };
    for (int k = 0; k < 2; k++) {
        qsort(t[k] + 1, (size_t)reps, sizeof(double), cmp_d);
        const double best = t[k][1], med = t[k][1 + reps / 2];
        printf("  %-28s %9.3f %9.3f %9.2f %7.1f%%\n", form[k], best * 1e3, med * 1e3, fl / best / 1e12, 100 * fl / best / amx_bf);
    }
    printf("  outputs differing between the two: %zu of %zu\n", differ, (size_t)T * H);
    for (int o = 0; o < 3; o++) free(p[o]);
    free(x), free(nw), free(g), free(u), free(y[0]), free(y[1]), free(scr), free(t[0]), free(t[1]);
}

enum { K_AMX = 0, K_DNNL, K_BF16P, K_AMX8, K_VNNI, NK };
static const char *const kname[NK] = { "amx bf16", "onednn bf16", "bf16p", "amx int8", "vnni int8" };

int main(int argc, char **argv)
{
    int T = 1024, reps = 7, threads = 2;
    static const char usage[] = "usage: bench_amx [--rows T] [--reps R] [--threads N]\n";
    const int args = bench_args_check(argc, argv);
    if (args) return bench_usage(args, usage);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--rows") == 0) T = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
        else return bench_usage(2, usage);
    }
    if (T < 1 || reps < 1 || threads < 1) return fprintf(stderr, "%s: rows, reps and threads must be >= 1\n", PROG), 2;
    omp_set_num_threads(threads);
    cp_error err = { 0 };
    if (cp_amx_ready(&err)) return die("AMX", &err);
    cp_dnnl_mm *dnnl = NULL;
    if (cp_dnnl_mm_create(&dnnl, &err)) return die("oneDNN", &err);

    char load[64] = "?";
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (!fgets(load, sizeof load, lf)) snprintf(load, sizeof load, "?");
        fclose(lf);
        load[strcspn(load, "\n")] = 0;
    }
    printf("%s: %d threads, %d rows, best and median of %d interleaved calls; load average %s; oneDNN isa %s\n", PROG, threads, T, reps,
           load, cp_dnnl_mm_isa());

    cp_amx_ceiling ce;
    if (cp_amx_peak(threads, 0.4, &ce, &err)) return die("AMX ceiling", &err);
    const double amx_bf = ce.bf16_flops, amx_i8 = ce.i8_ops;
    const double vnni = 2 * q8p_peak_ops(threads, 0.3), bw = stream_read_gbs();
    printf("\nceilings (in-run, %d threads; per CPU second: one core's rate while it runs)\n", threads);
    printf("  %-36s %9.2f TFLOP/s   %6.2f TFLOP per CPU s\n", "AMX bf16 tiles on registers", amx_bf / 1e12, ce.bf16_flops_cpu / 1e12);
    printf("  %-36s %9.2f TOP/s     %6.2f TOP per CPU s\n", "AMX int8 tiles on registers", amx_i8 / 1e12, ce.i8_ops_cpu / 1e12);
    printf("  %-36s %9.2f TOP/s\n", "vpdpbusd on zmm registers", vnni / 1e12);
    printf("  %-36s %9.1f GB/s\n", "stream read (512 MiB)", bw);

    const bench_shape sh[] = { { "q/o 896x896", 896, 896, 2 }, { "k/v 128x896", 128, 896, 2 }, { "gate/up 4864x896", 4864, 896, 2 },
                               { "down 896x4864", 896, 4864, 1 } };
    const int nsh = (int)(sizeof sh / sizeof *sh);
    double layer_best[NK] = { 0 }, layer_med[NK] = { 0 }, layer_cpu[NK] = { 0 }, layer_fl = 0;
    printf("\n%-18s %-12s %9s %9s %9s %8s %9s %9s %9s\n", "matrix", "kernel", "best ms", "med ms", "TFLOP/s", "of tile", "cpu-s eff",
           "best/amx", "med/amx");
    for (int s = 0; s < nsh; s++) {
        const int N = sh[s].out, K = sh[s].in;
        const size_t NK_e = (size_t)N * K;
        float *wf = bench_xmalloc(PROG, NK_e * 4), *x = bench_xmalloc(PROG, (size_t)T * K * 4);
        float *y[NK];
        for (int k = 0; k < NK; k++) y[k] = bench_xmalloc(PROG, (size_t)T * N * 4);
        uint16_t *w = bench_xmalloc(PROG, NK_e * 2);
        bench_fill(wf, NK_e, 7 + s);
        bench_fill(x, (size_t)T * K, 3 + s);
        for (size_t i = 0; i < NK_e; i++) w[i] = cp_f32_to_bf16(wf[i]);
        /* bf16: tile order, oneDNN's layout, bf16p's */
        void *wa = NULL;
        cp_amx_bf16_layout L;
        if (cp_amx_bf16_pack(w, N, K, &wa, &L, &err)) return die("amx pack", &err);
        const size_t db = cp_dnnl_mm_packed_bytes(dnnl, K, N, &err);
        if (!db) return die("oneDNN layout", &err);
        void *wd = bench_xmalloc(PROG, db), *wp = bench_xmalloc(PROG, bf16p_bytes(N, K));
        if (cp_dnnl_mm_pack(dnnl, wd, db, w, K, N, &err)) return die("oneDNN pack", &err);
        bf16p_pack(wp, w, N, K);
        /* int8: the loader's panel blob */
        char *rows = bench_xmalloc(PROG, cp_q8_bytes(N, K)), *blob = bench_xmalloc(PROG, cp_q8_bytes_in(N, K, CP_Q8_PANELS));
        cp_q8_quantize_rows((int8_t *)(rows + cp_q8_off_data(N)), (float *)(void *)(rows + cp_q8_off_scales()),
                            (int32_t *)(void *)(rows + cp_q8_off_sums(N)), wf, N, K);
        *(cp_q8_head *)(void *)rows = (cp_q8_head){ CP_Q8_MAGIC, N, K, cp_q8_ld(K), CP_Q8_ROWS };
        if (!cp_q8_pack_blob(blob, rows)) return fprintf(stderr, "%s: panel pack failed\n", PROG), 1;
        size_t sb = cp_amx_bf16_scratch(T, &L, threads);
        const size_t sizes[] = { bf16p_scratch(T, K), cp_amx_i8_scratch(T, K, threads), q8p_scratch(T, K, threads) };
        for (int i = 0; i < 3; i++) sb = sizes[i] > sb ? sizes[i] : sb;
        void *scr = bench_xmalloc(PROG, sb);
        double *t[NK], cbest[NK];
        for (int k = 0; k < NK; k++) t[k] = bench_xmalloc(PROG, (size_t)(reps + 1) * sizeof(double)), cbest[k] = 1e30;
        for (int rep = 0; rep <= reps; rep++) /* rep 0 warms every kernel (oneDNN makes its primitive) and is not counted */
            for (int k = 0; k < NK; k++) {
                const double c0 = cpu_s(), t0 = now_s();
                cp_status st = CP_OK;
                switch (k) {
                case K_AMX: st = cp_amx_bf16_gemm(y[k], N, x, wa, &L, T, 0, scr, threads, &err); break;
                case K_DNNL: st = cp_dnnl_mm_run_packed(dnnl, y[k], N, x, wd, T, K, N, 0, &err); break;
                case K_BF16P: bf16p_gemm(y[k], N, x, wp, T, K, N, 0, scr); break;
                case K_AMX8: st = cp_amx_i8_gemm(y[k], N, x, blob, T, K, N, 0, scr, threads, &err); break;
                default: q8p_gemm(y[k], N, x, blob, T, K, N, 0, scr, threads); break;
                }
                if (st) return die(kname[k], &err);
                t[k][rep] = now_s() - t0;
                const double dc = cpu_s() - c0;
                if (rep && dc < cbest[k]) cbest[k] = dc;
            }
        const double fl = 2.0 * T * (double)NK_e;
        double best[NK], med[NK];
        for (int k = 0; k < NK; k++) {
            qsort(t[k] + 1, (size_t)reps, sizeof(double), cmp_d);
            best[k] = t[k][1], med[k] = t[k][1 + reps / 2];
        }
        for (int k = 0; k < NK; k++) {
            const int amx = k < K_AMX8 ? K_AMX : K_AMX8;
            const double ceil = k < K_AMX8 ? amx_bf : amx_i8, ceil_cpu = k < K_AMX8 ? ce.bf16_flops_cpu : ce.i8_ops_cpu;
            printf("%-18s %-12s %9.3f %9.3f %9.2f %7.1f%% %8.1f%% %8.2fx %8.2fx\n", k ? "" : sh[s].name, kname[k], best[k] * 1e3,
                   med[k] * 1e3, fl / best[k] / 1e12, 100 * fl / best[k] / ceil, 100 * fl / cbest[k] / ceil_cpu, best[k] / best[amx],
                   med[k] / med[amx]);
            layer_best[k] += sh[s].per_layer * best[k];
            layer_med[k] += sh[s].per_layer * med[k];
            layer_cpu[k] += sh[s].per_layer * cbest[k];
        }
        layer_fl += sh[s].per_layer * fl;
        /* the int8 kernels agree bit for bit; bf16 against oneDNN */
        size_t diff8 = 0;
        double rel = 0, mag = 0;
        for (size_t i = 0; i < (size_t)T * N; i++) {
            diff8 += memcmp(&y[K_AMX8][i], &y[K_VNNI][i], 4) != 0;
            rel = fmax(rel, fabs((double)y[K_AMX][i] - y[K_DNNL][i]));
            mag = fmax(mag, fabs((double)y[K_DNNL][i]));
        }
        printf("%-18s int8 amx vs vnni: %zu of %zu outputs differ; bf16 amx vs onednn: max |diff| %.3g (max |y| %.3g)\n", "", diff8,
               (size_t)T * N, rel, mag);
        for (int k = 0; k < NK; k++) free(y[k]), free(t[k]);
        free(wf), free(x), free(w), free(wa), free(wd), free(wp), free(rows), free(blob), free(scr);
    }
    printf("\none layer's 7 matrices at %d rows (x 24 layers in a 0.5B prefill): sums of the best / median calls\n", T);
    printf("  %-12s %9s %9s %9s %8s %9s %9s %9s\n", "kernel", "best ms", "med ms", "TFLOP/s", "of tile", "cpu-s eff", "best/amx", "med/amx");
    for (int k = 0; k < NK; k++) {
        const int amx = k < K_AMX8 ? K_AMX : K_AMX8;
        const double ceil = k < K_AMX8 ? amx_bf : amx_i8, ceil_cpu = k < K_AMX8 ? ce.bf16_flops_cpu : ce.i8_ops_cpu;
        printf("  %-12s %9.3f %9.3f %9.2f %7.1f%% %8.1f%% %8.2fx %8.2fx\n", kname[k], layer_best[k] * 1e3, layer_med[k] * 1e3,
               layer_fl / layer_best[k] / 1e12, 100 * layer_fl / layer_best[k] / ceil, 100 * layer_fl / layer_cpu[k] / ceil_cpu,
               layer_best[k] / layer_best[amx], layer_med[k] / layer_med[amx]);
    }
    mlp_table(T, reps, threads, amx_bf);
    attention_table(dnnl, T, threads, &ce);
    cp_dnnl_mm_destroy(dnnl);
    return 0;
}
