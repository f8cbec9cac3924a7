#define _POSIX_C_SOURCE 200809L
#include "config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/fileio.h"
#include "../kernels/log.h"

/* Keys we read or know to be harmless for the forward pass. */
static const char *const known_keys[] = {
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
    "vocab_size", "max_position_embeddings", "tie_word_embeddings", "hidden_act", "bos_token_id",
    "eos_token_id", "sliding_window", "use_sliding_window", "max_window_layers", "rope_scaling",
    "attention_bias", "mlp_bias", "partial_rotary_factor", "attention_dropout", "torch_dtype",
    "pad_token_id", "initializer_range", "use_cache", "transformers_version", "pretraining_tp",
    "layer_types", "dtype",
};

static int is_known(const char *k)
{
    for (size_t i = 0; i < sizeof known_keys / sizeof known_keys[0]; i++)
        if (strcmp(known_keys[i], k) == 0) return 1;
    return 0;
}

typedef struct ctx {
    const cJSON *root;
    const char *where;
    cp_error *err;
} ctx;

/* Reads an integer field in [lo, hi].  Absent: *out = def and returns OK if
 * def_ok, else a "missing field" error. */
static cp_status get_int(ctx *c, const char *key, int lo, int hi, int def_ok, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!v || cJSON_IsNull(v)) {
        if (def_ok) { *out = def; return CP_OK; }
        return cp_fail(c->err, CP_EFORMAT, "%s: missing required field '%s'", c->where, key);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return cp_fail(c->err, CP_EFORMAT, "%s: field '%s' must be an integer", c->where, key);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return cp_fail(c->err, CP_ERANGE, "%s: field '%s' = %.0f is outside [%d, %d]", c->where, key, v->valuedouble, lo, hi);
    *out = (int)v->valuedouble;
    return CP_OK;
}

static cp_status get_num(ctx *c, const char *key, double lo, double hi, double def, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!v || cJSON_IsNull(v)) { *out = def; return CP_OK; }
    if (!cJSON_IsNumber(v)) return cp_fail(c->err, CP_EFORMAT, "%s: field '%s' must be a number", c->where, key);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return cp_fail(c->err, CP_ERANGE, "%s: field '%s' = %g is outside [%g, %g]", c->where, key, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return CP_OK;
}

static cp_status get_bool(ctx *c, const char *key, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!v || cJSON_IsNull(v)) { *out = def; return CP_OK; }
    if (!cJSON_IsBool(v)) return cp_fail(c->err, CP_EFORMAT, "%s: field '%s' must be true or false", c->where, key);
    *out = cJSON_IsTrue(v);
    return CP_OK;
}

static cp_status parse_rope_scaling(ctx *c, cp_config *cfg)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c->root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return CP_OK;
    if (!cJSON_IsObject(rs)) return cp_fail(c->err, CP_EFORMAT, "%s: field 'rope_scaling' must be an object or null", c->where);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t))
        return cp_fail(c->err, CP_EFORMAT, "%s: field 'rope_scaling.rope_type' missing or not a string", c->where);
    if (strcmp(t->valuestring, "default") == 0) return CP_OK;
    if (strcmp(t->valuestring, "llama3") != 0)
        return cp_fail(c->err, CP_EUNSUPPORTED, "%s: unsupported rope_scaling.rope_type '%.64s' (supported: default, llama3)",
                       c->where, t->valuestring);
    ctx sub = { rs, c->where, c->err };
    double omp = 0;
    cp_status rc;
    if ((rc = get_num(&sub, "factor", 1e-6, 1e6, NAN, &cfg->rope_llama3.factor)) ||
        (rc = get_num(&sub, "low_freq_factor", 1e-6, 1e6, NAN, &cfg->rope_llama3.low_freq_factor)) ||
        (rc = get_num(&sub, "high_freq_factor", 1e-6, 1e6, NAN, &cfg->rope_llama3.high_freq_factor)) ||
        (rc = get_num(&sub, "original_max_position_embeddings", 1, 1 << 24, NAN, &omp)))
        return rc;
    if (isnan(cfg->rope_llama3.factor) || isnan(cfg->rope_llama3.low_freq_factor) ||
        isnan(cfg->rope_llama3.high_freq_factor) || isnan(omp))
        return cp_fail(c->err, CP_EFORMAT,
                       "%s: rope_scaling llama3 needs factor, low_freq_factor, high_freq_factor and "
                       "original_max_position_embeddings",
                       c->where);
    if (cfg->rope_llama3.high_freq_factor <= cfg->rope_llama3.low_freq_factor)
        return cp_fail(c->err, CP_ERANGE, "%s: rope_scaling.high_freq_factor must exceed low_freq_factor", c->where);
    cfg->rope_llama3.original_max_pos = (int)omp;
    return CP_OK;
}

static cp_status parse_token_ids(ctx *c, cp_config *cfg)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(c->root, "bos_token_id");
    cfg->bos_id = -1;
    if (b && !cJSON_IsNull(b)) {
        if (!cJSON_IsNumber(b) || b->valuedouble < 0 || b->valuedouble >= cfg->vocab)
            return cp_fail(c->err, CP_ERANGE, "%s: field 'bos_token_id' must be an id below vocab_size %d", c->where, cfg->vocab);
        cfg->bos_id = (int)b->valuedouble;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(c->root, "eos_token_id");
    cfg->n_eos = 0;
    if (!e || cJSON_IsNull(e)) return CP_OK;
    const cJSON *one = cJSON_IsArray(e) ? e->child : e;
    for (; one; one = cJSON_IsArray(e) ? one->next : NULL) {
        if (!cJSON_IsNumber(one) || one->valuedouble < 0 || one->valuedouble >= cfg->vocab)
            return cp_fail(c->err, CP_ERANGE, "%s: field 'eos_token_id' must hold ids below vocab_size %d", c->where, cfg->vocab);
        if (cfg->n_eos == CP_MAX_EOS)
            return cp_fail(c->err, CP_ERANGE, "%s: field 'eos_token_id' lists more than %d ids", c->where, CP_MAX_EOS);
        cfg->eos_ids[cfg->n_eos++] = (int)one->valuedouble;
    }
    return CP_OK;
}

static cp_status parse_windows(ctx *c, cp_config *cfg)
{
    int w = 0;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(c->root, "sliding_window");
    if (sw && !cJSON_IsNull(sw)) {
        cp_status rc = get_int(c, "sliding_window", 1, 1 << 30, 0, 0, &w);
        if (rc) return rc;
    } else if (cfg->arch == CP_ARCH_MISTRAL && !sw) {
        w = 4096; /* MistralConfig's default when the key is absent */
    }
    int first_windowed = 0;
    if (cfg->arch == CP_ARCH_QWEN2) {
        /* Qwen2: sliding window only if use_sliding_window, and only on
         * layers >= max_window_layers. */
        int use = 0;
        cp_status rc;
        if ((rc = get_bool(c, "use_sliding_window", 0, &use))) return rc;
        if ((rc = get_int(c, "max_window_layers", 0, CP_MAX_LAYERS, 1, cfg->n_layers, &first_windowed))) return rc;
        if (!use) w = 0;
    } else if (cfg->arch == CP_ARCH_LLAMA) {
        w = 0;
    }
    for (int l = 0; l < cfg->n_layers; l++) cfg->window[l] = l >= first_windowed ? w : 0;
    return CP_OK;
}

static cp_status check_unsupported(ctx *c, const cp_config *cfg)
{
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(c->root, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0))
        return cp_fail(c->err, CP_EUNSUPPORTED, "%s: unsupported hidden_act '%.64s' (only silu)", c->where,
                       cJSON_IsString(act) ? act->valuestring : "(not a string)");
    double prf = 1.0;
    cp_status rc = get_num(c, "partial_rotary_factor", 0, 1, 1.0, &prf);
    if (rc) return rc;
    if (prf != 1.0)
        return cp_fail(c->err, CP_EUNSUPPORTED, "%s: unsupported partial_rotary_factor %g (only 1.0)", c->where, prf);
    int ab = 0, mb = 0;
    if ((rc = get_bool(c, "attention_bias", 0, &ab)) || (rc = get_bool(c, "mlp_bias", 0, &mb))) return rc;
    if (ab && cfg->arch != CP_ARCH_QWEN2)
        return cp_fail(c->err, CP_EUNSUPPORTED, "%s: unsupported attention_bias true for %s", c->where, cfg->arch_name);
    if (mb) return cp_fail(c->err, CP_EUNSUPPORTED, "%s: unsupported mlp_bias true", c->where);
    return CP_OK;
}

cp_status cp_config_parse(const char *json, const char *where, cp_config *cfg, cp_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_Parse(json);
    if (!root) return cp_fail(err, CP_EFORMAT, "%s: not well-formed JSON", where);
    ctx c = { root, where, err };
    cp_status rc = CP_OK;
    if (!cJSON_IsObject(root)) { rc = cp_fail(err, CP_EFORMAT, "%s: not a JSON object", where); goto out; }

    /* JSON readers disagree on repeated keys (first wins here, last in
     * Python): refuse them rather than guess.  The key cap bounds the
     * quadratic check. */
    if (cJSON_GetArraySize(root) > 1024) {
        rc = cp_fail(err, CP_EFORMAT, "%s: more than 1024 top-level keys", where);
        goto out;
    }
    for (const cJSON *e = root->child; e; e = e->next)
        for (const cJSON *f = e->next; f; f = f->next)
            if (strcmp(e->string, f->string) == 0) {
                rc = cp_fail(err, CP_EFORMAT, "%s: duplicate key '%.64s'", where, e->string);
                goto out;
            }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? archs->child : NULL;
    if (!cJSON_IsString(a0)) {
        rc = cp_fail(err, CP_EFORMAT, "%s: missing field 'architectures' (a list with the model class name)", where);
        goto out;
    }
    static const struct { const char *name; cp_arch arch; } archs_known[] = {
        { "LlamaForCausalLM", CP_ARCH_LLAMA }, { "MistralForCausalLM", CP_ARCH_MISTRAL }, { "Qwen2ForCausalLM", CP_ARCH_QWEN2 },
    };
    for (size_t i = 0; i < 3; i++)
        if (strcmp(a0->valuestring, archs_known[i].name) == 0) {
            cfg->arch = archs_known[i].arch;
            cfg->arch_name = archs_known[i].name;
        }
    if (!cfg->arch) {
        rc = cp_fail(err, CP_EUNSUPPORTED,
                     "%s: unsupported architecture '%.64s' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)",
                     where, a0->valuestring);
        goto out;
    }
    double eps, theta;
    if ((rc = get_int(&c, "hidden_size", 1, 1 << 16, 0, 0, &cfg->hidden)) ||
        (rc = get_int(&c, "intermediate_size", 1, 1 << 18, 0, 0, &cfg->intermediate)) ||
        (rc = get_int(&c, "num_hidden_layers", 1, CP_MAX_LAYERS, 0, 0, &cfg->n_layers)) ||
        (rc = get_int(&c, "num_attention_heads", 1, 1024, 0, 0, &cfg->n_heads)) ||
        (rc = get_int(&c, "num_key_value_heads", 1, 1024, 1, cfg->n_heads, &cfg->n_kv_heads)) ||
        (rc = get_int(&c, "vocab_size", 1, 1 << 22, 0, 0, &cfg->vocab)) ||
        (rc = get_int(&c, "max_position_embeddings", 1, 1 << 24, 1,
                      cfg->arch == CP_ARCH_QWEN2 ? 32768 : cfg->arch == CP_ARCH_MISTRAL ? 131072 : 2048, &cfg->max_pos)) ||
        (rc = get_num(&c, "rms_norm_eps", 1e-12, 1.0, 1e-6, &eps)) ||
        (rc = get_num(&c, "rope_theta", 1.0, 1e12, 10000.0, &theta)) ||
        (rc = get_bool(&c, "tie_word_embeddings", 0, &cfg->tie_embeddings)))
        goto out;
    cfg->rms_eps = (float)eps;
    cfg->rope_theta = theta;
    if (cfg->hidden % cfg->n_heads != 0 && !cJSON_GetObjectItemCaseSensitive(root, "head_dim")) {
        rc = cp_fail(err, CP_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d and no head_dim is given",
                     where, cfg->hidden, cfg->n_heads);
        goto out;
    }
    if ((rc = get_int(&c, "head_dim", 2, 1024, 1, cfg->hidden / cfg->n_heads, &cfg->head_dim))) goto out;
    if (cfg->head_dim % 2) {
        rc = cp_fail(err, CP_EFORMAT, "%s: field 'head_dim' = %d must be even for RoPE", where, cfg->head_dim);
        goto out;
    }
    if (cfg->n_heads % cfg->n_kv_heads) {
        rc = cp_fail(err, CP_EFORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", where,
                     cfg->n_heads, cfg->n_kv_heads);
        goto out;
    }
    cfg->qkv_bias = cfg->arch == CP_ARCH_QWEN2;
    if ((rc = check_unsupported(&c, cfg)) || (rc = parse_rope_scaling(&c, cfg)) || (rc = parse_token_ids(&c, cfg)) ||
        (rc = parse_windows(&c, cfg)))
        goto out;
    for (const cJSON *e = root->child; e; e = e->next)
        if (!is_known(e->string)) cp_debug("%s: ignoring unknown key '%.64s'", where, e->string);
out:
    cJSON_Delete(root);
    return rc;
}

cp_status cp_config_load(const char *model_dir, cp_config *cfg, cp_error *err)
{
    char path[4096], *text;
    cp_status rc;
    if ((rc = cp_model_dir_check(model_dir, err)) || (rc = cp_path_join(path, sizeof path, model_dir, "config.json", err)) ||
        (rc = cp_read_file(path, 1u << 20, &text, NULL, err)))
        return rc;
    rc = cp_config_parse(text, path, cfg, err);
    free(text);
    return rc;
}

void cp_config_rope_inv_freq(const cp_config *cfg, double *inv_freq)
{
    int half = cfg->head_dim / 2;
    for (int i = 0; i < half; i++) inv_freq[i] = pow(cfg->rope_theta, -(2.0 * i) / cfg->head_dim);
    if (cfg->rope_llama3.factor > 0) {
        /* Llama-3.1 scaling: low frequencies divided by factor, high ones
         * kept, a smooth blend between the two wavelength bounds. */
        double factor = cfg->rope_llama3.factor, lo = cfg->rope_llama3.low_freq_factor,
               hi = cfg->rope_llama3.high_freq_factor, old = cfg->rope_llama3.original_max_pos;
        double low_wl = old / lo, high_wl = old / hi;
        for (int i = 0; i < half; i++) {
            double wl = 2 * 3.14159265358979323846 / inv_freq[i];
            if (wl < high_wl) continue;
            if (wl > low_wl) { inv_freq[i] /= factor; continue; }
            double smooth = (old / wl - lo) / (hi - lo);
            inv_freq[i] = (1 - smooth) * inv_freq[i] / factor + smooth * inv_freq[i];
        }
    }
}

int cp_config_is_eos(const cp_config *cfg, int id)
{
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id) return 1;
    return 0;
}
