/* The selective prefill (forward_select.h): the layer loop
 * (forward_layer.c) run layer-major over a token set that shrinks by KV
 * deviation, which rows and which layers its inputs.  Hidden states
 * of the set live in one backend buffer between layers; each layer runs in
 * chunks of the state's max_batch. */
#include "forward_select.h"

#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"

static size_t kvd_of(const cp_config *c) { return (size_t)c->n_kv_heads * c->head_dim; }

typedef struct sel {
    cp_model *m;
    cp_state *s;
    const cp_select_args *a;
    float *X;           /* backend [n][hidden]: row j is candidate cur[j] */
    int *cur, ncur;     /* candidates still computed, ascending */
    int32_t *ct, *cp, *cs; /* one chunk's tokens, positions, slots (host) */
    float *host;        /* deviation scratch: 4 x max_batch x kv_dim */
    float *dev;         /* [n] */
    float *dk;          /* one chunk's deviations: max_batch */
    /* export of the fixed candidates */
    int *fixrow;        /* [n]: row in E, -1 when not fixed */
    int n_fixed, n_export, want_sens;
    float *E, *sensm;   /* host [n_fixed][n_keys], [n_fixed] */
    int *exrow;         /* one chunk's rows' E rows (direct export): max_batch */
} sel;

static cp_status check_args(const cp_model *m, const cp_state *s, const cp_select_args *a, cp_error *err)
{
    cp_status rc = check_at(m, s, a->tokens, a->pos, a->slots, a->n, a->n_keys, err);
    if (rc) return rc;
    if (!a->fixed[a->n - 1]) return cp_fail(err, CP_EINVAL, "select: the last candidate (its logits) must be computed at every layer");
    int free_n = 0;
    for (int i = 0; i < a->n; i++) free_n += !a->fixed[i];
    if (a->keep[0] != free_n) return cp_fail(err, CP_EINVAL, "select: layer 0 computes all %d ranked candidates, not %d", free_n, a->keep[0]);
    for (int l = 1; l < m->cfg.n_layers; l++)
        if (a->keep[l] < 0 || a->keep[l] > a->keep[l - 1])
            return cp_fail(err, CP_EINVAL, "select: layer %d keeps %d of %d (the set only shrinks)", l, a->keep[l], a->keep[l - 1]);
    if (a->ex && !a->ex->rows && a->ex->ld < a->n_keys)
        return cp_fail(err, CP_EINVAL, "select: export row stride %d is less than the %d keys", a->ex->ld, a->n_keys);
    return CP_OK;
}

/* candidate rows [j0, j0 + k) of the current set into the chunk arrays */
static void gather(sel *g, int j0, int k)
{
    for (int j = 0; j < k; j++) {
        int i = g->cur[j0 + j];
        g->ct[j] = g->a->tokens[i], g->cp[j] = g->a->pos[i], g->cs[j] = g->a->slots[i];
    }
}

/* dev[cur[j]] for the current set: the layer loop's deviation probe at
 * layer l (forward_layer.c, as cp_forward_deviation), chunk by chunk */
static cp_status deviation_at(sel *g, int l, cp_error *err)
{
    cp_model *m = g->m;
    cp_state *s = g->s;
    const size_t hid = (size_t)m->cfg.hidden;
    cp_status rc = CP_OK;
    for (int j0 = 0; j0 < g->ncur && rc == CP_OK; j0 += s->max_batch) {
        int k = g->ncur - j0 < s->max_batch ? g->ncur - j0 : s->max_batch;
        gather(g, j0, k);
        m->be->copy(m->be, s->x, g->X + (size_t)j0 * hid, (size_t)k * hid * sizeof(float));
        rc = cp_fwd_kv_deviation(m, s, l, k, g->cs, g->dk, g->host, err);
        for (int j = 0; rc == CP_OK && j < k; j++) g->dev[g->cur[j0 + j]] = g->dk[j];
    }
    return rc;
}

/* a ranked candidate: its deviation and index; largest first, ties by index (deterministic) */
typedef struct ranked_c {
    float d;
    int i;
} ranked_c;

static int cmp_rank(const void *x, const void *y)
{
    const ranked_c *a = x, *b = y;
    return a->d > b->d ? -1 : a->d < b->d ? 1 : (a->i > b->i) - (a->i < b->i);
}

static int cmp_int(const void *x, const void *y) { return (*(const int *)x > *(const int *)y) - (*(const int *)x < *(const int *)y); }

/* Keeps the fixed candidates and the `keep` ranked ones that deviate most;
 * the hidden-state rows follow their candidates. */
static cp_status shrink(sel *g, int l, int keep, cp_error *err)
{
    cp_status rc = deviation_at(g, l, err);
    if (rc) return rc;
    int *next = malloc((size_t)g->ncur * sizeof *next), *rowof = malloc((size_t)g->a->n * sizeof *rowof);
    ranked_c *rk = malloc((size_t)g->ncur * sizeof *rk);
    if (!next || !rowof || !rk) {
        free(next), free(rowof), free(rk);
        return cp_fail(err, CP_ENOMEM, "select: out of memory ranking %d candidates", g->ncur);
    }
    int nr = 0, nk = 0;
    for (int j = 0; j < g->ncur; j++) {
        rowof[g->cur[j]] = j;
        if (!g->a->fixed[g->cur[j]]) rk[nr++] = (ranked_c){ g->dev[g->cur[j]], g->cur[j] };
    }
    qsort(rk, (size_t)nr, sizeof *rk, cmp_rank);
    for (int j = 0; j < keep && j < nr; j++) next[nk++] = rk[j].i;
    for (int j = 0; j < g->ncur; j++)
        if (g->a->fixed[g->cur[j]]) next[nk++] = g->cur[j];
    free(rk);
    int nn = nk;
    qsort(next, (size_t)nn, sizeof *next, cmp_int);
    cp_backend *be = g->m->be;
    size_t hid = (size_t)g->m->cfg.hidden;
    for (int j = 0; j < nn; j++) { /* rowof[next[j]] >= j: moving rows down never overwrites one still needed */
        int from = rowof[next[j]];
        if (from != j) be->copy(be, g->X + (size_t)j * hid, g->X + (size_t)from * hid, hid * sizeof(float));
        g->cur[j] = next[j];
    }
    g->ncur = nn;
    free(next), free(rowof);
    return CP_OK;
}

static int exported(const cp_export *ex, int l) { return ex && (!ex->layers || ex->layers[l]); }

/* the chunk's export rows of fixed candidates added into E, its sensitive
 * masses maxed into sensm */
static cp_status collect_export(sel *g, int j0, int k, cp_error *err)
{
    cp_backend *be = g->m->be;
    cp_state *s = g->s;
    const size_t nk = (size_t)g->a->n_keys;
    cp_status rc = be->download(be, s->export_host, s->export_tmp, (size_t)k * nk * sizeof(float), err);
    for (int j = 0; rc == CP_OK && j < k; j++) {
        int r = g->fixrow[g->cur[j0 + j]];
        if (r < 0) continue;
        float *dst = g->E + (size_t)r * nk;
        const float *src = s->export_host + (size_t)j * nk;
        for (size_t t = 0; t < nk; t++) dst[t] += src[t];
    }
    if (rc == CP_OK && g->want_sens) {
        float *tmp = s->export_host; /* k floats fit: the rows above are consumed */
        rc = be->download(be, tmp, s->sens_mass_dev, (size_t)k * sizeof(float), err);
        for (int j = 0; rc == CP_OK && j < k; j++) {
            int r = g->fixrow[g->cur[j0 + j]];
            if (r >= 0 && tmp[j] > g->sensm[r]) g->sensm[r] = tmp[j];
        }
    }
    return rc;
}

/* Whether the chunk's wanted rows can take their export straight into E
 * (cp_fwd_seq.ex_to): a backend of host memory that exports only the rows
 * it is asked for, and every wanted row fixed (an E row) with a run of
 * them in consecutive E rows -- true by construction (the wanted rows are
 * fixed candidates, and fixed ones are never dropped), checked anyway.
 * Then no per-chunk buffer is zeroed, copied back and added each layer:
 * the rows add over the layers in place, as cp_forward_at's chunk buffer
 * does (the same sums). */
static int direct_export(sel *g, int j0, int k)
{
    const cp_export *ex = g->a->ex;
    const unsigned need = CP_BE_HOST_MEMORY | CP_BE_ATTN_EXPORT_ONLY;
    if (!ex || !ex->want || (g->m->be->flags & need) != need || !g->exrow) return 0;
    for (int j = 0; j < k; j++) {
        g->exrow[j] = g->fixrow[g->cur[j0 + j]];
        if (!ex->want[g->cs[j]]) continue;
        if (g->exrow[j] < 0) return 0;
        if (j > 0 && ex->want[g->cs[j - 1]] && g->exrow[j] != g->exrow[j - 1] + 1) return 0;
    }
    return 1;
}

/* layer l over the current set, in chunks */
static cp_status run_layer(sel *g, int l, cp_error *err)
{
    cp_model *m = g->m;
    cp_state *s = g->s;
    cp_backend *be = m->be;
    const cp_config *c = &m->cfg;
    const cp_export *ex = exported(g->a->ex, l) ? g->a->ex : NULL;
    cp_status rc = CP_OK;
    for (int j0 = 0; j0 < g->ncur && rc == CP_OK; j0 += s->max_batch) {
        int k = g->ncur - j0 < s->max_batch ? g->ncur - j0 : s->max_batch;
        gather(g, j0, k);
        if ((rc = chunk_inputs(m, s, g->ct, g->cp, g->cs, k, g->a->n_keys, err))) break;
        float *xr = g->X + (size_t)j0 * c->hidden;
        if (l == 0) be->embed(be, s->x, &m->embed, s->ids, k, c->hidden);
        else be->copy(be, s->x, xr, (size_t)k * c->hidden * sizeof(float));
        const int direct = ex && direct_export(g, j0, k);
        if (ex && !direct) {
            be->zero(be, s->export_tmp, (size_t)k * g->a->n_keys * sizeof(float));
            if (g->want_sens) be->zero(be, s->sens_mass_dev, (size_t)k * sizeof(float));
        }
        cp_fwd_seq q;
        cp_attn_args args;
        cp_fwd_rows r;
        cp_fwd_state_rows(s, k, g->cs, g->a->n_keys, ex, g->n_export, ex && g->want_sens, &q, &args, &r);
        if (direct) q.ex_to = g->E, q.sens_to = g->sensm, q.ex_row = g->exrow;
        /* the last layer: only the last candidate's hidden state is read after it (its logits) */
        if (l == c->n_layers - 1) q.skip_out = j0 + k == g->ncur ? k - 1 : k;
        cp_fwd_layer(m, &r, l);
        be->copy(be, xr, s->x, (size_t)k * c->hidden * sizeof(float));
        if (ex && !direct) rc = collect_export(g, j0, k, err);
    }
    return rc;
}

/* the rows' sensitive masses (n, at slots) into the export, where it wants them */
static void deliver_sens(const cp_export *ex, const float *sensm, const int32_t *slots, int n)
{
    if (ex->sensitive && ex->sens_mass)
        for (int r = 0; r < n; r++) ex->sens_mass[slots[r]] = sensm[r];
}

/* Rows E (n of n_keys floats, at slots) to the export's consumer, as
 * cp_forward_at delivers them; the sensitive masses first (rows() may read
 * them).  run: the most rows a rows() call takes. */
static cp_status deliver_rows(const cp_export *ex, const float *E, const float *sensm, const int32_t *slots, int n, int nk, int run,
                              cp_error *err)
{
    deliver_sens(ex, sensm, slots, n);
    cp_status rc = CP_OK;
    if (ex->rows) { /* runs of wanted rows: an unwanted one is a zero row, which its consumer takes as given by skipping it */
        for (int r0 = 0, r1; r0 < n && rc == CP_OK; r0 = r1) {
            const int want = !ex->want || ex->want[slots[r0]];
            for (r1 = r0 + 1; r1 < n && r1 - r0 < run && (!ex->want || ex->want[slots[r1]]) == want;) r1++;
            if (want) rc = ex->rows(ex->rows_ctx, E + (size_t)r0 * nk, (size_t)nk, slots + r0, r1 - r0, err);
        }
    }
    return rc;
}

/* the fixed candidates' slots, in E's row order (NULL: out of memory) */
static int32_t *fixed_slots(const sel *g)
{
    int32_t *slots = malloc((size_t)(g->n_fixed ? g->n_fixed : 1) * sizeof *slots);
    if (slots)
        for (int i = 0; i < g->a->n; i++)
            if (g->fixrow[i] >= 0) slots[g->fixrow[i]] = g->a->slots[i];
    return slots;
}

/* E's rows to the export's consumer, as cp_forward_at delivers them, or
 * into a->held (E and the masses move there) */
static cp_status deliver_export(sel *g, cp_error *err)
{
    const cp_export *ex = g->a->ex;
    cp_backend *be = g->m->be;
    const int nk = g->a->n_keys;
    int32_t *slots = fixed_slots(g);
    if (!slots) return cp_fail(err, CP_ENOMEM, "select: out of memory delivering the export");
    cp_status rc = CP_OK;
    if (g->a->held && ex->rows) {
        cp_select_held *h = g->a->held;
        cp_select_held_free(h);
        *h = (cp_select_held){ .E = g->E, .sensm = g->sensm, .slots = slots, .n = g->n_fixed, .n_keys = nk, .run = g->s->max_batch };
        g->E = NULL, g->sensm = NULL;
        return CP_OK;
    }
    if (ex->rows) {
        rc = deliver_rows(ex, g->E, g->sensm, slots, g->n_fixed, nk, g->s->max_batch, err);
    } else {
        deliver_sens(ex, g->sensm, slots, g->n_fixed);
        for (int r = 0; r < g->n_fixed && rc == CP_OK; r++) {
            float *dst = ex->a + (size_t)slots[r] * ex->ld;
            if (ex->a_on_backend) rc = be->upload(be, dst, g->E + (size_t)r * nk, (size_t)nk * sizeof(float), err);
            else memcpy(dst, g->E + (size_t)r * nk, (size_t)nk * sizeof(float));
        }
    }
    free(slots);
    return rc;
}

cp_status cp_select_held_deliver(cp_select_held *h, const cp_export *ex, cp_error *err)
{
    cp_status rc = h->E ? deliver_rows(ex, h->E, h->sensm, h->slots, h->n, h->n_keys, h->run, err) : CP_OK;
    cp_select_held_free(h);
    return rc;
}

void cp_select_held_free(cp_select_held *h)
{
    free(h->E), free(h->sensm), free(h->slots);
    memset(h, 0, sizeof *h);
}

static cp_status prepare_export(sel *g, cp_error *err)
{
    const cp_export *ex = g->a->ex;
    cp_model *m = g->m;
    cp_state *s = g->s;
    cp_backend *be = m->be;
    for (int l = 0; l < m->cfg.n_layers; l++) g->n_export += exported(ex, l);
    g->want_sens = ex->sensitive && ex->sens_mass;
    g->E = calloc((size_t)g->n_fixed * g->a->n_keys + 1, sizeof *g->E);
    g->sensm = calloc((size_t)g->n_fixed + 1, sizeof *g->sensm);
    g->exrow = malloc((size_t)s->max_batch * sizeof *g->exrow);
    if (!g->E || !g->sensm || !g->exrow) return cp_fail(err, CP_ENOMEM, "select: out of memory for %d export rows", g->n_fixed);
    cp_status rc = grow_export(m, s, (size_t)s->max_batch, g->a->n_keys, err);
    if (rc == CP_OK && g->want_sens && !s->sens_dev &&
        ((rc = be->alloc(be, (size_t)s->capacity, (void **)&s->sens_dev, err)) ||
         (rc = be->alloc(be, (size_t)s->capacity * sizeof(float), (void **)&s->sens_mass_dev, err))))
        return rc;
    if (rc == CP_OK && g->want_sens) rc = be->upload(be, s->sens_dev, ex->sensitive, (size_t)g->a->n_keys, err);
    return rc;
}

/* the last candidate's logits from its final hidden state */
static cp_status last_logits(sel *g, float *logits, cp_error *err)
{
    cp_model *m = g->m;
    cp_state *s = g->s;
    cp_backend *be = m->be;
    const cp_config *c = &m->cfg;
    be->copy(be, s->x, g->X + (size_t)(g->ncur - 1) * c->hidden, (size_t)c->hidden * sizeof(float));
    be->rmsnorm(be, s->xn, s->x, m->final_norm, 1, c->hidden, c->rms_eps);
    be->matmul(be, s->logits, c->vocab, s->xn, &m->lm_head, NULL, 1, c->hidden, c->vocab, 0);
    return be->download(be, logits, s->logits, (size_t)c->vocab * sizeof(float), err);
}

static void sel_free(cp_model *m, sel *g)
{
    if (g->X) m->be->free(m->be, g->X);
    free(g->cur), free(g->ct), free(g->cp), free(g->cs), free(g->host), free(g->dev), free(g->dk), free(g->fixrow), free(g->E), free(g->sensm), free(g->exrow);
}

static cp_status layers(sel *g, uint8_t *depth, cp_error *err)
{
    const cp_select_args *a = g->a;
    cp_status rc = CP_OK;
    int ranked = a->keep[0];
    for (int l = 0; l < g->m->cfg.n_layers && rc == CP_OK; l++) {
        if (l > 0 && a->keep[l] < ranked) {
            rc = shrink(g, l, a->keep[l], err);
            ranked = a->keep[l];
        }
        if (rc == CP_OK) rc = run_layer(g, l, err);
        for (int j = 0; depth && rc == CP_OK && j < g->ncur; j++) depth[g->cur[j]]++;
    }
    return rc;
}

cp_status cp_forward_select(cp_model *m, cp_state *s, const cp_select_args *a, float *logits, uint8_t *depth, cp_error *err)
{
    if (!a || a->n < 1 || !a->fixed || !a->keep || !logits) return cp_fail(err, CP_EINVAL, "select: no candidates or no logits buffer");
    cp_status rc = check_args(m, s, a, err);
    if (rc) return rc;
    const cp_config *c = &m->cfg;
    size_t B = (size_t)s->max_batch, n = (size_t)a->n;
    sel g = { .m = m, .s = s, .a = a, .ncur = a->n };
    g.cur = malloc(n * sizeof *g.cur);
    g.ct = malloc(B * sizeof *g.ct), g.cp = malloc(B * sizeof *g.cp), g.cs = malloc(B * sizeof *g.cs);
    g.host = malloc(4 * B * kvd_of(c) * sizeof *g.host);
    g.dev = calloc(n, sizeof *g.dev);
    g.dk = malloc(B * sizeof *g.dk);
    g.fixrow = malloc(n * sizeof *g.fixrow);
    if (!g.cur || !g.ct || !g.cp || !g.cs || !g.host || !g.dev || !g.dk || !g.fixrow) rc = cp_fail(err, CP_ENOMEM, "select: out of memory for %d candidates", a->n);
    if (rc == CP_OK) rc = m->be->alloc(m->be, n * c->hidden * sizeof(float), (void **)&g.X, err);
    for (int i = 0; rc == CP_OK && i < a->n; i++) {
        g.cur[i] = i;
        g.fixrow[i] = a->fixed[i] ? g.n_fixed++ : -1;
        s->pos_host[a->slots[i]] = a->pos[i]; /* every computed slot's position first, as cp_forward_at */
    }
    if (depth) memset(depth, 0, n);
    if (rc == CP_OK && a->ex) rc = prepare_export(&g, err);
    cp_range_push(m->be, "prefill");
    if (rc == CP_OK) rc = layers(&g, depth, err);
    if (rc == CP_OK) rc = last_logits(&g, logits, err);
    if (rc == CP_OK && a->ex) rc = deliver_export(&g, err);
    cp_range_pop(m->be);
    if (rc == CP_OK) rc = m->be->sync(m->be, err);
    if (rc == CP_OK) {
        if (a->n_keys > s->n) s->n = a->n_keys;
        int32_t top = s->next_pos - 1;
        for (int j = 0; j < s->n; j++)
            if (s->pos_host[j] > top) top = s->pos_host[j];
        s->next_pos = top + 1;
    }
    sel_free(m, &g);
    return rc;
}
