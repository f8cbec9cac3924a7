#include "synth.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../kernels/dtype.h"
#include "../kernels/fileio.h"
#include "safetensors.h"

typedef struct shape {
    const char *name, *arch, *model_type;
    int hidden, inter, layers, heads, kv_heads, head_dim, vocab, max_pos, tied, qkv_bias, window;
    double theta, eps;
    int bos, eos; /* the real model's ids, used with --tokenizer */
} shape;

static const shape shapes[] = {
    { "tiny", "Qwen2ForCausalLM", "qwen2", 64, 172, 2, 4, 2, 16, 320, 4096, 1, 1, 0, 1e6, 1e-6, 256, 257 },
    { "qwen2.5-0.5b", "Qwen2ForCausalLM", "qwen2", 896, 4864, 24, 14, 2, 64, 151936, 32768, 1, 1, 0, 1e6, 1e-6, 151643, 151645 },
    { "qwen2.5-7b", "Qwen2ForCausalLM", "qwen2", 3584, 18944, 28, 28, 4, 128, 152064, 32768, 0, 1, 0, 1e6, 1e-6, 151643, 151645 },
    { "mistral-7b", "MistralForCausalLM", "mistral", 4096, 14336, 32, 32, 8, 128, 32000, 32768, 0, 0, 4096, 1e4, 1e-5, 1, 2 },
};

const char *cp_synth_shape_names(void) { return "tiny qwen2.5-0.5b qwen2.5-7b mistral-7b"; }

/* ---- tensors ----------------------------------------------------------- */

typedef struct gen {
    st_write_entry *e;
    float *std; /* per entry: 0 = constant 1 (norm weights) */
    size_t n, cap;
    uint64_t seed;
    size_t done, total;
    const cp_synth_opts *o;
} gen;

static cp_status add(gen *g, const char *name, int64_t d0, int64_t d1, float std, cp_error *err)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        st_write_entry *e = realloc(g->e, cap * sizeof *e);
        if (!e) return cp_fail(err, CP_ENOMEM, "synth: out of memory");
        g->e = e;
        float *s = realloc(g->std, cap * sizeof *s);
        if (!s) return cp_fail(err, CP_ENOMEM, "synth: out of memory");
        g->std = s;
        g->cap = cap;
    }
    size_t len = strlen(name) + 1;
    char *nm = malloc(len);
    if (!nm) return cp_fail(err, CP_ENOMEM, "synth: out of memory");
    memcpy(nm, name, len);
    g->e[g->n] = (st_write_entry){ .name = nm, .dtype = CP_BF16, .ndim = d1 ? 2 : 1, .shape = { d0, d1 } };
    g->std[g->n] = std;
    g->n++;
    return CP_OK;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Values depend only on (seed, tensor name): sharding does not change them. */
static cp_status produce(void *ctx, size_t i, void *buf, size_t nbytes, cp_error *err)
{
    (void)err;
    gen *g = ctx;
    uint16_t *d = buf;
    size_t n = nbytes / 2;
    float std = g->std[i];
    if (std == 0) {
        for (size_t k = 0; k < n; k++) d[k] = cp_f32_to_bf16(1.0f);
    } else {
        uint64_t x = (g->seed ^ hash_name(g->e[i].name)) | 1; /* xorshift state must not be 0 */
        float a = std * 1.7320508f; /* uniform(-a, a) has this std */
        for (size_t k = 0; k < n; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
            float u = (float)(x >> 40) / 16777216.0f;
            d[k] = cp_f32_to_bf16((2.0f * u - 1.0f) * a);
        }
    }
    g->done += nbytes;
    if (g->o->progress) g->o->progress(g->o->progress_ctx, g->done, g->total);
    return CP_OK;
}

static cp_status build_tensors(gen *g, const shape *s, cp_error *err)
{
    int64_t H = s->hidden, qd = (int64_t)s->heads * s->head_dim, kvd = (int64_t)s->kv_heads * s->head_dim, I = s->inter;
    float sh = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I), sq = 1.0f / sqrtf((float)qd);
    cp_status rc;
    char n[128];
    if ((rc = add(g, "model.embed_tokens.weight", s->vocab, H, 0.02f, err))) return rc;
    for (int l = 0; l < s->layers; l++) {
#define A(suffix, d0, d1, std)                                                        \
    do {                                                                              \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                       \
        if ((rc = add(g, n, d0, d1, std, err))) return rc;                            \
    } while (0)
        A("input_layernorm.weight", H, 0, 0);
        A("self_attn.q_proj.weight", qd, H, sh);
        A("self_attn.k_proj.weight", kvd, H, sh);
        A("self_attn.v_proj.weight", kvd, H, sh);
        if (s->qkv_bias) {
            A("self_attn.q_proj.bias", qd, 0, 0.02f);
            A("self_attn.k_proj.bias", kvd, 0, 0.02f);
            A("self_attn.v_proj.bias", kvd, 0, 0.02f);
        }
        A("self_attn.o_proj.weight", H, qd, sq);
        A("post_attention_layernorm.weight", H, 0, 0);
        A("mlp.gate_proj.weight", I, H, sh);
        A("mlp.up_proj.weight", I, H, sh);
        A("mlp.down_proj.weight", H, I, si);
#undef A
    }
    if ((rc = add(g, "model.norm.weight", H, 0, 0, err))) return rc;
    if (!s->tied && (rc = add(g, "lm_head.weight", s->vocab, H, 0.02f, err))) return rc;
    return CP_OK;
}

/* ---- files ------------------------------------------------------------- */

static cp_status write_json(const char *dir, const char *name, cJSON *j, cp_error *err)
{
    char path[4096];
    cp_status rc = cp_path_join(path, sizeof path, dir, name, err);
    if (rc) return rc;
    char *text = j ? cJSON_Print(j) : NULL;
    if (!text) return cp_fail(err, CP_ENOMEM, "synth: out of memory writing %s", path);
    FILE *fp = fopen(path, "wb");
    int ok = fp && fputs(text, fp) >= 0;
    if (fp && fclose(fp) != 0) ok = 0;
    free(text);
    if (!ok) return cp_fail(err, CP_EIO, "%s: cannot write: %s", path, strerror(errno));
    return CP_OK;
}

static cp_status write_config(const cp_synth_opts *o, const shape *s, int bos, int eos, cp_error *err)
{
    cJSON *c = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(s->arch));
    cJSON_AddStringToObject(c, "model_type", s->model_type);
    cJSON_AddNumberToObject(c, "hidden_size", s->hidden);
    cJSON_AddNumberToObject(c, "intermediate_size", s->inter);
    cJSON_AddNumberToObject(c, "num_hidden_layers", s->layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", s->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", s->kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", s->head_dim);
    cJSON_AddNumberToObject(c, "rms_norm_eps", s->eps);
    cJSON_AddNumberToObject(c, "rope_theta", s->theta);
    cJSON_AddNumberToObject(c, "vocab_size", s->vocab);
    cJSON_AddNumberToObject(c, "max_position_embeddings", s->max_pos);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", s->tied);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "bos_token_id", bos);
    cJSON_AddNumberToObject(c, "eos_token_id", eos);
    cJSON_AddStringToObject(c, "torch_dtype", "bfloat16");
    if (s->window) cJSON_AddNumberToObject(c, "sliding_window", s->window);
    else if (strcmp(s->model_type, "qwen2") == 0) cJSON_AddBoolToObject(c, "use_sliding_window", 0);
    cJSON_AddStringToObject(c, "cacheprune_synth", "random weights: not for quality claims");
    cp_status rc = write_json(o->out_dir, "config.json", c, err);
    cJSON_Delete(c);
    return rc;
}

/* GPT-2's byte -> printable code point map used by byte-level BPE. */
static int byte_to_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int k = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) k++;
    return 256 + k;
}

static void utf8(int cp, char *out)
{
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xc0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3f)); out[2] = 0; }
}

static cJSON *added_token(int id, const char *content)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", id);
    cJSON_AddStringToObject(t, "content", content);
    cJSON_AddBoolToObject(t, "single_word", 0);
    cJSON_AddBoolToObject(t, "lstrip", 0);
    cJSON_AddBoolToObject(t, "rstrip", 0);
    cJSON_AddBoolToObject(t, "normalized", 0);
    cJSON_AddBoolToObject(t, "special", 1);
    return t;
}

static cJSON *byte_level(const char *type)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", type);
    cJSON_AddBoolToObject(p, "add_prefix_space", 0);
    cJSON_AddBoolToObject(p, "trim_offsets", 1);
    cJSON_AddBoolToObject(p, "use_regex", 0);
    return p;
}

/* A byte-level BPE tokenizer.json with no merges: 256 byte tokens, then
 * <s> = 256 and </s> = 257, BOS prepended by a TemplateProcessing. */
static cp_status write_byte_tokenizer(const char *dir, cp_error *err)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "version", "1.0");
    cJSON_AddNullToObject(t, "truncation");
    cJSON_AddNullToObject(t, "padding");
    cJSON *added = cJSON_AddArrayToObject(t, "added_tokens");
    cJSON_AddItemToArray(added, added_token(256, "<s>"));
    cJSON_AddItemToArray(added, added_token(257, "</s>"));
    cJSON_AddNullToObject(t, "normalizer");
    cJSON_AddItemToObject(t, "pre_tokenizer", byte_level("ByteLevel"));
    cJSON *post = cJSON_AddObjectToObject(t, "post_processor");
    cJSON_AddStringToObject(post, "type", "TemplateProcessing");
    cJSON *single = cJSON_AddArrayToObject(post, "single");
    cJSON *bos = cJSON_CreateObject(), *bos_in = cJSON_AddObjectToObject(bos, "SpecialToken");
    cJSON_AddStringToObject(bos_in, "id", "<s>");
    cJSON_AddNumberToObject(bos_in, "type_id", 0);
    cJSON *seq = cJSON_CreateObject(), *seq_in = cJSON_AddObjectToObject(seq, "Sequence");
    cJSON_AddStringToObject(seq_in, "id", "A");
    cJSON_AddNumberToObject(seq_in, "type_id", 0);
    cJSON_AddItemToArray(single, bos);
    cJSON_AddItemToArray(single, seq);
    cJSON_AddItemToObject(post, "pair", cJSON_Duplicate(single, 1));
    cJSON *sp = cJSON_AddObjectToObject(post, "special_tokens"), *s_bos = cJSON_AddObjectToObject(sp, "<s>");
    cJSON_AddStringToObject(s_bos, "id", "<s>");
    cJSON *ids = cJSON_AddArrayToObject(s_bos, "ids");
    cJSON_AddItemToArray(ids, cJSON_CreateNumber(256));
    cJSON *toks = cJSON_AddArrayToObject(s_bos, "tokens");
    cJSON_AddItemToArray(toks, cJSON_CreateString("<s>"));
    cJSON_AddItemToObject(t, "decoder", byte_level("ByteLevel"));
    cJSON *m = cJSON_AddObjectToObject(t, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddBoolToObject(m, "fuse_unk", 0);
    cJSON_AddBoolToObject(m, "byte_fallback", 0);
    cJSON_AddBoolToObject(m, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(m, "vocab");
    for (int b = 0; b < 256; b++) {
        char s[4];
        utf8(byte_to_cp(b), s);
        cJSON_AddNumberToObject(vocab, s, b);
    }
    cJSON_AddArrayToObject(m, "merges");
    cp_status rc = write_json(dir, "tokenizer.json", t, err);
    cJSON_Delete(t);
    if (rc) return rc;
    cJSON *tc = cJSON_CreateObject();
    cJSON_AddStringToObject(tc, "bos_token", "<s>");
    cJSON_AddStringToObject(tc, "eos_token", "</s>");
    cJSON_AddBoolToObject(tc, "add_bos_token", 1);
    cJSON_AddStringToObject(tc, "tokenizer_class", "PreTrainedTokenizerFast");
    rc = write_json(dir, "tokenizer_config.json", tc, err);
    cJSON_Delete(tc);
    return rc;
}

static cp_status copy_file(const char *from_dir, const char *to_dir, const char *name, int required, cp_error *err)
{
    char src[4096], dst[4096];
    cp_status rc;
    if ((rc = cp_path_join(src, sizeof src, from_dir, name, err)) || (rc = cp_path_join(dst, sizeof dst, to_dir, name, err)))
        return rc;
    FILE *in;
    if ((rc = cp_fopen_regular(src, &in, err))) return required || rc != CP_EIO ? rc : CP_OK;
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return cp_fail(err, CP_EIO, "%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (ferror(in)) ok = 0;
    fclose(in);
    if (fclose(out) != 0) ok = 0;
    return ok ? CP_OK : cp_fail(err, CP_EIO, "copying %s to %s failed", src, dst);
}

static cp_status write_weights(const cp_synth_opts *o, gen *g, cp_error *err)
{
    size_t limit = o->shard_bytes ? o->shard_bytes : ((size_t)4 << 30);
    char path[4096];
    if (g->total <= limit) {
        cp_status rc = cp_path_join(path, sizeof path, o->out_dir, "model.safetensors", err);
        return rc ? rc : st_write_file(path, g->e, g->n, produce, g, err);
    }
    /* group consecutive tensors into shards of at most `limit` bytes */
    size_t *first = calloc(g->n + 1, sizeof *first), n_shards = 0, acc = 0;
    if (!first) return cp_fail(err, CP_ENOMEM, "synth: out of memory");
    for (size_t i = 0; i < g->n; i++) {
        size_t b = st_entry_nbytes(&g->e[i]);
        if (i == 0 || acc + b > limit) {
            first[n_shards++] = i;
            acc = 0;
        }
        acc += b;
    }
    first[n_shards] = g->n;
    cJSON *index = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)g->total);
    cJSON *wm = cJSON_AddObjectToObject(index, "weight_map");
    cp_status rc = CP_OK;
    for (size_t s = 0; s < n_shards && rc == CP_OK; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        if ((rc = cp_path_join(path, sizeof path, o->out_dir, name, err))) break;
        for (size_t i = first[s]; i < first[s + 1]; i++) cJSON_AddStringToObject(wm, g->e[i].name, name);
        /* produce() indexes g->e, so shift the view to this shard */
        gen sub = *g;
        sub.e += first[s];
        sub.std += first[s];
        rc = st_write_file(path, sub.e, first[s + 1] - first[s], produce, &sub, err);
        g->done = sub.done;
    }
    if (rc == CP_OK) rc = write_json(o->out_dir, "model.safetensors.index.json", index, err);
    cJSON_Delete(index);
    free(first);
    return rc;
}

cp_status cp_synth(const cp_synth_opts *o, cp_error *err)
{
    const shape *s = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (o->shape && strcmp(o->shape, shapes[i].name) == 0) s = &shapes[i];
    if (!s) return cp_fail(err, CP_EINVAL, "synth: unknown shape '%s' (known: %s)", o->shape ? o->shape : "", cp_synth_shape_names());
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return cp_fail(err, CP_EIO, "%s: cannot create directory: %s", o->out_dir, strerror(errno));
    cp_status rc;
    if (o->tokenizer_dir) {
        if ((rc = copy_file(o->tokenizer_dir, o->out_dir, "tokenizer.json", 1, err)) ||
            (rc = copy_file(o->tokenizer_dir, o->out_dir, "tokenizer_config.json", 0, err)))
            return rc;
        rc = write_config(o, s, s->bos, s->eos, err);
    } else {
        if ((rc = write_byte_tokenizer(o->out_dir, err))) return rc;
        rc = write_config(o, s, 256, 257, err);
    }
    if (rc) return rc;
    gen g = { .seed = o->seed * 0x9e3779b97f4a7c15ull + 1, .o = o };
    rc = build_tensors(&g, s, err);
    for (size_t i = 0; rc == CP_OK && i < g.n; i++) g.total += st_entry_nbytes(&g.e[i]);
    if (rc == CP_OK) rc = write_weights(o, &g, err);
    for (size_t i = 0; i < g.n; i++) free((char *)g.e[i].name);
    free(g.e);
    free(g.std);
    return rc;
}
