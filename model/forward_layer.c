/* The layer loop's one body.  A step's rows -- one sequence's chunk, every
 * sequence's tokens of a batched step, the selective prefill's current
 * candidates -- go through cp_fwd_layer, so every path runs the same ops
 * in the same order: the fused norm and Q/K/V projections, K/V into each
 * sequence's own cache, RoPE over all rows, attention per sequence, the
 * output projection and the MLP.  A single sequence is a step of one. */
#include "forward_internal.h"

static size_t kv_dim(const cp_config *c) { return (size_t)c->n_kv_heads * c->head_dim; }
static size_t q_dim(const cp_config *c) { return (size_t)c->n_heads * c->head_dim; }

/* outs[j].y = rmsnorm(x) . W_j^T + bias_j: the backend's fused op where it
 * takes these (int8 on vnni, bf16 on AMX tiles: each normalized row made,
 * rounded or quantized once for all the products in one parallel region,
 * the rows never stored), else the norm into xn and one matmul each */
void cp_fwd_norm_matmuls(cp_backend *be, float *xn, const float *x, const float *norm_w, float eps, int n, int in, const cp_mm_out *outs,
                         int count)
{
    if (be->norm_matmuls && be->norm_matmuls(be, x, norm_w, eps, n, in, outs, count)) return;
    be->rmsnorm(be, xn, x, norm_w, n, in, eps);
    for (int j = 0; j < count; j++) be->matmul(be, outs[j].y, outs[j].ldy, xn, outs[j].w, outs[j].bias, n, in, outs[j].out, 0);
}

/* Attention of q's rows with the export and sensitive mass of the rows
 * its export wants (cp_export.want) on a backend that exports a call's
 * rows only (CP_BE_ATTN_EXPORT_ONLY), into the rows of the full call's
 * buffers they would have had (the state's chunk rows, or the caller's
 * rows accumulated over the layers).  With CP_BE_ATTN_EXPORT_ROWS, one
 * call naming each row's export row (-1: not wanted); else one call per
 * run of consecutive rows alike.  The output rows come in the same calls,
 * the export from their own scores: a row's output is the same at every
 * row count, so the split changes no bit of it.  Rows before `skip` that
 * the export does not want are not attended at all (cp_fwd_seq.skip_out). */
static void attention_wanted_rows(cp_backend *be, const cp_attn_args *a, const cp_fwd_seq *q, float weight, size_t qd, int skip)
{
    cp_state *s = q->s;
    if (!skip && (be->flags & CP_BE_ATTN_EXPORT_ROWS) && s->export_rows_cap >= (size_t)q->n) { /* grow_export sized it for every chunk */
        for (int r = 0; r < q->n; r++)
            s->export_rows[r] = !q->ex->want[q->slots[r]] ? -1 : q->ex_to ? q->ex_row[r] : r;
        cp_attn_args e = *a;
        e.export_a = q->ex_to ? q->ex_to : s->export_tmp, e.export_ld = q->n_keys, e.export_weight = weight;
        if (q->want_sens) e.sens_cols = s->sens_dev, e.sens_mass = q->ex_to ? q->sens_to : s->sens_mass_dev;
        e.export_rows = s->export_rows;
        be->attention(be, &e);
        return;
    }
    for (int r0 = 0, r1; r0 < q->n; r0 = r1) {
        const int want = q->ex->want[q->slots[r0]] != 0;
        for (r1 = r0 + 1; r1 < q->n && (q->ex->want[q->slots[r1]] != 0) == want;) r1++;
        const int from = want || r0 >= skip ? r0 : skip < r1 ? skip : r1; /* unwanted rows before skip: nobody reads them */
        if (from == r1) continue;
        cp_attn_args e = *a;
        e.q = a->q + (size_t)from * qd, e.q_pos = a->q_pos + from, e.out = a->out + (size_t)from * qd, e.n = r1 - from;
        if (want) { /* the state's chunk rows, or the caller's rows (accumulated over the layers) */
            const size_t row = q->ex_to ? (size_t)q->ex_row[r0] : (size_t)r0;
            e.export_a = (q->ex_to ? q->ex_to : q->s->export_tmp) + row * q->n_keys, e.export_ld = q->n_keys, e.export_weight = weight;
            if (q->want_sens) e.sens_cols = q->s->sens_dev, e.sens_mass = (q->ex_to ? q->sens_to : q->s->sens_mass_dev) + row;
        }
        be->attention(be, &e);
    }
}

/* The output projection and MLP of the rows read after this layer: all of
 * them, or where sequences skip rows (cp_fwd_seq.skip_out) the rest -- one
 * sequence's as the tail of the step, several sequences' moved together
 * row by row (each row's destination at or before its source) and back. */
static void attn_out_mlp_read_rows(cp_model *m, const cp_fwd_rows *r, const cp_layer_weights *w)
{
    cp_backend *be = m->be;
    const size_t hid = (size_t)m->cfg.hidden, qd = q_dim(&m->cfg);
    int need = 0, skipped = 0;
    for (int i = 0; i < r->n_seqs; i++) need += r->seqs[i].n - r->seqs[i].skip_out, skipped += r->seqs[i].skip_out;
    if (!skipped || (r->n_seqs == 1 && need)) {
        const size_t s0 = (size_t)r->seqs[0].skip_out * (r->n_seqs == 1);
        cp_fwd_attn_out_mlp(m, w, r->T - (int)s0, r->x + s0 * hid, r->xn, r->att + s0 * qd, r->gate, r->up);
        return;
    }
    if (!need) {
        cp_range_pop(be); /* attention's, as cp_fwd_attn_out_mlp pops it */
        return;
    }
    for (int i = 0, p = 0; i < r->n_seqs; i++)
        for (int t = r->seqs[i].off + r->seqs[i].skip_out; t < r->seqs[i].off + r->seqs[i].n; t++, p++)
            if (p != t) {
                be->copy(be, r->x + (size_t)p * hid, r->x + (size_t)t * hid, hid * sizeof(float));
                be->copy(be, r->att + (size_t)p * qd, r->att + (size_t)t * qd, qd * sizeof(float));
            }
    cp_fwd_attn_out_mlp(m, w, need, r->x, r->xn, r->att, r->gate, r->up);
    for (int i = r->n_seqs - 1, p = need - 1; i >= 0; i--)
        for (int t = r->seqs[i].off + r->seqs[i].n - 1; t >= r->seqs[i].off + r->seqs[i].skip_out; t--, p--)
            if (p != t) be->copy(be, r->x + (size_t)t * hid, r->x + (size_t)p * hid, hid * sizeof(float));
}

void cp_fwd_layer(cp_model *m, const cp_fwd_rows *r, int l)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    const size_t kvd = kv_dim(c), qd = q_dim(c);
    const cp_layer_weights *w = &m->layers[l];
    cp_range_push(be, "layer");
    cp_range_push(be, "attention");
    const cp_mm_out qkv[3] = { { r->q, (int)qd, &w->wq, w->bq, (int)qd }, { r->kt, (int)kvd, &w->wk, w->bk, (int)kvd },
                               { r->vt, (int)kvd, &w->wv, w->bv, (int)kvd } };
    cp_fwd_norm_matmuls(be, r->xn, r->x, w->attn_norm, c->rms_eps, r->T, c->hidden, qkv, 3);
    for (int i = 0; i < r->n_seqs; i++) { /* K before RoPE (for the pool; bf16: kt rounded to it) and V into each sequence's cache */
        const cp_fwd_seq *q = &r->seqs[i];
        cp_fwd_store_kv(m, q->s, 0, l, r->kt + (size_t)q->off * kvd, kvd, q->slots, q->n);
        cp_fwd_store_kv(m, q->s, 1, l, r->vt + (size_t)q->off * kvd, kvd, q->slots, q->n);
    }
    be->rope(be, r->q, (int)qd, r->cos, r->sin, r->T, c->n_heads, c->head_dim);
    be->rope(be, r->kt, (int)kvd, r->cos, r->sin, r->T, c->n_kv_heads, c->head_dim);
    int calls = 0; /* the sequences whose attention is one call each, their arguments packed into r->args */
    for (int i = 0; i < r->n_seqs; i++) {
        const cp_fwd_seq *q = &r->seqs[i];
        cp_state *s = q->s;
        const size_t o = (size_t)q->off;
        cp_fwd_store_kv(m, s, 2, l, r->kt + o * kvd, kvd, q->slots, q->n);
        cp_attn_args *a = &r->args[calls++];
        *a = (cp_attn_args){
            .q = r->q + o * qd, .q_pos = r->qpos + o, .k_pos = s->pos, .out = r->att + o * qd,
            .n = q->n, .n_keys = q->n_keys, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
            .head_dim = c->head_dim, .window = c->window[l],
        };
        cp_fwd_attn_kv(m, s, l, a);
        const int skip = q->skip_out;
        if (!q->ex || (q->ex->layers && !q->ex->layers[l])) { /* no export from this layer */
            if (skip) { /* only the rows read after this layer */
                a->q += (size_t)skip * qd, a->q_pos += skip, a->out += (size_t)skip * qd, a->n -= skip;
                if (!a->n) calls--;
            }
            continue;
        }
        const float weight = 1.0f / ((float)c->n_heads * q->n_export);
        if (q->ex->want && (be->flags & CP_BE_ATTN_EXPORT_ONLY)) {
            attention_wanted_rows(be, a, q, weight, qd, skip);
            calls--; /* done */
        } else {
            a->export_a = s->export_tmp;
            a->export_ld = q->n_keys;
            a->export_weight = weight;
            if (q->want_sens) a->sens_cols = s->sens_dev, a->sens_mass = s->sens_mass_dev;
        }
    }
    /* several sequences' attention in one call where the backend batches
     * it (one fork and join for the step's decode rows, not one a
     * sequence); one sequence's is the plain op (the same bits either way) */
    if (calls > 1 && be->attention_batch) be->attention_batch(be, r->args, calls);
    else
        for (int i = 0; i < calls; i++) be->attention(be, &r->args[i]);
    attn_out_mlp_read_rows(m, r, w);
    cp_range_pop(be);
}

void cp_fwd_layers(cp_model *m, const cp_fwd_rows *r, int l0, int l1)
{
    for (int l = l0; l < l1; l++) cp_fwd_layer(m, r, l);
}

void cp_fwd_attn_out_mlp(cp_model *m, const cp_layer_weights *w, int n, float *x, float *xn, const float *att, float *gate, float *up)
{
    cp_backend *be = m->be;
    const cp_config *c = &m->cfg;
    be->matmul(be, x, c->hidden, att, &w->wo, NULL, n, (int)q_dim(c), c->hidden, 1);
    cp_range_pop(be);
    cp_range_push(be, "mlp");
    if (be->mlp && be->mlp(be, x, w->mlp_norm, c->rms_eps, n, c->hidden, &w->w_gate, &w->w_up, &w->w_down, c->intermediate)) {
        cp_range_pop(be);
        return;
    }
    const cp_mm_out gu[2] = { { gate, c->intermediate, &w->w_gate, NULL, c->intermediate }, { up, c->intermediate, &w->w_up, NULL, c->intermediate } };
    cp_fwd_norm_matmuls(be, xn, x, w->mlp_norm, c->rms_eps, n, c->hidden, gu, 2);
    if (!be->swiglu_matmul || !be->swiglu_matmul(be, x, c->hidden, gate, up, &w->w_down, n, c->intermediate, c->hidden, 1)) {
        be->swiglu(be, gate, gate, up, (size_t)n * c->intermediate);
        be->matmul(be, x, c->hidden, gate, &w->w_down, NULL, n, c->intermediate, c->hidden, 1);
    }
    cp_range_pop(be);
}

cp_status cp_fwd_kv_deviation(cp_model *m, cp_state *s, int l, int n, const int32_t *slots, float *dev, float *host, cp_error *err)
{
    const cp_config *c = &m->cfg;
    cp_backend *be = m->be;
    const size_t kvd = kv_dim(c);
    const cp_layer_weights *w = &m->layers[l];
    /* the layer's own K/V projections, as the layer loop makes them (the
     * fused norm and products where the backend fuses them) */
    const cp_mm_out kv[2] = { { s->kt, (int)kvd, &w->wk, w->bk, (int)kvd }, { s->vt, (int)kvd, &w->wv, w->bv, (int)kvd } };
    cp_fwd_norm_matmuls(be, s->xn, s->x, w->attn_norm, c->rms_eps, n, c->hidden, kv, 2);
    const size_t rows = (size_t)n * kvd;
    float *kf = host, *vf = kf + rows, *kc = vf + rows, *vc = kc + rows;
    cp_status rc;
    if ((rc = be->download(be, kf, s->kt, rows * sizeof(float), err)) || (rc = be->download(be, vf, s->vt, rows * sizeof(float), err)))
        return rc;
    /* the cache's rows at the slots: one download per run of consecutive slots */
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && slots[j] == slots[j - 1] + 1) j++;
        if ((rc = cp_state_read_kv(m, s, 0, l, slots[i], j - i, kc + (size_t)i * kvd, err)) ||
            (rc = cp_state_read_kv(m, s, 1, l, slots[i], j - i, vc + (size_t)i * kvd, err)))
            return rc;
        i = j;
    }
    for (int i = 0; i < n; i++) {
        const float *k1 = kf + (size_t)i * kvd, *v1 = vf + (size_t)i * kvd, *k0 = kc + (size_t)i * kvd, *v0 = vc + (size_t)i * kvd;
        double d = 0, norm = 0;
        for (size_t j = 0; j < kvd; j++) {
            d += ((double)k1[j] - k0[j]) * ((double)k1[j] - k0[j]) + ((double)v1[j] - v0[j]) * ((double)v1[j] - v0[j]);
            norm += (double)k1[j] * k1[j] + (double)v1[j] * v1[j];
        }
        dev[i] = (float)(norm > 0 ? d / norm : d);
    }
    return CP_OK;
}

void cp_fwd_state_rows(cp_state *s, int n, const int32_t *slots, int n_keys, const cp_export *ex, int n_export, int want_sens,
                       cp_fwd_seq *q, cp_attn_args *args, cp_fwd_rows *r)
{
    *q = (cp_fwd_seq){ .s = s, .off = 0, .n = n, .slots = slots, .n_keys = n_keys, .ex = ex, .n_export = n_export, .want_sens = want_sens };
    *r = (cp_fwd_rows){ .T = n, .x = s->x, .xn = s->xn, .q = s->q, .att = s->att, .kt = s->kt, .vt = s->vt, .gate = s->gate, .up = s->up,
                        .cos = s->cos, .sin = s->sin, .qpos = s->qpos, .seqs = q, .n_seqs = 1, .args = args };
}
