/* The CachePrune request path: render + tokenize -> detect -> retrieve
 * (the tenant's private segments, then shared segments over non-sensitive
 * windows) -> plan (fresh / reused / recomputed per token) -> reuse prefill
 * -> first token -> then, off the time-to-first-token path: annotate, store
 * segments (scope per policy), decode, release pins, zero the request's KV.
 *
 * The same engine runs every sharing mode with the same prefill code, so
 * they can be compared side by side; what each mode looks up and stores is
 * its policy in the cache manager (engine/cache/policy.h), the only door
 * between a request and stored KV (engine/cache/cache.h).
 * The cp_job_* phases below are the request path (engine/pipeline.c): the
 * batcher (engine/batch/) runs many requests through them, admitted in
 * arrival order (FIFO: a cache hit never jumps the queue), and
 * cp_engine_run serves one request alone as a batch of one through the
 * same phases. */
#ifndef CP_REQUEST_H
#define CP_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"
#include "annotate/annotate.h"
#include "cache/cache.h" /* the sharing modes, and the pool and tier types the engine is handed */
#include "detect/detect.h"
#include "recompute.h"
#include "sampler.h"

typedef enum cp_segkv { CP_SEGKV_IN_CONTEXT = 0, CP_SEGKV_CANONICAL, CP_SEGKV_STRICT } cp_segkv;

cp_status cp_segkv_from_name(const char *name, cp_segkv *out, cp_error *err);
const char *cp_segkv_name(cp_segkv s);

typedef struct cp_engine_opts {
    cp_sharing sharing;
    cp_segkv segment_kv;
    int user_text_private;  /* --user-text private: user segments stay the tenant's */
    int admit_k;            /* a segment is shared once k distinct tenants produced it (1) */
    int chunk_size;         /* chunk mode (512) */
    double chunk_recompute; /* chunk mode recompute ratio (0.15) */
    int mask_pad;           /* 1 */
    int private_reuse;      /* look up the tenant's own segments first (1) */
    int report_reuse;       /* tenants may see whether shared segments were hit (0) */
    cp_annot_opts annot;
    /* which reused tokens to recompute: 0 the flags stored with each segment
     * (annotator: first k0 + top r by external attention; chunk: its head);
     * 1 at request time, the fraction r (chunk: chunk_recompute) of reused
     * tokens whose layer-`deviation_layer` K/V moved most when recomputed in
     * this context (CacheBlend's selection; costs that many layers over the
     * whole prompt) */
    int recompute_by_deviation;
    int deviation_layer;    /* 1 */
    /* CP_RECOMPUTE_PLAN: the above; else a request-time method of
     * recompute.h (gradual, flagged, epic) over this request's reused
     * tokens, R = annot.r (chunk: chunk_recompute), k_first = annot.k0, its
     * first ranking at deviation_layer (recompute_by_deviation set: that
     * instead).  Default: epic */
    cp_recompute_method recompute_method;
    double gradual_start;   /* gradual: the set starts at this x R (2) */
    int recompute_tail;     /* request-time methods: the last N reused tokens before the end are forced (0) */
    int detect_memo;        /* messages whose detection each tenant's later requests reuse (engine/detect_memo.h; 1024, 0: none) */
    double recompute_per_segment; /* request-time methods: R grows by this per reused segment not exact (0) */
    cp_template tpl;
    int max_context;        /* prompt + generation limit; 0 = the model's max_position_embeddings */
    /* --kv-dtype: the request caches' KV element type, CP_F32 (0 = f32) or
     * CP_BF16 (half the bytes per token); the pool's layout must match */
    cp_dtype kv_dtype;
} cp_engine_opts;

void cp_engine_opts_default(cp_engine_opts *o);

typedef struct cp_request_msg {
    cp_role role;
    const char *text;
    size_t len;
    int sensitive;          /* the whole message is sensitive */
    const cp_span *marked;  /* explicit sensitive spans (byte offsets into text) */
    size_t n_marked;
} cp_request_msg;

typedef struct cp_request {
    uint32_t tenant;
    const cp_request_msg *msgs;
    size_t n_msgs;
    int max_tokens;
    cp_sampler_opts sampling;
    int ignore_eos;
    /* Streaming (optional): called during decoding once per generated token
     * with the text that token made final (the tokenizer's streaming
     * decoder: whole UTF-8 characters only; n may be 0).  A non-zero return
     * stops generation after that token (a stop string, a client gone). */
    int (*on_piece)(void *ctx, const char *bytes, size_t n);
    void *piece_ctx;
    /* cache "no-store": nothing of this request is inserted into the pool
     * (private or shared) and its --admit-k counts are not touched; it
     * still reads what is stored */
    int no_store;
    /* optional, ctx = piece_ctx: non-zero once the client is gone; asked
     * before anything is stored (then nothing is) */
    int (*cancelled)(void *ctx);
} cp_request;

/* Where a request's time goes, stage by stage, on one monotonic clock.  The
 * stages up to CP_STAGE_FIRST_TOKEN partition the time to the first token:
 * each is the wall time from the previous stage's end to its own, so they
 * add up to ttft_ms; the ones after it partition offpath_ms.  A stage the
 * request's mode never runs stays 0. */
typedef enum cp_stage {
    CP_STAGE_QUEUE,       /* batched: from submission to the job's begin (and peeks meanwhile) */
    CP_STAGE_TOKENIZE,    /* validation, <pii> markers, rendering, tokenizing */
    CP_STAGE_DETECT,      /* the detector chain, the sensitive mask, shared eligibility */
    CP_STAGE_LOOKUP,      /* the local pool's lookups (pins taken) */
    CP_STAGE_TIER,        /* the tier: its purge-epoch check and fetches into the pool */
    CP_STAGE_PLACEMENT,   /* the request's KV state made ready, the plan, reused KV placed, exact marks */
    CP_STAGE_SELECTION,   /* the plan path's deviation probe and ranking (--recompute-by deviation) */
    CP_STAGE_PREFILL,     /* the prefill's compute: the computed tokens, or a request-time method's
                           * selective prefill (its selection's partial rows included); batched:
                           * the steps until its last chunk, shared with other requests */
    CP_STAGE_EXPORT,      /* the annotator's attention export: its buffers, and the rows cut into
                           * its band as the prefill hands them over (a backend that keeps the
                           * export itself: inside the prefill) */
    CP_STAGE_FIRST_TOKEN, /* the plan kept, the sampler, the first token sampled */
    CP_STAGE_ANNOTATE,    /* after the first token: segmenting (cacheprune's annotator; canonical runs) */
    CP_STAGE_STORE,       /* after the first token: the inserts into the pool (and the tier's queue) */
    CP_STAGE_N
} cp_stage;
/* the stages before the first token: [0, CP_STAGE_BEFORE_FIRST) */
#define CP_STAGE_BEFORE_FIRST (CP_STAGE_FIRST_TOKEN + 1)
/* "queue", "tokenize", ... (JSON keys and table rows); NULL out of range */
const char *cp_stage_name(int stage);

/* Why generation ended: decided once, by the engine, where it stops
 * generating (the server's finish_reason reads it). */
typedef enum cp_finish {
    CP_FINISH_NONE = 0, /* not ended: an error, or no token asked for (max_tokens 0) */
    CP_FINISH_STOP,     /* an end-of-sequence token of the model (not under ignore_eos) */
    CP_FINISH_LENGTH,   /* max_tokens generated */
    CP_FINISH_CALLER,   /* on_piece asked to stop (a stop sequence matched, the client left) */
} cp_finish;

typedef struct cp_response {
    int32_t *ids;
    size_t n_ids;
    cp_finish finish;
    /* per generated id, the top-1 minus top-2 logit it was chosen from
     * (cp_top2_margin: how near a tie the argmax was); NULL from the
     * batched path */
    float *margins;
    char *text;
    double ttft_ms, total_ms, offpath_ms;
    double stage_ms[CP_STAGE_N]; /* per cp_stage, ms (none from cp_engine_replay) */
    int prompt_tokens, sensitive_tokens;
    /* the operator's figures */
    int computed, reused, recomputed;
    int segments_hit, private_hit_tokens, shared_hit_tokens;
    int shared_reused, shared_recomputed; /* the shared hits' tokens by what became of them */
    /* token-layers computed for tokens that ended reused: the cost of a
     * request-time selection (deviation's probe, gradual's dropped tokens) */
    int partial_rows;
    int segments_stored, shared_stored, private_stored;
    /* the reuse plan (for --plan-out): prompt ids and per token 0 fresh,
     * 1 reused, 2 recomputed; plan_flags per token CP_PLAN_SEG_START (a
     * reused segment's first token) and CP_PLAN_EXACT (reused KV computed in
     * this very context: a request-time method never ranks or recomputes
     * it), so a replay's method spends what this request's did */
    int32_t *prompt_ids;
    uint8_t *plan;
    uint8_t *plan_flags;
    uint8_t *sensitive; /* per prompt token: the sensitive mask the request ran under (operator's) */
} cp_response;

enum { CP_PLAN_STATE = 3, CP_PLAN_SEG_START = 4, CP_PLAN_EXACT = 8 };

void cp_response_free(cp_response *r);
/* What the tenant may see: without report_reuse, tokens of shared segments
 * (reused or recomputed) count as plain computation, so a tenant cannot tell
 * another's text was hit; computed + reused stays the prompt length. */
void cp_response_tenant_view(const cp_response *r, int report_reuse, cp_response *out);

typedef struct cp_engine cp_engine;

/* Ids a model may emit and be decoded: its vocabulary, cut to the
 * tokenizer's ids (checkpoints pad the embedding past them); tok may be NULL. */
int cp_usable_vocab(const cp_model *m, const cp_tokenizer *tok);

/* The pool layout that holds this model's KV as the CPU engine stores it
 * (f32, 16 tokens a block, the model's fingerprint). */
void cp_engine_kv_layout(const cp_model *m, cp_kv_layout *out); /* f32 KV */
/* the pool layout for a KV dtype (--kv-dtype: CP_F32 or CP_BF16) */
void cp_engine_kv_layout_as(const cp_model *m, cp_dtype kv_dtype, cp_kv_layout *out);

/* The engine borrows model, tokenizer, pool (NULL only for sharing none) and
 * detector chain; they must outlive it. */
cp_status cp_engine_create(cp_model *m, cp_tokenizer *tok, cp_pool *pool, cp_detect_chain *chain, const cp_engine_opts *o,
                           cp_engine **out, cp_error *err);
void cp_engine_free(cp_engine *e);
/* The shared segment tier under the local pool (pool/tier.h), or NULL;
 * borrowed, it must outlive the engine.  Set before the first request. */
void cp_engine_set_tier(cp_engine *e, cp_tier *t);
/* Serves one request.  A bad request is an error for it alone; the engine
 * keeps serving. */
cp_status cp_engine_run(cp_engine *e, const cp_request *req, cp_response *resp, cp_error *err);
/* Erasure of one tenant (call it between requests, on the thread that runs
 * them): its private segments are purged from the pool (cp_pool_purge;
 * *segments of them) and it is dropped from every --admit-k record
 * (*admissions of them).  Shared segments stay.  With a tier, its private
 * values there go too (*tier_segments of them; -1 when Redis could not be
 * reached; 0 without a tier; tier_segments may be NULL) and its purge
 * epoch moves, so every other replica drops what it holds of the tenant
 * before that tenant's next request there (cp_tier_epoch_sync). */
void cp_engine_purge_tenant(cp_engine *e, uint32_t tenant, size_t *segments, size_t *admissions, long *tier_segments);
/* The prompt logits of the last request's first token (vocab floats):
 * quality comparisons and tests. */
const float *cp_engine_last_logits(const cp_engine *e);
/* The engine's request KV state, for tests and audits: between requests it
 * holds nothing (every K/V byte zero), since a request's KV held its
 * secrets. */
const cp_state *cp_engine_request_state(const cp_engine *e);

/* Replays a reuse plan made elsewhere (another model, same tokenizer):
 * tokens planned reused get placeholder KV (zeros) placed, the rest are
 * computed, then decoding runs.  The speed is real; the output is not
 * meaningful (the KV is not).  plan: cp_response's plan | plan_flags; under a
 * request-time method the method runs (its selection's cost is real) over
 * the plan's segments and exact tokens where the codes carry them (else each
 * run of reused tokens is a segment, none exact), and resp's counts are the
 * tokens the replay computed. */
cp_status cp_engine_replay(cp_engine *e, const int32_t *ids, const uint8_t *plan, int n, int max_tokens, cp_response *resp,
                           cp_error *err);

/* ---- the request path in phases (continuous batching, engine/batch) ----
 * One request as a job whose forward work a caller batches with others'
 * (cp_forward_batch), keeping the request path's order:
 *   cp_job_create       render, tokenize, detect (nothing read from the pool)
 *   cp_job_begin        before its first prefill chunk: its own KV state,
 *                       retrieve (pins taken), plan, reused KV placed
 *   cp_job_prefill_seq  the computed tokens among prompt positions
 *                       [from, from + len), as one sequence of a step
 *                       (returns how many: 0 = nothing to compute there)
 *   cp_job_first_token  after the step with its last chunk: the first token
 *                       (its own sampler and seed), TTFT, annotate + store
 *   cp_job_decode_seq / cp_job_decoded   one token a step
 *   cp_job_finish       text, pins released, KV zeroed and freed, the job
 *                       freed; returns rc or the first error of its own
 * done is set when generation ends (end of sequence, max_tokens, on_piece
 * asking to stop).  req and resp must outlive the job.  Its TTFT counts from
 * cp_job_create.  One thread drives an engine's jobs. */
typedef struct cp_job cp_job;

cp_status cp_job_create(cp_engine *e, const cp_request *req, cp_response *resp, cp_job **out, cp_error *err);
int cp_job_prompt_tokens(const cp_job *j);
/* What cp_job_create checks before it detects: the request's shape, its
 * rendering and tokenizing, its prompt + max_tokens inside the context
 * (CP_ERANGE past it), with *prompt_tokens the prompt's length.  It reads
 * only the engine's tokenizer, template and context, never the pool or the
 * detector, so any thread may call it while another drives the engine: a
 * server refuses what would fail there before the request is queued. */
cp_status cp_engine_check_request(const cp_engine *e, const cp_request *req, int *prompt_tokens, cp_error *err);
/* The context a request's prompt + max_tokens must fit in (tokens). */
int cp_engine_context(const cp_engine *e);
/* Prompt tokens the pool would serve the job if it retrieved now (the
 * lookup its cp_job_begin makes; pins taken and dropped at once).  For the
 * batch scheduler's leaky LPM control only (eval/probe.h, CP_SCHED_LPM_UNSAFE):
 * the FIFO order never asks. */
cp_status cp_job_peek_hits(cp_job *j, int *tokens, cp_error *err);
cp_status cp_job_begin(cp_job *j, cp_error *err);
int cp_job_prefill_seq(cp_job *j, int from, int len, int last, cp_batch_seq *out);
cp_status cp_job_first_token(cp_job *j, int *done, cp_error *err);
void cp_job_decode_seq(cp_job *j, cp_batch_seq *out);
cp_status cp_job_decoded(cp_job *j, int *done, cp_error *err);
cp_status cp_job_finish(cp_job *j, cp_status rc, cp_error *err);
cp_model *cp_engine_model(const cp_engine *e);
/* The engine's pool; NULL under sharing none. */
cp_pool *cp_engine_pool(const cp_engine *e);

#endif
