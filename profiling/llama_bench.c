/* build/llama/llama_bench: llama.cpp's prefill and decode speed on a GGUF,
 * measured the way bench_forward measures ours (make bench-llama puts the
 * two side by side).  Built by profiling/bench_llama.sh against the shared
 * libraries of the npm package @node-llama-cpp/linux-x64, with llama.h from
 * the llama.cpp source bundle inside node-llama-cpp (extracted into build/,
 * never copied into this repository).
 *
 *   llama_bench --model FILE.gguf --backends DIR [--tokens 1024] [--decode 32] [--threads 2]
 *   llama_bench --model FILE.gguf --backends DIR --greedy N [--usable-vocab V]
 *
 * --greedy N: no timing; prints the N greedy tokens after the prompt
 * 1,2,...,8 ("greedy ids: a,b,..."), to compare with `cacheprune generate
 * --prompt-ids 1,...,8 --greedy`: the same ids say the GGUF holds the same
 * model (names, layout, RoPE form), not merely one llama.cpp accepts.
 * --usable-vocab V: argmax over ids < V only, as our sampler does (it never
 * picks an id the tokenizer cannot spell: 258 for synth's byte tokenizer).
 *
 * DIR holds libggml-cpu-*.so: ggml picks the variant for this CPU at run time
 * (ggml_backend_load_all_from_path), as node-llama-cpp itself does.
 * Prints "prefill tok/s X", "decode tok/s Y" and the backend it chose. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-backend.h"
#include "llama.h"

#include "bench_clock.h"

/* llama.cpp logs every load step; keep warnings and errors only */
static void quiet_log(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

static int decode_all(struct llama_context *ctx, llama_token *ids, int n)
{
    int rc = llama_decode(ctx, llama_batch_get_one(ids, n));
    llama_synchronize(ctx);
    return rc;
}

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static int greedy_ids(struct llama_context *ctx, int n_vocab, int n)
{
    llama_token prompt[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    if (decode_all(ctx, prompt, 8)) return 1;
    printf("greedy ids: ");
    for (int i = 0; i < n; i++) {
        const float *lg = llama_get_logits_ith(ctx, -1);
        if (!lg) return 1;
        llama_token t = argmax(lg, n_vocab);
        printf("%s%d", i ? "," : "", t);
        if (i + 1 < n && decode_all(ctx, &t, 1)) return 1;
    }
    printf("\n");
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

/* all threads' CPU time: at 1 thread the work's own, whatever else the
 * machine runs (with more, spinning waits count too) */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *backends = NULL;
    int T = 1024, n_decode = 32, threads = 2, greedy = 0, usable = 0, ok = 1;
    for (int i = 1; i + 1 < argc && ok; i += 2) {
        if (strcmp(argv[i], "--model") == 0) path = argv[i + 1];
        else if (strcmp(argv[i], "--backends") == 0) backends = argv[i + 1];
        else if (strcmp(argv[i], "--tokens") == 0) ok = parse_int(argv[i + 1], 2, 1 << 16, &T);
        else if (strcmp(argv[i], "--decode") == 0) ok = parse_int(argv[i + 1], 1, 1 << 16, &n_decode);
        else if (strcmp(argv[i], "--threads") == 0) ok = parse_int(argv[i + 1], 1, 1024, &threads);
        else if (strcmp(argv[i], "--greedy") == 0) ok = parse_int(argv[i + 1], 1, 256, &greedy);
        else if (strcmp(argv[i], "--usable-vocab") == 0) ok = parse_int(argv[i + 1], 2, 1 << 30, &usable);
        else ok = 0;
    }
    if (!ok || !path || !backends || argc % 2 == 0) {
        fprintf(stderr, "usage: llama_bench --model FILE.gguf --backends DIR [--tokens N] [--decode N] [--threads N]\n");
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    ggml_backend_load_all_from_path(backends);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (!model) {
        fprintf(stderr, "llama_bench: cannot load %s\n", path);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(T + n_decode + 64);
    cp.n_batch = (uint32_t)T; /* the whole prompt in one llama_decode, split into n_ubatch pieces */
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_bench: cannot create a context of %u tokens\n", cp.n_ctx);
        llama_model_free(model);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token *ids = malloc((size_t)T * sizeof *ids);
    if (!ids || n_vocab < 2) {
        fprintf(stderr, "llama_bench: %s\n", ids ? "model has no vocabulary size" : "out of memory");
        return 1;
    }
    for (int i = 0; i < T; i++) ids[i] = (llama_token)((i * 7919) % (n_vocab < 20000 ? n_vocab : 20000)); /* as bench_forward */
    if (greedy) {
        int rc = greedy_ids(ctx, usable && usable < n_vocab ? usable : n_vocab, greedy);
        free(ids);
        llama_free(ctx);
        llama_model_free(model);
        return rc;
    }
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    /* warm-up: thread pool, compute buffers, the weights' pages */
    int rc = decode_all(ctx, ids, T < 64 ? T : 64);
    llama_memory_clear(llama_get_memory(ctx), true);
    double t = now_s(), c = cpu_s();
    if (!rc) rc = decode_all(ctx, ids, T);
    double t_prefill = now_s() - t, c_prefill = cpu_s() - c;
    llama_token tok = 1;
    t = now_s(), c = cpu_s();
    for (int i = 0; i < n_decode && !rc; i++) rc = decode_all(ctx, &tok, 1);
    double t_decode = (now_s() - t) / n_decode, c_decode = (cpu_s() - c) / n_decode;
    if (rc) {
        fprintf(stderr, "llama_bench: llama_decode returned %d\n", rc);
        return 1;
    }
    printf("llama.cpp model: %s (%s)\n", desc, path);
    printf("llama.cpp system: %s\n", llama_print_system_info());
    for (size_t i = 0; i < ggml_backend_reg_count(); i++)
        printf("llama.cpp backend: %s\n", ggml_backend_reg_name(ggml_backend_reg_get(i)));
    printf("threads %d, prefill %d tokens, decode %d tokens at context %d..%d\n", threads, T, n_decode, T, T + n_decode);
    printf("prefill tok/s %.1f\n", T / t_prefill);
    printf("decode tok/s %.2f\n", 1 / t_decode);
    printf("prefill tok/CPU-s %.1f\n", T / c_prefill);
    printf("decode tok/CPU-s %.2f\n", 1 / c_decode);
    free(ids);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
