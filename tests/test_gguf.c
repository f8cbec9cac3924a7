/* profiling/gguf.c, the GGUF writer behind make bench-llama: a file it
 * writes is parsed back by a reader written here from the format's
 * definition (not by the writer's own code), its tensor infos and
 * key-values checked against the checkpoint, and its data against the
 * source weights -- F32 values exact, BF16 bits exact, Q8_0 blocks against
 * ggml's scalar definition of the quantization. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/dtype.h"
#include "../model/safetensors.h"
#include "../model/synth.h"
#include "../profiling/gguf.h"
#include "helpers.h"

/* ---- an independent reader --------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t n, at;
    int bad;
} rd;

static uint64_t rd_le(rd *r, int bytes)
{
    uint64_t v = 0;
    if (r->at + (size_t)bytes > r->n) {
        r->bad = 1;
        return 0;
    }
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->at + i] << (8 * i);
    r->at += (size_t)bytes;
    return v;
}

/* a GGUF string as a NUL-terminated copy in out (cap bytes) */
static void rd_str(rd *r, char *out, size_t cap)
{
    uint64_t len = rd_le(r, 8);
    if (r->bad || len >= cap || r->at + len > r->n) {
        r->bad = 1;
        out[0] = 0;
        return;
    }
    memcpy(out, r->p + r->at, len);
    out[len] = 0;
    r->at += len;
}

#define MAX_KV 64
#define MAX_T 64

typedef struct kv {
    char key[96];
    uint32_t type; /* 4 u32, 6 f32, 8 string: all this writer may use */
    uint32_t u;
    float f;
    char s[96];
} kv;

typedef struct tinfo {
    char name[96];
    uint32_t ndim, type;
    uint64_t ne[4], offset;
} tinfo;

typedef struct gfile {
    uint8_t *bytes;
    size_t size;
    uint64_t n_t, n_kv, data_start, alignment;
    kv kvs[MAX_KV];
    tinfo t[MAX_T];
} gfile;

static void parse(const char *path, gfile *g)
{
    memset(g, 0, sizeof *g);
    g->bytes = (uint8_t *)read_text(path, &g->size);
    cr_assert(g->bytes, "cannot read %s", path);
    rd r = { g->bytes, g->size, 0, 0 };
    cr_assert(g->size > 24 && memcmp(g->bytes, "GGUF", 4) == 0, "no GGUF magic");
    r.at = 4;
    cr_assert_eq(rd_le(&r, 4), 3, "GGUF version");
    g->n_t = rd_le(&r, 8);
    g->n_kv = rd_le(&r, 8);
    cr_assert(g->n_t <= MAX_T && g->n_kv <= MAX_KV, "%llu tensors, %llu kvs", (unsigned long long)g->n_t,
              (unsigned long long)g->n_kv);
    g->alignment = 32;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kv *k = &g->kvs[i];
        rd_str(&r, k->key, sizeof k->key);
        k->type = (uint32_t)rd_le(&r, 4);
        if (k->type == 4) k->u = (uint32_t)rd_le(&r, 4);
        else if (k->type == 6) {
            uint32_t b = (uint32_t)rd_le(&r, 4);
            memcpy(&k->f, &b, 4);
        } else if (k->type == 8) rd_str(&r, k->s, sizeof k->s);
        else cr_assert_fail("kv %s: unexpected value type %u", k->key, k->type);
        if (strcmp(k->key, "general.alignment") == 0) g->alignment = k->u;
    }
    for (uint64_t i = 0; i < g->n_t; i++) {
        tinfo *t = &g->t[i];
        rd_str(&r, t->name, sizeof t->name);
        t->ndim = (uint32_t)rd_le(&r, 4);
        cr_assert(t->ndim >= 1 && t->ndim <= 4, "%s: %u dims", t->name, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++) t->ne[d] = rd_le(&r, 8);
        t->type = (uint32_t)rd_le(&r, 4);
        t->offset = rd_le(&r, 8);
    }
    cr_assert(!r.bad, "header runs past the end of the file");
    cr_assert(g->alignment && (g->alignment & (g->alignment - 1)) == 0);
    g->data_start = (r.at + g->alignment - 1) / g->alignment * g->alignment;
}

static const kv *find_kv(const gfile *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kvs[i].key, key) == 0) return &g->kvs[i];
    cr_assert_fail("key %s missing", key);
    return NULL;
}

static const tinfo *find_t(const gfile *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_t; i++)
        if (strcmp(g->t[i].name, name) == 0) return &g->t[i];
    return NULL;
}

/* bytes of a tensor by the format's definition of each type */
static uint64_t t_bytes(const tinfo *t)
{
    uint64_t rows = 1;
    for (uint32_t d = 1; d < t->ndim; d++) rows *= t->ne[d];
    switch (t->type) {
    case 0: return rows * t->ne[0] * 4;
    case 30: return rows * t->ne[0] * 2;
    case 8: return rows * (t->ne[0] / 32) * 34;
    }
    cr_assert_fail("%s: type %u", t->name, t->type);
    return 0;
}

/* ---- the source checkpoint ---------------------------------------------- */

static float src_elem(const st_tensor *t, size_t i)
{
    uint16_t h;
    cr_assert_eq(t->dtype, CP_BF16, "synth writes bf16");
    memcpy(&h, (const char *)t->data + 2 * i, 2);
    return cp_bf16_to_f32(h);
}

/* ggml's quantize_row_q8_0_ref for one block, written out again here */
static void q8_0_ref(const float *x, float *d_out, int8_t *q)
{
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) q[j] = (int8_t)roundf(x[j] * id);
    *d_out = d;
}

static void check_data(const gfile *g, const tinfo *t, const st_tensor *src)
{
    const uint8_t *p = g->bytes + g->data_start + t->offset;
    size_t n = src->numel;
    cr_assert_eq(t->ne[0] * (t->ndim > 1 ? t->ne[1] : 1), n, "%s: element count", t->name);
    if (t->type == 0) {
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, p + 4 * i, 4);
            cr_assert_eq(f, src_elem(src, i), "%s[%zu]", t->name, i);
        }
    } else if (t->type == 30) {
        cr_assert_eq(memcmp(p, src->data, 2 * n), 0, "%s: bf16 bits differ from the checkpoint", t->name);
    } else {
        float x[32];
        int8_t q[32];
        float d;
        for (size_t b = 0; b < n / 32; b++) {
            for (int j = 0; j < 32; j++) x[j] = src_elem(src, b * 32 + j);
            q8_0_ref(x, &d, q);
            const uint8_t *blk = p + b * 34;
            uint16_t dh = (uint16_t)(blk[0] | blk[1] << 8);
            float dd = cp_f16_to_f32(dh);
            cr_assert_leq(fabsf(dd - d), d * 0x1p-11f, "%s block %zu: scale %g stored as %g", t->name, b, d, dd);
            cr_assert_eq(memcmp(blk + 2, q, 32), 0, "%s block %zu: quants", t->name, b);
        }
    }
}

static void write_tiny(char *dir, size_t cap)
{
    test_tmpdir(dir, cap, "gguf");
    cp_error err = { 0 };
    cp_synth_opts o = { .shape = "tiny", .out_dir = dir, .seed = 3 };
    cr_assert_eq(cp_synth(&o, &err), CP_OK, "%s", err.msg);
}

static void round_trip(cp_gguf_type type, const char *tname)
{
    char dir[512], path[700];
    write_tiny(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tiny-%s.gguf", dir, tname);
    cp_error err = { 0 };
    cr_assert_eq(cp_gguf_write_model(dir, path, type, &err), CP_OK, "%s", err.msg);
    gfile g;
    parse(path, &g);
    /* the tiny shape: 2 layers, hidden 64, inter 172, 4 heads, 2 kv heads, head_dim 16, vocab 320, tied */
    cr_assert_str_eq(find_kv(&g, "general.architecture")->s, "qwen2");
    cr_assert_str_eq(find_kv(&g, "tokenizer.ggml.model")->s, "none");
    cr_assert_eq(find_kv(&g, "qwen2.block_count")->u, 2);
    cr_assert_eq(find_kv(&g, "qwen2.embedding_length")->u, 64);
    cr_assert_eq(find_kv(&g, "qwen2.feed_forward_length")->u, 172);
    cr_assert_eq(find_kv(&g, "qwen2.attention.head_count")->u, 4);
    cr_assert_eq(find_kv(&g, "qwen2.attention.head_count_kv")->u, 2);
    cr_assert_eq(find_kv(&g, "qwen2.vocab_size")->u, 320);
    cr_assert_eq(find_kv(&g, "qwen2.rope.freq_base")->f, 1e6f);
    cr_assert_eq(find_kv(&g, "qwen2.attention.layer_norm_rms_epsilon")->f, 1e-6f);
    /* embed + final norm + 2 x (2 norms, q/k/v weights and biases, o, gate, up, down); tied: no output */
    cr_assert_eq(g.n_t, 2 + 2 * 12);
    cr_assert_null(find_t(&g, "output.weight"));

    st_set *s = NULL;
    cr_assert_eq(st_open_dir(dir, &s, &err), CP_OK, "%s", err.msg);
    static const char *const pairs[][2] = {
        { "model.embed_tokens.weight", "token_embd.weight" }, { "model.norm.weight", "output_norm.weight" },
        { "model.layers.1.input_layernorm.weight", "blk.1.attn_norm.weight" },
        { "model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight" },
        { "model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias" },
        { "model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight" },
        { "model.layers.1.self_attn.o_proj.weight", "blk.1.attn_output.weight" },
        { "model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight" },
        { "model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight" },
        { "model.layers.1.mlp.up_proj.weight", "blk.1.ffn_up.weight" },
        { "model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight" },
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        st_tensor *src = st_find(s, pairs[i][0]);
        const tinfo *t = find_t(&g, pairs[i][1]);
        cr_assert(src && t, "%s -> %s", pairs[i][0], pairs[i][1]);
        /* dims innermost first: HF [out, in] is ne = {in, out} */
        cr_assert_eq(t->ndim, (uint32_t)src->ndim, "%s", t->name);
        cr_assert_eq(t->ne[0], (uint64_t)src->shape[src->ndim - 1], "%s ne0", t->name);
        if (src->ndim == 2) cr_assert_eq(t->ne[1], (uint64_t)src->shape[0], "%s ne1", t->name);
        /* 1-D tensors stay F32; a matrix whose rows are not whole Q8_0 blocks too (ffn_down: 172) */
        uint32_t want = src->ndim == 1 ? 0 : (type == CP_GGUF_Q8_0 && src->shape[1] % 32) ? 0 : (uint32_t)type;
        cr_assert_eq(t->type, want, "%s: type %u, want %u", t->name, t->type, want);
        check_data(&g, t, src);
    }
    /* every tensor aligned, inside the file, none overlapping the next */
    for (uint64_t i = 0; i < g.n_t; i++) {
        cr_assert_eq(g.t[i].offset % g.alignment, 0, "%s offset", g.t[i].name);
        cr_assert_leq(g.data_start + g.t[i].offset + t_bytes(&g.t[i]), g.size, "%s past the end", g.t[i].name);
        if (i + 1 < g.n_t) cr_assert_leq(g.t[i].offset + t_bytes(&g.t[i]), g.t[i + 1].offset, "%s overlaps", g.t[i].name);
    }
    st_close(s);
    free(g.bytes);
}

Test(gguf, f32_round_trip) { round_trip(CP_GGUF_F32, "f32"); }
Test(gguf, bf16_round_trip) { round_trip(CP_GGUF_BF16, "bf16"); }
Test(gguf, q8_0_round_trip) { round_trip(CP_GGUF_Q8_0, "q8_0"); }

/* Q8_0 on blocks whose answer is worked out by hand */
Test(gguf, q8_0_golden_blocks)
{
    float x[32];
    uint8_t out[34 * 2];
    for (int j = 0; j < 32; j++) x[j] = 1.0f;
    x[5] = -2.0f; /* amax 2: d = 2/127, 1 * 63.5 rounds away from zero to 64 */
    cp_q8_0_quantize(x, 32, out);
    for (int j = 0; j < 32; j++) cr_assert_eq((int8_t)out[2 + j], j == 5 ? -127 : 64, "q[%d] = %d", j, (int8_t)out[2 + j]);
    float d = cp_f16_to_f32((uint16_t)(out[0] | out[1] << 8));
    cr_assert_leq(fabsf(d - 2.0f / 127.0f), 2.0f / 127.0f * 0x1p-11f, "scale %g", d);
    /* an all-zero block: d = 0 and every quant 0 (no division by zero) */
    memset(x, 0, sizeof x);
    x[0] = 127.0f; /* and a second block after it: d = 1, quants are the values */
    float y[64] = { 0 };
    for (int j = 0; j < 32; j++) y[32 + j] = (float)(j - 16) * (j % 2 ? 1 : -1);
    y[32] = 127.0f;
    cp_q8_0_quantize(y, 64, out);
    cr_assert_eq(out[0] | out[1] << 8, 0, "zero block scale");
    for (int j = 0; j < 32; j++) cr_assert_eq(out[2 + j], 0);
    cr_assert_eq(out[34] | out[35] << 8, 0x3c00, "scale 1.0");
    for (int j = 0; j < 32; j++) cr_assert_eq((int8_t)out[36 + j], (int)y[32 + j]);
}

Test(gguf, f16_conversion)
{
    cr_assert_eq(cp_gguf_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(cp_gguf_f32_to_f16(-2.0f), 0xc000);
    cr_assert_eq(cp_gguf_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(cp_gguf_f32_to_f16(65520.0f), 0x7c00, "halfway to 65536 rounds to even: inf");
    cr_assert_eq(cp_gguf_f32_to_f16(1.0f + 0x1p-11f), 0x3c00, "tie to even (down)");
    cr_assert_eq(cp_gguf_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02, "tie to even (up)");
    cr_assert_eq(cp_gguf_f32_to_f16(0x1p-24f), 0x0001, "smallest subnormal");
    cr_assert_eq(cp_gguf_f32_to_f16(0x1p-25f), 0x0000, "half of it ties to 0");
    cr_assert_eq(cp_gguf_f32_to_f16(3 * 0x1p-25f), 0x0002);
    uint16_t nan = cp_gguf_f32_to_f16(NAN);
    cr_assert((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff), "NaN stays NaN: %04x", nan);
    /* every finite half survives f16 -> f32 -> f16 (cp_f16_to_f32 is the loader's, not the writer's) */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        cr_assert_eq(cp_gguf_f32_to_f16(cp_f16_to_f32((uint16_t)h)), h, "half %04x", h);
    }
}

static cp_status zero_fill(void *ctx, size_t i, void *buf, size_t nbytes, cp_error *err)
{
    (void)ctx, (void)i, (void)err;
    memset(buf, 0, nbytes);
    return CP_OK;
}

Test(gguf, refuses_what_it_cannot_write)
{
    char dir[512], path[700];
    write_tiny(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/x.gguf", dir);
    cp_error err = { 0 };
    cp_gguf_type t;
    cr_assert_eq(cp_gguf_type_from_name("q4_0", &t, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "q4_0"), "%s", err.msg);
    cr_assert_eq(cp_gguf_write_model(dir, path, (cp_gguf_type)2, &err), CP_EINVAL, "an unknown type id");
    /* a tensor llama.cpp has no name for: the checkpoint replaced by one holding it */
    st_write_entry e = { .name = "model.extra.weight", .dtype = CP_F32, .ndim = 1, .shape = { 4 } };
    char st[700];
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    cr_assert_eq(st_write_file(st, &e, 1, zero_fill, NULL, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_gguf_write_model(dir, path, CP_GGUF_F32, &err), CP_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "model.extra.weight"), "%s", err.msg);
}
