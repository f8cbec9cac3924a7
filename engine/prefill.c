/* A request's plan before its prefill: deviation selection, request-time
 * recompute methods, the computed tokens and the annotator's export (see
 * engine_internal.h). */
#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/log.h"
#include "engine_internal.h"

/* The recompute ratio R of the mode's policy. */
double cp_req_recompute_ratio(const cp_engine *e)
{
    return cp_cache_policy_of(e->cache)->chunk_ratio ? e->o.chunk_recompute : e->o.annot.r;
}

static int cmp_dev_desc(const void *a, const void *b)
{
    float x = ((const float *)a)[0], y = ((const float *)b)[0];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The deviation probe over a whole prompt (slot = position): dev[i] for
 * every token.  Its cost is part of the first token's. */
cp_status cp_req_deviation_probe(cp_engine *e, cp_state *st, const int32_t *ids, int n, float *dev, cp_error *err)
{
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) return cp_fail(err, CP_ENOMEM, "request: out of memory");
    for (int i = 0; i < n; i++) pos[i] = i;
    cp_status rc = cp_forward_deviation(e->m, st, ids, pos, pos, n, n, e->o.deviation_layer, dev, err);
    free(pos);
    return rc;
}

/* recompute_by_deviation: replaces the plan's recompute flags with the
 * reused tokens whose K/V at deviation_layer move most in this context */
cp_status cp_req_select_by_deviation(reqctx *c, cp_error *err)
{
    cp_engine *e = c->e;
    int T = c->T, n_reuse = 0;
    for (int i = 0; i < T; i++) n_reuse += c->state[i] != TOK_FRESH;
    if (!n_reuse || e->o.deviation_layer >= e->m->cfg.n_layers) return CP_OK;
    double r = cp_req_recompute_ratio(e);
    float *dev = malloc((size_t)T * sizeof *dev), (*rank)[2] = malloc((size_t)n_reuse * sizeof *rank);
    if (!dev || !rank) {
        free(dev), free(rank);
        return cp_fail(err, CP_ENOMEM, "request: out of memory");
    }
    cp_status rc = cp_req_deviation_probe(e, c->st, c->prompt.enc.ids, T, dev, err);
    if (rc == CP_OK) c->resp->partial_rows += T * e->o.deviation_layer; /* the probe's layers, over the whole prompt */
    if (rc == CP_OK) {
        int k = 0;
        for (int i = 0; i < T; i++)
            if (c->state[i] != TOK_FRESH) rank[k][0] = dev[i], rank[k][1] = (float)i, k++;
        qsort(rank, (size_t)n_reuse, sizeof *rank, cmp_dev_desc);
        int want = (int)ceil(r * n_reuse);
        for (int j = 0; j < n_reuse; j++) c->state[(int)rank[j][1]] = j < want ? TOK_RECOMPUTE : TOK_REUSED;
        if (c->state[T - 1] == TOK_REUSED) c->state[T - 1] = TOK_RECOMPUTE; /* its logits start decoding */
    }
    free(dev), free(rank);
    return rc;
}

/* the prefill's attention export for the annotator: the rows of its fresh
 * tokens only (want), the only rows it reads -- a reuse prefill's
 * recomputed rows are most of its computed ones */
cp_export cp_req_prefill_export(reqctx *c)
{
    return (cp_export){ .a = c->A, .ld = c->T, .sensitive = c->mask, .sens_mass = c->sens_mass, .a_on_backend = c->A_on_backend,
                        .rows = c->A_on_backend ? NULL : cp_req_band_rows, .rows_ctx = c, .want = c->fresh };
}

#define METHOD_EXPORT_FLOATS ((size_t)1 << 26) /* 256 MiB of fresh export rows held through the layers */

/* A request-time method runs when one is set and something was reused; a
 * prompt whose fresh rows' export would not fit the bound (the selective
 * prefill holds them all through the layers) takes the plan path. */
int cp_req_use_method(const reqctx *c, int need_export)
{
    const cp_engine *e = c->e;
    /* the baselines keep their own flags; --recompute-by deviation is the plan path's */
    if (e->o.recompute_method == CP_RECOMPUTE_PLAN || e->o.recompute_by_deviation || !cp_cache_policy_of(e->cache)->request_time) return 0;
    size_t fresh = 0, reused = 0;
    for (int i = 0; i < c->T; i++) fresh += c->state[i] == TOK_FRESH, reused += c->state[i] != TOK_FRESH;
    if (!reused) return 0;
    if (need_export && fresh * (size_t)c->T > METHOD_EXPORT_FLOATS) {
        cp_debug("request: %zu fresh rows of %d keys exceed the selective prefill's export bound: the plan path serves it", fresh, c->T);
        return 0;
    }
    return 1;
}

static cp_status method_prefill(reqctx *c, int need_export, float *logits, cp_error *err)
{
    cp_engine *e = c->e;
    cp_recompute_opts ro = { .method = e->o.recompute_method, .r = cp_req_recompute_ratio(e),
                             .start = e->o.gradual_start, .layer = e->o.deviation_layer, .k_first = e->o.annot.k0,
                             .tail = e->o.recompute_tail,
                             .per_segment = e->o.recompute_per_segment };
    cp_export ex = cp_req_prefill_export(c);
    /* the rows reach the band after the first token (request_store.c):
     * summing them is the annotator's work, not part of the wait for it */
    cp_recompute_in in = { .ids = c->prompt.enc.ids, .T = c->T, .seg_off = c->seg_off, .exact = c->exact, .ex = need_export ? &ex : NULL,
                           .held = need_export && ex.rows ? &c->held_export : NULL };
    cp_recompute_stats rs;
    cp_status rc = cp_recompute_prefill(e->m, c->st, &ro, &in, c->state, logits, &rs, err);
    if (rc == CP_OK) c->resp->partial_rows += rs.partial_rows;
    return rc;
}

/* What the prefill computes under the plan: the computed tokens (toks) at
 * their slots (= positions), counted into the response; with the
 * annotator's export (*need_export) ready in *ex. */
cp_status cp_req_prefill_inputs(reqctx *c, int by_method, float *logits, int32_t **slots_out, int32_t **toks_out, int *n_out,
                                cp_export *ex, int *need_export, cp_error *err)
{
    cp_engine *e = c->e;
    cp_response *resp = c->resp;
    cp_status rc = CP_OK;
    *need_export = cp_req_wants_export(e);
    int need = *need_export;
    int32_t *slots = NULL, *toks = NULL;
    int n = 0;
    resp->prompt_tokens = c->T;
    slots = malloc((size_t)c->T * sizeof *slots);
    toks = malloc((size_t)c->T * sizeof *toks);
    if (need) {
        cp_backend *be = e->m->be;
        c->sens_mass = calloc((size_t)c->T, sizeof *c->sens_mass);
        if (be->annot_open) { /* the export stays on the backend, annotated there */
            size_t bytes = (size_t)c->T * c->T * sizeof *c->A;
            c->A_on_backend = 1;
            rc = be->alloc(be, bytes, (void **)&c->A, err);
            if (rc == CP_OK) be->zero(be, c->A, bytes);
            if (rc == CP_OK) rc = be->alloc(be, (size_t)c->T, (void **)&c->mask_backend, err);
            if (rc == CP_OK) rc = be->upload(be, c->mask_backend, c->mask, (size_t)c->T, err);
        } else if (rc == CP_OK) {
            rc = cp_annot_band_init_kept(&c->band, c->T, &e->o.annot, &e->band_cells, err);
        }
        /* before the prefill: the band is cut into runs as rows arrive */
        if (rc == CP_OK) c->fresh = cp_req_annot_fresh(c);
        cp_req_stage(c, CP_STAGE_EXPORT);
    }
    if (rc == CP_OK && (!slots || !toks || (need && ((c->A_on_backend && !c->A) || !c->sens_mass || !c->fresh))))
        rc = cp_fail(err, CP_ENOMEM, "request: out of memory");
    if (rc == CP_OK && by_method) rc = method_prefill(c, need, logits, err); /* rewrites the plan: counted below */
    if (by_method) cp_req_stage(c, CP_STAGE_PREFILL);
    for (int i = 0; rc == CP_OK && i < c->T; i++) {
        if (c->state[i] == TOK_REUSED) {
            resp->reused++;
            resp->shared_reused += c->shared_hit[i];
            continue;
        }
        resp->computed++;
        resp->recomputed += c->state[i] == TOK_RECOMPUTE;
        resp->shared_recomputed += c->state[i] == TOK_RECOMPUTE && c->shared_hit[i];
        slots[n] = i;
        toks[n++] = c->prompt.enc.ids[i];
    }
    *ex = cp_req_prefill_export(c);
    if (rc) free(slots), free(toks), slots = toks = NULL, n = 0;
    *slots_out = slots, *toks_out = toks, *n_out = n;
    return rc;
}

/* The plan into the response (for --plan-out), after the prefill. */
void cp_req_keep_plan(reqctx *c)
{
    cp_response *resp = c->resp;
    resp->prompt_ids = malloc((size_t)c->T * sizeof *resp->prompt_ids);
    resp->plan = malloc((size_t)c->T);
    resp->sensitive = malloc((size_t)c->T);
    resp->plan_flags = malloc((size_t)c->T);
    if (resp->prompt_ids && resp->plan && resp->sensitive && resp->plan_flags) {
        memcpy(resp->prompt_ids, c->prompt.enc.ids, (size_t)c->T * sizeof *resp->prompt_ids);
        memcpy(resp->plan, c->state, (size_t)c->T);
        for (int t = 0; t < c->T; t++) {
            uint8_t fl = 0;
            if (c->state[t] != TOK_FRESH && c->seg_off[t] == 0) fl |= CP_PLAN_SEG_START;
            if (c->state[t] == TOK_REUSED && c->exact[t] && t != c->T - 1) fl |= CP_PLAN_EXACT;
            resp->plan_flags[t] = fl;
        }
        memcpy(resp->sensitive, c->mask, (size_t)c->T);
    } else { /* out of memory: no plan rather than an uninitialised one (--plan-out skips a request without) */
        free(resp->prompt_ids), free(resp->plan), free(resp->sensitive), free(resp->plan_flags);
        resp->prompt_ids = NULL, resp->plan = NULL, resp->sensitive = NULL, resp->plan_flags = NULL;
    }
}

