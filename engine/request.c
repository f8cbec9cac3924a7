/* One request's context: render, detect, mask; its lookup and placement
 * through the cache manager (see engine_internal.h). */
#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/log.h"
#include "../tokenizer/utf8.h"
#include "cache/reuse_rule.h"
#include "engine_internal.h"

void cp_response_tenant_view(const cp_response *r, int report_reuse, cp_response *out)
{
    *out = *r;
    out->ids = NULL;
    out->text = NULL;
    out->prompt_ids = NULL;
    out->plan = NULL;
    out->sensitive = NULL;
    cp_rule_counters c = { r->computed,     r->reused,           r->recomputed,       r->segments_hit,
                           r->shared_hit_tokens, r->shared_reused, r->shared_recomputed };
    cp_rule_tenant_counters(report_reuse, &c);
    out->computed = c.computed, out->reused = c.reused, out->recomputed = c.recomputed;
    out->segments_hit = c.segments_hit, out->shared_hit_tokens = c.shared_hit_tokens;
    out->shared_reused = c.shared_reused, out->shared_recomputed = c.shared_recomputed;
}

/* The time since the last stage ended goes to `stage`, which ends now. */
void cp_req_stage(reqctx *c, cp_stage stage)
{
    double t = cp_now_ms();
    c->resp->stage_ms[stage] += t - c->mark;
    c->mark = t;
}

/* What render_checked made: the messages' text without markers is the
 * prompt's, so it is wiped before it is freed (cp_prompt_free wipes the
 * rendered text and its ids). */
void cp_req_rendered_free(reqctx *c)
{
    for (size_t i = 0; c->clean && i < c->req->n_msgs; i++) {
        if (c->clean[i]) OPENSSL_cleanse(c->clean[i], c->clean_len[i]);
        free(c->clean[i]);
    }
    free(c->clean);
    free(c->clean_len);
    for (size_t i = 0; c->spans && i < c->req->n_msgs; i++) cp_spans_free(&c->spans[i]);
    free(c->spans);
    cp_prompt_free(&c->prompt);
    c->clean = NULL, c->clean_len = NULL, c->spans = NULL;
}

void cp_req_free(reqctx *c)
{
    cp_cache_hits_free(c->e->cache, c->hits); /* releases the pins */
    c->hits = NULL;
    cp_req_rendered_free(c);
    if (c->A_on_backend) {
        cp_backend *be = c->e->m->be;
        if (c->A) be->free(be, c->A);
        if (c->mask_backend) be->free(be, c->mask_backend);
        c->A = NULL;
    }
    free(c->mask), free(c->state), free(c->eligible), free(c->shared_hit), free(c->A), free(c->sens_mass), free(c->fresh), free(c->seg_off), free(c->exact);
    cp_annot_band_free(&c->band);
    cp_select_held_free(&c->held_export);
}

/* Marks the prompt tokens of message i's spans in c->mask by the one rule
 * (cp_spans_to_mask: a token is sensitive if its bytes overlap a span at
 * all, e.g. " Bob" for the span "Bob"; padded by mask_pad tokens anywhere in
 * the prompt).  A wholly sensitive message is one span over its rendered
 * text, so every token touching its bytes is marked whoever owns it. */
static cp_status mask_message(reqctx *c, size_t i, const cp_spans *s, cp_error *err)
{
    const cp_prompt *p = &c->prompt;
    size_t n = c->clean_len[i], lead = 0;
    /* a template that trims (Llama-3) renders the text from its first
     * non-blank byte: span offsets shift by what it dropped */
    if (c->e->o.tpl == CP_TPL_LLAMA3)
        while (lead < n && memchr(" \n\t\r", c->clean[i][lead], 4)) lead++;
    size_t begin = p->msg_begin[i], end = p->msg_end[i];
    if (end > begin && begin < lead) return cp_fail(err, CP_EINVAL, "request: message %zu renders before its own text", i);
    uint32_t base = (uint32_t)(end > begin ? begin - lead : begin);
    cp_span whole = { .start = (uint32_t)lead, .end = (uint32_t)(lead + (end - begin)), .type = "wholly", .score = 1 };
    cp_spans one = { .v = &whole, .n = 1 };
    cp_spans_to_mask(s->wholly ? &one : s, base, &p->enc, 0, p->enc.n, c->e->o.mask_pad, c->mask);
    return CP_OK;
}

/* Validation, rendering and tokenizing, up to the context check: what a
 * request needs of the engine's immutable parts only (tokenizer, template,
 * context), so cp_engine_check_request runs it on any thread. */
cp_status cp_req_render(reqctx *c, cp_error *err)
{
    const cp_request *r = c->req;
    const cp_engine *e = c->e;
    if (!r->msgs || r->n_msgs == 0) return cp_fail(err, CP_EINVAL, "request: no messages");
    if (r->n_msgs > 4096) return cp_fail(err, CP_EINVAL, "request: %zu messages, more than 4096", r->n_msgs);
    if (r->max_tokens < 0 || r->max_tokens > (1 << 20)) return cp_fail(err, CP_ERANGE, "request: max_tokens %d out of range", r->max_tokens);
    /* a prompt too long for the context by its bytes alone is refused
     * before it is tokenized: a megabyte of text was a million tokens' worth
     * of encoding (~47 MB a request) only to be refused after.  A token
     * covers at most piece_max bytes (a vocabulary piece spells its bytes
     * or more: SentencePiece's U+2581, byte-level BPE's 2-byte stand-ins,
     * <0xNN>), and normalization is given 4x room */
    size_t bytes = 0;
    for (size_t i = 0; i < r->n_msgs; i++) bytes += r->msgs[i].len;
    if (e->piece_max && bytes / 4 / e->piece_max > (size_t)e->cap)
        return cp_fail(err, CP_ERANGE, "request: %zu bytes of messages are more than the context of %d tokens can hold", bytes, e->cap);
    c->clean = cp_calloc(r->n_msgs, sizeof *c->clean, "request", err);
    c->clean_len = cp_calloc(r->n_msgs, sizeof *c->clean_len, "request", err);
    c->spans = cp_calloc(r->n_msgs, sizeof *c->spans, "request", err);
    cp_message *msgs = cp_calloc(r->n_msgs, sizeof *msgs, "request", err);
    if (!c->clean || !c->clean_len || !c->spans || !msgs) {
        free(msgs);
        return CP_ENOMEM;
    }
    cp_status rc = CP_OK;
    for (size_t i = 0; i < r->n_msgs && rc == CP_OK; i++) {
        const cp_request_msg *m = &r->msgs[i];
        if (!m->text) rc = cp_fail(err, CP_EINVAL, "request: message %zu has no text", i);
        else if ((unsigned)m->role > CP_ROLE_DOCUMENT) rc = cp_fail(err, CP_EINVAL, "request: message %zu has an unknown role", i);
        if (rc) break;
        size_t n;
        if ((rc = cp_strip_pii_markers(m->text, m->len, &c->clean[i], &n, &c->spans[i], err))) {
            cp_fail_wrap(err, "request: message %zu", i);
            break;
        }
        c->clean_len[i] = n; /* now: an error below still wipes it whole */
        if (m->n_marked && c->spans[i].n) {
            rc = cp_fail(err, CP_EINVAL, "request: message %zu has both <pii> markers and marked spans", i);
            break;
        }
        for (size_t k = 0; k < m->n_marked && rc == CP_OK; k++) {
            if (m->marked[k].start > m->marked[k].end || m->marked[k].end > n)
                rc = cp_fail(err, CP_ERANGE, "request: message %zu: marked span %zu [%u, %u) is outside its %zu bytes", i, k,
                             m->marked[k].start, m->marked[k].end, n);
            else rc = cp_spans_add(&c->spans[i], m->marked[k].start, m->marked[k].end, "marked", 1.0f, err);
        }
        msgs[i] = (cp_message){ m->role, c->clean[i], n };
    }
    if (rc == CP_OK) rc = cp_chat_render(e->tok, e->o.tpl, msgs, r->n_msgs, 1, &c->prompt, err);
    free(msgs);
    if (rc) return rc;
    c->T = (int)c->prompt.enc.n;
    if (c->T == 0) return cp_fail(err, CP_EINVAL, "request: the prompt is empty");
    if (c->T + r->max_tokens > e->cap)
        return cp_fail(err, CP_ERANGE, "request: %d prompt tokens + %d to generate exceed the context of %d", c->T, r->max_tokens,
                       e->cap);
    return CP_OK;
}

/* One message through the detector chain, or the memo of what the chain
 * found in this tenant's same message before (detect_memo.h): scanned
 * messages without marked spans (the chain resolves marked spans with its
 * own), and only an outcome no detector failed on is kept. */
static cp_status detect_message(reqctx *c, size_t i, cp_spans *s, cp_error *err)
{
    cp_engine *e = c->e;
    const cp_role role = c->req->msgs[i].role;
    const int memo = e->memo && s->n == 0 && (unsigned)role < 4 && e->chain->policy[role] == CP_POLICY_SCAN;
    uint8_t key[32];
    if (memo) {
        cp_detect_memo_key(c->req->tenant, role, c->clean[i], c->clean_len[i], key);
        int hit = cp_detect_memo_get(e->memo, key, s, err);
        if (hit) return hit > 0 ? CP_OK : CP_ENOMEM; /* -1: cp_spans_add's message in err */
    }
    const uint64_t failures = e->chain->failures;
    /* the spans the client marked (s holds them on entry) reach no detector's process */
    cp_status rc = cp_chain_detect_marked(e->chain, c->clean[i], c->clean_len[i], role, s, s, err);
    /* a no-store request leaves nothing behind, not even its digests */
    if (rc == CP_OK && memo && e->chain->failures == failures && !c->req->no_store) cp_detect_memo_put(e->memo, key, c->req->tenant, s);
    return rc;
}

/* A secret whose cue ends one message and whose value opens the next
 * ("password =" closing one chunk of a config, the value opening the next
 * document) is whole in neither: each seam between two messages whose roles
 * are scanned at all gets the chain's credential scan over the last
 * SEAM_TAIL bytes of the one, a line break and the first SEAM_HEAD bytes of
 * the other, and what it finds is masked in both (found whole in one, it
 * was masked already: masking is idempotent). */
#define SEAM_TAIL 96
#define SEAM_HEAD 384

static cp_status detect_seam(reqctx *c, size_t i, cp_error *err)
{
    const char *a = c->clean[i], *b = c->clean[i + 1];
    size_t la = c->clean_len[i], lb = c->clean_len[i + 1];
    size_t t0 = la > SEAM_TAIL ? la - SEAM_TAIL : 0, hl = lb < SEAM_HEAD ? lb : SEAM_HEAD;
    while (t0 < la && cp_utf8_continues((unsigned char)a[t0])) t0++; /* whole UTF-8 characters */
    while (hl > 0 && hl < lb && cp_utf8_continues((unsigned char)b[hl])) hl--;
    const size_t tl = la - t0, n = tl + 1 + hl;
    char *w = malloc(n ? n : 1);
    if (!w) return cp_fail(err, CP_ENOMEM, "request: out of memory scanning a message seam");
    memcpy(w, a + t0, tl);
    w[tl] = '\n';
    memcpy(w + tl + 1, b, hl);
    cp_spans s = { 0 }, in_a = { 0 }, in_b = { 0 };
    cp_status rc = cp_chain_detect_secrets(c->e->chain, w, n, &s, err);
    OPENSSL_cleanse(w, n); /* a prompt's text */
    free(w);
    if (rc == CP_OK && s.wholly) { /* a detector failed on the seam: both sides of it, closed */
        rc = cp_spans_add(&in_a, (uint32_t)t0, (uint32_t)la, "seam", 1, err);
        if (rc == CP_OK) rc = cp_spans_add(&in_b, 0, (uint32_t)hl, "seam", 1, err);
    }
    for (size_t k = 0; rc == CP_OK && k < s.n; k++) {
        const cp_span *v = &s.v[k];
        if (v->start < tl) rc = cp_spans_add(&in_a, (uint32_t)(t0 + v->start), (uint32_t)(t0 + (v->end < tl ? v->end : tl)), v->type, v->score, err);
        if (rc == CP_OK && v->end > tl + 1)
            rc = cp_spans_add(&in_b, v->start > tl + 1 ? v->start - (uint32_t)(tl + 1) : 0, v->end - (uint32_t)(tl + 1), v->type, v->score, err);
    }
    if (rc == CP_OK && in_a.n) rc = mask_message(c, i, &in_a, err);
    if (rc == CP_OK && in_b.n) rc = mask_message(c, i + 1, &in_b, err);
    cp_spans_free(&s), cp_spans_free(&in_a), cp_spans_free(&in_b);
    return rc;
}

cp_status cp_req_prepare(reqctx *c, cp_error *err)
{
    const cp_request *r = c->req;
    cp_engine *e = c->e;
    cp_status rc = cp_req_render(c, err);
    cp_req_stage(c, CP_STAGE_TOKENIZE);
    if (rc) return rc;
    size_t T = (size_t)c->T;
    c->mask = calloc(T, 1), c->state = calloc(T, 1), c->eligible = calloc(T, 1), c->shared_hit = calloc(T, 1);
    c->seg_off = calloc(T, 1), c->exact = calloc(T, 1);
    if (!c->mask || !c->state || !c->eligible || !c->shared_hit || !c->seg_off || !c->exact) return cp_fail(err, CP_ENOMEM, "request: out of memory");
    /* detection, per message, under the role policy -- where the mask
     * decides anything: a mode that neither looks up nor stores in the pool
     * (none) shares nothing, so it runs no detector (a baseline that paid
     * for one would flatter every sharing mode beside it) */
    if (c->prompt.len > UINT32_MAX) return cp_fail(err, CP_ERANGE, "request: the rendered prompt is %zu bytes", c->prompt.len);
    const int detect = e->chain && cp_cache_policy_uses_pool(cp_cache_policy_of(e->cache));
    for (size_t i = 0; i < r->n_msgs && rc == CP_OK; i++) {
        cp_spans *s = &c->spans[i];
        /* a message declared sensitive is masked whole: no detector needs
         * its text (a plugin process would keep copies of it) */
        if (r->msgs[i].sensitive) s->wholly = 1;
        else if (detect) rc = detect_message(c, i, s, err);
        if (rc == CP_OK) rc = mask_message(c, i, s, err);
    }
    for (size_t i = 0; detect && i + 1 < r->n_msgs && rc == CP_OK; i++) {
        const cp_role ra = r->msgs[i].role, rb = r->msgs[i + 1].role;
        const int scanned = (unsigned)ra < 4 && (unsigned)rb < 4 && e->chain->policy[ra] != CP_POLICY_PUBLIC &&
                            e->chain->policy[rb] != CP_POLICY_PUBLIC;
        if (scanned && !(c->spans[i].wholly && c->spans[i + 1].wholly)) rc = detect_seam(c, i, err);
    }
    for (size_t k = 0; k < T; k++) c->resp->sensitive_tokens += c->mask[k];
    /* shared-eligible tokens: template markup, system and documents, and user
     * text unless it is kept private; never assistant turns */
    for (size_t k = 0; k < T; k++) {
        int32_t mi = c->prompt.msg[k];
        cp_role role = mi < 0 ? CP_ROLE_SYSTEM : r->msgs[mi].role;
        c->eligible[k] = role == CP_ROLE_SYSTEM || role == CP_ROLE_DOCUMENT || (role == CP_ROLE_USER && !e->o.user_text_private);
    }
    cp_req_stage(c, CP_STAGE_DETECT);
    return rc;
}

/* The request as the cache manager sees it (cache.h). */
cp_cache_req cp_req_cache_view(const reqctx *c)
{
    return (cp_cache_req){ .tenant = c->req->tenant, .ids = c->prompt.enc.ids, .T = c->T, .msg = c->prompt.msg, .sensitive = c->mask,
                           .eligible = c->eligible, .bos = cp_tokenizer_bos(c->e->tok) };
}

/* the cache's lookup marks as stages */
static void lookup_mark(void *ctx, int what) { cp_req_stage(ctx, what == CP_CACHE_MARK_TIER ? CP_STAGE_TIER : CP_STAGE_LOOKUP); }

/* The request's hits, pinned (the cache's lookup: the local pool, then the tier). */
cp_status cp_req_lookup(reqctx *c, cp_error *err)
{
    cp_status rc = c->hits ? CP_OK : cp_cache_hits_create(&c->hits, err);
    cp_cache_req r = cp_req_cache_view(c);
    if (rc == CP_OK) rc = cp_cache_lookup(c->e->cache, &r, c->hits, lookup_mark, c, err);
    return rc;
}

/* Plans each token and places the reused KV (the cache's placement and
 * chain proof). */
cp_status cp_req_place(reqctx *c, cp_error *err)
{
    cp_cache_req r = cp_req_cache_view(c);
    cp_cache_plan p = { .state = c->state, .shared_hit = c->shared_hit, .seg_off = c->seg_off, .exact = c->exact };
    cp_status rc = c->hits ? cp_cache_place(c->e->cache, &r, c->hits, c->st, &p, err) : CP_OK;
    c->resp->segments_hit += p.segments_hit;
    c->resp->private_hit_tokens += p.private_hit_tokens;
    c->resp->shared_hit_tokens += p.shared_hit_tokens;
    if (c->state[c->T - 1] == TOK_REUSED) c->state[c->T - 1] = TOK_RECOMPUTE; /* its logits start decoding */
    return rc;
}

