/* One sequence through the layer loop (forward_layer.c) as a step of one:
 * a whole prompt, a chunk of one, and a single decode step -- n new tokens
 * appended to the cache, their queries attending to every cached slot,
 * causally by position -- and the reuse prefill at chosen slots; the
 * state's KV cache and scratch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "forward_internal.h"

#define LOGIT_ROWS 64 /* rows of the LM head computed at once (CP_LOGITS_ALL) */

static size_t kv_dim(const cp_config *c) { return (size_t)c->n_kv_heads * c->head_dim; }
static size_t q_dim(const cp_config *c) { return (size_t)c->n_heads * c->head_dim; }

void cp_state_free(const cp_model *m, cp_state *s)
{
    if (!s) return;
    cp_backend *be = m->be;
    if ((s->k && s->v && s->k_pre) || (s->k16 && s->v16 && s->k_pre16)) cp_state_reset(m, s, NULL); /* the KV may hold sensitive tokens */
    void *ps[] = { s->k, s->v, s->k_pre, s->k16, s->v16, s->k_pre16, s->kt, s->vt, s->qpos, s->pos, s->x, s->xn, s->q, s->att, s->gate, s->up,
                   s->logits, s->cos, s->sin, s->ids, s->export_tmp, s->sens_dev, s->sens_mass_dev };
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i]) be->free(be, ps[i]);
    free(s->pos_host);
    free(s->cos_host);
    free(s->sin_host);
    free(s->export_host);
    free(s->export_rows);
    free(s);
}

static size_t kv_elem(const cp_state *s) { return s->kv_dtype == CP_BF16 ? 2 : 4; }

/* the base of one of the cache's three arrays (which: 0 K_pre, 1 V, 2 K) */
static char *kv_base(const cp_state *s, int which)
{
    if (s->kv_dtype == CP_BF16) return (char *)(which == 0 ? s->k_pre16 : which == 1 ? s->v16 : s->k16);
    return (char *)(which == 0 ? s->k_pre : which == 1 ? s->v : s->k);
}

void *cp_state_kv_row(const cp_model *m, const cp_state *s, int which, int layer, int slot)
{
    size_t kvd = kv_dim(&m->cfg);
    return kv_base(s, which) + ((size_t)layer * s->capacity + (size_t)slot) * kvd * kv_elem(s);
}

cp_status cp_state_read_kv(const cp_model *m, const cp_state *s, int which, int layer, int slot, int n, float *dst, cp_error *err)
{
    if (which < 0 || which > 2 || layer < 0 || layer >= m->cfg.n_layers || slot < 0 || n < 0 || n > s->capacity - slot)
        return cp_fail(err, CP_ERANGE, "state: rows [%d, %d) of layer %d (array %d) are outside the cache", slot, slot + n, layer, which);
    size_t elems = (size_t)n * kv_dim(&m->cfg);
    const void *src = cp_state_kv_row(m, s, which, layer, slot);
    if (s->kv_dtype != CP_BF16) return m->be->download(m->be, dst, src, elems * sizeof(float), err);
    /* the bf16 rows land in the upper half of dst's bytes and widen upwards
     * from the start: element i is written (bytes [4i, 4i+4)) only after
     * every element at or below i was read (from bytes >= 2 elems + 2i) */
    uint16_t *half = (uint16_t *)(void *)dst + elems;
    cp_status rc = m->be->download(m->be, half, src, elems * 2, err);
    if (rc) return rc;
    for (size_t i = 0; i < elems; i++) {
        uint16_t h;
        memcpy(&h, half + i, sizeof h);
        float f = cp_bf16_to_f32(h);
        memcpy(dst + i, &f, sizeof f);
    }
    return CP_OK;
}

/* Stores rows [0, n) of f32 scratch src (row stride src_ld) at slots[i] of
 * the cache array `which` of one layer, in the cache's dtype.  For bf16,
 * src is rounded in place to what the cache holds (kv_store_bf16). */
void cp_fwd_store_kv(cp_model *m, cp_state *s, int which, int layer, float *src, size_t src_ld, const int32_t *slots, int n)
{
    cp_backend *be = m->be;
    const size_t row = kv_dim(&m->cfg);
    for (int i = 0; i < n; i++)
        if (slots[i] >= s->dirty) s->dirty = slots[i] + 1;
    if (s->kv_dtype != CP_BF16) {
        cp_fwd_scatter_rows(be, (float *)cp_state_kv_row(m, s, which, layer, 0), src, src_ld, slots, n, row);
        return;
    }
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && slots[j] == slots[j - 1] + 1 && src_ld == row) j++;
        be->kv_store_bf16(be, cp_state_kv_row(m, s, which, layer, slots[i]), src + (size_t)i * src_ld, (size_t)(j - i) * row);
        i = j;
    }
}

void cp_fwd_attn_kv(const cp_model *m, const cp_state *s, int layer, cp_attn_args *a)
{
    if (s->kv_dtype == CP_BF16) {
        a->k16 = cp_state_kv_row(m, s, 2, layer, 0);
        a->v16 = cp_state_kv_row(m, s, 1, layer, 0);
    } else {
        a->k = cp_state_kv_row(m, s, 2, layer, 0);
        a->v = cp_state_kv_row(m, s, 1, layer, 0);
    }
}

/* Every slot a request wrote is zeroed: only [0, dirty) of each layer,
 * since nothing writes KV but cp_fwd_store_kv and cp_state_place_kv, which
 * raise dirty (a state grown to the longest request once paid ~1 ms a
 * request zeroing slots no later request had touched). */
cp_status cp_state_reset(const cp_model *m, cp_state *s, cp_error *err)
{
    const size_t row = kv_dim(&m->cfg) * kv_elem(s), bytes = (size_t)s->dirty * row;
    for (int w = 0; bytes && w < 3; w++)
        for (int l = 0; l < m->cfg.n_layers; l++) m->be->zero(m->be, kv_base(s, w) + (size_t)l * s->capacity * row, bytes);
    s->dirty = 0;
    s->n = 0;
    s->next_pos = 0;
    return m->be->sync(m->be, err);
}

cp_status cp_state_create(const cp_model *m, int capacity, int max_batch, cp_state **out, cp_error *err)
{
    return cp_state_create_kv(m, capacity, max_batch, CP_F32, out, err);
}

cp_status cp_state_create_kv(const cp_model *m, int capacity, int max_batch, cp_dtype kv_dtype, cp_state **out, cp_error *err)
{
    *out = NULL;
    const cp_config *c = &m->cfg;
    if (capacity < 1 || max_batch < 1)
        return cp_fail(err, CP_EINVAL, "state: capacity %d and max_batch %d must be positive", capacity, max_batch);
    if (kv_dtype != CP_F32 && kv_dtype != CP_BF16)
        return cp_fail(err, CP_EUNSUPPORTED, "state: a KV cache can be F32 or BF16, not %s", cp_dtype_name(kv_dtype));
    if (kv_dtype == CP_BF16 && (!m->be->kv_store_bf16 || !m->be->place_kv_bf16))
        return cp_fail(err, CP_EUNSUPPORTED, "state: the %s backend keeps its KV cache in f32 (--kv-dtype bf16 needs the cpu backend)",
                       m->be->name);
    if (max_batch > capacity) max_batch = capacity;
    cp_state *s = cp_calloc(1, sizeof *s, "state", err);
    if (!s) return CP_ENOMEM;
    s->capacity = capacity;
    s->max_batch = max_batch;
    s->kv_dtype = kv_dtype;
    cp_backend *be = m->be;
    size_t B = (size_t)max_batch, kv = (size_t)c->n_layers * capacity * kv_dim(c) * kv_elem(s);
    int h = kv_dtype == CP_BF16; /* which three of the KV arrays */
    size_t lrows = B < LOGIT_ROWS ? B : LOGIT_ROWS, half = (size_t)c->head_dim / 2;
    struct { void **p; size_t bytes; } bufs[] = {
        { h ? (void **)&s->k16 : (void **)&s->k, kv }, { h ? (void **)&s->v16 : (void **)&s->v, kv },
        { h ? (void **)&s->k_pre16 : (void **)&s->k_pre, kv }, { (void **)&s->pos, (size_t)capacity * 4 },
        { (void **)&s->kt, B * kv_dim(c) * 4 }, { (void **)&s->vt, B * kv_dim(c) * 4 }, { (void **)&s->qpos, B * 4 },
        { (void **)&s->x, B * c->hidden * 4 }, { (void **)&s->xn, B * c->hidden * 4 },
        { (void **)&s->q, B * q_dim(c) * 4 }, { (void **)&s->att, B * q_dim(c) * 4 },
        { (void **)&s->gate, B * c->intermediate * 4 }, { (void **)&s->up, B * c->intermediate * 4 },
        { (void **)&s->logits, lrows * c->vocab * 4 }, { (void **)&s->cos, B * half * 4 },
        { (void **)&s->sin, B * half * 4 }, { (void **)&s->ids, B * 4 },
    };
    cp_status rc = CP_OK;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0] && rc == CP_OK; i++) rc = be->alloc(be, bufs[i].bytes, bufs[i].p, err);
    if (rc == CP_OK) {
        s->pos_host = cp_calloc((size_t)capacity, 4, "positions", err);
        s->cos_host = cp_calloc(B * half, 4, "rope cos", err);
        s->sin_host = cp_calloc(B * half, 4, "rope sin", err);
        if (!s->pos_host || !s->cos_host || !s->sin_host) rc = CP_ENOMEM;
    }
    s->dirty = capacity; /* a new buffer's bytes are unknown: all of it zeroed once */
    if (rc == CP_OK) rc = cp_state_reset(m, s, err);
    if (rc != CP_OK) {
        cp_state_free(m, s);
        return cp_fail_wrap(err, "creating a KV cache of %d slots", capacity);
    }
    *out = s;
    return CP_OK;
}

cp_status grow_export(cp_model *m, cp_state *s, size_t rows, int n_keys, cp_error *err)
{
    if (rows > s->export_rows_cap) {
        int32_t *r = cp_malloc(rows * sizeof *r, "attention export rows", err);
        if (!r) return CP_ENOMEM;
        free(s->export_rows);
        s->export_rows = r, s->export_rows_cap = rows;
    }
    const size_t floats = rows * (size_t)n_keys;
    if (floats <= s->export_tmp_floats) return CP_OK;
    if (s->export_tmp) m->be->free(m->be, s->export_tmp);
    s->export_tmp = NULL;
    s->export_tmp_floats = 0;
    free(s->export_host);
    s->export_host = NULL;
    cp_status rc = m->be->alloc(m->be, floats * sizeof(float), (void **)&s->export_tmp, err);
    if (rc) return rc;
    s->export_host = cp_malloc(floats * sizeof(float), "attention export", err);
    if (!s->export_host) return CP_ENOMEM;
    s->export_tmp_floats = floats;
    return CP_OK;
}

/* The LM head over rows [r0, r0+nr) of the current chunk. */
static cp_status head_rows(cp_model *m, cp_state *s, int r0, int nr, float *dst, cp_error *err)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    for (int b = 0; b < nr; b += LOGIT_ROWS) {
        int k = nr - b < LOGIT_ROWS ? nr - b : LOGIT_ROWS;
        float *x = s->x + (size_t)(r0 + b) * c->hidden, *xn = s->xn + (size_t)(r0 + b) * c->hidden;
        be->rmsnorm(be, xn, x, m->final_norm, k, c->hidden, c->rms_eps);
        be->matmul(be, s->logits, c->vocab, xn, &m->lm_head, NULL, k, c->hidden, c->vocab, 0);
        cp_status rc = be->download(be, dst + (size_t)b * c->vocab, s->logits, (size_t)k * c->vocab * sizeof(float), err);
        if (rc) return rc;
    }
    return CP_OK;
}

/* position p's cos and sin into c and s (head_dim/2 each): the arithmetic
 * of every row, kept or not */
static void rope_row(const cp_model *m, int32_t p, float *c, float *s)
{
    for (int k = 0; k < m->cfg.head_dim / 2; k++) {
        double ang = (double)p * m->rope_inv_freq[k];
        c[k] = (float)cos(ang);
        s[k] = (float)sin(ang);
    }
}

/* rows kept: the model's context, at least 2^16 positions; a position past
 * them (a caller's own, up to CP_MAX_POSITION) is computed each time */
static int rope_rows_max(const cp_model *m) { return m->cfg.max_pos > (1 << 16) ? m->cfg.max_pos : 1 << 16; }

/* the model's cos/sin rows cover positions [0, top] (top below
 * rope_rows_max): grown by doubling, at least 256 rows, each computed once */
static cp_status rope_rows_to(cp_model *m, int32_t top, cp_error *err)
{
    if (top < m->rope_rows) return CP_OK;
    const int half = m->cfg.head_dim / 2;
    long long want = m->rope_rows ? 2LL * m->rope_rows : 256;
    if (want <= top) want = (long long)top + 1;
    if (want > rope_rows_max(m)) want = rope_rows_max(m);
    float *c = realloc(m->rope_cos, (size_t)want * half * sizeof *c);
    if (c) m->rope_cos = c;
    float *s = c ? realloc(m->rope_sin, (size_t)want * half * sizeof *s) : NULL;
    if (!s) return cp_fail(err, CP_ENOMEM, "forward: out of memory for the RoPE tables of %lld positions", want);
    m->rope_sin = s;
    for (long long p = m->rope_rows; p < want; p++) rope_row(m, (int32_t)p, m->rope_cos + (size_t)p * half, m->rope_sin + (size_t)p * half);
    m->rope_rows = (int)want;
    return CP_OK;
}

/* cos/sin of the RoPE angles for n positions into the state's host tables
 * and then the backend (n <= max_batch). */
static cp_status rope_tables(cp_model *m, cp_state *s, const int32_t *pos, int n, cp_error *err)
{
    const int half = m->cfg.head_dim / 2;
    int32_t top = 0;
    for (int i = 0; i < n; i++) top = pos[i] > top && pos[i] < rope_rows_max(m) ? pos[i] : top;
    cp_status rc = rope_rows_to(m, top, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        float *c = s->cos_host + (size_t)i * half, *sn = s->sin_host + (size_t)i * half;
        if (pos[i] >= m->rope_rows) {
            rope_row(m, pos[i], c, sn);
            continue;
        }
        memcpy(c, m->rope_cos + (size_t)pos[i] * half, (size_t)half * sizeof(float));
        memcpy(sn, m->rope_sin + (size_t)pos[i] * half, (size_t)half * sizeof(float));
    }
    rc = m->be->upload(m->be, s->cos, s->cos_host, (size_t)n * half * 4, err);
    return rc ? rc : m->be->upload(m->be, s->sin, s->sin_host, (size_t)n * half * 4, err);
}

/* Copies rows [0, n) of src (row stride src_ld floats) to slots[i] of dst
 * (rows of `row` floats); runs of consecutive slots go in one copy. */
void cp_fwd_scatter_rows(cp_backend *be, float *dst, const float *src, size_t src_ld, const int32_t *slots, int n, size_t row)
{
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && slots[j] == slots[j - 1] + 1 && src_ld == row) j++;
        be->copy(be, dst + (size_t)slots[i] * row, src + (size_t)i * src_ld, (size_t)(j - i) * row * sizeof(float));
        i = j;
    }
}

/* The chunk's positions, RoPE tables, ids and key positions to the backend. */
cp_status chunk_inputs(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                              int n_keys, cp_error *err)
{
    cp_backend *be = m->be;
    cp_status rc;
    for (int i = 0; i < n; i++) s->pos_host[slots[i]] = pos[i];
    if ((rc = rope_tables(m, s, pos, n, err)) || (rc = be->upload(be, s->ids, tokens, (size_t)n * 4, err)) ||
        (rc = be->upload(be, s->qpos, pos, (size_t)n * 4, err)) ||
        (rc = be->upload(be, s->pos, s->pos_host, (size_t)n_keys * 4, err)))
        return rc;
    return CP_OK;
}

static cp_status forward_chunk(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots,
                               int n, int n_keys, int want_rows, float *logits, const cp_export *ex, cp_error *err)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    cp_status rc;
    if ((rc = chunk_inputs(m, s, tokens, pos, slots, n, n_keys, err))) return rc;

    int n_export = 0, want_sens = 0;
    if ((rc = cp_fwd_export_begin(m, s, ex, n, n_keys, &n_export, &want_sens, err))) return rc;

    cp_fwd_seq q;
    cp_attn_args args;
    cp_fwd_rows r;
    cp_fwd_state_rows(s, n, slots, n_keys, ex, n_export, want_sens, &q, &args, &r);
    be->embed(be, s->x, &m->embed, s->ids, n, c->hidden);
    cp_fwd_layers(m, &r, 0, c->n_layers - 1);
    q.skip_out = n - want_rows; /* the last layer: only the rows whose logits are wanted go on past their K and V */
    cp_fwd_layer(m, &r, c->n_layers - 1);
    if (want_rows > 0 && (rc = head_rows(m, s, n - want_rows, want_rows, logits, err))) return rc;
    if ((rc = cp_fwd_export_end(m, s, ex, slots, n, n_keys, want_sens, err))) return rc;
    return be->sync(be, err);
}

cp_status cp_fwd_export_begin(cp_model *m, cp_state *s, const cp_export *ex, int n, int n_keys, int *n_export, int *want_sens,
                              cp_error *err)
{
    cp_backend *be = m->be;
    cp_status rc;
    *n_export = 0;
    if (ex) {
        for (int l = 0; l < m->cfg.n_layers; l++) *n_export += !ex->layers || ex->layers[l];
        if ((rc = grow_export(m, s, (size_t)n, n_keys, err))) return rc;
        be->zero(be, s->export_tmp, (size_t)n * n_keys * sizeof(float));
    }
    *want_sens = ex && ex->sensitive && ex->sens_mass;
    if (*want_sens) {
        if (!s->sens_dev && ((rc = be->alloc(be, (size_t)s->capacity, (void **)&s->sens_dev, err)) ||
                             (rc = be->alloc(be, (size_t)s->capacity * sizeof(float), (void **)&s->sens_mass_dev, err))))
            return rc;
        if ((rc = be->upload(be, s->sens_dev, ex->sensitive, (size_t)n_keys, err))) return rc;
        be->zero(be, s->sens_mass_dev, (size_t)n * sizeof(float));
    }
    return CP_OK;
}

cp_status cp_fwd_export_end(cp_model *m, cp_state *s, const cp_export *ex, const int32_t *slots, int n, int n_keys, int want_sens,
                            cp_error *err)
{
    cp_backend *be = m->be;
    cp_status rc;
    /* a backend in host memory: its buffers are read where they are (the
     * chunk's export was a copy of n x n_keys floats a layer set) */
    const int host = (be->flags & CP_BE_HOST_MEMORY) != 0;
    if (want_sens) { /* first: rows() may read the chunk's sens_mass */
        float *tmp = host ? s->sens_mass_dev : s->export_host; /* n floats fit: n_keys >= 1 */
        if (!host && (rc = be->download(be, tmp, s->sens_mass_dev, (size_t)n * sizeof(float), err))) return rc;
        for (int i = 0; i < n; i++) ex->sens_mass[slots[i]] = tmp[i];
    }
    if (ex && ex->rows) {
        const float *rows = host ? s->export_tmp : s->export_host;
        if ((!host && (rc = be->download(be, s->export_host, s->export_tmp, (size_t)n * n_keys * sizeof(float), err))) ||
            (rc = ex->rows(ex->rows_ctx, rows, (size_t)n_keys, slots, n, err)))
            return rc;
    } else if (ex && ex->a_on_backend) {
        if (ex->ld == n_keys) cp_fwd_scatter_rows(be, ex->a, s->export_tmp, (size_t)n_keys, slots, n, (size_t)n_keys); /* runs in one copy */
        else
            for (int i = 0; i < n; i++)
                be->copy(be, ex->a + (size_t)slots[i] * ex->ld, s->export_tmp + (size_t)i * n_keys, (size_t)n_keys * sizeof(float));
    } else if (ex) {
        if ((rc = be->download(be, s->export_host, s->export_tmp, (size_t)n * n_keys * sizeof(float), err))) return rc;
        for (int i = 0; i < n; i++)
            memcpy(ex->a + (size_t)slots[i] * ex->ld, s->export_host + (size_t)i * n_keys, (size_t)n_keys * sizeof(float));
    }
    return CP_OK;
}

cp_status cp_fwd_check_tokens(const cp_model *m, const int32_t *tokens, const int32_t *pos, int n, cp_error *err)
{
    if (m->be->matrix_dtype != m->matrix_dtype)
        return cp_fail(err, CP_EINVAL, "forward: the model's matrices are %s but the backend now computes with %s (one backend per weight dtype)",
                       cp_dtype_name(m->matrix_dtype), cp_dtype_name(m->be->matrix_dtype));
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab)
            return cp_fail(err, CP_ERANGE, "forward: token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                           m->cfg.vocab);
        if (pos && (pos[i] < 0 || pos[i] >= CP_MAX_POSITION))
            return cp_fail(err, CP_ERANGE, "forward: position %d at index %d is outside [0, %d)", pos[i], i, CP_MAX_POSITION);
    }
    return CP_OK;
}

/* the arguments of a computation at given slots (cp_forward_at) */
cp_status check_at(const cp_model *m, const cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots,
                          int n, int n_keys, cp_error *err)
{
    if (n < 1) return cp_fail(err, CP_EINVAL, "forward: no tokens (n = %d)", n);
    if (n_keys < 1 || n_keys > s->capacity)
        return cp_fail(err, CP_ERANGE, "forward: %d keys do not fit in %d cache slots", n_keys, s->capacity);
    cp_status rc = cp_fwd_check_tokens(m, tokens, pos, n, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= n_keys || (i && (slots[i] <= slots[i - 1] || pos[i] <= pos[i - 1])))
            return cp_fail(err, CP_EINVAL, "forward: slots and positions must ascend within [0, %d) (index %d)", n_keys, i);
    return CP_OK;
}

/* One chunk of cp_forward_deviation: the layer loop over layers below
 * `layer`, then the probe at `layer` (forward_layer.c). */
static cp_status deviation_chunk(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                                 int n_keys, int layer, float *dev, float *host, cp_error *err)
{
    cp_status rc = chunk_inputs(m, s, tokens, pos, slots, n, n_keys, err);
    if (rc) return rc;
    cp_fwd_seq q;
    cp_attn_args args;
    cp_fwd_rows r;
    cp_fwd_state_rows(s, n, slots, n_keys, NULL, 0, 0, &q, &args, &r);
    m->be->embed(m->be, s->x, &m->embed, s->ids, n, m->cfg.hidden);
    cp_fwd_layers(m, &r, 0, layer);
    return cp_fwd_kv_deviation(m, s, layer, n, slots, dev, host, err);
}

cp_status cp_forward_deviation(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                               int n_keys, int layer, float *dev, cp_error *err)
{
    if (layer < 1 || layer >= m->cfg.n_layers)
        return cp_fail(err, CP_EINVAL, "forward: deviation layer %d outside [1, %d)", layer, m->cfg.n_layers);
    cp_status rc = check_at(m, s, tokens, pos, slots, n, n_keys, err);
    if (rc) return rc;
    size_t kvd = kv_dim(&m->cfg), B = (size_t)s->max_batch;
    float *host = cp_malloc(4 * B * kvd * sizeof(float), "deviation rows", err);
    if (!host) return CP_ENOMEM;
    for (int i = 0; i < n; i++) s->pos_host[slots[i]] = pos[i]; /* as cp_forward_at: later chunks' slots masked */
    for (int i0 = 0; i0 < n && rc == CP_OK; i0 += s->max_batch) {
        int k = n - i0 < s->max_batch ? n - i0 : s->max_batch;
        rc = deviation_chunk(m, s, tokens + i0, pos + i0, slots + i0, k, n_keys, layer, dev + i0, host, err);
    }
    free(host);
    return rc ? rc : m->be->sync(m->be, err);
}

cp_status cp_forward_at(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                        int n_keys, cp_logits_mode mode, float *logits, const cp_export *ex, cp_error *err)
{
    const cp_config *c = &m->cfg;
    if (ex && !ex->rows && ex->ld < n_keys)
        return cp_fail(err, CP_EINVAL, "forward: export row stride %d is less than the %d keys", ex->ld, n_keys);
    if (mode != CP_LOGITS_NONE && !logits) return cp_fail(err, CP_EINVAL, "forward: logits requested with no buffer");
    cp_status rc = check_at(m, s, tokens, pos, slots, n, n_keys, err);
    if (rc) return rc;
    /* every computed slot's position first: an early chunk's queries must
     * see later chunks' slots at their true (later) positions, masked, not
     * at whatever an earlier request left there */
    for (int i = 0; i < n; i++) s->pos_host[slots[i]] = pos[i];
    cp_range_push(m->be, "prefill");
    for (int i0 = 0; i0 < n && rc == CP_OK; i0 += s->max_batch) {
        int k = n - i0 < s->max_batch ? n - i0 : s->max_batch;
        int want = mode == CP_LOGITS_ALL ? k : (mode == CP_LOGITS_LAST && i0 + k == n) ? 1 : 0;
        float *dst = mode == CP_LOGITS_ALL ? logits + (size_t)i0 * c->vocab : logits;
        rc = forward_chunk(m, s, tokens + i0, pos + i0, slots + i0, k, n_keys, want, dst, ex, err);
    }
    cp_range_pop(m->be);
    if (rc == CP_OK) {
        if (n_keys > s->n) s->n = n_keys;
        int32_t top = s->next_pos - 1;
        for (int j = 0; j < s->n; j++)
            if (s->pos_host[j] > top) top = s->pos_host[j];
        s->next_pos = top + 1;
    }
    return rc;
}

cp_status cp_forward(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, int n, cp_logits_mode mode,
                     float *logits, const cp_export *ex, cp_error *err)
{
    if (n < 1) return cp_fail(err, CP_EINVAL, "forward: no tokens (n = %d)", n);
    if (n > s->capacity - s->n)
        return cp_fail(err, CP_ERANGE, "forward: %d tokens do not fit: %d of %d cache slots are in use", n, s->n, s->capacity);
    cp_status rc = cp_fwd_check_tokens(m, tokens, NULL, n, err);
    if (rc) return rc;
    int32_t *own = cp_malloc((size_t)n * 2 * sizeof *own, "positions", err);
    if (!own) return CP_ENOMEM;
    int32_t *slots = own + n;
    for (int i = 0; i < n; i++) {
        int64_t p = pos ? pos[i] : (int64_t)s->next_pos + i;
        if (p < 0 || p >= CP_MAX_POSITION) {
            free(own);
            return cp_fail(err, CP_ERANGE, "forward: position %lld at index %d is outside [0, %d)", (long long)p, i,
                           CP_MAX_POSITION);
        }
        own[i] = (int32_t)p;
        slots[i] = s->n + i;
    }
    /* appended in chunks: each chunk's keys end at its own last slot */
    const cp_config *c = &m->cfg;
    cp_range_push(m->be, n == 1 ? "decode" : "prefill");
    for (int i0 = 0; i0 < n && rc == CP_OK; i0 += s->max_batch) {
        int k = n - i0 < s->max_batch ? n - i0 : s->max_batch;
        int want = mode == CP_LOGITS_ALL ? k : (mode == CP_LOGITS_LAST && i0 + k == n) ? 1 : 0;
        float *dst = mode == CP_LOGITS_ALL ? logits + (size_t)i0 * c->vocab : logits;
        if (ex && !ex->rows && ex->ld < slots[i0] + k) rc = cp_fail(err, CP_EINVAL, "forward: export row stride %d is too small", ex->ld);
        else if (mode != CP_LOGITS_NONE && !logits) rc = cp_fail(err, CP_EINVAL, "forward: logits requested with no buffer");
        else rc = forward_chunk(m, s, tokens + i0, own + i0, slots + i0, k, slots[i0] + k, want, dst, ex, err);
        if (rc == CP_OK) {
            s->n = slots[i0] + k;
            s->next_pos = own[i0 + k - 1] + 1;
        }
    }
    cp_range_pop(m->be);
    free(own);
    return rc;
}

cp_status cp_state_place(cp_model *m, cp_state *s, int slot0, int n, const int32_t *pos, const float *const *k_pre,
                         const float *const *v, size_t ld, cp_error *err)
{
    if (s->kv_dtype != CP_F32)
        return cp_fail(err, CP_EINVAL, "place: f32 rows offered to a %s KV cache (cp_state_place_kv takes its dtype)",
                       cp_dtype_name(s->kv_dtype));
    const int L = m->cfg.n_layers;
    const void **t = cp_malloc(2 * (size_t)L * sizeof *t, "placement table", err);
    if (!t) return CP_ENOMEM;
    for (int l = 0; l < L; l++) t[l] = k_pre[l], t[L + l] = v[l];
    cp_status rc = cp_state_place_kv(m, s, slot0, n, pos, t, t + L, ld, err);
    free(t);
    return rc;
}

/* layer l's rows [slot0, slot0 + n) from source rows ks / vs (ld elements
 * apart), K rotated with the cos / sin rows given: the backend's op for the
 * state's KV dtype */
static void place_layer(cp_model *m, cp_state *s, int l, int slot0, int n, const void *ks, const void *vs, size_t ld, const float *cs,
                        const float *sn)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    void *kd = cp_state_kv_row(m, s, 2, l, slot0), *kpd = cp_state_kv_row(m, s, 0, l, slot0), *vd = cp_state_kv_row(m, s, 1, l, slot0);
    if (s->kv_dtype == CP_BF16) be->place_kv_bf16(be, kd, kpd, vd, ks, vs, ld, n, cs, sn, c->n_kv_heads, c->head_dim);
    else be->place_kv(be, kd, kpd, vd, ks, vs, ld, n, cs, sn, c->n_kv_heads, c->head_dim);
}

cp_status cp_state_place_kv(cp_model *m, cp_state *s, int slot0, int n, const int32_t *pos, const void *const *k_pre,
                            const void *const *v, size_t ld, cp_error *err)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    const size_t kvd = kv_dim(c), esz = kv_elem(s);
    if (slot0 < 0 || n < 1 || slot0 + n > s->capacity)
        return cp_fail(err, CP_ERANGE, "place: slots [%d, %d) outside the %d-slot cache", slot0, slot0 + n, s->capacity);
    cp_status rc = CP_OK;
    for (int i = 0; i < n && rc == CP_OK; i++)
        if (pos[i] < 0 || pos[i] >= CP_MAX_POSITION) rc = cp_fail(err, CP_ERANGE, "place: position %d out of range", pos[i]);
    if (ld < kvd) rc = cp_fail(err, CP_EINVAL, "place: source rows %zu floats apart are shorter than %zu", ld, kvd);
    cp_range_push(be, "placement");
    if (rc == CP_OK && slot0 + n > s->dirty) s->dirty = slot0 + n;
    for (int i0 = 0; i0 < n && rc == CP_OK; i0 += s->max_batch) {
        int k = n - i0 < s->max_batch ? n - i0 : s->max_batch;
        if ((rc = rope_tables(m, s, pos + i0, k, err))) break;
        for (int l = 0; l < c->n_layers; l++)
            place_layer(m, s, l, slot0 + i0, k, (const char *)k_pre[l] + (size_t)i0 * ld * esz, (const char *)v[l] + (size_t)i0 * ld * esz, ld,
                        s->cos, s->sin);
        for (int t = 0; t < k; t++) s->pos_host[slot0 + i0 + t] = pos[i0 + t];
    }
    cp_range_pop(be);
    return rc ? rc : be->sync(be, err);
}

/* below this many bytes copied a placement stays on its caller's thread
 * (waking the other costs ~20-40 us on these machines) */
#define PLACE_PARALLEL_BYTES ((size_t)1 << 19)

cp_status cp_state_place_kv_runs(cp_model *m, cp_state *s, const cp_kv_run *runs, int n_runs, size_t ld, cp_error *err)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    const int L = c->n_layers, half = c->head_dim / 2;
    const size_t kvd = kv_dim(c), esz = kv_elem(s);
    int fast = (be->flags & CP_BE_HOST_MEMORY) != 0 && ld >= kvd;
    int32_t top = 0;
    size_t rows = 0;
    for (int r = 0; r < n_runs && fast; r++) {
        const cp_kv_run *u = &runs[r];
        fast = u->n >= 1 && u->slot0 >= 0 && u->slot0 + u->n <= s->capacity && u->pos[0] >= 0 &&
               u->pos[u->n - 1] < rope_rows_max(m) && u->pos[u->n - 1] < CP_MAX_POSITION;
        for (int i = 1; i < u->n && fast; i++) fast = u->pos[i] == u->pos[0] + i;
        if (fast && u->pos[u->n - 1] > top) top = u->pos[u->n - 1];
        rows += (size_t)u->n;
    }
    cp_status rc = fast ? rope_rows_to(m, top, err) : CP_OK;
    if (rc) return rc;
    if (!fast || top >= m->rope_rows) { /* one run at a time, each checked and placed by cp_state_place_kv */
        for (int r = 0; r < n_runs && rc == CP_OK; r++)
            rc = cp_state_place_kv(m, s, runs[r].slot0, runs[r].n, runs[r].pos, runs[r].k_pre, runs[r].v, ld, err);
        return rc;
    }
    cp_range_push(be, "placement");
    for (int r = 0; r < n_runs; r++) {
        const cp_kv_run *u = &runs[r];
        if (u->slot0 + u->n > s->dirty) s->dirty = u->slot0 + u->n;
        for (int t = 0; t < u->n; t++) s->pos_host[u->slot0 + t] = u->pos[t];
    }
    const long jobs = (long)n_runs * L;
    const int par = rows * (size_t)L * kvd * esz * 2 >= PLACE_PARALLEL_BYTES;
#pragma omp parallel for schedule(static) if (par)
    for (long j = 0; j < jobs; j++) {
        const cp_kv_run *u = &runs[j / L];
        const int l = (int)(j % L);
        const float *cs = m->rope_cos + (size_t)u->pos[0] * half, *sn = m->rope_sin + (size_t)u->pos[0] * half;
        place_layer(m, s, l, u->slot0, u->n, u->k_pre[l], u->v[l], ld, cs, sn);
    }
    cp_range_pop(be);
    return be->sync(be, err);
}

cp_status cp_state_place_placeholder(cp_model *m, cp_state *s, const uint8_t *reused, int n, int run, cp_error *err)
{
    cp_backend *be = m->be;
    const int L = m->cfg.n_layers;
    const size_t kvd = kv_dim(&m->cfg);
    if (run < 1 || n < 0 || n > s->capacity)
        return cp_fail(err, CP_EINVAL, "place: %d placeholder rows in runs of %d do not fit %d slots", n, run, s->capacity);
    void *zero = NULL;
    const void **src = cp_malloc((size_t)L * sizeof *src, "placeholder table", err);
    int32_t *pos = cp_malloc((size_t)run * sizeof *pos, "placeholder positions", err);
    cp_status rc = src && pos ? be->alloc(be, (size_t)run * kvd * kv_elem(s), &zero, err) : CP_ENOMEM;
    if (rc == CP_OK) be->zero(be, zero, (size_t)run * kvd * kv_elem(s));
    for (int l = 0; rc == CP_OK && l < L; l++) src[l] = zero;
    for (int i = 0; rc == CP_OK && i < n; i++) {
        if (!reused[i]) continue;
        int j = i;
        while (j < n && j - i < run && reused[j]) pos[j - i] = j, j++;
        rc = cp_state_place_kv(m, s, i, j - i, pos, src, src, kvd, err);
        i = j - 1;
    }
    if (zero) be->free(be, zero);
    free(src), free(pos);
    return rc;
}
