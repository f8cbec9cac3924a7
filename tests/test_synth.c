/* synth writes loadable checkpoints; single-file and sharded layouts hold
 * the same weights; the shard index is checked as hostile input. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../model/synth.h"
#include "../tokenizer/tokenizer.h"
#include "helpers.h"

static float *last_logits(const char *dir, int *vocab)
{
    cp_backend *be;
    cp_model *m = load_model_or_die(dir, &be);
    cp_error err = { 0 };
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, 16, 16, &s, &err), CP_OK, "%s", err.msg);
    int32_t ids[] = { 256, 72, 105, 33, 10 };
    float *lg = malloc((size_t)m->cfg.vocab * sizeof(float));
    cr_assert_eq(cp_forward(m, s, ids, NULL, 5, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    *vocab = m->cfg.vocab;
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
    return lg;
}

static int exists(const char *dir, const char *name)
{
    char p[700];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

Test(synth, single_and_sharded_hold_the_same_model)
{
    char a[512], b[512];
    test_tmpdir(a, sizeof a, "synth-single");
    test_tmpdir(b, sizeof b, "synth-sharded");
    cp_error err = { 0 };
    cp_synth_opts o = { .shape = "tiny", .out_dir = a, .seed = 7 };
    cr_assert_eq(cp_synth(&o, &err), CP_OK, "%s", err.msg);
    o.out_dir = b;
    o.shard_bytes = 60000;
    cr_assert_eq(cp_synth(&o, &err), CP_OK, "%s", err.msg);
    cr_assert(exists(a, "model.safetensors") && !exists(a, "model.safetensors.index.json"));
    cr_assert(exists(b, "model.safetensors.index.json") && exists(b, "model-00001-of-00005.safetensors") &&
              !exists(b, "model.safetensors"));
    int va, vb;
    float *la = last_logits(a, &va), *lb = last_logits(b, &vb);
    cr_assert_eq(va, vb);
    cr_assert_eq(max_abs_diff(la, lb, (size_t)va), 0.0f);
    cr_assert_gt(max_abs(la, (size_t)va), 0.0f);
    /* another seed gives another model */
    o.out_dir = a;
    o.seed = 8;
    o.shard_bytes = 0;
    cr_assert_eq(cp_synth(&o, &err), CP_OK, "%s", err.msg);
    float *lc = last_logits(a, &va);
    cr_assert_gt(max_abs_diff(la, lc, (size_t)va), 0.0f);
    free(la), free(lb), free(lc);
    /* the byte-level tokenizer: 256 bytes + <s> + </s> */
    cp_tokenizer *t = NULL;
    cr_assert_eq(cp_tokenizer_load(a, &t, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_tokenizer_n_ids(t), 258);
    /* it round-trips any text: every byte is a token */
    const char *text = "h\xc3\xa9llo \xf0\x9f\x99\x82";
    cp_encoding e = { 0 };
    cr_assert_eq(cp_tokenize(t, text, strlen(text), CP_TOK_ADD_SPECIAL, &e, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(e.n, strlen(text) + 1);
    cr_assert_eq(e.ids[0], 256);
    char *back = NULL;
    cr_assert_eq(cp_detokenize(t, e.ids, e.n, 1, &back, NULL, &err), CP_OK);
    cr_assert_str_eq(back, text);
    free(back);
    cp_encoding_free(&e);
    cp_tokenizer_free(t);
}

Test(synth, copies_a_given_tokenizer)
{
    char d[512], tok[512];
    test_tmpdir(d, sizeof d, "synth-tok");
    shared_path(tok, sizeof tok, "models/qwen-bpe-tokenizer-qwen3");
    cp_error err = { 0 };
    cp_synth_opts o = { .shape = "tiny", .out_dir = d, .seed = 1, .tokenizer_dir = tok };
    cr_assert_eq(cp_synth(&o, &err), CP_OK, "%s", err.msg);
    cp_tokenizer *t = NULL;
    cr_assert_eq(cp_tokenizer_load(d, &t, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_tokenizer_n_ids(t), 151669); /* 151643 BPE ids + 26 added tokens */
    cp_tokenizer_free(t);
    o.shape = "gpt-9";
    cr_assert_eq(cp_synth(&o, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "unknown shape 'gpt-9'"), "%s", err.msg);
}

static void write_index(const char *dir, const char *json)
{
    char p[700];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    cr_assert(write_bytes(p, json, strlen(json)));
}

Test(synth, hostile_shard_index_is_rejected)
{
    char d[512];
    test_tmpdir(d, sizeof d, "synth-index");
    cp_error err = { 0 };
    cp_synth_opts o = { .shape = "tiny", .out_dir = d, .seed = 1, .shard_bytes = 60000 };
    cr_assert_eq(cp_synth(&o, &err), CP_OK, "%s", err.msg);
    st_set *s = NULL;
    write_index(d, "{\"weight_map\":{\"model.norm.weight\":\"../../etc/passwd\"}}");
    cr_assert_eq(st_open_dir(d, &s, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "not a plain file name"), "%s", err.msg);
    write_index(d, "{\"weight_map\":{\"model.norm.weight\":\"model-00001-of-00005.safetensors\"}}");
    cr_assert_eq(st_open_dir(d, &s, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "does not hold it"), "%s", err.msg);
    write_index(d, "{\"metadata\":{}}");
    cr_assert_eq(st_open_dir(d, &s, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "weight_map"), "%s", err.msg);
    write_index(d, "{\"weight_map\":{\"x\":\"model-00009-of-00009.safetensors\"}}");
    cr_assert_eq(st_open_dir(d, &s, &err), CP_EIO);
    cr_assert(strstr(err.msg, "model-00009-of-00009.safetensors: cannot open"), "%s", err.msg);
    cr_assert_null(s);
}

Test(synth, fingerprints_tell_models_apart)
{
    char a[512], b[512];
    test_tmpdir(a, sizeof a, "fp-a");
    test_tmpdir(b, sizeof b, "fp-b");
    cp_error err = { 0 };
    cp_synth_opts o = { .shape = "tiny", .out_dir = a, .seed = 1 };
    cr_assert_eq(cp_synth(&o, &err), CP_OK, "%s", err.msg);
    o.out_dir = b;
    o.seed = 2; /* same shapes, other weights */
    cr_assert_eq(cp_synth(&o, &err), CP_OK, "%s", err.msg);
    cp_backend *be1, *be2, *be3;
    cp_model *m1 = load_model_or_die(a, &be1), *m2 = load_model_or_die(b, &be2), *m3 = load_model_or_die(a, &be3);
    cr_assert(memcmp(m1->fingerprint, m3->fingerprint, 32) == 0, "the same model must keep its fingerprint");
    cr_assert(memcmp(m1->fingerprint, m2->fingerprint, 32) != 0, "other weights, same shapes: other fingerprint");
    cp_model_free(m1), cp_model_free(m2), cp_model_free(m3);
    cp_backend_destroy(be1), cp_backend_destroy(be2), cp_backend_destroy(be3);
}
