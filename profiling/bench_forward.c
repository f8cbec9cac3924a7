/* make bench: prefill and decode throughput of the CPU backend on a synth
 * qwen2.5-0.5b, next to the BLAS's own sgemm rate measured in the same run
 * (the ceiling) and the time to stream the weights once (decode's floor).
 * Ratios, not absolute times, are what to compare across machines.
 *
 * --dtype f32|bf16|auto loads the weights so (one dtype per process, so the
 * peak RSS is that dtype's); with bf16 the run also prints the bf16 GEMM
 * ceilings of the same shape — f32 compute from bf16 weights (our blocked
 * sgemm) and oneDNN's bf16 matmul — and which path the backend chose. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/cpu/gemm_dnnl.h"
#include "../kernels/cpu/ops_cpu.h"
#include "../model/model.h"
#include "../model/synth.h"

char *openblas_get_corename(void);
char *openblas_get_config(void);
int openblas_get_num_threads(void);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

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

/* XOR of every 32-bit word: vectorizes, so the loop runs at memory speed. */
static uint32_t xor_words(const void *p, size_t n_words)
{
    const uint32_t *w = p;
    uint32_t x = 0;
#pragma omp parallel for reduction(^ : x) schedule(static)
    for (size_t i = 0; i < n_words; i++) x ^= w[i];
    return x;
}

/* Reads every weight byte once (what one decode step must at least do). */
static double stream_weights_s(const cp_model *m)
{
    const cp_config *c = &m->cfg;
    const size_t esz = cp_dtype_size(m->matrix_dtype); /* sizes below are elements; words are 4 bytes */
    size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim,
           inter = c->intermediate;
    double best = 1e30;
    uint32_t sink = 0;
    for (int r = 0; r < 3; r++) {
        double t = now_s();
        for (int l = 0; l < c->n_layers; l++) {
            const cp_layer_weights *w = &m->layers[l];
            const void *mats[] = { w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down };
            size_t sizes[] = { qd * H, kvd * H, kvd * H, H * qd, inter * H, inter * H, H * inter };
            for (int k = 0; k < 7; k++) sink ^= xor_words(mats[k], sizes[k] * esz / 4);
        }
        sink ^= xor_words(m->lm_head, (size_t)c->vocab * H * esz / 4);
        t = now_s() - t;
        if (t < best) best = t;
    }
    if (sink == 0x12345678u) printf(" ");
    return best;
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
    int T = 1024, n_decode = 16;
    cp_weight_dtype dtype = CP_WEIGHTS_F32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
        else if (strcmp(argv[i], "--tokens") == 0) T = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--decode") == 0) n_decode = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--dtype") == 0) {
            cp_error e = { 0 };
            if (cp_weight_dtype_from_name(argv[i + 1], &dtype, &e)) { fprintf(stderr, "bench: %s\n", e.msg); return 2; }
        } else {
            fprintf(stderr, "usage: bench_forward [--dir DIR] [--tokens T] [--decode N] [--dtype f32|bf16|auto]\n");
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

    cp_state *s;
    if (cp_state_create(m, T + n_decode, 1024, &s, &err)) die("state", &err);
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 7919) % 20000);
    float *lg = malloc((size_t)c->vocab * sizeof(float));
    /* warm-up: thread pools, page faults of the scratch buffers */
    if (cp_forward(m, s, ids, NULL, 64, CP_LOGITS_LAST, lg, NULL, &err)) die("warm-up", &err);
    if (cp_state_reset(m, s, &err)) die("reset", &err);
    double t = now_s();
    if (cp_forward(m, s, ids, NULL, T, CP_LOGITS_LAST, lg, NULL, &err)) die("prefill", &err);
    double t_prefill = now_s() - t;
    int32_t tok = 1;
    t = now_s();
    for (int i = 0; i < n_decode; i++)
        if (cp_forward(m, s, &tok, NULL, 1, CP_LOGITS_LAST, lg, NULL, &err)) die("decode", &err);
    double t_decode = (now_s() - t) / n_decode;
    double fl = prefill_flops(c, T), gf = fl / t_prefill / 1e9;
    long rss_peak = peak_rss_mb(); /* before the ceilings' own buffers */
    int threads = thread_count();
    const char *path = be->describe(be);
    char path_now[256];
    snprintf(path_now, sizeof path_now, "%s", path);

    double ceiling = sgemm_gflops(T, c->intermediate, c->hidden, 3);
    double stream = stream_weights_s(m);
    double c_wide = 0, c_dnnl = 0;
    const char *impl = "";
    bf16_gemm_gflops(T, c->intermediate, c->hidden, 3, &c_wide, &c_dnnl, &impl);
    cpu_isa best_isa = feat.avx512 ? CPU_ISA_AVX512 : feat.avx2_fma ? CPU_ISA_AVX2 : CPU_ISA_GENERIC;
    double gv32 = gemv_gbs(c->intermediate, c->hidden, best_isa, 0), gv16 = gemv_gbs(c->intermediate, c->hidden, best_isa, 1);

    printf("\nmodel: %s (%s, %d layers, hidden %d, %.2f GB of %s weights, loaded in %.1f s)\n", dir, c->arch_name,
           c->n_layers, c->hidden, m->weight_bytes / 1e9, cp_dtype_name(m->matrix_dtype), t_load);
    printf("matmul path: %s\n", path_now);
    printf("%-34s %12s %12s %10s\n", "measure", "value", "baseline", "ratio");
    printf("%-34s %12.1f %12s %10s\n", "sgemm GFLOP/s (ceiling, in-run)", ceiling, "", "");
    printf("%-34s %12.1f %12.1f %9.2fx\n", "bf16 weights, f32 compute GFLOP/s", c_wide, ceiling, c_wide / ceiling);
    printf("%-34s %12.1f %12.1f %9.2fx  (%s)\n", "oneDNN bf16 matmul GFLOP/s", c_dnnl, ceiling, c_dnnl / ceiling, impl);
    printf("%-34s %12.1f %12.1f %9.2fx  (%s dot kernel vs sgemv)\n", "decode GEMV GB/s bf16 vs f32", gv16, gv32, gv16 / gv32,
           cpu_isa_name(best_isa));
    printf("%-34s %12.1f %12.1f %9.2fx\n", "prefill GFLOP/s vs sgemm", gf, ceiling, gf / ceiling);
    printf("%-34s %12.1f %12s %10s\n", "prefill tok/s", T / t_prefill, "", "");
    printf("%-34s %12.1f %12.1f %9.2fx\n", "decode ms/token vs weight stream", t_decode * 1e3, stream * 1e3,
           t_decode / stream);
    printf("%-34s %12.2f %12s %10s\n", "decode tok/s at context", 1 / t_decode, "", "");
    printf("%-34s %12ld %12s %10s\n", "peak RSS MB (load + prefill + decode)", rss_peak, "", "");
    printf("%-34s %12ld %12s %10s\n", "peak RSS MB after the load", rss_loaded, "", "");
    printf("%-34s %12d %12s %10s\n", "threads after prefill", threads, "", "");
    printf("(prefill of %d tokens = %.3f TFLOP; decode at context %d..%d)\n", T, fl / 1e12, T, T + n_decode);

    if (m->matrix_dtype == CP_BF16 && !getenv("CP_CPU_ISA")) bf16_kernel_crossover(c->intermediate, c->hidden, best_isa);

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
