/* Loading a checkpoint's tensors onto a backend: name and shape checks per
 * architecture, conversion to the backend's dtypes, leftovers reported. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/backend.h"
#include "../kernels/fileio.h"
#include "../kernels/log.h"
#include "../kernels/q8.h"
#include "../kernels/sha256.h"
#include "model.h"
#include "safetensors.h"

typedef struct loader {
    cp_model *m;
    st_set *st;
    const cp_load_opts *opts;
    size_t done, total;
    void *tmp; /* conversion buffer */
    size_t tmp_bytes;
} loader;

#define LOAD_CHUNK_ELEMS ((size_t)4 << 20)

/* NaN / Inf weights make every logit NaN (generate then emitted id 0
 * forever): refused at load, naming the tensor and the element.  Scanned
 * chunk by chunk in the checkpoint's own dtype, just before the chunk is
 * converted, while it is in cache. */
static cp_status check_finite(const st_tensor *t, size_t off, size_t cnt, cp_error *err)
{
    size_t bad = cp_first_nonfinite((const char *)t->data + off * cp_dtype_size(t->dtype), t->dtype, cnt);
    if (bad == cnt) return CP_OK;
    return cp_fail(err, CP_EFORMAT, "%s: tensor '%s' holds a non-finite value (NaN or Inf) at element %zu: refused", t->file,
                   t->name, off + bad);
}

/* A matrix quantized to int8 (kernels/q8.h): whole rows at a time through
 * f32, the int8 rows uploaded as they are made, the header, scales and row
 * sums at the end.  In the layout the backend's kernels read
 * (CP_Q8_PANELS where the backend's flags have CP_BE_Q8_PANELS): for the panel order each chunk of rows (a
 * multiple of 48, so chunks are whole panels) is packed on the host before
 * its upload, so the backend never holds a second, row-major copy. */
static cp_status load_q8(loader *L, st_tensor *t, void **out, cp_error *err)
{
    cp_backend *be = L->m->be;
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const int layout = be->flags & CP_BE_Q8_PANELS ? CP_Q8_PANELS : CP_Q8_ROWS;
    size_t bytes = cp_q8_bytes_in(rows, cols, layout);
    if (!bytes)
        return cp_fail(err, CP_EUNSUPPORTED, "%s: tensor '%s' [%lld, %lld]: --dtype int8 takes rows of 1..%d columns", t->file,
                       t->name, (long long)rows, (long long)cols, CP_Q8_MAX_COLS);
    cp_status rc = be->alloc(be, bytes, out, err);
    if (rc) return cp_fail_wrap(err, "loading '%s'", t->name);
    L->m->weight_bytes += bytes;
    const int ld = cp_q8_ld((int)cols);
    const size_t sesz = cp_dtype_size(t->dtype);
    size_t per = LOAD_CHUNK_ELEMS / (size_t)cols; /* rows per chunk, >= 64 */
    if (layout == CP_Q8_PANELS) per -= per % CP_Q8_PANEL_COLS; /* whole panels, >= 48 */
    /* L->tmp holds a chunk of rows as f32; q their int8 rows (and qp the
     * same in the panel order); meta the header, scales and sums of the
     * whole matrix (8 bytes a row) */
    int8_t *q = cp_malloc(per * (size_t)ld, "int8 rows", err);
    int8_t *qp = q && layout == CP_Q8_PANELS ? cp_malloc(per * (size_t)ld, "int8 panels", err) : NULL;
    char *meta = q && (qp || layout != CP_Q8_PANELS) ? cp_calloc(1, cp_q8_off_data((int)rows), "int8 scales", err) : NULL;
    if (!meta) {
        free(q), free(qp);
        return CP_ENOMEM;
    }
    float *scale = (float *)(void *)(meta + cp_q8_off_scales());
    int32_t *sum = (int32_t *)(void *)(meta + cp_q8_off_sums((int)rows));
    for (int64_t r0 = 0; r0 < rows && rc == CP_OK; r0 += (int64_t)per) {
        size_t nr = (size_t)(rows - r0) < per ? (size_t)(rows - r0) : per, off = (size_t)r0 * (size_t)cols, cnt = nr * (size_t)cols;
        if ((rc = check_finite(t, off, cnt, err))) break;
        cp_convert_float(L->tmp, CP_F32, (const char *)t->data + off * sesz, t->dtype, cnt);
        cp_q8_quantize_rows(q, scale + r0, sum + r0, L->tmp, (int)nr, (int)cols);
        const int8_t *src = q;
        size_t up = nr * (size_t)ld;
        if (qp) { /* the last chunk's panel padded with zero rows */
            cp_q8_panelize(qp, q, (int)nr, ld);
            src = qp, up = (size_t)cp_q8_data_rows((int64_t)nr, CP_Q8_PANELS) * (size_t)ld;
        }
        rc = be->upload(be, (char *)*out + cp_q8_off_data((int)rows) + (size_t)r0 * ld, src, up, err);
    }
    if (rc == CP_OK) {
        *(cp_q8_head *)(void *)meta =
            (cp_q8_head){ .magic = CP_Q8_MAGIC, .rows = (int32_t)rows, .cols = (int32_t)cols, .ld = ld, .layout = layout };
        rc = be->upload(be, *out, meta, cp_q8_off_data((int)rows), err);
    }
    free(q), free(qp);
    free(meta);
    if (rc) return rc == CP_EFORMAT ? rc : cp_fail_wrap(err, "uploading '%s'", t->name);
    st_release(t);
    L->done += t->nbytes;
    if (L->opts && L->opts->progress) L->opts->progress(L->opts->progress_ctx, L->done, L->total);
    return CP_OK;
}

/* The tensor checked (every chunk finite) and done: its pages dropped,
 * progress reported. */
static cp_status check_all_finite(const st_tensor *t, cp_error *err)
{
    for (size_t off = 0; off < t->numel; off += LOAD_CHUNK_ELEMS) {
        cp_status rc = check_finite(t, off, t->numel - off < LOAD_CHUNK_ELEMS ? t->numel - off : LOAD_CHUNK_ELEMS, err);
        if (rc) return rc;
    }
    return CP_OK;
}

static void tensor_done(loader *L, const st_tensor *t)
{
    st_release(t); /* converted: its mapped pages need not stay resident beside the copy */
    L->done += t->nbytes;
    if (L->opts && L->opts->progress) L->opts->progress(L->opts->progress_ctx, L->done, L->total);
}

/* A bf16 or f32 matrix (the backend's matrix_dtype) into the layout the
 * backend's GEMMs prefer (backend.h's pack_matrix), one tensor at a time
 * so the load never holds two copies of more than one: a checkpoint of
 * that dtype's mapped rows straight into the packed block, then its pages
 * dropped; any other dtype through the plain copy load_tensor made, freed
 * once packed.  *done: packed, *layout the backend's layout of it (else
 * the caller goes on with the plain layout). */
static cp_status pack_matrix(loader *L, const st_tensor *t, void **out, int *layout, int *done, cp_error *err)
{
    cp_backend *be = L->m->be;
    *done = 0;
    int from_map = !*out;
    const size_t esz = cp_dtype_size(be->matrix_dtype);
    if (from_map && (t->dtype != be->matrix_dtype || ((uintptr_t)t->data & (esz - 1)))) return CP_OK; /* converted first, then packed */
    cp_matrix pm = { 0 };
    size_t bytes = 0;
    cp_status rc = be->pack_matrix(be, from_map ? t->data : *out, (int)t->shape[0], (int)t->shape[1], &pm, &bytes, err);
    void *p = pm.data;
    if (rc) return cp_fail_wrap(err, "%s: packing '%s'", t->file, t->name);
    if (!p) return CP_OK; /* the backend reads this one plain */
    if (from_map && (rc = check_all_finite(t, err))) { /* the converting path checks as it goes */
        cp_matrix_free(be, &pm);
        return rc;
    }
    if (!from_map) { /* the plain copy this replaces */
        be->free(be, *out);
        L->m->weight_bytes -= t->numel * esz;
    }
    *out = p;
    *layout = pm.layout;
    L->m->weight_bytes += bytes;
    *done = 1;
    return CP_OK;
}

/* Takes `name`, checks its shape, converts to `dt` and uploads it to newly
 * allocated backend memory; `pack`: a matrix only matmul reads, which may
 * go into the backend's own layout (the embedding table only where it is
 * the LM head too and the backend's embed reads that layout's rows), named
 * in *layout (CP_LAYOUT_ROWS where not packed; layout may be NULL for a
 * vector). */
static cp_status load_tensor(loader *L, const char *name, int ndim, int64_t d0, int64_t d1, cp_dtype dt, int pack, void **out,
                             int *layout, cp_error *err)
{
    cp_backend *be = L->m->be;
    st_tensor *t = st_take(L->st, name);
    if (!t) return cp_fail(err, CP_EFORMAT, "checkpoint is missing tensor '%s' needed by %s", name, L->m->cfg.arch_name);
    int ok = t->ndim == ndim && t->shape[0] == d0 && (ndim == 1 || t->shape[1] == d1);
    if (!ok) {
        char got[96] = "", *p = got;
        for (int i = 0; i < t->ndim && p < got + sizeof got - 24; i++) p += sprintf(p, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (ndim == 1)
            return cp_fail(err, CP_EFORMAT, "%s: tensor '%s' has shape [%s], expected [%lld]", t->file, name, got, (long long)d0);
        return cp_fail(err, CP_EFORMAT, "%s: tensor '%s' has shape [%s], expected [%lld, %lld]", t->file, name, got,
                       (long long)d0, (long long)d1);
    }
    if (t->dtype != CP_F32 && t->dtype != CP_F16 && t->dtype != CP_BF16)
        return cp_fail(err, CP_EFORMAT, "%s: tensor '%s' has dtype %s; weights must be F32, F16 or BF16", t->file, name,
                       cp_dtype_name(t->dtype));
    if (dt == CP_I8) return load_q8(L, t, out, err);
    int packed = 0;
    pack = pack && (dt == CP_BF16 || dt == CP_F32) && dt == be->matrix_dtype && ndim == 2 && be->pack_matrix && d0 <= INT32_MAX && d1 <= INT32_MAX;
    *out = NULL;
    if (pack) {
        cp_status rc = pack_matrix(L, t, out, layout, &packed, err);
        if (rc) return rc;
        if (packed) return tensor_done(L, t), CP_OK;
    }
    size_t esz = cp_dtype_size(dt), sesz = cp_dtype_size(t->dtype);
    cp_status rc = be->alloc(be, t->numel * esz, out, err);
    if (rc) return cp_fail_wrap(err, "loading '%s'", name);
    L->m->weight_bytes += t->numel * esz;
    for (size_t off = 0; off < t->numel; off += LOAD_CHUNK_ELEMS) {
        size_t cnt = t->numel - off < LOAD_CHUNK_ELEMS ? t->numel - off : LOAD_CHUNK_ELEMS;
        if ((rc = check_finite(t, off, cnt, err))) return rc;
        cp_convert_float(L->tmp, dt, (const char *)t->data + off * sesz, t->dtype, cnt);
        rc = be->upload(be, (char *)*out + off * esz, L->tmp, cnt * esz, err);
        if (rc) return cp_fail_wrap(err, "uploading '%s'", name);
    }
    if (pack && (rc = pack_matrix(L, t, out, layout, &packed, err))) return rc;
    tensor_done(L, t);
    return CP_OK;
}

/* A matrix [rows, cols] as load_tensor takes it, into a handle that names
 * its dtype, shape and layout. */
static cp_status load_matrix(loader *L, const char *name, int64_t rows, int64_t cols, cp_dtype dt, int pack, cp_matrix *out,
                             cp_error *err)
{
    int layout = CP_LAYOUT_ROWS;
    *out = (cp_matrix){ 0 };
    cp_status rc = load_tensor(L, name, 2, rows, cols, dt, pack, &out->data, &layout, err);
    if (rc == CP_OK) *out = (cp_matrix){ out->data, dt, (int)rows, (int)cols, layout };
    return rc;
}

/* Config text plus every tensor's name, dtype, shape and 3 x 64 sampled
 * bytes (start, middle, end): cheap even for 7B checkpoints, and two
 * different weight sets that share shapes still differ. */
static cp_status fingerprint(const char *dir, st_set *st, uint8_t out[32], cp_error *err)
{
    char path[4096], *cfg;
    size_t cfg_len;
    cp_status rc;
    if ((rc = cp_path_join(path, sizeof path, dir, "config.json", err)) ||
        (rc = cp_read_file(path, 1u << 20, &cfg, &cfg_len, err)))
        return rc;
    size_t n = st_count(st), cap = cfg_len + n * (256 + 3 * 64 + 64) + 1, at = 0;
    unsigned char *buf = cp_malloc(cap, "fingerprint", err);
    if (!buf) {
        free(cfg);
        return CP_ENOMEM;
    }
    memcpy(buf, cfg, cfg_len);
    at = cfg_len;
    free(cfg);
    for (size_t i = 0; i < n; i++) { /* the set is sorted by name */
        const st_tensor *t = st_at(st, i);
        at += (size_t)snprintf((char *)buf + at, 256, "%.200s|%s|%d", t->name, cp_dtype_name(t->dtype), t->ndim);
        for (int d = 0; d < t->ndim; d++) at += (size_t)snprintf((char *)buf + at, 24, ",%lld", (long long)t->shape[d]);
        size_t k = t->nbytes < 64 ? t->nbytes : 64;
        const unsigned char *data = t->data;
        memcpy(buf + at, data, k), at += k;
        memcpy(buf + at, data + (t->nbytes - k) / 2, k), at += k;
        memcpy(buf + at, data + t->nbytes - k, k), at += k;
        st_release(t); /* the fault-around of three reads: up to 48 pages, per tensor */
    }
    const void *parts[1] = { buf };
    size_t lens[1] = { at };
    cp_sha256(parts, lens, 1, out);
    free(buf);
    return CP_OK;
}

cp_status cp_weight_dtype_from_name(const char *name, cp_weight_dtype *out, cp_error *err)
{
    static const struct { const char *name; cp_weight_dtype d; } names[] = {
        { "auto", CP_WEIGHTS_AUTO }, { "f32", CP_WEIGHTS_F32 }, { "bf16", CP_WEIGHTS_BF16 },
        { "int8", CP_WEIGHTS_INT8 },
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) return *out = names[i].d, CP_OK;
    return cp_fail(err, CP_EINVAL, "--dtype: expected auto, f32, bf16 or int8, got '%.32s'", name);
}

/* auto: bf16 when every matrix (2-D float tensor) is stored in 16 bits */
static cp_dtype stored_matrix_dtype(st_set *st)
{
    for (size_t i = 0; i < st_count(st); i++) {
        const st_tensor *t = st_at(st, i);
        if (t->ndim == 2 && t->dtype == CP_F32) return CP_F32;
    }
    return CP_BF16;
}

cp_status cp_model_stored_dtype(const char *dir, cp_dtype *out, cp_error *err)
{
    st_set *st;
    if (st_open_dir(dir, &st, err)) return cp_fail_wrap(err, "%s", dir);
    *out = stored_matrix_dtype(st);
    st_close(st);
    return CP_OK;
}

/* Sets the backend's matrix dtype for this load (cp_weight_dtype). */
static cp_status choose_matrix_dtype(cp_backend *be, const cp_load_opts *opts, st_set *st, cp_error *err)
{
    cp_weight_dtype want = opts ? opts->dtype : CP_WEIGHTS_BACKEND;
    if (want == CP_WEIGHTS_BACKEND) return CP_OK;
    cp_dtype dt = want == CP_WEIGHTS_F32 ? CP_F32 : want == CP_WEIGHTS_BF16 ? CP_BF16 : want == CP_WEIGHTS_INT8 ? CP_I8 : stored_matrix_dtype(st);
    if (dt == be->matrix_dtype) return CP_OK;
    if (be->set_matrix_dtype) return be->set_matrix_dtype(be, dt, err);
    if (want == CP_WEIGHTS_AUTO) return CP_OK; /* as the backend holds them */
    return cp_fail(err, CP_EUNSUPPORTED, "the %s backend keeps matrices in %s: --dtype %s is not available on it", be->name,
                   cp_dtype_name(be->matrix_dtype), want == CP_WEIGHTS_F32 ? "f32" : want == CP_WEIGHTS_INT8 ? "int8" : "bf16");
}

static cp_status load_layer(loader *L, int l, cp_error *err)
{
    const cp_config *c = &L->m->cfg;
    cp_layer_weights *w = &L->m->layers[l];
    cp_dtype md = L->m->be->matrix_dtype;
    int64_t H = c->hidden, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim,
            I = c->intermediate;
    char n[128];
    cp_status rc;
#define LT(suffix, a, dst)                                                                                 \
    do {                                                                                                   \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                                            \
        if ((rc = load_tensor(L, n, 1, a, 0, CP_F32, 0, (void **)(dst), NULL, err)) != CP_OK) return rc;   \
    } while (0)
#define LM(suffix, a, b, dst)                                                                              \
    do {                                                                                                   \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                                            \
        if ((rc = load_matrix(L, n, a, b, md, 1, dst, err)) != CP_OK) return rc;                           \
    } while (0)
    LT("input_layernorm.weight", H, &w->attn_norm);
    LT("post_attention_layernorm.weight", H, &w->mlp_norm);
    LM("self_attn.q_proj.weight", qd, H, &w->wq);
    LM("self_attn.k_proj.weight", kvd, H, &w->wk);
    LM("self_attn.v_proj.weight", kvd, H, &w->wv);
    LM("self_attn.o_proj.weight", H, qd, &w->wo);
    if (c->qkv_bias) {
        LT("self_attn.q_proj.bias", qd, &w->bq);
        LT("self_attn.k_proj.bias", kvd, &w->bk);
        LT("self_attn.v_proj.bias", kvd, &w->bv);
    }
    LM("mlp.gate_proj.weight", I, H, &w->w_gate);
    LM("mlp.up_proj.weight", I, H, &w->w_up);
    LM("mlp.down_proj.weight", H, I, &w->w_down);
#undef LM
#undef LT
    return CP_OK;
}

cp_status cp_model_load(const char *dir, cp_backend *be, const cp_load_opts *opts, cp_model **out, cp_error *err)
{
    *out = NULL;
    /* a backend still being written may lack ops: refuse it here, by name,
     * rather than fail inside a forward pass */
    struct { const void *fn; const char *name; } ops[] = {
        { (const void *)be->embed, "embed" }, { (const void *)be->rmsnorm, "rmsnorm" },
        { (const void *)be->matmul, "matmul" }, { (const void *)be->rope, "rope" },
        { (const void *)be->attention, "attention" }, { (const void *)be->swiglu, "swiglu" },
        { (const void *)be->place_kv, "place_kv" },
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!ops[i].fn)
            return cp_fail(err, CP_EUNSUPPORTED, "the %s backend cannot run a model yet: it has no '%s' op", be->name,
                           ops[i].name);
    cp_model *m = cp_calloc(1, sizeof *m, "model", err);
    if (!m) return CP_ENOMEM;
    m->be = be;
    loader L = { .m = m, .opts = opts };
    cp_status rc = cp_config_load(dir, &m->cfg, err);
    if (rc) goto fail;
    const cp_config *c = &m->cfg;
    if ((rc = st_open_dir(dir, &L.st, err))) goto fail;
    if ((rc = fingerprint(dir, L.st, m->fingerprint, err))) goto fail;
    if ((rc = choose_matrix_dtype(be, opts, L.st, err))) goto fail;
    m->matrix_dtype = be->matrix_dtype;
    for (size_t i = 0; i < st_count(L.st); i++) L.total += st_at(L.st, i)->nbytes;
    L.tmp_bytes = LOAD_CHUNK_ELEMS * 4;
    if (!(L.tmp = cp_malloc(L.tmp_bytes, "weight conversion buffer", err))) { rc = CP_ENOMEM; goto fail; }
    m->layers = cp_calloc((size_t)c->n_layers, sizeof *m->layers, "layer table", err);
    m->rope_inv_freq = cp_calloc((size_t)c->head_dim / 2, sizeof(double), "rope table", err);
    if (!m->layers || !m->rope_inv_freq) { rc = CP_ENOMEM; goto fail; }
    cp_config_rope_inv_freq(c, m->rope_inv_freq);

    /* tied (or no head stored): the embedding is the LM head too; packed
     * for the head's GEMM only where the backend's embed reads that layout
     * by rows (flags: CP_BE_EMBED_READS_PACKED; the CPU's avx512bf16 path,
     * and the amx path with its tile kernels), else plain for both -- one
     * copy either way */
    const int tied = c->tie_embeddings || !st_find(L.st, "lm_head.weight");
    const int pack_embed = tied && (be->flags & CP_BE_EMBED_READS_PACKED);
    if ((rc = load_matrix(&L, "model.embed_tokens.weight", c->vocab, c->hidden, be->matrix_dtype, pack_embed, &m->embed, err)))
        goto fail;
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = load_layer(&L, l, err))) goto fail;
    if ((rc = load_tensor(&L, "model.norm.weight", 1, c->hidden, 0, CP_F32, 0, (void **)&m->final_norm, NULL, err))) goto fail;
    st_tensor *head = st_find(L.st, "lm_head.weight");
    if (c->tie_embeddings || !head) {
        if (!c->tie_embeddings)
            cp_warn("%s: no lm_head.weight in the checkpoint: using the tied input embeddings as the output head", dir);
        if (head) head->used = 1; /* tied: HF ignores a stored copy too */
        m->lm_head = m->embed;
    } else if ((rc = load_matrix(&L, "lm_head.weight", c->vocab, c->hidden, be->matrix_dtype, 1, &m->lm_head, err))) {
        goto fail;
    }
    for (size_t i = 0; i < st_count(L.st); i++) {
        st_tensor *t = st_at(L.st, i);
        if (!t->used) {
            if (m->n_leftover < 5) cp_warn("%s: tensor '%s' is not used by %s", t->file, t->name, c->arch_name);
            m->n_leftover++;
        }
    }
    if (m->n_leftover > 5) cp_warn("%s: %d unused tensors in all", dir, m->n_leftover);
    if ((rc = be->sync(be, err))) goto fail;
    free(L.tmp);
    st_close(L.st);
    *out = m;
    return CP_OK;
fail:
    free(L.tmp);
    st_close(L.st);
    cp_model_free(m);
    return rc;
}
