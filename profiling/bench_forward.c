/* make bench: prefill and decode throughput of the CPU backend on a synth
 * qwen2.5-0.5b, next to the BLAS's own sgemm rate measured in the same run
 * (the ceiling) and the time to stream the weights once (decode's floor).
 * Ratios, not absolute times, are what to compare across machines. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

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
            for (int k = 0; k < 7; k++) sink ^= xor_words(mats[k], sizes[k]);
        }
        sink ^= xor_words(m->lm_head, (size_t)c->vocab * H);
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
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
        else if (strcmp(argv[i], "--tokens") == 0) T = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--decode") == 0) n_decode = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_forward [--dir DIR] [--tokens T] [--decode N]\n");
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
    if (cp_model_load(dir, be, NULL, &m, &err)) die("load", &err);
    t_load = now_s() - t_load;
    const cp_config *c = &m->cfg;

    double ceiling = sgemm_gflops(T, c->intermediate, c->hidden, 3);
    double stream = stream_weights_s(m);

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

    printf("\nmodel: %s (%s, %d layers, hidden %d, %.2f GB of f32 weights, loaded in %.1f s)\n", dir, c->arch_name,
           c->n_layers, c->hidden, m->weight_bytes / 1e9, t_load);
    printf("%-34s %12s %12s %10s\n", "measure", "value", "baseline", "ratio");
    printf("%-34s %12.1f %12s %10s\n", "sgemm GFLOP/s (ceiling, in-run)", ceiling, "", "");
    printf("%-34s %12.1f %12.1f %9.2fx\n", "prefill GFLOP/s vs sgemm", gf, ceiling, gf / ceiling);
    printf("%-34s %12.1f %12s %10s\n", "prefill tok/s", T / t_prefill, "", "");
    printf("%-34s %12.1f %12.1f %9.2fx\n", "decode ms/token vs weight stream", t_decode * 1e3, stream * 1e3,
           t_decode / stream);
    printf("%-34s %12.2f %12s %10s\n", "decode tok/s at context", 1 / t_decode, "", "");
    printf("%-34s %12ld %12s %10s\n", "peak RSS MB", peak_rss_mb(), "", "");
    printf("(prefill of %d tokens = %.3f TFLOP; decode at context %d..%d)\n", T, fl / 1e12, T, T + n_decode);

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
