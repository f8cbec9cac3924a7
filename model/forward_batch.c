/* One forward step for several sequences (continuous batching) through the
 * layer loop (forward_layer.c).  The dense work — embedding, norms,
 * projections, MLP, LM head — runs once over the step's tokens of every
 * sequence, so decoding k sequences streams the weights once instead of k
 * times; only RoPE tables, K/V writes and attention are per sequence (each
 * has its own cache and positions). */
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

/* A sequence's first row whose logits it wants (its n when none): the rows
 * before it are read by nobody after the last layer. */
static int first_logits_row(const cp_batch_seq *q)
{
    return q->mode == CP_LOGITS_ALL ? 0 : q->mode == CP_LOGITS_LAST ? q->n - 1 : q->n;
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
        for (int r = first_logits_row(q); r < q->n && rc == CP_OK; r++) {
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
    cp_fwd_seq *fs = cp_calloc((size_t)n_seqs, sizeof *fs, "batch sequences", err);
    if (!fs) return CP_ENOMEM;
    for (int i = 0; i < n_seqs; i++)
        fs[i] = (cp_fwd_seq){ .s = seqs[i].s, .off = ws->off[i], .n = seqs[i].n, .slots = ws->slots_h + ws->off[i], .n_keys = ws->keys[i],
                              .ex = seqs[i].ex };
    const cp_fwd_rows r = { .T = T, .x = ws->x, .xn = ws->xn, .q = ws->q, .att = ws->att, .kt = ws->kt, .vt = ws->vt, .gate = ws->gate,
                            .up = ws->up, .cos = ws->cos, .sin = ws->sin, .qpos = ws->qpos, .seqs = fs, .n_seqs = n_seqs, .args = ws->args };
    cp_range_push(be, "batch");
    rc = step_inputs(m, ws, seqs, n_seqs, T, err);
    for (int i = 0; i < n_seqs && rc == CP_OK; i++)
        rc = cp_fwd_export_begin(m, seqs[i].s, seqs[i].ex, seqs[i].n, ws->keys[i], &fs[i].n_export, &fs[i].want_sens, err);
    if (rc == CP_OK) {
        be->embed(be, ws->x, &m->embed, ws->ids, T, c->hidden);
        cp_fwd_layers(m, &r, 0, c->n_layers - 1);
        /* the last layer: only the rows whose logits are wanted go on past their K and V */
        for (int i = 0; i < n_seqs; i++) fs[i].skip_out = first_logits_row(&seqs[i]);
        cp_fwd_layer(m, &r, c->n_layers - 1);
        rc = head_batch(m, ws, seqs, n_seqs, err);
    }
    for (int i = 0; i < n_seqs && rc == CP_OK; i++)
        rc = cp_fwd_export_end(m, seqs[i].s, seqs[i].ex, ws->slots_h + ws->off[i], seqs[i].n, ws->keys[i], fs[i].want_sens, err);
    cp_range_pop(be);
    free(fs);
    if (rc == CP_OK) rc = be->sync(be, err);
    if (rc == CP_OK) advance(ws, seqs, n_seqs);
    return rc;
}
