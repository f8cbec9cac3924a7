/* GGUF v3 writer (see gguf.h).  Layout: "GGUF", u32 version, u64 tensor
 * count, u64 key-value count, the key-values, the tensor infos (name, dims
 * innermost first, type, offset into the data section), zero padding to
 * the alignment, then each tensor's data at its aligned offset. */
#include "gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/dtype.h"
#include "../kernels/fileio.h"
#include "../model/config.h"
#include "../model/safetensors.h"

enum { GV_U32 = 4, GV_F32 = 6, GV_STRING = 8 }; /* gguf_type value ids */

cp_status cp_gguf_type_from_name(const char *name, cp_gguf_type *out, cp_error *err)
{
    if (name && strcmp(name, "f32") == 0) *out = CP_GGUF_F32;
    else if (name && strcmp(name, "bf16") == 0) *out = CP_GGUF_BF16;
    else if (name && strcmp(name, "q8_0") == 0) *out = CP_GGUF_Q8_0;
    else return cp_fail(err, CP_EINVAL, "gguf: unknown type '%s' (f32, bf16, q8_0)", name ? name : "");
    return CP_OK;
}

uint16_t cp_gguf_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* rounds past 65504: inf */
    if (a < 0x38800000u) {                                           /* below 2^-14: subnormal or 0 */
        /* value / 2^-24, rounded to nearest even, is the subnormal's mantissa */
        float m = fabsf(f) * 16777216.0f;
        float r = nearbyintf(m); /* default rounding mode: to nearest even */
        return (uint16_t)(sign | (uint16_t)r);
    }
    uint32_t e = (a >> 23) - 112; /* rebias 127 -> 15 */
    uint32_t mant = a & 0x7fffffu;
    uint32_t h = (e << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* carries into the exponent correctly */
    return (uint16_t)(sign | h);
}

void cp_q8_0_quantize(const float *x, size_t n, uint8_t *out)
{
    for (size_t b = 0; b < n / CP_Q8_0_BLOCK; b++) {
        const float *v = x + b * CP_Q8_0_BLOCK;
        uint8_t *o = out + b * CP_Q8_0_BYTES;
        float amax = 0;
        for (int j = 0; j < CP_Q8_0_BLOCK; j++)
            if (fabsf(v[j]) > amax) amax = fabsf(v[j]);
        const float d = amax / 127.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = cp_gguf_f32_to_f16(d);
        memcpy(o, &dh, 2); /* little-endian host: the file's byte order */
        for (int j = 0; j < CP_Q8_0_BLOCK; j++) {
            int8_t q = (int8_t)roundf(v[j] * id); /* |v * id| <= 127 */
            memcpy(o + 2 + j, &q, 1);
        }
    }
}

size_t cp_gguf_row_bytes(cp_gguf_type t, int64_t ne0)
{
    if (ne0 <= 0) return 0;
    switch (t) {
    case CP_GGUF_F32: return (size_t)ne0 * 4;
    case CP_GGUF_F16:
    case CP_GGUF_BF16: return (size_t)ne0 * 2;
    case CP_GGUF_Q8_0: return ne0 % CP_Q8_0_BLOCK ? 0 : (size_t)(ne0 / CP_Q8_0_BLOCK) * CP_Q8_0_BYTES;
    }
    return 0;
}

/* ---- output stream ------------------------------------------------------ */

typedef struct gw {
    FILE *f;
    uint64_t pos; /* bytes written so far */
    int bad;
} gw;

static void w_bytes(gw *w, const void *p, size_t n)
{
    if (!w->bad && n && fwrite(p, 1, n, w->f) != n) w->bad = 1;
    w->pos += n;
}
static void w_u32(gw *w, uint32_t v) { w_bytes(w, &v, 4); }
static void w_u64(gw *w, uint64_t v) { w_bytes(w, &v, 8); }
static void w_str(gw *w, const char *s)
{
    w_u64(w, strlen(s));
    w_bytes(w, s, strlen(s));
}
static void w_pad(gw *w)
{
    static const uint8_t zero[CP_GGUF_ALIGN];
    w_bytes(w, zero, (size_t)((CP_GGUF_ALIGN - w->pos % CP_GGUF_ALIGN) % CP_GGUF_ALIGN));
}

typedef struct kvs {
    gw w;
    uint64_t n;
} kvs;

static void kv_u32(kvs *k, const char *key, uint32_t v)
{
    w_str(&k->w, key), w_u32(&k->w, GV_U32), w_u32(&k->w, v), k->n++;
}
static void kv_f32(kvs *k, const char *key, float v)
{
    w_str(&k->w, key), w_u32(&k->w, GV_F32), w_bytes(&k->w, &v, 4), k->n++;
}
static void kv_str(kvs *k, const char *key, const char *v)
{
    w_str(&k->w, key), w_u32(&k->w, GV_STRING), w_str(&k->w, v), k->n++;
}

/* ---- tensors ------------------------------------------------------------ */

typedef struct gg_tensor {
    char name[96];
    st_tensor *src;
    int ndim;
    int64_t ne[2]; /* innermost first */
    cp_gguf_type type;
    uint64_t offset, nbytes;
} gg_tensor;

/* HF name -> llama.cpp's (llama-arch.cpp LLM_TENSOR_NAMES); 0 when unknown. */
static int map_name(const char *hf, char *out, size_t cap)
{
    static const char *const top[][2] = {
        { "model.embed_tokens.weight", "token_embd.weight" },
        { "model.norm.weight", "output_norm.weight" },
        { "lm_head.weight", "output.weight" },
    };
    static const char *const per_layer[][2] = {
        { "input_layernorm.weight", "attn_norm.weight" },   { "self_attn.q_proj.weight", "attn_q.weight" },
        { "self_attn.q_proj.bias", "attn_q.bias" },         { "self_attn.k_proj.weight", "attn_k.weight" },
        { "self_attn.k_proj.bias", "attn_k.bias" },         { "self_attn.v_proj.weight", "attn_v.weight" },
        { "self_attn.v_proj.bias", "attn_v.bias" },         { "self_attn.o_proj.weight", "attn_output.weight" },
        { "post_attention_layernorm.weight", "ffn_norm.weight" }, { "mlp.gate_proj.weight", "ffn_gate.weight" },
        { "mlp.up_proj.weight", "ffn_up.weight" },          { "mlp.down_proj.weight", "ffn_down.weight" },
    };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (strcmp(hf, top[i][0]) == 0) return snprintf(out, cap, "%s", top[i][1]) < (int)cap;
    int layer, used = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 || layer >= CP_MAX_LAYERS) return 0;
    for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++)
        if (strcmp(hf + used, per_layer[i][0]) == 0) return snprintf(out, cap, "blk.%d.%s", layer, per_layer[i][1]) < (int)cap;
    return 0;
}

static cp_status plan_tensors(st_set *s, cp_gguf_type type, gg_tensor *t, size_t n, cp_error *err)
{
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        st_tensor *src = st_at(s, i);
        if (!map_name(src->name, t[i].name, sizeof t[i].name))
            return cp_fail(err, CP_EUNSUPPORTED, "gguf: tensor '%s' has no llama.cpp name here", src->name);
        if (src->ndim < 1 || src->ndim > 2 || (src->dtype != CP_F32 && src->dtype != CP_F16 && src->dtype != CP_BF16))
            return cp_fail(err, CP_EUNSUPPORTED, "gguf: tensor '%s': %d dims of %s (1-2 dims of a float type only)",
                           src->name, src->ndim, cp_dtype_name(src->dtype));
        t[i].src = src;
        t[i].ndim = src->ndim;
        t[i].ne[0] = src->shape[src->ndim - 1];
        t[i].ne[1] = src->ndim == 2 ? src->shape[0] : 1;
        t[i].type = src->ndim == 1 ? CP_GGUF_F32 : type;
        if (t[i].type == CP_GGUF_Q8_0 && t[i].ne[0] % CP_Q8_0_BLOCK) t[i].type = CP_GGUF_F32; /* no whole blocks */
        size_t row = cp_gguf_row_bytes(t[i].type, t[i].ne[0]);
        if (!row) return cp_fail(err, CP_EFORMAT, "gguf: tensor '%s' has an empty row", src->name);
        t[i].offset = off;
        t[i].nbytes = (uint64_t)row * (uint64_t)t[i].ne[1];
        off += (t[i].nbytes + CP_GGUF_ALIGN - 1) / CP_GGUF_ALIGN * CP_GGUF_ALIGN;
    }
    return CP_OK;
}

static float elem(const st_tensor *t, size_t i)
{
    const char *p = (const char *)t->data;
    if (t->dtype == CP_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == CP_BF16 ? cp_bf16_to_f32(h) : cp_f16_to_f32(h);
}

/* One row at a time: row (floats) and out (its encoding) hold one row. */
static void write_data(gw *w, const gg_tensor *t, float *row, uint8_t *out)
{
    size_t ne0 = (size_t)t->ne[0], rb = cp_gguf_row_bytes(t->type, t->ne[0]);
    for (int64_t r = 0; r < t->ne[1]; r++) {
        for (size_t j = 0; j < ne0; j++) row[j] = elem(t->src, (size_t)r * ne0 + j);
        if (t->type == CP_GGUF_F32) memcpy(out, row, rb);
        else if (t->type == CP_GGUF_Q8_0) cp_q8_0_quantize(row, ne0, out);
        else
            for (size_t j = 0; j < ne0; j++) {
                uint16_t h = t->type == CP_GGUF_BF16 ? cp_f32_to_bf16(row[j]) : cp_gguf_f32_to_f16(row[j]);
                memcpy(out + 2 * j, &h, 2);
            }
        w_bytes(w, out, rb);
    }
    st_release(t->src); /* a 7B checkpoint's pages must not pile up */
}

static void write_kvs(kvs *k, const cp_config *c, cp_gguf_type type)
{
    kv_str(k, "general.architecture", "qwen2");
    kv_str(k, "general.name", "cacheprune synth");
    kv_u32(k, "general.alignment", CP_GGUF_ALIGN);
    /* llama_ftype: ALL_F32 0, MOSTLY_Q8_0 7, MOSTLY_BF16 32 */
    kv_u32(k, "general.file_type", type == CP_GGUF_F32 ? 0 : type == CP_GGUF_Q8_0 ? 7 : type == CP_GGUF_BF16 ? 32 : 1);
    kv_u32(k, "qwen2.context_length", (uint32_t)c->max_pos);
    kv_u32(k, "qwen2.embedding_length", (uint32_t)c->hidden);
    kv_u32(k, "qwen2.block_count", (uint32_t)c->n_layers);
    kv_u32(k, "qwen2.feed_forward_length", (uint32_t)c->intermediate);
    kv_u32(k, "qwen2.attention.head_count", (uint32_t)c->n_heads);
    kv_u32(k, "qwen2.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    kv_u32(k, "qwen2.attention.key_length", (uint32_t)c->head_dim);
    kv_u32(k, "qwen2.attention.value_length", (uint32_t)c->head_dim);
    kv_u32(k, "qwen2.rope.dimension_count", (uint32_t)c->head_dim);
    kv_f32(k, "qwen2.rope.freq_base", (float)c->rope_theta);
    kv_f32(k, "qwen2.attention.layer_norm_rms_epsilon", c->rms_eps);
    kv_u32(k, "qwen2.vocab_size", (uint32_t)c->vocab);
    kv_str(k, "tokenizer.ggml.model", "none");
}

static cp_status check_config(const cp_config *c, cp_error *err)
{
    if (c->arch != CP_ARCH_QWEN2)
        return cp_fail(err, CP_EUNSUPPORTED, "gguf: %s: only Qwen2 checkpoints (Llama/Mistral need q/k rows permuted)",
                       c->arch_name);
    for (int l = 0; l < c->n_layers; l++)
        if (c->window[l]) return cp_fail(err, CP_EUNSUPPORTED, "gguf: layer %d has a sliding window", l);
    if (c->rope_llama3.factor != 0) return cp_fail(err, CP_EUNSUPPORTED, "gguf: rope_scaling is not written");
    return CP_OK;
}

static cp_status write_file(const char *out_path, const cp_config *c, st_set *s, cp_gguf_type type, cp_error *err)
{
    size_t n = st_count(s), max_row = 1;
    gg_tensor *t = calloc(n ? n : 1, sizeof *t);
    if (!t) return cp_fail(err, CP_ENOMEM, "gguf: out of memory (%zu tensor infos)", n);
    cp_status rc = plan_tensors(s, type, t, n, err);
    for (size_t i = 0; i < n && !rc; i++)
        if ((size_t)t[i].ne[0] > max_row) max_row = (size_t)t[i].ne[0];
    char *kbuf = NULL;
    size_t klen = 0;
    kvs k = { 0 };
    float *row = NULL;
    uint8_t *enc = NULL;
    gw w = { 0 };
    if (!rc) {
        k.w.f = open_memstream(&kbuf, &klen);
        if (!k.w.f) rc = cp_fail(err, CP_ENOMEM, "gguf: out of memory (key-values)");
    }
    if (!rc) {
        write_kvs(&k, c, type);
        if (fclose(k.w.f) != 0 || k.w.bad) rc = cp_fail(err, CP_ENOMEM, "gguf: out of memory (key-values)");
    }
    if (!rc && (!(row = malloc(max_row * sizeof *row)) || !(enc = malloc(max_row * 4))))
        rc = cp_fail(err, CP_ENOMEM, "gguf: out of memory (a row of %zu)", max_row);
    if (!rc && !(w.f = fopen(out_path, "wb"))) rc = cp_fail(err, CP_EIO, "gguf: cannot create %s", out_path);
    if (!rc) {
        w_bytes(&w, "GGUF", 4);
        w_u32(&w, 3);
        w_u64(&w, n);
        w_u64(&w, k.n);
        w_bytes(&w, kbuf, klen);
        for (size_t i = 0; i < n; i++) {
            w_str(&w, t[i].name);
            w_u32(&w, (uint32_t)t[i].ndim);
            for (int d = 0; d < t[i].ndim; d++) w_u64(&w, (uint64_t)t[i].ne[d]);
            w_u32(&w, (uint32_t)t[i].type);
            w_u64(&w, t[i].offset);
        }
        w_pad(&w);
        uint64_t base = w.pos;
        for (size_t i = 0; i < n && !w.bad; i++) {
            write_data(&w, &t[i], row, enc);
            w_pad(&w);
            if (i + 1 < n && w.pos - base != t[i + 1].offset) w.bad = 1; /* the plan and the bytes disagree */
        }
        if (fclose(w.f) != 0) w.bad = 1;
        if (w.bad) rc = cp_fail(err, CP_EIO, "gguf: writing %s failed (disk full?)", out_path);
    }
    free(kbuf), free(row), free(enc), free(t);
    return rc;
}

cp_status cp_gguf_write_model(const char *model_dir, const char *out_path, cp_gguf_type type, cp_error *err)
{
    if (!cp_gguf_row_bytes(type, CP_Q8_0_BLOCK)) return cp_fail(err, CP_EINVAL, "gguf: bad tensor type %d", (int)type);
    cp_config c;
    cp_status rc = cp_config_load(model_dir, &c, err);
    if (!rc) rc = check_config(&c, err);
    st_set *s = NULL;
    if (!rc) rc = st_open_dir(model_dir, &s, err);
    if (!rc) rc = write_file(out_path, &c, s, type, err);
    st_close(s);
    return rc;
}
