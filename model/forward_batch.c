/* One forward step for several sequences (continuous batching).  The dense
 * work — embedding, norms, projections, MLP, LM head — runs once over the
 * step's tokens of every sequence, so decoding k sequences streams the
 * weights once instead of k times; only RoPE tables, K/V writes and
 * attention are per sequence (each has its own cache and positions). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "model.h"

#define HEAD_ROWS 64 /* rows of the LM head computed at once */

struct cp_batch_ws {
    int max_tokens;
    /* backend: [T, ...] activations of the step's tokens */
    float *x, *xn, *q, *att, *kt, *vt, *gate, *up, *cos, *sin;
    int32_t *ids, *qpos;
    float *hx, *logits; /* [HEAD_ROWS, hidden], [HEAD_ROWS, vocab] */
    /* host mirrors: the step's tokens, positions and slots, concatenated */
    int32_t *ids_h, *pos_h, *slots_h;
    float *cos_h, *sin_h;
    int *off, *keys; /* per sequence: first row in the step, keys it attends */
    cp_attn_args *args; /* per sequence: one layer's attention call */
};

static size_t kv_dim(const cp_config *c) { return (size_t)c->n_kv_heads * c->head_dim; }
static size_t q_dim(const cp_config *c) { return (size_t)c->n_heads * c->head_dim; }

void cp_batch_ws_free(const cp_model *m, cp_batch_ws *ws)
{
    if (!ws) return;
    cp_backend *be = m->be;
    void *ps[] = { ws->x, ws->xn, ws->q, ws->att, ws->kt, ws->vt, ws->gate, ws->up, ws->cos, ws->sin, ws->ids, ws->qpos, ws->hx, ws->logits };
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i]) be->free(be, ps[i]);
    free(ws->ids_h), free(ws->pos_h), free(ws->slots_h), free(ws->cos_h), free(ws->sin_h), free(ws->off), free(ws->keys), free(ws->args);
    free(ws);
}

int cp_batch_ws_max_tokens(const cp_batch_ws *ws) { return ws->max_tokens; }

cp_status cp_batch_ws_create(const cp_model *m, int max_tokens, cp_batch_ws **out, cp_error *err)
{
    *out = NULL;
    const cp_config *c = &m->cfg;
    if (max_tokens < 1 || max_tokens > (1 << 20))
        return cp_fail(err, CP_EINVAL, "batch: %d tokens a step is outside [1, %d]", max_tokens, 1 << 20);
    cp_batch_ws *ws = cp_calloc(1, sizeof *ws, "batch workspace", err);
    if (!ws) return CP_ENOMEM;
    ws->max_tokens = max_tokens;
    cp_backend *be = m->be;
    size_t T = (size_t)max_tokens, half = (size_t)c->head_dim / 2, hr = HEAD_ROWS;
    struct { void **p; size_t bytes; } bufs[] = {
        { (void **)&ws->x, T * c->hidden * 4 }, { (void **)&ws->xn, T * c->hidden * 4 },
        { (void **)&ws->q, T * q_dim(c) * 4 }, { (void **)&ws->att, T * q_dim(c) * 4 },
        { (void **)&ws->kt, T * kv_dim(c) * 4 }, { (void **)&ws->vt, T * kv_dim(c) * 4 },
        { (void **)&ws->gate, T * c->intermediate * 4 }, { (void **)&ws->up, T * c->intermediate * 4 },
        { (void **)&ws->cos, T * half * 4 }, { (void **)&ws->sin, T * half * 4 },
        { (void **)&ws->ids, T * 4 }, { (void **)&ws->qpos, T * 4 },
        { (void **)&ws->hx, hr * c->hidden * 4 }, { (void **)&ws->logits, hr * c->vocab * 4 },
    };
    cp_status rc = CP_OK;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0] && rc == CP_OK; i++) rc = be->alloc(be, bufs[i].bytes, bufs[i].p, err);
    if (rc == CP_OK) {
        ws->ids_h = cp_calloc(T, 4, "batch ids", err);
        ws->pos_h = cp_calloc(T, 4, "batch positions", err);
        ws->slots_h = cp_calloc(T, 4, "batch slots", err);
        ws->cos_h = cp_calloc(T * half, 4, "batch rope cos", err);
        ws->sin_h = cp_calloc(T * half, 4, "batch rope sin", err);
        ws->off = cp_calloc(T, sizeof *ws->off, "batch offsets", err);
        ws->keys = cp_calloc(T, sizeof *ws->keys, "batch keys", err);
        ws->args = cp_calloc(T, sizeof *ws->args, "batch attention calls", err);
        if (!ws->ids_h || !ws->pos_h || !ws->slots_h || !ws->cos_h || !ws->sin_h || !ws->off || !ws->keys || !ws->args) rc = CP_ENOMEM;
    }
    if (rc) {
        cp_batch_ws_free(m, ws);
        return cp_fail_wrap(err, "creating a batch workspace for %d tokens a step", max_tokens);
    }
    *out = ws;
    return CP_OK;
}

cp_status cp_state_set_positions(cp_state *s, const int32_t *slots, const int32_t *pos, int n, cp_error *err)
{
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= s->capacity || pos[i] < 0 || pos[i] >= CP_MAX_POSITION)
            return cp_fail(err, CP_ERANGE, "batch: slot %d at position %d (index %d) is outside the %d-slot cache", slots[i], pos[i],
                           i, s->capacity);
    for (int i = 0; i < n; i++) s->pos_host[slots[i]] = pos[i];
    return CP_OK;
}

/* One sequence's arguments; its resolved slots and positions go to the
 * step's host arrays at row off. */
static cp_status resolve_seq(const cp_model *m, cp_batch_ws *ws, const cp_batch_seq *q, int i, int off, cp_error *err)
{
    cp_state *s = q->s;
    if (!s || !q->tokens || q->n < 1) return cp_fail(err, CP_EINVAL, "batch: sequence %d has no state or no tokens", i);
    if (q->mode != CP_LOGITS_NONE && !q->logits) return cp_fail(err, CP_EINVAL, "batch: sequence %d wants logits with no buffer", i);
    cp_status rc = cp_fwd_check_tokens(m, q->tokens, q->pos, q->n, err);
    if (rc) return cp_fail_wrap(err, "batch: sequence %d", i);
    int32_t *slots = ws->slots_h + off, *pos = ws->pos_h + off;
    int n_keys;
    if (!q->slots) {
        if (q->n > s->capacity - s->n)
            return cp_fail(err, CP_ERANGE, "batch: sequence %d: %d tokens do not fit: %d of %d cache slots are in use", i, q->n, s->n,
                           s->capacity);
        for (int t = 0; t < q->n; t++) {
            int64_t p = q->pos ? q->pos[t] : (int64_t)s->next_pos + t;
            if (p >= CP_MAX_POSITION) return cp_fail(err, CP_ERANGE, "batch: sequence %d: position %lld is too large", i, (long long)p);
            slots[t] = s->n + t, pos[t] = (int32_t)p;
        }
        n_keys = s->n + q->n;
    } else {
        if (!q->pos) return cp_fail(err, CP_EINVAL, "batch: sequence %d gives slots without positions", i);
        n_keys = q->n_keys;
        if (n_keys < 1 || n_keys > s->capacity)
            return cp_fail(err, CP_ERANGE, "batch: sequence %d: %d keys do not fit in %d cache slots", i, n_keys, s->capacity);
        for (int t = 0; t < q->n; t++) {
            if (q->slots[t] < 0 || q->slots[t] >= n_keys || (t && (q->slots[t] <= q->slots[t - 1] || q->pos[t] <= q->pos[t - 1])))
                return cp_fail(err, CP_EINVAL, "batch: sequence %d: slots and positions must ascend within [0, %d) (index %d)", i,
                               n_keys, t);
            slots[t] = q->slots[t], pos[t] = q->pos[t];
        }
    }
    if (q->ex && !q->ex->rows && q->ex->ld < n_keys)
        return cp_fail(err, CP_EINVAL, "batch: sequence %d: export row stride %d is less than its %d keys", i, q->ex->ld, n_keys);
    memcpy(ws->ids_h + off, q->tokens, (size_t)q->n * sizeof *q->tokens);
    ws->keys[i] = n_keys;
    return CP_OK;
}

/* Checks every sequence and lays the step out (ws->off, ws->keys, the host
 * arrays); returns the step's token count in *total. */
static cp_status resolve(const cp_model *m, cp_batch_ws *ws, const cp_batch_seq *seqs, int n_seqs, int *total, cp_error *err)
{
    if (n_seqs < 1 || !seqs) return cp_fail(err, CP_EINVAL, "batch: no sequences");
    long long sum = 0;
    for (int i = 0; i < n_seqs; i++) {
        sum += seqs[i].n > 0 ? seqs[i].n : 0;
        for (int j = 0; j < i; j++) /* two writers of one cache in one step */
            if (seqs[j].s == seqs[i].s) return cp_fail(err, CP_EINVAL, "batch: sequences %d and %d share one state", j, i);
    }
    if (sum > ws->max_tokens)
        return cp_fail(err, CP_ERANGE, "batch: %lld tokens exceed the workspace's %d a step", sum, ws->max_tokens);
    int off = 0;
    for (int i = 0; i < n_seqs; i++) {
        cp_status rc = resolve_seq(m, ws, &seqs[i], i, off, err);
        if (rc) return rc;
        ws->off[i] = off;
        off += seqs[i].n;
    }
    *total = off;
    return CP_OK;
}

/* The step's ids, query positions and RoPE tables (one row per token, at
 * its own position) to the backend; each sequence's key positions too. */
static cp_status step_inputs(cp_model *m, cp_batch_ws *ws, const cp_batch_seq *seqs, int n_seqs, int T, cp_error *err)
{
    cp_backend *be = m->be;
    const int half = m->cfg.head_dim / 2;
    for (int i = 0; i < T; i++)
        for (int k = 0; k < half; k++) {
            double ang = (double)ws->pos_h[i] * m->rope_inv_freq[k];
            ws->cos_h[(size_t)i * half + k] = (float)cos(ang);
            ws->sin_h[(size_t)i * half + k] = (float)sin(ang);
        }
    cp_status rc;
    if ((rc = be->upload(be, ws->cos, ws->cos_h, (size_t)T * half * 4, err)) ||
        (rc = be->upload(be, ws->sin, ws->sin_h, (size_t)T * half * 4, err)) ||
        (rc = be->upload(be, ws->ids, ws->ids_h, (size_t)T * 4, err)) || (rc = be->upload(be, ws->qpos, ws->pos_h, (size_t)T * 4, err)))
        return rc;
    for (int i = 0; i < n_seqs; i++) {
        cp_state *s = seqs[i].s;
        for (int t = 0; t < seqs[i].n; t++) s->pos_host[ws->slots_h[ws->off[i] + t]] = ws->pos_h[ws->off[i] + t];
        if ((rc = be->upload(be, s->pos, s->pos_host, (size_t)ws->keys[i] * 4, err))) return rc;
    }
    return CP_OK;
}

typedef struct seq_export {
    int n_export, want_sens;
} seq_export;

/* One layer over the step's T tokens (hidden states in ws->x). */
static void layer_batch(cp_model *m, cp_batch_ws *ws, const cp_batch_seq *seqs, int n_seqs, int T, int l, const seq_export *sx)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    const size_t kvd = kv_dim(c), qd = q_dim(c);
    const cp_layer_weights *w = &m->layers[l];
    cp_range_push(be, "layer");
    cp_range_push(be, "attention");
    be->rmsnorm(be, ws->xn, ws->x, w->attn_norm, T, c->hidden, c->rms_eps);
    be->matmul(be, ws->q, (int)qd, ws->xn, &w->wq, w->bq, T, c->hidden, (int)qd, 0);
    be->matmul(be, ws->kt, (int)kvd, ws->xn, &w->wk, w->bk, T, c->hidden, (int)kvd, 0);
    be->matmul(be, ws->vt, (int)kvd, ws->xn, &w->wv, w->bv, T, c->hidden, (int)kvd, 0);
    for (int i = 0; i < n_seqs; i++) { /* K before RoPE (for the pool) and V into each sequence's own cache */
        cp_state *s = seqs[i].s;
        size_t o = (size_t)ws->off[i] * kvd;
        cp_fwd_store_kv(m, s, 0, l, ws->kt + o, kvd, ws->slots_h + ws->off[i], seqs[i].n);
        cp_fwd_store_kv(m, s, 1, l, ws->vt + o, kvd, ws->slots_h + ws->off[i], seqs[i].n);
    }
    be->rope(be, ws->q, (int)qd, ws->cos, ws->sin, T, c->n_heads, c->head_dim);
    be->rope(be, ws->kt, (int)kvd, ws->cos, ws->sin, T, c->n_kv_heads, c->head_dim);
    for (int i = 0; i < n_seqs; i++) {
        cp_state *s = seqs[i].s;
        const cp_export *ex = seqs[i].ex;
        size_t o = (size_t)ws->off[i];
        cp_fwd_store_kv(m, s, 2, l, ws->kt + o * kvd, kvd, ws->slots_h + o, seqs[i].n);
        cp_attn_args *a = &ws->args[i];
        *a = (cp_attn_args){
            .q = ws->q + o * qd, .q_pos = ws->qpos + o, .k_pos = s->pos,
            .out = ws->att + o * qd, .n = seqs[i].n, .n_keys = ws->keys[i], .n_heads = c->n_heads,
            .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .window = c->window[l],
        };
        cp_fwd_attn_kv(m, s, l, a);
        if (ex && (!ex->layers || ex->layers[l])) {
            a->export_a = s->export_tmp;
            a->export_ld = ws->keys[i];
            a->export_weight = 1.0f / ((float)c->n_heads * sx[i].n_export);
            if (sx[i].want_sens) a->sens_cols = s->sens_dev, a->sens_mass = s->sens_mass_dev;
        }
    }
    /* every sequence's attention in one call where the backend batches it
     * (one fork and join for the step's decode rows, not one a sequence) */
    if (be->attention_batch) be->attention_batch(be, ws->args, n_seqs);
    else
        for (int i = 0; i < n_seqs; i++) be->attention(be, &ws->args[i]);
    cp_fwd_attn_out_mlp(m, w, T, ws->x, ws->xn, ws->att, ws->gate, ws->up);
    cp_range_pop(be);
}

/* Final norm and LM head over the k rows gathered in ws->hx; row j's
 * logits to dst[j]. */
static cp_status head_flush(cp_model *m, cp_batch_ws *ws, float *const *dst, int k, cp_error *err)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    be->rmsnorm(be, ws->hx, ws->hx, m->final_norm, k, c->hidden, c->rms_eps);
    be->matmul(be, ws->logits, c->vocab, ws->hx, &m->lm_head, NULL, k, c->hidden, c->vocab, 0);
    for (int j = 0; j < k; j++) {
        cp_status rc = be->download(be, dst[j], ws->logits + (size_t)j * c->vocab, (size_t)c->vocab * sizeof(float), err);
        if (rc) return rc;
    }
    return CP_OK;
}

/* The LM head over the rows the sequences want: gathered HEAD_ROWS at a
 * time (every decoding sequence's last row in one GEMM). */
static cp_status head_batch(cp_model *m, cp_batch_ws *ws, const cp_batch_seq *seqs, int n_seqs, cp_error *err)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    float *dst[HEAD_ROWS];
    int k = 0;
    cp_status rc = CP_OK;
    for (int i = 0; i < n_seqs && rc == CP_OK; i++) {
        const cp_batch_seq *q = &seqs[i];
        int first = q->mode == CP_LOGITS_ALL ? 0 : q->mode == CP_LOGITS_LAST ? q->n - 1 : q->n;
        for (int r = first; r < q->n && rc == CP_OK; r++) {
            be->copy(be, ws->hx + (size_t)k * c->hidden, ws->x + (size_t)(ws->off[i] + r) * c->hidden, (size_t)c->hidden * sizeof(float));
            dst[k++] = q->logits + (q->mode == CP_LOGITS_ALL ? (size_t)r * c->vocab : 0);
            if (k == HEAD_ROWS) rc = head_flush(m, ws, dst, k, err), k = 0;
        }
    }
    if (rc == CP_OK && k > 0) rc = head_flush(m, ws, dst, k, err);
    return rc;
}

/* After the step: each state's filled slots and next position, as
 * cp_forward (append) or cp_forward_at (slots) leaves them. */
static void advance(cp_batch_ws *ws, const cp_batch_seq *seqs, int n_seqs)
{
    for (int i = 0; i < n_seqs; i++) {
        cp_state *s = seqs[i].s;
        if (!seqs[i].slots) {
            s->n += seqs[i].n;
            s->next_pos = ws->pos_h[ws->off[i] + seqs[i].n - 1] + 1;
            continue;
        }
        if (ws->keys[i] > s->n) s->n = ws->keys[i];
        int32_t top = s->next_pos - 1;
        for (int j = 0; j < s->n; j++)
            if (s->pos_host[j] > top) top = s->pos_host[j];
        s->next_pos = top + 1;
    }
}

cp_status cp_forward_batch(cp_model *m, cp_batch_ws *ws, const cp_batch_seq *seqs, int n_seqs, cp_error *err)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    int T = 0;
    cp_status rc = resolve(m, ws, seqs, n_seqs, &T, err);
    if (rc) return rc;
    seq_export *sx = cp_calloc((size_t)n_seqs, sizeof *sx, "batch export flags", err);
    if (!sx) return CP_ENOMEM;
    cp_range_push(be, "batch");
    rc = step_inputs(m, ws, seqs, n_seqs, T, err);
    for (int i = 0; i < n_seqs && rc == CP_OK; i++)
        rc = cp_fwd_export_begin(m, seqs[i].s, seqs[i].ex, seqs[i].n, ws->keys[i], &sx[i].n_export, &sx[i].want_sens, err);
    if (rc == CP_OK) {
        be->embed(be, ws->x, &m->embed, ws->ids, T, c->hidden);
        for (int l = 0; l < c->n_layers; l++) layer_batch(m, ws, seqs, n_seqs, T, l, sx);
        rc = head_batch(m, ws, seqs, n_seqs, err);
    }
    for (int i = 0; i < n_seqs && rc == CP_OK; i++)
        rc = cp_fwd_export_end(m, seqs[i].s, seqs[i].ex, ws->slots_h + ws->off[i], seqs[i].n, ws->keys[i], sx[i].want_sens, err);
    cp_range_pop(be);
    free(sx);
    if (rc == CP_OK) rc = be->sync(be, err);
    if (rc == CP_OK) advance(ws, seqs, n_seqs);
    return rc;
}
