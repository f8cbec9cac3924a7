/* Peak resident memory of one long request through the engine (sharing
 * cacheprune: the prefill's attention export and the annotator), with
 * getrusage: a benchmark, not a test (minutes for 16k tokens of a 0.5B
 * model on a laptop's cores).
 *
 *   build/peak_rss MODEL_DIR TOKENS
 * prints the prompt's tokens and the process's peak RSS after loading and
 * after the request (KiB).  The prompt is one user message of words from a
 * small alphabet; on a byte-level tokenizer (synth models) that is about one
 * token a byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../engine/request.h"
#include "../model/model.h"
#include "../pool/pool.h"
#include "../tokenizer/tokenizer.h"

static long peak_kib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

static int die(const char *what, const cp_error *err)
{
    fprintf(stderr, "peak_rss: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: peak_rss MODEL_DIR TOKENS\n");
        return 2;
    }
    long want = strtol(argv[2], NULL, 10);
    if (want < 64 || want > 1 << 24) {
        fprintf(stderr, "peak_rss: TOKENS %s is outside [64, 2^24]\n", argv[2]);
        return 2;
    }
    cp_error err = { 0 };
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    if (cp_backend_cpu_create(&be, &err)) return die("backend", &err);
    if (cp_model_load(argv[1], be, NULL, &m, &err)) return die("model", &err);
    if (cp_tokenizer_load(argv[1], &tok, &err)) return die("tokenizer", &err);
    cp_kv_layout l;
    cp_engine_kv_layout(m, &l);
    cp_pool_opts po;
    cp_pool_opts_default(&po);
    cp_pool *pool;
    if (cp_pool_create(&l, be, &po, &pool, &err)) return die("pool", &err);
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.sharing = CP_SHARE_CACHEPRUNE;
    cp_engine *e;
    if (cp_engine_create(m, tok, pool, NULL, &o, &e, &err)) return die("engine", &err);
    long loaded = peak_kib();
    /* the prompt: the chat template adds a few tokens */
    static const char *words[] = { "the", "a", "of", "river", "stone", "garden", "lamp", "quiet", "morning", "letter" };
    size_t n = (size_t)want - 44, at = 0;
    char *text = malloc(n + 16);
    if (!text) return 1;
    uint32_t r = 1;
    while (at < n) {
        r = r * 1664525u + 1013904223u;
        const char *w = words[(r >> 16) % 10];
        size_t k = strlen(w);
        memcpy(text + at, w, k);
        text[at + k] = ' ';
        at += k + 1;
    }
    text[n] = '\0';
    cp_request_msg msg = { CP_ROLE_USER, text, n, 0, NULL, 0 };
    cp_request req = { .tenant = 1, .msgs = &msg, .n_msgs = 1, .max_tokens = 1, .sampling = { .top_p = 1 } };
    cp_response resp;
    if (cp_engine_run(e, &req, &resp, &err)) return die("request", &err);
    printf("prompt tokens %d, computed %d\n", resp.prompt_tokens, resp.computed);
    printf("peak RSS after loading: %ld KiB\npeak RSS after the request: %ld KiB\n", loaded, peak_kib());
    cp_response_free(&resp);
    cp_engine_free(e);
    cp_pool_free(pool);
    cp_tokenizer_free(tok);
    cp_model_free(m);
    cp_backend_destroy(be);
    free(text);
    return 0;
}
