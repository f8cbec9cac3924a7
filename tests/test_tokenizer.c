/* The tokenizer against golden encodings from an independent port of the HF
 * tokenizers, plus offset invariants, decoding, streaming and bad input. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/tokenizer.h"
#include "helpers.h"

static const char *const tok_dirs[] = { "models/qwen-bpe-tokenizer-qwen3", "models/mistral-7b-v0.1-tokenizer",
                                        "models/stories260K-hf", "models/cp-books-6m" };

static cp_tokenizer *open_tok(const char *rel)
{
    char dir[512];
    cp_error err = { 0 };
    cp_tokenizer *t = NULL;
    cr_assert_eq(cp_tokenizer_load(shared_path(dir, sizeof dir, rel), &t, &err), CP_OK, "%s", err.msg);
    return t;
}

static cJSON *open_golden(const char *rel)
{
    char dir[512], path[700];
    shared_path(dir, sizeof dir, rel);
    snprintf(path, sizeof path, "%s/golden_tokenizer.json", dir);
    char *text = read_text(path, NULL);
    cr_assert(text, "cannot read %s", path);
    cJSON *g = cJSON_Parse(text);
    free(text);
    cr_assert(g, "%s: bad JSON", path);
    return g;
}

static void check_ids(const cp_encoding *e, const cJSON *ids, const char *what, const char *text)
{
    size_t n = (size_t)cJSON_GetArraySize(ids), i = 0;
    char got[4096] = "", *p = got;
    for (size_t k = 0; k < e->n && p < got + sizeof got - 16; k++) p += sprintf(p, "%d ", e->ids[k]);
    cr_assert_eq(e->n, n, "%s %s: %zu ids, golden %zu (got %s)", what, text, e->n, n, got);
    for (const cJSON *x = ids->child; x; x = x->next, i++)
        cr_assert_eq(e->ids[i], (int32_t)x->valuedouble, "%s '%s': id %zu is %d, golden %d (got %s)", what, text, i,
                     e->ids[i], (int32_t)x->valuedouble, got);
}

/* Offsets in order, inside the text, and covering it: each range starts
 * where the last ended or shares the last one's character. */
static void check_offsets(const cp_encoding *e, const char *text, size_t len)
{
    uint32_t covered = 0, prev_s = 0;
    for (size_t k = 0; k < e->n; k++) {
        uint32_t s = e->start[k], en = e->end[k];
        cr_assert(s <= en && en <= len, "'%s': token %zu range [%u, %u) outside the text", text, k, s, en);
        cr_assert(s >= prev_s, "'%s': token %zu starts at %u before the previous one at %u", text, k, s, prev_s);
        if (s == en) continue; /* an inserted token */
        cr_assert(s == covered || s < covered, "'%s': gap before token %zu: [%u, %u) after %u", text, k, s, en, covered);
        if (s < covered) /* sharing: only the same character may be shared */
            cr_assert(en <= covered || s == prev_s, "'%s': token %zu overlaps its neighbour", text, k);
        if (en > covered) covered = en;
        prev_s = s;
    }
    cr_assert_eq(covered, (uint32_t)len, "'%s': ranges cover %u of %zu bytes", text, covered, len);
}

ParameterizedTestParameters(tokenizer, golden_encodings)
{
    static int idx[] = { 0, 1, 2, 3 };
    return cr_make_param_array(int, idx, 4);
}

ParameterizedTest(int *which, tokenizer, golden_encodings)
{
    const char *rel = tok_dirs[*which];
    cp_tokenizer *t = open_tok(rel);
    cJSON *g = open_golden(rel);
    cp_error err = { 0 };
    int cases = 0;
    for (const cJSON *c = cJSON_GetObjectItem(g, "cases")->child; c; c = c->next, cases++) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        size_t len = strlen(text);
        cp_encoding e = { 0 };
        cr_assert_eq(cp_tokenize(t, text, len, 0, &e, &err), CP_OK, "%s: %s", rel, err.msg);
        check_ids(&e, cJSON_GetObjectItem(c, "ids"), rel, text);
        check_offsets(&e, text, len);
        char *dec = NULL;
        cr_assert_eq(cp_detokenize(t, e.ids, e.n, 0, &dec, NULL, &err), CP_OK, "%s", err.msg);
        const char *want = cJSON_GetObjectItem(c, "decoded")->valuestring;
        cr_assert_str_eq(dec, want, "%s: decode('%s') = '%s', golden '%s'", rel, text, dec, want);
        free(dec);
        cp_encoding_free(&e);
    }
    cr_assert_gt(cases, 20);
    for (const cJSON *c = cJSON_GetObjectItem(g, "with_special_tokens")->child; c; c = c->next) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        cp_encoding e = { 0 };
        cr_assert_eq(cp_tokenize(t, text, strlen(text), CP_TOK_ADD_SPECIAL, &e, &err), CP_OK, "%s", err.msg);
        check_ids(&e, cJSON_GetObjectItem(c, "ids"), rel, text);
        cp_encoding_free(&e);
    }
    cJSON_Delete(g);
    cp_tokenizer_free(t);
}
