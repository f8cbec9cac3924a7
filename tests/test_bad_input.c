/* Hostile files: one test per class of damage.  Each asserts that loading
 * fails with a message naming the problem, and never crashes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/config.h"
#include "helpers.h"

/* Writes u64 header length + header + data_len bytes of zeros.  hlen_override
 * (when nonzero) replaces the true header length. */
static const char *write_st(const char *dir, const char *header, size_t data_len, uint64_t hlen_override)
{
    static char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t h = strlen(header);
    size_t total = 8 + h + data_len;
    unsigned char *buf = calloc(1, total);
    uint64_t hl = hlen_override ? hlen_override : h;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
    memcpy(buf + 8, header, h);
    cr_assert(write_bytes(path, buf, total));
    free(buf);
    return path;
}

static void expect_st_error(const char *path, cp_status code, const char *needle)
{
    st_set *s = NULL;
    cp_error err = { 0 };
    cp_status rc = st_open_file(path, &s, &err);
    cr_assert_eq(rc, code, "expected %s, got %s (%s)", cp_status_name(code), cp_status_name(rc), err.msg);
    cr_assert_null(s);
    cr_assert(strstr(err.msg, needle), "message '%s' does not mention '%s'", err.msg, needle);
}

Test(bad_input, truncated_file)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "trunc");
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert(write_bytes(path, "\x10\x00\x00", 3));
    expect_st_error(path, CP_EFORMAT, "truncated");
    /* a header that promises more tensor bytes than the file holds */
    const char *p = write_st(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, 0);
    expect_st_error(p, CP_EFORMAT, "out of range");
}

Test(bad_input, header_length_past_eof)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "hlen");
    const char *p = write_st(dir, "{}", 0, 1000);
    expect_st_error(p, CP_EFORMAT, "runs past the end");
    p = write_st(dir, "{}", 0, (uint64_t)1 << 40);
    expect_st_error(p, CP_EFORMAT, "exceeds the cap");
}

Test(bad_input, malformed_header_json)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "json");
    expect_st_error(write_st(dir, "{\"a\":{\"dtype\":\"F32\",", 0, 0), CP_EFORMAT, "not well-formed JSON");
    expect_st_error(write_st(dir, "[1,2]", 0, 0), CP_EFORMAT, "not a JSON object");
    expect_st_error(write_st(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, 0), CP_EFORMAT,
                    "shape[0]");
}

Test(bad_input, offsets_out_of_range)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "range");
    const char *p = write_st(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8, 0);
    expect_st_error(p, CP_EFORMAT, "'w': data_offsets [8, 16] out of range");
    p = write_st(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,4]}}", 16, 0);
    expect_st_error(p, CP_EFORMAT, "begin <= end");
}

Test(bad_input, offsets_overlapping)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "overlap");
    const char *p = write_st(dir,
                             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                             "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                             24, 0);
    expect_st_error(p, CP_EFORMAT, "overlap");
}

Test(bad_input, size_mismatch_and_duplicates)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "size");
    const char *p = write_st(dir, "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, 0);
    expect_st_error(p, CP_EFORMAT, "BF16 x shape is 8 bytes");
    p = write_st(dir,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, 0);
    expect_st_error(p, CP_EFORMAT, "appears twice");
}

Test(bad_input, unknown_dtype)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "dtype");
    const char *p = write_st(dir, "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, 0);
    expect_st_error(p, CP_EUNSUPPORTED, "unknown dtype 'F8_E4M3'");
}

/* ---- model-level damage, built from the llama-tiny fixture ------------- */

typedef struct rewrite {
    st_set *src;
    st_write_entry *e;
    const st_tensor **t;
} rewrite;

static cp_status copy_tensor(void *ctx, size_t i, void *buf, size_t nbytes, cp_error *err)
{
    (void)err;
    rewrite *r = ctx;
    memset(buf, 0, nbytes);
    memcpy(buf, r->t[i]->data, nbytes < r->t[i]->nbytes ? nbytes : r->t[i]->nbytes);
    return CP_OK;
}

/* Copies llama-tiny into dir, dropping tensor `drop` and giving tensor
 * `reshape` the shape [7, 5]; config.json text replaced by `config` if set. */
static void make_model(const char *dir, const char *drop, const char *reshape, const char *config)
{
    char src[512], path[700];
    shared_path(src, sizeof src, "fixtures/llama-tiny");
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    rewrite r = { 0 };
    cp_error err = { 0 };
    cr_assert_eq(st_open_file(path, &r.src, &err), CP_OK, "%s", err.msg);
    size_t n = st_count(r.src), k = 0;
    r.e = calloc(n, sizeof *r.e);
    r.t = calloc(n, sizeof *r.t);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_at(r.src, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        st_write_entry *e = &r.e[k];
        e->name = t->name;
        e->dtype = t->dtype;
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof e->shape);
        if (reshape && strcmp(t->name, reshape) == 0) {
            e->ndim = 2;
            e->shape[0] = 7;
            e->shape[1] = 5;
        }
        r.t[k++] = t;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(st_write_file(path, r.e, k, copy_tensor, &r, &err), CP_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/config.json", src);
    char *cfg = config ? NULL : read_text(path, NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *text = config ? config : cfg;
    cr_assert(write_bytes(path, text, strlen(text)));
    free(cfg);
    free(r.e);
    free(r.t);
    st_close(r.src);
}

static void expect_model_error(const char *dir, cp_status code, const char *needle)
{
    cp_backend *be = NULL;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK);
    cp_model *m = NULL;
    cp_status rc = cp_model_load(dir, be, NULL, &m, &err);
    cr_assert_eq(rc, code, "expected %s, got %s (%s)", cp_status_name(code), cp_status_name(rc), err.msg);
    cr_assert_null(m);
    cr_assert(strstr(err.msg, needle), "message '%s' does not mention '%s'", err.msg, needle);
    cp_backend_destroy(be);
}

Test(bad_input, rewritten_model_still_loads)
{
    /* the control for the tests below: an unmodified copy loads */
    char dir[512];
    test_tmpdir(dir, sizeof dir, "control");
    make_model(dir, NULL, NULL, NULL);
    cp_backend *be;
    cp_model *m = load_model_or_die(dir, &be);
    cr_assert_eq(m->n_leftover, 0);
    cp_model_free(m);
    cp_backend_destroy(be);
}

Test(bad_input, missing_tensor)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "missing");
    make_model(dir, "model.layers.1.mlp.up_proj.weight", NULL, NULL);
    expect_model_error(dir, CP_EFORMAT, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
}

Test(bad_input, wrong_shape)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "shape");
    make_model(dir, NULL, "model.layers.0.self_attn.k_proj.weight", NULL);
    expect_model_error(dir, CP_EFORMAT, "'model.layers.0.self_attn.k_proj.weight' has shape [7, 5], expected [64, 64]");
}

Test(bad_input, missing_model_files)
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "nofiles");
    expect_model_error(dir, CP_EIO, "config.json: cannot open");
}

static const char *good_cfg =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":256%s}";

static cp_status parse_cfg(const char *extra, cp_config *cfg, cp_error *err)
{
    char text[2048];
    snprintf(text, sizeof text, good_cfg, extra);
    return cp_config_parse(text, "config.json", cfg, err);
}

Test(bad_input, config_errors_name_the_field)
{
    cp_config cfg;
    cp_error err = { 0 };
    cr_assert_eq(parse_cfg("", &cfg, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cfg.head_dim, 8);
    cr_assert_eq(cfg.n_kv_heads, 8);

    struct { const char *extra; cp_status code; const char *needle; } cases[] = {
        { ",\"hidden_act\":\"gelu\"", CP_EUNSUPPORTED, "hidden_act 'gelu'" },
        { ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}", CP_EUNSUPPORTED, "rope_type 'yarn'" },
        { ",\"partial_rotary_factor\":0.5", CP_EUNSUPPORTED, "partial_rotary_factor" },
        { ",\"rms_norm_eps\":\"small\"", CP_EFORMAT, "'rms_norm_eps' must be a number" },
        { ",\"num_key_value_heads\":3", CP_EFORMAT, "not a multiple of num_key_value_heads 3" },
        { ",\"head_dim\":7", CP_EFORMAT, "'head_dim' = 7" },
        { ",\"eos_token_id\":[2,9999]", CP_ERANGE, "eos_token_id" },
        { ",\"tie_word_embeddings\":1", CP_EFORMAT, "tie_word_embeddings" },
        { ",\"hidden_size\":128", CP_EFORMAT, "duplicate key 'hidden_size'" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err.msg[0] = 0;
        cp_status rc = parse_cfg(cases[i].extra, &cfg, &err);
        cr_assert_eq(rc, cases[i].code, "case %zu: got %s (%s)", i, cp_status_name(rc), err.msg);
        cr_assert(strstr(err.msg, cases[i].needle), "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].needle);
    }
    /* a missing required field, malformed JSON, an unknown architecture */
    cr_assert_eq(cp_config_parse("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64}", "config.json", &cfg, &err),
                 CP_EFORMAT);
    cr_assert(strstr(err.msg, "missing required field 'intermediate_size'"), "%s", err.msg);
    cr_assert_eq(cp_config_parse("{\"architectures\":[\"Llama", "config.json", &cfg, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "not well-formed JSON"), "%s", err.msg);
    cr_assert_eq(cp_config_parse("{\"architectures\":[\"GPT2LMHeadModel\"]}", "config.json", &cfg, &err), CP_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "unsupported architecture 'GPT2LMHeadModel'"), "%s", err.msg);
}

Test(bad_input, config_reads_real_variants)
{
    cp_config cfg;
    cp_error err = { 0 };
    /* unknown keys are ignored; llama3 rope scaling parses; eos as a list */
    cr_assert_eq(parse_cfg(",\"some_future_key\":{\"x\":1},\"eos_token_id\":[2,3],\"rope_scaling\":{\"rope_type\":\"llama3\","
                           "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":8192}",
                           &cfg, &err),
                 CP_OK, "%s", err.msg);
    cr_assert_eq(cfg.n_eos, 2);
    cr_assert_eq(cfg.eos_ids[1], 3);
    double f[4];
    cp_config_rope_inv_freq(&cfg, f);
    /* head_dim 8, theta 1e4: wavelengths 2pi x {1, 10, 100, 1000}; with
     * 8192 / {1, 4} as the bounds, the first three (< 2048) are kept and
     * the last (6283) is blended between f/8 and f */
    cr_assert_float_eq(f[0], 1.0, 1e-12);
    cr_assert_float_eq(f[1], 0.1, 1e-12);
    cr_assert_float_eq(f[2], 0.01, 1e-12);
    double smooth = (8192.0 / (2 * 3.14159265358979323846 / 0.001) - 1.0) / 3.0;
    cr_assert_float_eq(f[3], (1 - smooth) * 0.001 / 8 + smooth * 0.001, 1e-15);
    cr_assert(f[3] < 0.001 && f[3] > 0.001 / 8);
    char path[512];
    cr_assert_eq(cp_config_load(shared_path(path, sizeof path, "models/mistral-7b-v0.1-tokenizer"), &cfg, &err), CP_OK,
                 "%s", err.msg);
    cr_assert_eq(cfg.arch, CP_ARCH_MISTRAL);
    cr_assert_eq(cfg.window[0], 4096);
    cr_assert_eq(cfg.n_kv_heads, 8);
    /* Qwen2: the window applies only from max_window_layers on */
    char q[1024];
    snprintf(q, sizeof q,
             "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
             "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"vocab_size\":256,\"use_sliding_window\":true,"
             "\"sliding_window\":32,\"max_window_layers\":2}");
    cr_assert_eq(cp_config_parse(q, "q", &cfg, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cfg.window[1], 0);
    cr_assert_eq(cfg.window[2], 32);
    cr_assert(cfg.qkv_bias);
}

Test(bad_input, backend_missing_an_op_is_refused_by_name)
{
    cp_backend *be = NULL;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK);
    void (*saved)(cp_backend *, const cp_attn_args *) = be->attention;
    be->attention = NULL;
    char dir[512];
    cp_model *m = NULL;
    cp_status rc = cp_model_load(shared_path(dir, sizeof dir, "fixtures/llama-tiny"), be, NULL, &m, &err);
    cr_assert_eq(rc, CP_EUNSUPPORTED);
    cr_assert_null(m);
    cr_assert(strstr(err.msg, "cpu backend cannot run a model yet: it has no 'attention' op"), "%s", err.msg);
    be->attention = saved;
    cp_backend_destroy(be);
}

Test(bad_input, oversized_kv_cache_fails_cleanly)
{
    cp_backend *be;
    char dir[512];
    cp_model *m = load_model_or_die(shared_path(dir, sizeof dir, "models/stories260K-hf"), &be);
    cp_state *s = NULL;
    cp_error err = { 0 };
    /* 5 layers x 2^30 slots x 32 floats x 2: far past this machine's memory */
    cr_assert_eq(cp_state_create(m, 1 << 30, 1, &s, &err), CP_ENOMEM);
    cr_assert_null(s);
    cr_assert(strstr(err.msg, "creating a KV cache of 1073741824 slots"), "%s", err.msg);
    cr_assert_eq(cp_state_create(m, 0, 1, &s, &err), CP_EINVAL);
    /* a forward past the cache's capacity is refused, the state unchanged */
    cr_assert_eq(cp_state_create(m, 4, 4, &s, &err), CP_OK, "%s", err.msg);
    int32_t ids[5] = { 1, 2, 3, 4, 5 };
    cr_assert_eq(cp_forward(m, s, ids, NULL, 5, CP_LOGITS_NONE, NULL, NULL, &err), CP_ERANGE);
    cr_assert(strstr(err.msg, "5 tokens do not fit"), "%s", err.msg);
    cr_assert_eq(s->n, 0);
    int32_t neg = -3;
    cr_assert_eq(cp_forward(m, s, ids, &neg, 1, CP_LOGITS_NONE, NULL, NULL, &err), CP_ERANGE);
    cr_assert(strstr(err.msg, "position -3"), "%s", err.msg);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
}
