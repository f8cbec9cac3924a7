/* The request path in phases (request.h: cp_job_*), and cp_engine_run as
 * a batch of one through them. */
#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/log.h"
#include "engine_internal.h"

/* Whether a request's KV may go into the pool after its first token: not
 * when it asked for no-store, nor when its client has already left (a
 * cancelled request stores nothing, never half). */
static int may_store(const cp_request *req)
{
    return !req->no_store && !(req->cancelled && req->cancelled(req->piece_ctx));
}

/* One token's text to the request's on_piece; 1 when it asks to stop. */
static int stream_piece(cp_detok_stream *ds, const cp_request *req, int32_t id, cp_status *rc, cp_error *err)
{
    char *piece = NULL;
    if ((*rc = cp_detok_stream_push(ds, id, &piece, err))) return 1;
    int stop = req->on_piece(req->piece_ctx, piece, strlen(piece));
    free(piece);
    return stop;
}

cp_status cp_job_create(cp_engine *e, const cp_request *req, cp_response *resp, cp_job **out, cp_error *err)
{
    *out = NULL;
    memset(resp, 0, sizeof *resp);
    cp_job *j = cp_calloc(1, sizeof *j, "request job", err);
    if (!j) return CP_ENOMEM;
    j->t0 = cp_now_ms();
    j->c = (reqctx){ .e = e, .req = req, .resp = resp, .mark = j->t0 };
    cp_status rc = cp_req_prepare(&j->c, err);
    if (rc) {
        cp_req_free(&j->c);
        free(j);
        return rc;
    }
    *out = j;
    return CP_OK;
}

int cp_job_prompt_tokens(const cp_job *j) { return j->c.T; }

cp_status cp_engine_check_request(const cp_engine *e, const cp_request *req, int *prompt_tokens, cp_error *err)
{
    *prompt_tokens = 0;
    cp_response none = { 0 };
    reqctx c = { .e = (cp_engine *)e, .req = req, .resp = &none }; /* render_checked reads e only */
    cp_status rc = cp_req_render(&c, err);
    *prompt_tokens = c.T;
    cp_req_rendered_free(&c); /* nothing else was made: no pool, no pins */
    return rc;
}

int cp_engine_context(const cp_engine *e) { return e->cap; }

cp_status cp_job_peek_hits(cp_job *j, int *tokens, cp_error *err)
{
    reqctx *c = &j->c;
    *tokens = 0;
    if (j->begun) return cp_fail(err, CP_EINVAL, "job: hits peeked after it retrieved");
    if (!cp_cache_pool(c->e->cache)) return CP_OK;
    cp_req_stage(c, CP_STAGE_QUEUE);
    cp_status rc = cp_req_lookup(c, err);
    if (rc == CP_OK) *tokens = cp_cache_hit_tokens(c->hits);
    if (c->hits) cp_cache_release(c->e->cache, c->hits); /* the look-up's pins: a peek keeps none */
    return rc;
}

cp_status cp_job_begin(cp_job *j, cp_error *err)
{
    reqctx *c = &j->c;
    cp_engine *e = c->e;
    const cp_request *req = c->req;
    if (j->begun) return cp_fail(err, CP_EINVAL, "job: begun twice");
    j->begun = 1;
    if (!j->alone) cp_req_stage(c, CP_STAGE_QUEUE); /* from submission (or its last peek) until now */
    /* batched: its own KV, sized for this request, with the engine's
     * internal chunk: the step's activations live in the batch workspace,
     * but a request-time recompute method runs its layers here in chunks of
     * max_batch, and its deviation ranking must be the one a lone run
     * computes (a GEMM's summation order moves with the chunk's row count);
     * alone: the engine's KV state, grown to fit, kept between requests
     * (zeroed after each) */
    cp_status rc = CP_OK;
    if (j->alone) {
        if (rc == CP_OK) rc = cp_engine_grow_state(e, &e->st, c->T + req->max_tokens, err);
        if (rc == CP_OK) rc = cp_state_reset(e->m, e->st, err);
        c->st = e->st;
    } else {
        rc = cp_state_create_kv(e->m, c->T + req->max_tokens, STATE_BATCH, e->o.kv_dtype, &c->st, err);
    }
    cp_req_stage(c, CP_STAGE_PLACEMENT);
    cp_range_push(e->m->be, "retrieve");
    if (rc == CP_OK) rc = cp_req_lookup(c, err);
    cp_range_pop(e->m->be);
    if (rc == CP_OK) rc = cp_req_place(c, err);
    cp_req_stage(c, CP_STAGE_PLACEMENT);
    int need_export = cp_req_wants_export(e);
    int by_method = rc == CP_OK && cp_req_use_method(c, need_export);
    if (rc == CP_OK && e->o.recompute_by_deviation && !by_method) {
        rc = cp_req_select_by_deviation(c, err);
        cp_req_stage(c, CP_STAGE_SELECTION);
    }
    if (rc == CP_OK && !(j->logits = cp_malloc((size_t)e->m->cfg.vocab * sizeof *j->logits, "job logits", err))) rc = CP_ENOMEM;
    /* a request-time recompute method (the default, epic) selects layer by
     * layer over the whole prompt: it runs here, for this request alone, and
     * leaves the steps nothing to prefill — its first token comes from the
     * logits it wrote, at the step its last chunk is scheduled */
    if (rc == CP_OK) rc = cp_req_prefill_inputs(c, by_method, j->logits, &j->slots, &j->toks, &j->n, &j->ex, &j->need_export, err);
    if (rc == CP_OK && by_method) { /* nothing left for the steps: its ids are wiped now, their count goes */
        if (j->toks) OPENSSL_cleanse(j->toks, (size_t)j->n * sizeof *j->toks);
        j->n = 0;
    }
    /* every computed slot's position before the first chunk, as cp_forward_at does */
    if (rc == CP_OK) rc = cp_state_set_positions(c->st, j->slots, j->slots, j->n, err);
    if (rc == CP_OK && req->max_tokens > 0 && !(c->resp->ids = cp_malloc((size_t)req->max_tokens * sizeof *c->resp->ids, "job ids", err)))
        rc = CP_ENOMEM;
    /* alone: each id's top-2 margin too (near-tie statistics of a reference) */
    if (rc == CP_OK && j->alone && req->max_tokens > 0 &&
        !(c->resp->margins = cp_malloc((size_t)req->max_tokens * sizeof *c->resp->margins, "job margins", err)))
        rc = CP_ENOMEM;
    if (rc == CP_OK) rc = cp_sampler_init(&j->smp, &req->sampling, e->n_valid, err);
    if (rc == CP_OK) cp_detok_stream_init(&j->ds, e->tok, 1), j->ds_open = 1;
    cp_req_stage(c, CP_STAGE_PLACEMENT); /* its slots and buffers for the steps */
    return rc;
}

int cp_job_prefill_seq(cp_job *j, int from, int len, int last, cp_batch_seq *out)
{
    int k = j->cur;
    while (k < j->n && j->slots[k] < from + len) k++;
    int n = k - j->cur;
    *out = (cp_batch_seq){ .s = j->c.st, .tokens = j->toks + j->cur, .pos = j->slots + j->cur, .slots = j->slots + j->cur, .n = n,
                           .n_keys = j->c.T, .mode = last ? CP_LOGITS_LAST : CP_LOGITS_NONE, .logits = j->logits,
                           .ex = j->need_export ? &j->ex : NULL };
    j->cur = k;
    return n;
}

/* Appends a generated token: streamed, then *done when it ends generation. */
static cp_status job_emit(cp_job *j, int32_t id, int *done, cp_error *err)
{
    const cp_request *req = j->c.req;
    cp_response *resp = j->c.resp;
    cp_status rc = CP_OK;
    if (resp->margins) resp->margins[resp->n_ids] = cp_top2_margin(j->logits, j->c.e->n_valid);
    resp->ids[resp->n_ids++] = id;
    j->next = id;
    resp->finish = !req->ignore_eos && cp_config_is_eos(&j->c.e->m->cfg, id) ? CP_FINISH_STOP
                   : (int)resp->n_ids == req->max_tokens                      ? CP_FINISH_LENGTH
                                                                              : CP_FINISH_NONE;
    *done = resp->finish != CP_FINISH_NONE;
    if (req->on_piece && stream_piece(&j->ds, req, id, &rc, err)) *done = 1;
    if (*done && resp->finish == CP_FINISH_NONE) resp->finish = CP_FINISH_CALLER;
    return rc;
}

cp_status cp_job_first_token(cp_job *j, int *done, cp_error *err)
{
    reqctx *c = &j->c;
    cp_engine *e = c->e;
    const cp_request *req = c->req;
    *done = 1;
    if (j->cur != j->n) return cp_fail(err, CP_EINVAL, "job: first token before the prefill ended (%d of %d)", j->cur, j->n);
    cp_req_stage(c, CP_STAGE_PREFILL); /* the steps that carried its chunks (alone: its one call) */
    cp_req_keep_plan(c);
    int32_t first = req->max_tokens > 0 ? cp_sample(&j->smp, j->logits) : -1;
    memcpy(e->logits, j->logits, (size_t)e->m->cfg.vocab * sizeof *e->logits); /* cp_engine_last_logits */
    c->resp->ttft_ms = cp_now_ms() - j->t0; /* from submission: the queue's wait counts */
    cp_req_stage(c, CP_STAGE_FIRST_TOKEN);
    /* the first token goes to its client before the annotator and the store
     * run (work for later requests, ~4 ms of a kit-model rag-v1 request
     * that its client waited on); whether it stores is asked before, so a
     * client that has left stores nothing.  Nothing else runs on this
     * engine between the two: the next request's look-up still finds this
     * one's segments. */
    int keep = may_store(req);
    cp_status rc = req->max_tokens > 0 ? job_emit(j, first, done, err) : CP_OK;
    double t1 = cp_now_ms();
    c->mark = t1;
    if (rc == CP_OK && cp_cache_active(e->cache) && keep) rc = cp_req_store(c, err);
    c->resp->offpath_ms = cp_now_ms() - t1;
    return rc;
}

void cp_job_decode_seq(cp_job *j, cp_batch_seq *out)
{
    *out = (cp_batch_seq){ .s = j->c.st, .tokens = &j->next, .n = 1, .mode = CP_LOGITS_LAST, .logits = j->logits };
}

cp_status cp_job_decoded(cp_job *j, int *done, cp_error *err) { return job_emit(j, cp_sample(&j->smp, j->logits), done, err); }

cp_status cp_job_finish(cp_job *j, cp_status rc, cp_error *err)
{
    reqctx *c = &j->c;
    cp_response *resp = c->resp;
    if (rc == CP_OK && c->req->max_tokens > 0) rc = cp_detokenize(c->e->tok, resp->ids, resp->n_ids, 1, &resp->text, NULL, err);
    cp_sampler_free(&j->smp);
    if (j->ds_open) cp_detok_stream_free(&j->ds);
    cp_engine *e = c->e;
    cp_state *st = c->st;
    cp_req_free(c); /* releases the pins */
    if (j->alone && st) {
        cp_status zr = cp_state_reset(e->m, e->st, NULL); /* the request's KV held its secrets */
        if (rc == CP_OK) rc = zr;
    } else {
        cp_state_free(e->m, st); /* zeroes the request's KV first: it held its secrets */
    }
    if (j->toks) OPENSSL_cleanse(j->toks, (size_t)j->n * sizeof *j->toks); /* the prompt's computed ids */
    free(j->slots), free(j->toks), free(j->logits);
    resp->total_ms = cp_now_ms() - j->t0;
    if (rc) {
        if (resp->prompt_ids) OPENSSL_cleanse(resp->prompt_ids, (size_t)resp->prompt_tokens * sizeof *resp->prompt_ids);
        free(resp->ids), free(resp->margins), free(resp->text), free(resp->prompt_ids), free(resp->plan), free(resp->plan_flags), free(resp->sensitive);
        resp->ids = NULL, resp->margins = NULL, resp->text = NULL, resp->prompt_ids = NULL, resp->plan = NULL, resp->plan_flags = NULL, resp->sensitive = NULL, resp->n_ids = 0;
    }
    free(j);
    return rc;
}

/* One request alone: a batch of one through the same phases, its prefill
 * in one call and each decoding step here rather than in the batcher's
 * shared steps (the logits are the same bit for bit either way). */
cp_status cp_engine_run(cp_engine *e, const cp_request *req, cp_response *resp, cp_error *err)
{
    double t0 = cp_now_ms();
    cp_job *j = NULL;
    cp_status rc = cp_job_create(e, req, resp, &j, err);
    if (rc) {
        resp->total_ms = cp_now_ms() - t0;
        return rc;
    }
    j->alone = 1;
    int done = 1;
    rc = cp_job_begin(j, err);
    /* the computed tokens (none left when a request-time method ran in the begin) */
    if (rc == CP_OK && j->n > 0)
        rc = cp_forward_at(e->m, j->c.st, j->toks, j->slots, j->slots, j->n, j->c.T, CP_LOGITS_LAST, j->logits, j->need_export ? &j->ex : NULL, err);
    if (rc == CP_OK) j->cur = j->n, rc = cp_job_first_token(j, &done, err);
    while (rc == CP_OK && !done) {
        rc = cp_forward(e->m, j->c.st, &j->next, NULL, 1, CP_LOGITS_LAST, j->logits, NULL, err);
        if (rc == CP_OK) rc = cp_job_decoded(j, &done, err);
    }
    return cp_job_finish(j, rc, err);
}
