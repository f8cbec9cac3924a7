/* After a request's first token: the annotator over its export, canonical
 * runs, and the stores through the cache manager (see engine_internal.h). */
#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/log.h"
#include "engine_internal.h"

/* The annotator's per-row inputs of a request (A: the dense export on a
 * backend that keeps it; else c->band holds what it reads) */
static cp_annot_input annot_input(const reqctx *c)
{
    return (cp_annot_input){ c->A, (size_t)c->T, c->T, c->fresh, c->mask, c->sens_mass, c->prompt.msg, NULL };
}

/* The annotator's fresh tokens: computed by this request, and (strict)
 * before its first sensitive token; NULL when out of memory */
uint8_t *cp_req_annot_fresh(const reqctx *c)
{
    uint8_t *fresh = malloc((size_t)c->T);
    if (!fresh) return NULL;
    int seen_sensitive = 0;
    for (int t = 0; t < c->T; t++) {
        seen_sensitive |= c->mask[t];
        fresh[t] = c->state[t] == TOK_FRESH && !(c->e->o.segment_kv == CP_SEGKV_STRICT && seen_sensitive);
    }
    return fresh;
}

/* cp_export.rows: each prefill chunk's finished rows into the band */
cp_status cp_req_band_rows(void *ctx, const float *rows, size_t ld, const int32_t *slots, int n, cp_error *err)
{
    reqctx *c = ctx;
    if (!c->export_late) cp_req_stage(c, CP_STAGE_PREFILL); /* the rows' layers ran until now */
    cp_annot_input in = annot_input(c);
    cp_status rc = cp_annot_band_add(&c->band, &in, rows, ld, slots, n, err);
    if (!c->export_late) cp_req_stage(c, CP_STAGE_EXPORT);
    return rc;
}

/* canonical: one run's rows into its own band */
typedef struct canon_band {
    cp_annot_band band;
    cp_annot_input in;
} canon_band;

static cp_status canon_rows(void *ctx, const float *rows, size_t ld, const int32_t *slots, int n, cp_error *err)
{
    canon_band *cb = ctx;
    return cp_annot_band_add(&cb->band, &cb->in, rows, ld, slots, n, err);
}

/* Stores annotator segments of one computed sequence (the request, or a
 * canonical recomputation) whose position p is request token p + off. */
static cp_status store_segments(reqctx *c, cp_state *st, const int32_t *tokens, const cp_annot_result *ar, int off, cp_error *err)
{
    cp_status rc = CP_OK;
    for (size_t k = 0; k < ar->n && rc == CP_OK; k++) {
        const cp_annot_segment *g = &ar->v[k];
        rc = cp_cache_store_segment(c->store, st, tokens, g->start, g->len, g->recompute, off, st == c->st, err);
    }
    return rc;
}

/* canonical: each fresh, non-sensitive, shared-eligible run of one message
 * alone (BOS + run), annotated from its own attention, stored with that KV */
static cp_status store_canonical(reqctx *c, cp_error *err)
{
    cp_engine *e = c->e;
    int bos = cp_tokenizer_bos(e->tok);
    cp_status rc = CP_OK;
    for (int i = 0; i < c->T && rc == CP_OK;) {
        if (c->state[i] != TOK_FRESH || c->mask[i] || !c->eligible[i]) {
            i++;
            continue;
        }
        /* a run never crosses a message: each message is recomputed in its
         * own context, so nothing before it (an injection) shapes its KV */
        int j = i;
        while (j < c->T && c->state[j] == TOK_FRESH && !c->mask[j] && c->eligible[j] && c->prompt.msg[j] == c->prompt.msg[i]) j++;
        int head = bos >= 0 && c->prompt.enc.ids[i] != bos ? 1 : 0, n = head + (j - i);
        if (j - i >= e->o.annot.min_len) {
            int32_t *toks = malloc((size_t)n * sizeof *toks);
            uint8_t *fresh = malloc((size_t)n);
            cp_annot_result ar = { 0 };
            canon_band cb = { 0 };
            if (!toks || !fresh) rc = cp_fail(err, CP_ENOMEM, "canonical: out of memory");
            if (rc == CP_OK) rc = cp_annot_band_init(&cb.band, n, &e->o.annot, err);
            if (rc == CP_OK) rc = cp_engine_grow_state(e, &e->canon, n, err);
            if (rc == CP_OK) {
                if (head) toks[0] = bos;
                memcpy(toks + head, c->prompt.enc.ids + i, (size_t)(j - i) * sizeof *toks);
                memset(fresh, 1, (size_t)n);
                fresh[0] = !head; /* the sink is never part of a segment */
                cb.in = (cp_annot_input){ NULL, (size_t)n, n, fresh, NULL, NULL, NULL, NULL };
                cp_export ex = { .rows = canon_rows, .rows_ctx = &cb };
                rc = cp_state_reset(e->m, e->canon, err);
                if (rc == CP_OK) rc = cp_forward(e->m, e->canon, toks, NULL, n, CP_LOGITS_NONE, NULL, &ex, err);
                if (rc == CP_OK) rc = cp_annotate_band(&cb.in, &cb.band, &e->o.annot, &ar, err);
                /* every token here is shared-eligible: run position p is request token i - head + p */
                if (rc == CP_OK) rc = store_segments(c, e->canon, toks, &ar, i - head, err);
            }
            cp_annot_result_free(&ar);
            cp_annot_band_free(&cb.band);
            free(toks), free(fresh);
        }
        i = j;
    }
    if (rc == CP_OK) rc = cp_state_reset(e->m, e->canon, err);
    return rc;
}

/* The stores after the first token: the policy's store of the prompt, then
 * (cacheprune) the annotator's segments of the request, or canonical runs. */
cp_status cp_req_store(reqctx *c, cp_error *err)
{
    cp_engine *e = c->e;
    const cp_cache_policy *pol = cp_cache_policy_of(e->cache);
    const int32_t *ids = c->prompt.enc.ids;
    int T = c->T;
    cp_cache_req r = cp_req_cache_view(c);
    cp_status rc = cp_cache_writer_open(e->cache, &r, c->state, c->exact, c->shared_hit, &c->store, err);
    if (rc == CP_OK) rc = cp_cache_store_prompt(c->store, c->st, err);
    if (pol->segments && (rc || e->o.segment_kv == CP_SEGKV_CANONICAL)) {
        cp_req_stage(c, CP_STAGE_STORE);
        if (rc == CP_OK) rc = store_canonical(c, err); /* its runs' forwards, bands and inserts */
        cp_req_stage(c, CP_STAGE_ANNOTATE);
    } else if (pol->segments) {
        /* runs end at message boundaries (group = message): a document is
         * segmented from its own rows alone, the same whatever follows it */
        cp_annot_input in = annot_input(c);
        cp_annot_result ar = { 0 };
        cp_annot_dev dev = { 0 };
        cp_backend *be = e->m->be;
        cp_req_stage(c, CP_STAGE_STORE); /* the private insert above */
        cp_range_push(be, "annotate");
        if (c->held_export.E) { /* a selective prefill's rows, kept past the first token */
            cp_export ex = cp_req_prefill_export(c);
            c->export_late = 1;
            rc = cp_select_held_deliver(&c->held_export, &ex, err);
            c->export_late = 0;
        }
        if (c->A_on_backend) { /* the O(T^2) part next to the export */
            rc = be->annot_open(be, c->A, (size_t)T, T, c->mask_backend, &dev, err);
            in.dev = &dev;
        }
        if (rc == CP_OK) rc = c->A_on_backend ? cp_annotate(&in, &e->o.annot, &ar, err) : cp_annotate_band(&in, &c->band, &e->o.annot, &ar, err);
        if (dev.ctx) be->annot_close(be, &dev);
        cp_range_pop(be);
        cp_req_stage(c, CP_STAGE_ANNOTATE);
        if (rc == CP_OK) rc = store_segments(c, c->st, ids, &ar, 0, err);
        cp_annot_result_free(&ar);
    }
    int segs, shared, priv;
    cp_cache_writer_close(c->store, &segs, &shared, &priv);
    c->store = NULL;
    c->resp->segments_stored += segs, c->resp->shared_stored += shared, c->resp->private_stored += priv;
    cp_req_stage(c, CP_STAGE_STORE);
    return rc;
}

/* Whether the prefill exports its attention for the annotator: the policy
 * stores the annotator's segments of the request itself (not canonical
 * runs). */
int cp_req_wants_export(const cp_engine *e)
{
    return cp_cache_policy_of(e->cache)->segments && e->o.segment_kv != CP_SEGKV_CANONICAL;
}

