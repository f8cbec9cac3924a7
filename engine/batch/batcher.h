/* Continuous batching over an engine: requests in flight together, each
 * step one cp_forward_batch carrying every running request's decode token
 * and the prefill chunks the scheduler (step_sched.h) hands out, so decoding k
 * requests streams the weights once.
 *
 * Per request the request path keeps its order (request.h, cp_job_*):
 * retrieve and plan just before its first prefill chunk — later than a
 * sequential engine would, so it sees what requests ahead of it stored
 * meanwhile, and it cannot see a request that was still prefilling —
 * annotate and store right after its first token, then one token a step
 * under its own sampler and seed; when it retires its pins are released and
 * its KV zeroed.  The reuse prefill is batched too: a request's computed
 * tokens go into the step at their slots (cp_batch_seq slot mode) with the
 * attention export the annotator reads, so hits only shorten the
 * requester's own share of a step's compute.
 *
 * The server calls it from its one engine thread: cp_batcher_submit as jobs
 * leave the server's queue (engine/server/queue.h), cp_batcher_step in a
 * loop while cp_batcher_pending, the done callback once per submitted
 * request (its response complete, or its error).
 * `cacheprune run --concurrency N` replays a log through it. */
#ifndef CP_BATCHER_H
#define CP_BATCHER_H

#include "../request.h"
#include "step_sched.h"

/* A waiting request as a batcher's admission policy sees it: the
 * scheduler's id (arrival order), the pointer it was submitted with, and
 * its job (cp_job_peek_hits: what the pool would serve it now). */
typedef struct cp_batcher_waiting {
    uint64_t id;
    void *user;
    cp_job *job;
} cp_batcher_waiting;

/* An admission order other than arrival order (step_sched.h,
 * cp_sched_policy): order may permute w[0..n).  Only the attack harness
 * registers one, its leaky control (eval/probe.h); serve and run
 * register none. */
typedef struct cp_batcher_policy {
    cp_status (*order)(void *ctx, cp_batcher_waiting *w, size_t n, cp_error *err);
    void *ctx;
} cp_batcher_policy;

typedef struct cp_batcher_opts {
    int max_running;     /* requests in flight */
    int step_tokens;     /* tokens a step carries (> max_running) */
    /* tokens a step carries when none of its requests decodes (step_sched.h);
     * 0: step_tokens.  serve and run default to CP_BATCH_PREFILL_TOKENS */
    int prefill_tokens;
    size_t kv_bytes;     /* KV memory the running requests may hold (K, K before RoPE, V: f32) */
    /* NULL (serve, run): arrival order.  The attack harness's leaky control
     * only: the policy it registers (copied at creation) */
    const cp_batcher_policy *policy;
    /* 1: one prompt prefills at a time even on an engine without a pool
     * (which otherwise lets several share a step's budget: step_sched.h,
     * prefill_many) — for measuring what that rule costs */
    int serial_prefill;
    /* 1 (serve): the next prompt to prefill is of the tenant whose last
     * one started longest ago (step_sched.h, prefill_by_tenant); 0 (run):
     * the oldest */
    int prefill_by_tenant;
} cp_batcher_opts;

/* A step's default token budget on the CPU backend: a step with prefill
 * work then takes at most about twice a pure decode step (profiling/bench_batch). */
#define CP_BATCH_STEP_TOKENS_CPU 32
/* The default budget of a step in which no request decodes (a burst of new
 * prompts, or one request alone): the sequential path's own prefill chunk
 * (engine/request.c, STATE_BATCH), so a prompt alone prefills as `run`
 * without --concurrency does, and nobody's inter-token latency waits on it. */
#define CP_BATCH_PREFILL_TOKENS 512

typedef struct cp_batcher cp_batcher;

/* rc, err: the request's outcome; user as given to submit */
typedef void (*cp_batcher_done)(void *ctx, void *user, cp_status rc, const cp_error *err);

cp_status cp_batcher_create(cp_engine *e, const cp_batcher_opts *o, cp_batcher **out, cp_error *err);
/* Requests still held are finished (cancelled) without a callback. */
void cp_batcher_free(cp_batcher *b);
/* Queues a request (rendered, tokenized, detected now; nothing read from the
 * pool yet).  An error is this request's alone (nothing queued, no callback).
 * req and resp must stay valid until its done callback. */
cp_status cp_batcher_submit(cp_batcher *b, const cp_request *req, cp_response *resp, void *user, uint64_t *id, cp_error *err);
/* The same for a job made already (cp_job_create, on any thread that alone
 * uses the engine's detector chain): the batcher takes it, and on an error
 * finishes it. */
cp_status cp_batcher_submit_job(cp_batcher *b, cp_job *job, const cp_request *req, void *user, uint64_t *id, cp_error *err);
/* The request retires at the next step (done with an error). */
int cp_batcher_cancel(cp_batcher *b, uint64_t id);
/* One step: plan, run, retire; done is called for each request that retired.
 * An error here is the whole step's (its requests have been failed). */
cp_status cp_batcher_step(cp_batcher *b, cp_batcher_done done, void *ctx, cp_error *err);
size_t cp_batcher_pending(const cp_batcher *b);
/* Could a request of these lengths ever fit the KV budget (else submit
 * refuses it)?  It reads a figure fixed at creation: any thread may ask. */
int cp_batcher_fits(const cp_batcher *b, int prompt_tokens, int max_tokens);
/* The most tokens to generate a prompt of prompt_tokens may reserve (0 when the prompt alone is too long). */
int cp_batcher_room(const cp_batcher *b, int prompt_tokens);

/* What the steps carried so far (an operator's figures: the server's
 * /metrics shows them, and they prove requests really share steps). */
typedef struct cp_batcher_stats {
    uint64_t steps;       /* steps that ran a forward */
    uint64_t seqs;        /* sequences summed over those steps */
    uint64_t tokens;      /* tokens summed over those steps */
    int last_seqs;        /* sequences of the latest step */
    int max_seqs;         /* the most sequences one step carried */
    /* where the steps went (make bench-serve reads them off /metrics):
     * tokens by kind, the most one step carried (never over step_tokens),
     * seconds in cp_forward_batch and in the rest of cp_batcher_step (the
     * plan, each request's retrieve / sample / store / stream / finish) */
    uint64_t prefill_tokens, decode_tokens;
    int max_tokens;
    double forward_s, host_s;
    /* the steps that carried prefill work (the rest were pure decode) and
     * their forward's seconds (part of forward_s) */
    uint64_t prefill_steps;
    double prefill_forward_s;
} cp_batcher_stats;
void cp_batcher_stats_get(const cp_batcher *b, cp_batcher_stats *out);

#endif
