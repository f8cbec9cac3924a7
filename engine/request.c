/* The request path (see request.h). */
#include "request.h"

#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/log.h"
#include "quality.h"

static const char *const segkv_names[] = { "in-context", "canonical", "strict" };

cp_status cp_segkv_from_name(const char *name, cp_segkv *out, cp_error *err)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, segkv_names[i]) == 0) return *out = (cp_segkv)i, CP_OK;
    return cp_fail(err, CP_EINVAL, "unknown segment KV mode '%.32s' (in-context, canonical, strict)", name);
}
const char *cp_segkv_name(cp_segkv s) { return (unsigned)s < 3 ? segkv_names[s] : "?"; }

int cp_usable_vocab(const cp_model *m, const cp_tokenizer *tok)
{
    return tok && cp_tokenizer_n_ids(tok) < m->cfg.vocab ? cp_tokenizer_n_ids(tok) : m->cfg.vocab;
}

void cp_engine_opts_default(cp_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->sharing = CP_SHARE_CACHEPRUNE;
    o->segment_kv = CP_SEGKV_IN_CONTEXT;
    o->admit_k = 1;
    o->chunk_size = 512;
    o->chunk_recompute = 0.15;
    o->mask_pad = 1;
    o->private_reuse = 1;
    o->deviation_layer = 1;
    o->gradual_start = 2;
    /* chosen from the measured frontier (docs/RESULTS.md, "Quality"): the
     * first k0 tokens of each reused segment plus deviation (epic) is the
     * cheapest method at every R measured (deviation needed 45 % more tokens
     * computed, gradual did not get there, the stored flags reached 77 %);
     * over all 150 rag-v1 requests R = 0.85 is the cheapest measured with
     * greedy agreement >= 95 %, KL <= 0.002 and ROUGE-L >= 0.97 (R is a
     * fraction of the reused tokens the chain proof does not show exact:
     * R 0.75 gave ROUGE-L 0.964, R 0.8 0.969, R 0.85 0.975; R 0.35 greedy
     * agreement 91.1 %) */
    o->recompute_method = CP_RECOMPUTE_EPIC;
    cp_annot_opts_default(&o->annot); /* first: it sets its own r (0.15, the stored flags' R), which the line below overrides */
    o->annot.r = 0.85;
    o->tpl = CP_TPL_PLAIN;
}

static const char *const stage_names[CP_STAGE_N] = { "queue",  "tokenize",  "detect", "lookup",      "tier",     "placement",
                                                     "selection", "prefill", "export", "first_token", "annotate", "store" };

const char *cp_stage_name(int stage) { return stage >= 0 && stage < CP_STAGE_N ? stage_names[stage] : NULL; }

void cp_response_free(cp_response *r)
{
    if (r->prompt_ids) OPENSSL_cleanse(r->prompt_ids, (size_t)r->prompt_tokens * sizeof *r->prompt_ids); /* the prompt's ids */
    free(r->ids);
    free(r->margins);
    free(r->text);
    free(r->prompt_ids);
    free(r->plan);
    free(r->plan_flags);
    free(r->sensitive);
    memset(r, 0, sizeof *r);
}

struct cp_engine {
    cp_model *m;
    cp_tokenizer *tok;
    cp_cache *cache; /* the only door to stored KV */
    cp_detect_chain *chain;
    cp_engine_opts o;
    int cap;
    cp_state *st, *canon;
    float *logits;
    int n_valid;
};

void cp_engine_set_tier(cp_engine *e, cp_tier *t) { cp_cache_set_tier(e->cache, t); }

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void cp_engine_kv_layout(const cp_model *m, cp_kv_layout *out) { cp_engine_kv_layout_as(m, CP_F32, out); }

void cp_engine_kv_layout_as(const cp_model *m, cp_dtype kv_dtype, cp_kv_layout *out) { cp_cache_kv_layout(m, kv_dtype, out); }

#define STATE_FIRST_SLOTS 256
#define STATE_BATCH 512 /* tokens per forward chunk */

/* Room for `need` slots in *st (need <= e->cap, checked by the caller): the
 * KV cache grows by doubling, up to the context, so a server sized by its
 * longest request pays for that request, not for the model's context.  The
 * old cache holds nothing between requests (each starts from a reset); it
 * is kept when the larger one cannot be made, and that request fails. */
static cp_status grow_state(cp_engine *e, cp_state **st, int need, cp_error *err)
{
    if (need <= (*st)->capacity) return CP_OK;
    if (need > e->cap) return cp_fail(err, CP_ERANGE, "engine: %d slots exceed the context of %d", need, e->cap);
    long long want = (long long)(*st)->capacity * 2;
    if (want < need) want = need;
    if (want > e->cap) want = e->cap;
    cp_state *bigger = NULL;
    cp_status rc = cp_state_create_kv(e->m, (int)want, STATE_BATCH, e->o.kv_dtype, &bigger, err);
    if (rc) return cp_fail_wrap(err, "growing the request's KV cache to %lld slots", want);
    cp_state_free(e->m, *st);
    *st = bigger;
    return CP_OK;
}

cp_status cp_engine_create(cp_model *m, cp_tokenizer *tok, cp_pool *pool, cp_detect_chain *chain, const cp_engine_opts *o,
                           cp_engine **out, cp_error *err)
{
    *out = NULL;
    if (o->mask_pad < 0 || o->mask_pad > 64) return cp_fail(err, CP_ERANGE, "engine: --mask-pad %d is outside [0, 64]", o->mask_pad);
    /* the request caches hold KV in the pool's dtype, so segments move
     * between them as bytes (0 in the options: f32) */
    cp_dtype kvd = o->kv_dtype ? o->kv_dtype : CP_F32;
    cp_engine *e = cp_calloc(1, sizeof *e, "engine", err);
    if (!e) return CP_ENOMEM;
    e->m = m, e->tok = tok, e->chain = chain, e->o = *o;
    cp_cache_opts co = { .sharing = o->sharing, .private_reuse = o->private_reuse, .admit_k = o->admit_k, .chunk_size = o->chunk_size,
                         .chunk_recompute = o->chunk_recompute, .kv_dtype = kvd };
    cp_status crc = cp_cache_create(m, pool, &co, &e->cache, err);
    if (crc) {
        free(e);
        return crc;
    }
    e->cap = o->max_context > 0 ? o->max_context : m->cfg.max_pos;
    e->n_valid = cp_usable_vocab(m, tok);
    /* sized for short requests; grow_state makes room for longer ones as they come */
    int first = e->cap < STATE_FIRST_SLOTS ? e->cap : STATE_FIRST_SLOTS;
    e->o.kv_dtype = kvd;
    cp_status rc = cp_state_create_kv(m, first, STATE_BATCH, kvd, &e->st, err);
    if (rc == CP_OK && o->segment_kv == CP_SEGKV_CANONICAL) rc = cp_state_create_kv(m, first, STATE_BATCH, kvd, &e->canon, err);
    if (rc == CP_OK && !(e->logits = cp_malloc((size_t)m->cfg.vocab * sizeof(float), "logits", err))) rc = CP_ENOMEM;
    if (rc) {
        cp_engine_free(e);
        return rc;
    }
    *out = e;
    return CP_OK;
}

void cp_engine_free(cp_engine *e)
{
    if (!e) return;
    cp_state_free(e->m, e->st);
    cp_state_free(e->m, e->canon);
    free(e->logits);
    cp_cache_free(e->cache);
    free(e);
}

const float *cp_engine_last_logits(const cp_engine *e) { return e->logits; }
const cp_state *cp_engine_request_state(const cp_engine *e) { return e->st; }

void cp_engine_purge_tenant(cp_engine *e, uint32_t tenant, size_t *segments, size_t *admissions, long *tier_segments)
{
    cp_cache_purge_tenant(e->cache, tenant, segments, admissions, tier_segments);
}

/* ---- one request ----------------------------------------------------------------- */

enum { TOK_FRESH = CP_CACHE_FRESH, TOK_REUSED = CP_CACHE_REUSED, TOK_RECOMPUTE = CP_CACHE_RECOMPUTE };

typedef struct reqctx {
    cp_engine *e;
    const cp_request *req;
    cp_response *resp;
    cp_prompt prompt;
    char **clean;
    size_t *clean_len; /* messages may hold NUL bytes: lengths, never strlen */
    cp_spans *spans;
    uint8_t *mask, *state, *eligible;
    uint8_t *shared_hit; /* per token: its KV came from a shared segment */
    float *A, *sens_mass;
    int A_on_backend;     /* the export stays in backend memory (the backend annotates next to it) */
    uint8_t *mask_backend; /* the sensitive mask there, for its annotator */
    cp_annot_band band;   /* else: the band of it the annotator reads, kept as the prefill runs */
    uint8_t *fresh;       /* per token: the annotator's fresh (computed here, not reused) */
    uint8_t *seg_off;     /* per token: its offset in the reused segment it came from (capped at 255) */
    uint8_t *exact;       /* per token: reused KV provably equal to this context's own (mark_exact) */
    cp_cache_hits *hits;  /* what the lookup found, pinned until the request ends */
    cp_cache_writer *store; /* while storing */
    int T;
    cp_state *st; /* the request's KV: the engine's (cp_engine_run) or its own (a batched job) */
    double mark;  /* now_ms() at the end of the last stage counted (stage_to) */
} reqctx;

/* The time since the last stage ended goes to `stage`, which ends now. */
static void stage_to(reqctx *c, cp_stage stage)
{
    double t = now_ms();
    c->resp->stage_ms[stage] += t - c->mark;
    c->mark = t;
}

/* What render_checked made: the messages' text without markers is the
 * prompt's, so it is wiped before it is freed (cp_prompt_free wipes the
 * rendered text and its ids). */
static void rendered_free(reqctx *c)
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

static void ctx_free(reqctx *c)
{
    cp_cache_hits_free(c->e->cache, c->hits); /* releases the pins */
    c->hits = NULL;
    rendered_free(c);
    if (c->A_on_backend) {
        cp_backend *be = c->e->m->be;
        if (c->A) be->free(be, c->A);
        if (c->mask_backend) be->free(be, c->mask_backend);
        c->A = NULL;
    }
    free(c->mask), free(c->state), free(c->eligible), free(c->shared_hit), free(c->A), free(c->sens_mass), free(c->fresh), free(c->seg_off), free(c->exact);
    cp_annot_band_free(&c->band);
}

/* The annotator's per-row inputs of a request (A: the dense export on a
 * backend that keeps it; else c->band holds what it reads) */
static cp_annot_input annot_input(const reqctx *c)
{
    return (cp_annot_input){ c->A, (size_t)c->T, c->T, c->fresh, c->mask, c->sens_mass, c->prompt.msg, NULL };
}

/* The annotator's fresh tokens: computed by this request, and (strict)
 * before its first sensitive token; NULL when out of memory */
static uint8_t *annot_fresh(const reqctx *c)
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
static cp_status band_rows(void *ctx, const float *rows, size_t ld, const int32_t *slots, int n, cp_error *err)
{
    reqctx *c = ctx;
    stage_to(c, CP_STAGE_PREFILL); /* the rows' layers ran until now */
    cp_annot_input in = annot_input(c);
    cp_status rc = cp_annot_band_add(&c->band, &in, rows, ld, slots, n, err);
    stage_to(c, CP_STAGE_EXPORT);
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
static cp_status render_checked(reqctx *c, cp_error *err)
{
    const cp_request *r = c->req;
    const cp_engine *e = c->e;
    if (!r->msgs || r->n_msgs == 0) return cp_fail(err, CP_EINVAL, "request: no messages");
    if (r->n_msgs > 4096) return cp_fail(err, CP_EINVAL, "request: %zu messages, more than 4096", r->n_msgs);
    if (r->max_tokens < 0 || r->max_tokens > (1 << 20)) return cp_fail(err, CP_ERANGE, "request: max_tokens %d out of range", r->max_tokens);
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

static cp_status prepare(reqctx *c, cp_error *err)
{
    const cp_request *r = c->req;
    cp_engine *e = c->e;
    cp_status rc = render_checked(c, err);
    stage_to(c, CP_STAGE_TOKENIZE);
    if (rc) return rc;
    size_t T = (size_t)c->T;
    c->mask = calloc(T, 1), c->state = calloc(T, 1), c->eligible = calloc(T, 1), c->shared_hit = calloc(T, 1);
    c->seg_off = calloc(T, 1), c->exact = calloc(T, 1);
    if (!c->mask || !c->state || !c->eligible || !c->shared_hit || !c->seg_off || !c->exact) return cp_fail(err, CP_ENOMEM, "request: out of memory");
    /* detection, per message, under the role policy */
    if (c->prompt.len > UINT32_MAX) return cp_fail(err, CP_ERANGE, "request: the rendered prompt is %zu bytes", c->prompt.len);
    for (size_t i = 0; i < r->n_msgs && rc == CP_OK; i++) {
        cp_spans *s = &c->spans[i];
        if (e->chain) rc = cp_chain_detect(e->chain, c->clean[i], c->clean_len[i], r->msgs[i].role, s, err);
        if (r->msgs[i].sensitive) s->wholly = 1;
        if (rc == CP_OK) rc = mask_message(c, i, s, err);
    }
    for (size_t k = 0; k < T; k++) c->resp->sensitive_tokens += c->mask[k];
    /* shared-eligible tokens: template markup, system and documents, and user
     * text unless it is kept private; never assistant turns */
    for (size_t k = 0; k < T; k++) {
        int32_t mi = c->prompt.msg[k];
        cp_role role = mi < 0 ? CP_ROLE_SYSTEM : r->msgs[mi].role;
        c->eligible[k] = role == CP_ROLE_SYSTEM || role == CP_ROLE_DOCUMENT || (role == CP_ROLE_USER && !e->o.user_text_private);
    }
    stage_to(c, CP_STAGE_DETECT);
    return rc;
}

/* The request as the cache manager sees it (cache.h). */
static cp_cache_req cache_req(const reqctx *c)
{
    return (cp_cache_req){ .tenant = c->req->tenant, .ids = c->prompt.enc.ids, .T = c->T, .msg = c->prompt.msg, .sensitive = c->mask,
                           .eligible = c->eligible, .bos = cp_tokenizer_bos(c->e->tok) };
}

/* the cache's lookup marks as stages */
static void lookup_mark(void *ctx, int what) { stage_to(ctx, what == CP_CACHE_MARK_TIER ? CP_STAGE_TIER : CP_STAGE_LOOKUP); }

/* The request's hits, pinned (the cache's lookup: the local pool, then the tier). */
static cp_status lookup(reqctx *c, cp_error *err)
{
    cp_status rc = c->hits ? CP_OK : cp_cache_hits_create(&c->hits, err);
    cp_cache_req r = cache_req(c);
    if (rc == CP_OK) rc = cp_cache_lookup(c->e->cache, &r, c->hits, lookup_mark, c, err);
    return rc;
}

/* Plans each token and places the reused KV (the cache's placement and
 * chain proof). */
static cp_status plan_and_place(reqctx *c, cp_error *err)
{
    cp_cache_req r = cache_req(c);
    cp_cache_plan p = { .state = c->state, .shared_hit = c->shared_hit, .seg_off = c->seg_off, .exact = c->exact };
    cp_status rc = c->hits ? cp_cache_place(c->e->cache, &r, c->hits, c->st, &p, err) : CP_OK;
    c->resp->segments_hit += p.segments_hit;
    c->resp->private_hit_tokens += p.private_hit_tokens;
    c->resp->shared_hit_tokens += p.shared_hit_tokens;
    if (c->state[c->T - 1] == TOK_REUSED) c->state[c->T - 1] = TOK_RECOMPUTE; /* its logits start decoding */
    return rc;
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
            if (rc == CP_OK) rc = grow_state(e, &e->canon, n, err);
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
static cp_status store(reqctx *c, cp_error *err)
{
    cp_engine *e = c->e;
    const cp_cache_policy *pol = cp_cache_policy_of(e->cache);
    const int32_t *ids = c->prompt.enc.ids;
    int T = c->T;
    cp_cache_req r = cache_req(c);
    cp_status rc = cp_cache_writer_open(e->cache, &r, c->state, c->exact, c->shared_hit, &c->store, err);
    if (rc == CP_OK) rc = cp_cache_store_prompt(c->store, c->st, err);
    if (pol->segments && (rc || e->o.segment_kv == CP_SEGKV_CANONICAL)) {
        stage_to(c, CP_STAGE_STORE);
        if (rc == CP_OK) rc = store_canonical(c, err); /* its runs' forwards, bands and inserts */
        stage_to(c, CP_STAGE_ANNOTATE);
    } else if (pol->segments) {
        /* runs end at message boundaries (group = message): a document is
         * segmented from its own rows alone, the same whatever follows it */
        cp_annot_input in = annot_input(c);
        cp_annot_result ar = { 0 };
        cp_annot_dev dev = { 0 };
        cp_backend *be = e->m->be;
        stage_to(c, CP_STAGE_STORE); /* the private insert above */
        cp_range_push(be, "annotate");
        if (c->A_on_backend) { /* the O(T^2) part next to the export */
            rc = be->annot_open(be, c->A, (size_t)T, T, c->mask_backend, &dev, err);
            in.dev = &dev;
        }
        if (rc == CP_OK) rc = c->A_on_backend ? cp_annotate(&in, &e->o.annot, &ar, err) : cp_annotate_band(&in, &c->band, &e->o.annot, &ar, err);
        if (dev.ctx) be->annot_close(be, &dev);
        cp_range_pop(be);
        stage_to(c, CP_STAGE_ANNOTATE);
        if (rc == CP_OK) rc = store_segments(c, c->st, ids, &ar, 0, err);
        cp_annot_result_free(&ar);
    }
    int segs, shared, priv;
    cp_cache_writer_close(c->store, &segs, &shared, &priv);
    c->store = NULL;
    c->resp->segments_stored += segs, c->resp->shared_stored += shared, c->resp->private_stored += priv;
    stage_to(c, CP_STAGE_STORE);
    return rc;
}

/* Whether the prefill exports its attention for the annotator: the policy
 * stores the annotator's segments of the request itself (not canonical
 * runs). */
static int wants_export(const cp_engine *e)
{
    return cp_cache_policy_of(e->cache)->segments && e->o.segment_kv != CP_SEGKV_CANONICAL;
}

/* The recompute ratio R of the mode's policy. */
static double recompute_ratio(const cp_engine *e)
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
static cp_status deviation_probe(cp_engine *e, cp_state *st, const int32_t *ids, int n, float *dev, cp_error *err)
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
static cp_status select_by_deviation(reqctx *c, cp_error *err)
{
    cp_engine *e = c->e;
    int T = c->T, n_reuse = 0;
    for (int i = 0; i < T; i++) n_reuse += c->state[i] != TOK_FRESH;
    if (!n_reuse || e->o.deviation_layer >= e->m->cfg.n_layers) return CP_OK;
    double r = recompute_ratio(e);
    float *dev = malloc((size_t)T * sizeof *dev), (*rank)[2] = malloc((size_t)n_reuse * sizeof *rank);
    if (!dev || !rank) {
        free(dev), free(rank);
        return cp_fail(err, CP_ENOMEM, "request: out of memory");
    }
    cp_status rc = deviation_probe(e, c->st, c->prompt.enc.ids, T, dev, err);
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

static cp_status decode(cp_engine *e, cp_sampler *smp, int32_t first, float margin0, int max_tokens, int ignore_eos, const cp_request *req,
                        cp_response *resp, cp_error *err);

/* the prefill's attention export for the annotator */
static cp_export prefill_export(reqctx *c)
{
    return (cp_export){ .a = c->A, .ld = c->T, .sensitive = c->mask, .sens_mass = c->sens_mass, .a_on_backend = c->A_on_backend,
                        .rows = c->A_on_backend ? NULL : band_rows, .rows_ctx = c };
}

#define METHOD_EXPORT_FLOATS ((size_t)1 << 26) /* 256 MiB of fresh export rows held through the layers */

/* A request-time method runs when one is set and something was reused; a
 * prompt whose fresh rows' export would not fit the bound (the selective
 * prefill holds them all through the layers) takes the plan path. */
static int use_method(const reqctx *c, int need_export)
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
    cp_recompute_opts ro = { .method = e->o.recompute_method, .r = recompute_ratio(e),
                             .start = e->o.gradual_start, .layer = e->o.deviation_layer, .k_first = e->o.annot.k0,
                             .tail = e->o.recompute_tail,
                             .per_segment = e->o.recompute_per_segment };
    cp_export ex = prefill_export(c);
    cp_recompute_in in = { .ids = c->prompt.enc.ids, .T = c->T, .seg_off = c->seg_off, .exact = c->exact, .ex = need_export ? &ex : NULL };
    cp_recompute_stats rs;
    cp_status rc = cp_recompute_prefill(e->m, c->st, &ro, &in, c->state, logits, &rs, err);
    if (rc == CP_OK) c->resp->partial_rows += rs.partial_rows;
    return rc;
}

/* Whether a request's KV may go into the pool after its first token: not
 * when it asked for no-store, nor when its client has already left (a
 * cancelled request stores nothing, never half). */
static int may_store(const cp_request *req)
{
    return !req->no_store && !(req->cancelled && req->cancelled(req->piece_ctx));
}

static int is_eos(const cp_config *cfg, int id)
{
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id) return 1;
    return 0;
}

/* What the prefill computes under the plan: the computed tokens (toks) at
 * their slots (= positions), counted into the response; with the
 * annotator's export (*need_export) ready in *ex. */
static cp_status prefill_inputs(reqctx *c, int by_method, float *logits, int32_t **slots_out, int32_t **toks_out, int *n_out,
                                cp_export *ex, int *need_export, cp_error *err)
{
    cp_engine *e = c->e;
    cp_response *resp = c->resp;
    cp_status rc = CP_OK;
    *need_export = wants_export(e);
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
            rc = cp_annot_band_init(&c->band, c->T, &e->o.annot, err);
        }
        /* before the prefill: the band is cut into runs as rows arrive */
        if (rc == CP_OK) c->fresh = annot_fresh(c);
        stage_to(c, CP_STAGE_EXPORT);
    }
    if (rc == CP_OK && (!slots || !toks || (need && ((c->A_on_backend && !c->A) || !c->sens_mass || !c->fresh))))
        rc = cp_fail(err, CP_ENOMEM, "request: out of memory");
    if (rc == CP_OK && by_method) rc = method_prefill(c, need, logits, err); /* rewrites the plan: counted below */
    if (by_method) stage_to(c, CP_STAGE_PREFILL);
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
    *ex = prefill_export(c);
    if (rc) free(slots), free(toks), slots = toks = NULL, n = 0;
    *slots_out = slots, *toks_out = toks, *n_out = n;
    return rc;
}

/* The plan into the response (for --plan-out), after the prefill. */
static void keep_plan(reqctx *c)
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

cp_status cp_engine_run(cp_engine *e, const cp_request *req, cp_response *resp, cp_error *err)
{
    memset(resp, 0, sizeof *resp);
    double t0 = now_ms();
    reqctx c = { .e = e, .req = req, .resp = resp, .mark = t0 };
    cp_sampler smp = { 0 };
    cp_status rc = cp_state_reset(e->m, e->st, err);
    stage_to(&c, CP_STAGE_PLACEMENT);
    if (rc == CP_OK) rc = prepare(&c, err);
    if (rc == CP_OK) rc = grow_state(e, &e->st, c.T + req->max_tokens, err);
    c.st = e->st;
    stage_to(&c, CP_STAGE_PLACEMENT);
    cp_range_push(e->m->be, "retrieve");
    if (rc == CP_OK) rc = lookup(&c, err);
    cp_range_pop(e->m->be);
    if (rc == CP_OK) rc = plan_and_place(&c, err);
    stage_to(&c, CP_STAGE_PLACEMENT);
    int need_export = wants_export(e);
    int by_method = rc == CP_OK && use_method(&c, need_export);
    if (rc == CP_OK && e->o.recompute_by_deviation && !by_method) {
        rc = select_by_deviation(&c, err);
        stage_to(&c, CP_STAGE_SELECTION);
    }
    int32_t *slots = NULL, *toks = NULL;
    int n = 0;
    cp_export ex;
    /* a request-time method runs the whole prefill itself (rewriting the plan) */
    if (rc == CP_OK) rc = prefill_inputs(&c, by_method, e->logits, &slots, &toks, &n, &ex, &need_export, err);
    if (rc == CP_OK && !by_method)
        rc = cp_forward_at(e->m, e->st, toks, slots, slots, n, c.T, CP_LOGITS_LAST, e->logits, need_export ? &ex : NULL, err);
    if (!by_method) stage_to(&c, CP_STAGE_PREFILL);
    free(slots), free(toks);
    if (rc == CP_OK) keep_plan(&c);
    int32_t first = -1;
    if (rc == CP_OK) rc = cp_sampler_init(&smp, &req->sampling, e->n_valid, err);
    float margin0 = 0;
    if (rc == CP_OK && req->max_tokens > 0) first = cp_sample(&smp, e->logits), margin0 = cp_top2_margin(e->logits, e->n_valid);
    resp->ttft_ms = now_ms() - t0; /* the first token is out */
    stage_to(&c, CP_STAGE_FIRST_TOKEN);
    double t1 = now_ms();
    c.mark = t1;
    /* no-store, or a client already gone: nothing of this request enters the
     * pool, and its admission counts are left as they were */
    int keep = may_store(req);
    if (rc == CP_OK && cp_cache_active(e->cache) && keep) rc = store(&c, err);
    resp->offpath_ms = now_ms() - t1;
    if (rc == CP_OK && req->max_tokens > 0) {
        rc = decode(e, &smp, first, margin0, req->max_tokens, req->ignore_eos, req, resp, err);
        if (rc == CP_OK) rc = cp_detokenize(e->tok, resp->ids, resp->n_ids, 1, &resp->text, NULL, err);
    }
    cp_sampler_free(&smp);
    ctx_free(&c); /* releases the pins */
    cp_status zr = cp_state_reset(e->m, e->st, NULL); /* the request's KV held its secrets */
    if (rc == CP_OK) rc = zr;
    resp->total_ms = now_ms() - t0;
    if (rc) {
        free(resp->ids), free(resp->margins), free(resp->text), free(resp->prompt_ids), free(resp->plan), free(resp->plan_flags), free(resp->sensitive);
        resp->ids = NULL, resp->margins = NULL, resp->text = NULL, resp->prompt_ids = NULL, resp->plan = NULL, resp->plan_flags = NULL, resp->sensitive = NULL, resp->n_ids = 0;
    }
    return rc;
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

/* decoding shared by the request path and replays (req NULL: no streaming) */
static cp_status decode(cp_engine *e, cp_sampler *smp, int32_t first, float margin0, int max_tokens, int ignore_eos, const cp_request *req,
                        cp_response *resp, cp_error *err)
{
    resp->ids = malloc((size_t)max_tokens * sizeof *resp->ids);
    resp->margins = malloc((size_t)max_tokens * sizeof *resp->margins);
    float *lg = malloc((size_t)e->m->cfg.vocab * sizeof *lg);
    cp_status rc = resp->ids && resp->margins && lg ? CP_OK : cp_fail(err, CP_ENOMEM, "request: out of memory");
    cp_detok_stream ds;
    cp_detok_stream_init(&ds, e->tok, 1); /* skip special ids, as the final text does */
    int32_t next = first;
    float margin = margin0;
    while (rc == CP_OK) {
        resp->margins[resp->n_ids] = margin;
        resp->ids[resp->n_ids++] = next;
        if (req && req->on_piece && stream_piece(&ds, req, next, &rc, err)) break;
        if ((!ignore_eos && is_eos(&e->m->cfg, next)) || (int)resp->n_ids == max_tokens) break;
        rc = cp_forward(e->m, e->st, &next, NULL, 1, CP_LOGITS_LAST, lg, NULL, err);
        if (rc == CP_OK) next = cp_sample(smp, lg), margin = cp_top2_margin(lg, e->n_valid);
    }
    cp_detok_stream_free(&ds);
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
    double t0 = now_ms();
    const cp_config *cfg = &e->m->cfg;
    int32_t *slots = malloc((size_t)n * sizeof *slots), *toks = malloc((size_t)n * sizeof *toks);
    uint8_t *reused = malloc((size_t)n);
    cp_status rc = slots && toks && reused ? grow_state(e, &e->st, n + max_tokens, err) : cp_fail(err, CP_ENOMEM, "replay: out of memory");
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
        rc = dev ? deviation_probe(e, e->st, ids, n, dev, err) : cp_fail(err, CP_ENOMEM, "replay: out of memory");
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
    resp->ttft_ms = now_ms() - t0;
    if (rc == CP_OK && max_tokens > 0) rc = decode(e, &smp, first, cp_top2_margin(e->logits, e->n_valid), max_tokens, 1, NULL, resp, err);
    cp_sampler_free(&smp);
    cp_status zr = cp_state_reset(e->m, e->st, NULL); /* a replayed prompt is a tenant's too */
    if (rc == CP_OK) rc = zr;
    resp->total_ms = now_ms() - t0;
    free(slots), free(toks), free(reused);
    return rc;
}

/* ---- the request path in phases, for the batching scheduler ------------------- */

struct cp_job {
    reqctx c;
    cp_sampler smp;
    cp_export ex;
    int need_export, begun;
    int32_t *slots, *toks; /* the computed tokens in prompt order (slot = position) */
    int n, cur;            /* how many; the first not yet handed to a step */
    int32_t next;          /* the token the next decode step feeds */
    float *logits;         /* [vocab] */
    cp_detok_stream ds;
    int ds_open;
    double t0;
};

cp_model *cp_engine_model(const cp_engine *e) { return e->m; }
cp_pool *cp_engine_pool(const cp_engine *e) { return cp_cache_pool(e->cache); }

cp_status cp_job_create(cp_engine *e, const cp_request *req, cp_response *resp, cp_job **out, cp_error *err)
{
    *out = NULL;
    memset(resp, 0, sizeof *resp);
    cp_job *j = cp_calloc(1, sizeof *j, "request job", err);
    if (!j) return CP_ENOMEM;
    j->t0 = now_ms();
    j->c = (reqctx){ .e = e, .req = req, .resp = resp, .mark = j->t0 };
    cp_status rc = prepare(&j->c, err);
    if (rc) {
        ctx_free(&j->c);
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
    cp_status rc = render_checked(&c, err);
    *prompt_tokens = c.T;
    rendered_free(&c); /* nothing else was made: no pool, no pins */
    return rc;
}

cp_status cp_job_peek_hits(cp_job *j, int *tokens, cp_error *err)
{
    reqctx *c = &j->c;
    *tokens = 0;
    if (j->begun) return cp_fail(err, CP_EINVAL, "job: hits peeked after it retrieved");
    if (!cp_cache_pool(c->e->cache)) return CP_OK;
    stage_to(c, CP_STAGE_QUEUE);
    cp_status rc = lookup(c, err);
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
    stage_to(c, CP_STAGE_QUEUE); /* from submission (or its last peek) until now */
    /* its own KV, sized for this request, with the engine's internal chunk:
     * the step's activations live in the batch workspace, but a request-time
     * recompute method runs its layers here in chunks of max_batch, and its
     * deviation ranking must be the one a lone run computes (a GEMM's
     * summation order moves with the chunk's row count) */
    cp_status rc = cp_state_create_kv(e->m, c->T + req->max_tokens, STATE_BATCH, e->o.kv_dtype, &c->st, err);
    stage_to(c, CP_STAGE_PLACEMENT);
    cp_range_push(e->m->be, "retrieve");
    if (rc == CP_OK) rc = lookup(c, err);
    cp_range_pop(e->m->be);
    if (rc == CP_OK) rc = plan_and_place(c, err);
    stage_to(c, CP_STAGE_PLACEMENT);
    int need_export = wants_export(e);
    int by_method = rc == CP_OK && use_method(c, need_export);
    if (rc == CP_OK && e->o.recompute_by_deviation && !by_method) {
        rc = select_by_deviation(c, err);
        stage_to(c, CP_STAGE_SELECTION);
    }
    if (rc == CP_OK && !(j->logits = cp_malloc((size_t)e->m->cfg.vocab * sizeof *j->logits, "job logits", err))) rc = CP_ENOMEM;
    /* a request-time recompute method (the default, epic) selects layer by
     * layer over the whole prompt: it runs here, for this request alone, and
     * leaves the steps nothing to prefill — its first token comes from the
     * logits it wrote, at the step its last chunk is scheduled */
    if (rc == CP_OK) rc = prefill_inputs(c, by_method, j->logits, &j->slots, &j->toks, &j->n, &j->ex, &j->need_export, err);
    if (rc == CP_OK && by_method) { /* nothing left for the steps: its ids are wiped now, their count goes */
        if (j->toks) OPENSSL_cleanse(j->toks, (size_t)j->n * sizeof *j->toks);
        j->n = 0;
    }
    /* every computed slot's position before the first chunk, as cp_forward_at does */
    if (rc == CP_OK) rc = cp_state_set_positions(c->st, j->slots, j->slots, j->n, err);
    if (rc == CP_OK && req->max_tokens > 0 && !(c->resp->ids = cp_malloc((size_t)req->max_tokens * sizeof *c->resp->ids, "job ids", err)))
        rc = CP_ENOMEM;
    if (rc == CP_OK) rc = cp_sampler_init(&j->smp, &req->sampling, e->n_valid, err);
    if (rc == CP_OK) cp_detok_stream_init(&j->ds, e->tok, 1), j->ds_open = 1;
    stage_to(c, CP_STAGE_PLACEMENT); /* its slots and buffers for the steps */
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
    resp->ids[resp->n_ids++] = id;
    j->next = id;
    *done = (!req->ignore_eos && is_eos(&j->c.e->m->cfg, id)) || (int)resp->n_ids == req->max_tokens;
    if (req->on_piece && stream_piece(&j->ds, req, id, &rc, err)) *done = 1;
    return rc;
}

cp_status cp_job_first_token(cp_job *j, int *done, cp_error *err)
{
    reqctx *c = &j->c;
    cp_engine *e = c->e;
    const cp_request *req = c->req;
    *done = 1;
    if (j->cur != j->n) return cp_fail(err, CP_EINVAL, "job: first token before the prefill ended (%d of %d)", j->cur, j->n);
    stage_to(c, CP_STAGE_PREFILL); /* the steps that carried its chunks */
    keep_plan(c);
    int32_t first = req->max_tokens > 0 ? cp_sample(&j->smp, j->logits) : -1;
    memcpy(e->logits, j->logits, (size_t)e->m->cfg.vocab * sizeof *e->logits); /* cp_engine_last_logits */
    c->resp->ttft_ms = now_ms() - j->t0; /* from submission: the queue's wait counts */
    stage_to(c, CP_STAGE_FIRST_TOKEN);
    double t1 = now_ms();
    c->mark = t1;
    int keep = may_store(req);
    cp_status rc = cp_cache_active(e->cache) && keep ? store(c, err) : CP_OK;
    c->resp->offpath_ms = now_ms() - t1;
    if (rc == CP_OK && req->max_tokens > 0) rc = job_emit(j, first, done, err);
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
    cp_state *st = c->st;
    cp_model *m = c->e->m;
    ctx_free(c);            /* releases the pins */
    cp_state_free(m, st);   /* zeroes the request's KV first: it held its secrets */
    if (j->toks) OPENSSL_cleanse(j->toks, (size_t)j->n * sizeof *j->toks); /* the prompt's computed ids */
    free(j->slots), free(j->toks), free(j->logits);
    resp->total_ms = now_ms() - j->t0;
    if (rc) {
        if (resp->prompt_ids) OPENSSL_cleanse(resp->prompt_ids, (size_t)resp->prompt_tokens * sizeof *resp->prompt_ids);
        free(resp->ids), free(resp->margins), free(resp->text), free(resp->prompt_ids), free(resp->plan), free(resp->plan_flags), free(resp->sensitive);
        resp->ids = NULL, resp->margins = NULL, resp->text = NULL, resp->prompt_ids = NULL, resp->plan = NULL, resp->plan_flags = NULL, resp->sensitive = NULL, resp->n_ids = 0;
    }
    free(j);
    return rc;
}
