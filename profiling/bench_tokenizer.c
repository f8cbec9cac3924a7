/* Encode throughput (MB/s, one thread) of the byte-level (Qwen) and Metaspace
 * (Mistral) tokenizers on Gutenberg prose and QMSum transcripts.  Each row
 * also prints tokens/byte so a change that breaks tokenization shows. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/fileio.h"
#include "../tokenizer/tokenizer.h"

#include "bench_clock.h"

typedef struct corpus {
    char **docs;
    size_t *lens;
    size_t n, bytes;
} corpus;

static void add_doc(corpus *c, char *s, size_t n)
{
    c->docs = realloc(c->docs, (c->n + 1) * sizeof *c->docs);
    c->lens = realloc(c->lens, (c->n + 1) * sizeof *c->lens);
    if (!c->docs || !c->lens) exit(1);
    c->docs[c->n] = s;
    c->lens[c->n++] = n;
    c->bytes += n;
}

static void load_gutenberg(const char *root, corpus *c)
{
    static const char *files[] = { "pg11_alice_in_wonderland.txt", "pg1342_pride_and_prejudice.txt",
                                   "pg1661_adventures_of_sherlock_holmes.txt", "pg84_frankenstein.txt" };
    for (size_t i = 0; i < 4; i++) {
        char path[1024], *s;
        size_t n;
        cp_error err;
        snprintf(path, sizeof path, "%s/data/gutenberg/%s", root, files[i]);
        if (cp_read_file(path, 16u << 20, &s, &n, &err) != CP_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            exit(1);
        }
        add_doc(c, s, n);
    }
}

/* each meeting as "speaker: content\n" lines */
static void load_qmsum(const char *root, corpus *c)
{
    char path[1024], *all;
    size_t n;
    cp_error err;
    snprintf(path, sizeof path, "%s/data/qmsum/test.jsonl", root);
    if (cp_read_file(path, 64u << 20, &all, &n, &err) != CP_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        exit(1);
    }
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *tr = cJSON_GetObjectItem(j, "meeting_transcripts");
        size_t cap = 1 << 16, len = 0;
        char *doc = malloc(cap);
        for (const cJSON *t = tr ? tr->child : NULL; t && doc; t = t->next) {
            const char *sp = cJSON_GetStringValue(cJSON_GetObjectItem(t, "speaker"));
            const char *ct = cJSON_GetStringValue(cJSON_GetObjectItem(t, "content"));
            if (!sp || !ct) continue;
            size_t need = strlen(sp) + strlen(ct) + 4;
            while (len + need >= cap) doc = realloc(doc, cap *= 2);
            if (!doc) exit(1);
            len += (size_t)sprintf(doc + len, "%s: %s\n", sp, ct);
        }
        cJSON_Delete(j);
        if (doc && len) add_doc(c, doc, len);
        else free(doc);
    }
    free(all);
}

static void run(const char *root, const char *tok_rel, const char *name, const corpus *c, const char *cname)
{
    char dir[1024];
    cp_error err;
    cp_tokenizer *t;
    snprintf(dir, sizeof dir, "%s/%s", root, tok_rel);
    if (cp_tokenizer_load(dir, &t, &err) != CP_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        exit(1);
    }
    /* whole documents, then the same bytes as 2 KB messages (one encode
     * call each, as a request's messages are): the pre-token cache is a
     * call's own, so short calls find fewer repeats in it */
    const size_t slices[2] = { 0, 2048 };
    printf("%-10s %-10s %8.2f MB", name, cname, c->bytes / 1e6);
    for (int sl = 0; sl < 2; sl++) {
        double best = 1e30;
        size_t tokens = 0;
        for (int rep = 0; rep < 2; rep++) {
            cp_encoding e = { 0 };
            tokens = 0;
            double t0 = now_s();
            for (size_t i = 0; i < c->n; i++)
                for (size_t at = 0; at < c->lens[i];) {
                    size_t n = slices[sl] && c->lens[i] - at > slices[sl] ? slices[sl] : c->lens[i] - at;
                    while (n < c->lens[i] - at && (c->docs[i][at + n] & 0xC0) == 0x80) n++; /* whole UTF-8 characters */
                    e.n = 0;
                    if (cp_tokenize(t, c->docs[i] + at, n, 0, &e, &err) != CP_OK) {
                        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                        exit(1);
                    }
                    tokens += e.n;
                    at += n;
                }
            double dt = now_s() - t0;
            if (dt < best) best = dt;
            cp_encoding_free(&e);
        }
        if (sl == 0) printf(" %10zu tok %6.3f tok/B  documents %7.2f MB/s", tokens, (double)tokens / c->bytes, c->bytes / best / 1e6);
        else printf("  2 KB messages %7.2f MB/s\n", c->bytes / best / 1e6);
    }
    cp_tokenizer_free(t);
}

int main(int argc, char **argv)
{
    const char *root = argc > 1 ? argv[1] : "../shared";
    corpus g = { 0 }, q = { 0 };
    load_gutenberg(root, &g);
    load_qmsum(root, &q);
    printf("encode throughput, one thread (targets: byte-level >= 10 MB/s, Metaspace >= 5 MB/s)\n");
    run(root, "models/qwen-bpe-tokenizer-qwen3", "qwen3", &g, "gutenberg");
    run(root, "models/qwen-bpe-tokenizer-qwen3", "qwen3", &q, "qmsum");
    run(root, "models/mistral-7b-v0.1-tokenizer", "mistral", &g, "gutenberg");
    run(root, "models/mistral-7b-v0.1-tokenizer", "mistral", &q, "qmsum");
    for (size_t i = 0; i < g.n; i++) free(g.docs[i]);
    for (size_t i = 0; i < q.n; i++) free(q.docs[i]);
    free(g.docs), free(g.lens), free(q.docs), free(q.lens);
    return 0;
}
