/* libFuzzer target: arbitrary bytes through encode / decode / stream of the
 * real Qwen (byte-level) and Mistral (Metaspace) tokenizers.  Invariants
 * checked on every input: invalid UTF-8 is refused, never crashes; offsets
 * are in order and inside the text; ids decode. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../tokenizer/tokenizer.h"

/* the fuzz process's tokenizers, loaded once */
static cp_tokenizer *fuzz_tokenizers[2];

static cp_tokenizer *load(const char *rel)
{
    const char *root = getenv("CP_SHARED");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root && *root ? root : "../shared", rel);
    cp_error err;
    cp_tokenizer *t = NULL;
    if (cp_tokenizer_load(dir, &t, &err) != CP_OK) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        abort();
    }
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fuzz_tokenizers[0]) {
        fuzz_tokenizers[0] = load("models/qwen-bpe-tokenizer-qwen3");
        fuzz_tokenizers[1] = load("models/mistral-7b-v0.1-tokenizer");
    }
    if (size < 1) return 0;
    cp_tokenizer *t = fuzz_tokenizers[data[0] & 1];
    int flags = (data[0] >> 1) & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    cp_encoding e = { 0 };
    cp_error err;
    if (cp_tokenize(t, text, len, flags, &e, &err) != CP_OK) {
        if (e.n != 0) abort(); /* a refused input leaves nothing behind */
        cp_encoding_free(&e);
        return 0;
    }
    for (size_t k = 0; k < e.n; k++) {
        if (e.start[k] > e.end[k] || e.end[k] > len) abort();
        if (k && e.start[k] < e.start[k - 1]) abort();
    }
    char *s = NULL;
    if (cp_detokenize(t, e.ids, e.n, 0, &s, NULL, &err) != CP_OK) abort();
    free(s);
    cp_detok_stream st;
    cp_detok_stream_init(&st, t, 1);
    for (size_t k = 0; k < e.n && k < 64; k++) {
        char *piece = NULL;
        if (cp_detok_stream_push(&st, e.ids[k], &piece, &err) != CP_OK) abort();
        free(piece);
    }
    cp_detok_stream_free(&st);
    cp_encoding_free(&e);
    return 0;
}
