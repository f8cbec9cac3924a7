/* Replays of a reuse plan made elsewhere (see request.h). */
#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/log.h"
#include "engine_internal.h"

/* A replay's decoding: max_tokens ids whatever they are (no end of
 * sequence, no streaming), each with its top-2 margin. */
static cp_status decode(cp_engine *e, cp_sampler *smp, int32_t first, float margin0, int max_tokens, cp_response *resp, cp_error *err)
{
    resp->ids = malloc((size_t)max_tokens * sizeof *resp->ids);
    resp->margins = malloc((size_t)max_tokens * sizeof *resp->margins);
    float *lg = malloc((size_t)e->m->cfg.vocab * sizeof *lg);
    cp_status rc = resp->ids && resp->margins && lg ? CP_OK : cp_fail(err, CP_ENOMEM, "replay: out of memory");
    int32_t next = first;
    float margin = margin0;
    while (rc == CP_OK) {
        resp->margins[resp->n_ids] = margin;
        resp->ids[resp->n_ids++] = next;
        if ((int)resp->n_ids == max_tokens) break;
        rc = cp_forward(e->m, e->st, &next, NULL, 1, CP_LOGITS_LAST, lg, NULL, err);
        if (rc == CP_OK) next = cp_sample(smp, lg), margin = cp_top2_margin(lg, e->n_valid);
    }
    free(lg);
    return rc;
}

/* A replayed plan under a request-time method: the method runs over the
 * plan's reused and recomputed tokens, in the plan's segments and with its
 * exact tokens left alone where the codes carry them (a plan without them:
 * runs of reused tokens taken as segments, none exact), so its selection
 * costs what it cost when planned; on placeholder KV its choice is not the
 * plan's, its counts are (the recompute promise depends on hit counts only),
 * and resp counts what the replay computed. */
static cp_status replay_method(cp_engine *e, const int32_t *ids, const uint8_t *plan, int n, cp_response *resp, cp_error *err)
{
    uint8_t *state = malloc((size_t)n), *off = malloc((size_t)n), *exact = malloc((size_t)n);
    if (!state || !off || !exact) {
        free(state), free(off), free(exact);
        return cp_fail(err, CP_ENOMEM, "replay: out of memory");
    }
    int segs = 0;
    for (int i = 0; i < n; i++) segs |= plan[i] & CP_PLAN_SEG_START;
    for (int i = 0; i < n; i++) {
        int code = plan[i] & CP_PLAN_STATE, prev = i ? plan[i - 1] & CP_PLAN_STATE : TOK_FRESH;
        state[i] = i == n - 1 && code == TOK_REUSED ? TOK_RECOMPUTE : (uint8_t)code; /* the last token's logits start decoding */
        int start = segs ? (plan[i] & CP_PLAN_SEG_START) != 0 : prev == TOK_FRESH;
        off[i] = code == TOK_FRESH || start || !i ? 0 : (uint8_t)(off[i - 1] < 255 ? off[i - 1] + 1 : 255);
        exact[i] = (plan[i] & CP_PLAN_EXACT) != 0;
    }
    cp_recompute_opts ro = { .method = e->o.recompute_method, .r = e->o.annot.r, .start = e->o.gradual_start, .layer = e->o.deviation_layer,
                             .k_first = e->o.annot.k0, .tail = e->o.recompute_tail,
                             .per_segment = e->o.recompute_per_segment };
    cp_recompute_in in = { .ids = ids, .T = n, .seg_off = off, .exact = exact };
    cp_recompute_stats rs;
    cp_status rc = cp_recompute_prefill(e->m, e->st, &ro, &in, state, e->logits, &rs, err);
    if (rc == CP_OK) {
        resp->partial_rows += rs.partial_rows;
        resp->computed = resp->reused = resp->recomputed = 0;
        for (int i = 0; i < n; i++) {
            resp->computed += state[i] != TOK_REUSED;
            resp->reused += state[i] == TOK_REUSED;
            resp->recomputed += state[i] == TOK_RECOMPUTE;
        }
    }
    free(state), free(off), free(exact);
    return rc;
}

cp_status cp_engine_replay(cp_engine *e, const int32_t *ids, const uint8_t *plan, int n, int max_tokens, cp_response *resp,
                           cp_error *err)
{
    memset(resp, 0, sizeof *resp);
    if (n < 1 || n + max_tokens > e->cap)
        return cp_fail(err, CP_ERANGE, "replay: %d prompt tokens + %d to generate do not fit the context of %d", n, max_tokens, e->cap);
    double t0 = cp_now_ms();
    const cp_config *cfg = &e->m->cfg;
    int32_t *slots = malloc((size_t)n * sizeof *slots), *toks = malloc((size_t)n * sizeof *toks);
    uint8_t *reused = malloc((size_t)n);
    cp_status rc = slots && toks && reused ? cp_engine_grow_state(e, &e->st, n + max_tokens, err) : cp_fail(err, CP_ENOMEM, "replay: out of memory");
    if (rc == CP_OK) rc = cp_state_reset(e->m, e->st, err);
    int m = 0;
    for (int i = 0; rc == CP_OK && i < n; i++) {
        int code = plan[i] & CP_PLAN_STATE;
        reused[i] = code == TOK_REUSED && i < n - 1; /* the last token's logits start decoding */
        if (ids[i] < 0 || ids[i] >= cfg->vocab) rc = cp_fail(err, CP_ERANGE, "replay: token %d is outside this model's vocabulary", ids[i]);
        else if (code > TOK_RECOMPUTE || plan[i] > (CP_PLAN_STATE | CP_PLAN_SEG_START | CP_PLAN_EXACT)) rc = cp_fail(err, CP_EINVAL, "replay: plan code %d of token %d", plan[i], i);
        else if (reused[i]) resp->reused++;
        else {
            slots[m] = i, toks[m++] = ids[i];
            resp->computed++;
            resp->recomputed += code == TOK_RECOMPUTE;
        }
    }
    /* placed like pool blocks: runs of 16 rows */
    if (rc == CP_OK) rc = cp_state_place_placeholder(e->m, e->st, reused, n, 16, err);
    resp->prompt_tokens = n;
    if (rc == CP_OK && e->o.recompute_by_deviation && resp->reused + resp->recomputed > 0 &&
        e->o.deviation_layer < cfg->n_layers) { /* the selection's cost is real; its choice is the plan's */
        float *dev = malloc((size_t)n * sizeof *dev);
        rc = dev ? cp_req_deviation_probe(e, e->st, ids, n, dev, err) : cp_fail(err, CP_ENOMEM, "replay: out of memory");
        free(dev);
    }
    int by_method = e->o.recompute_method != CP_RECOMPUTE_PLAN && !e->o.recompute_by_deviation && cp_cache_policy_of(e->cache)->request_time &&
                    resp->reused + resp->recomputed > 0;
    if (rc == CP_OK && by_method) rc = replay_method(e, ids, plan, n, resp, err);
    else if (rc == CP_OK) rc = cp_forward_at(e->m, e->st, toks, slots, slots, m, n, CP_LOGITS_LAST, e->logits, NULL, err);
    cp_sampler smp = { 0 };
    cp_sampler_opts so = { .top_p = 1 };
    if (rc == CP_OK) rc = cp_sampler_init(&smp, &so, e->n_valid, err);
    int32_t first = rc == CP_OK ? cp_sample(&smp, e->logits) : 0;
    resp->ttft_ms = cp_now_ms() - t0;
    if (rc == CP_OK && max_tokens > 0) rc = decode(e, &smp, first, cp_top2_margin(e->logits, e->n_valid), max_tokens, resp, err);
    cp_sampler_free(&smp);
    cp_status zr = cp_state_reset(e->m, e->st, NULL); /* a replayed prompt is a tenant's too */
    if (rc == CP_OK) rc = zr;
    resp->total_ms = cp_now_ms() - t0;
    free(slots), free(toks), free(reused);
    return rc;
}

