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
 * the time a token takes.  The kernel-level tables (ceilings, crossovers,
 * the int8 tables) are bench_ceilings.c's. */
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

#include "bench_ceilings.h"
#include "bench_clock.h"

static void die(const char *what, const cp_error *err)
{
    fprintf(stderr, "bench: %s: %s\n", what, err->msg);
    exit(1);
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
    static const char usage[] = "usage: bench_forward --skinny | --prefill-i8 [T] | --packed-i8 [N [REPS]] |\n"
                                "       [--dir DIR] [--tokens T] [--decode N] [--dtype f32|bf16|int8|auto] [--kv-dtype f32|bf16] [--decode-only]\n";
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return fputs(usage, stdout), 0;
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
            fprintf(stderr, "bench: %s needs a value\n%s", argv[i], usage);
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
            fprintf(stderr, "bench: unknown option %s\n%s", argv[i], usage);
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
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 7919) % (c->vocab < 20000 ? c->vocab : 20000));
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
    /* the pair kernel: what the backend runs for a call with output rows
     * off the amx path (cpu_attention, the BLAS products, serves only an
     * export without them) */
    const int thr = omp_get_max_threads();
    float *scr = malloc(cpu_attention_rows_scratch_floats(&a, thr, CPU_ATTN_AUTO) * sizeof(float));
    t = now_s();
    cpu_attention_rows(&a, scr, thr, CPU_ATTN_AUTO);
    double ta = now_s() - t;
    printf("%-34s %12.3f  (%.1f GFLOP/s causal, pair kernel)\n", "attention prefill (1 layer)", ta * 1e3,
           2.0 * T * (T + 1) * c->head_dim * c->n_heads / ta / 1e9);
    free(x), free(w), free(g), free(u), free(q), free(kk), free(vv), free(o), free(cs), free(sn), free(pos), free(scr);
    free(ids), free(lg);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
    return 0;
}
