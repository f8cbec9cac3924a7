/* The continuous-batching step scheduler's core: which requests run in the
 * next forward step and with how many tokens.  It knows requests only as
 * (tenant, prompt length, tokens it may generate) — no model, no pool — so
 * its rules are testable with fake requests, and in arrival order (what
 * serve and run use: they register no admission policy) it cannot order
 * anyone by what the cache holds (THREAT_MODEL.md, scheduling channel).
 *
 * Each step (cp_sched_next):
 *   1. cancelled requests retire (their KV reservation returned);
 *   2. waiting requests are admitted in arrival order (strict FIFO: the
 *      first that does not fit stops admission, so nobody is overtaken)
 *      while fewer than max_running run and its KV reservation (prompt +
 *      max_new slots) fits in what kv_budget leaves (a per-tenant cap is
 *      the server queue's, engine/server/queue.h: it counts queued
 *      requests too);
 *   3. every request that is decoding gets one token;
 *   4. the rest of the step_tokens budget (prefill_tokens when no request
 *      decodes this step: then no one's inter-token latency waits on the
 *      step, and a burst of new prompts prefills in large chunks) goes to
 *      one prefill chunk: of
 *      the admitted request mid-prefill, else the oldest whose prompt is
 *      not done (with prefill_by_tenant: of the tenant whose last prompt
 *      started longest ago), counted in
 *      prompt positions (a position whose KV is reused costs its chunk as
 *      much as a computed one, so one request's cache hits never change
 *      another's chunking).  One request prefills at a time: the next
 *      starts — and retrieves — in the step after the last chunk of the
 *      one before, when that one has stored, so every request sees the pool
 *      a sequential engine would have shown it (the same reuse plans; the
 *      leftover of a last chunk's step is not given away for that).  An
 *      engine without a pool sets prefill_many: then the leftover goes to
 *      the next oldest prompts in the same step (fewer steps for a burst of
 *      arrivals; nothing is retrieved, so no plan changes).
 * The caller runs the step, then cp_sched_end says which requests finished
 * (end of sequence, a stop, an error); those and the ones that reached
 * max_new retire.  Retired requests are handed back (step->retired) for the
 * caller to free: KV zeroed, pins released.
 *
 * The API is single-threaded (the engine thread that runs the steps owns
 * it); a server submits from its HTTP threads through its own queue. */
#ifndef CP_STEP_SCHED_H
#define CP_STEP_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/status.h"

/* One waiting request as an admission policy sees it: its id (ids grow in
 * arrival order) and the pointer it was submitted with. */
typedef struct cp_sched_waiting {
    uint64_t id;
    void *user;
} cp_sched_waiting;

/* An admission order other than arrival order, registered by its caller.
 * Before each admission, order gets the waiting requests in arrival order
 * and may permute them; the scheduler reads back only the ids (anything
 * but a permutation of them fails the step).  serve and run register none
 * (order NULL: FIFO, nothing asked); the attack harness registers its leaky
 * longest-prefix-match control (eval/probe.h) through the batcher. */
typedef struct cp_sched_policy {
    cp_status (*order)(void *ctx, cp_sched_waiting *w, size_t n, cp_error *err);
    void *ctx;
} cp_sched_policy;

typedef struct cp_sched_opts {
    int step_tokens;      /* tokens a step may carry, decode and prefill (> max_running) */
    /* tokens a step may carry when no request decodes in it (all prefill);
     * 0 or less than step_tokens: step_tokens.  Whether anyone decodes
     * follows from arrivals, prompt lengths and outputs, never from hits */
    int prefill_tokens;
    long long kv_budget;  /* KV slots all running requests may reserve together */
    int max_running;      /* requests in flight */
    /* 1: several requests may prefill in one step (oldest first, each
     * taking what the budget leaves), for an engine without a pool, where
     * nothing is retrieved and no plan can depend on who stored first;
     * 0: one at a time (rule 4 above), what a sharing engine needs */
    int prefill_many;
    /* 1 (serve): when no prompt is mid-prefill, the next to start is the
     * oldest of the tenant whose last prompt started longest ago (one that
     * never started one: first; ties: the oldest) -- round-robin, so one
     * tenant's admitted prompts do not all prefill before another's, whose
     * first token then waited for every one of them; 0 (run): the oldest,
     * so a replay's plans are a sequential engine's.  Tenants and arrival
     * only, never hits. */
    int prefill_by_tenant;
    cp_sched_policy policy; /* order NULL (zero): arrival order; set by the attack harness and tests only */
} cp_sched_opts;

typedef enum cp_sched_kind { CP_SCHED_PREFILL = 0, CP_SCHED_DECODE } cp_sched_kind;

/* One request's share of a step. */
typedef struct cp_sched_work {
    uint64_t id;
    void *user;
    cp_sched_kind kind;
    int from, n;   /* prefill: prompt positions [from, from + n) */
    int first;     /* prefill: its first chunk (admitted this step: retrieve and plan before it) */
    int last;      /* prefill: its prompt ends here (its first token comes from this step) */
} cp_sched_work;

typedef struct cp_sched_step {
    cp_sched_work *work;
    int n_work, cap_work;
    int tokens;           /* sum of the work's n */
    void **retired;       /* requests that left, for the caller to free */
    int n_retired, cap_retired;
} cp_sched_step;

typedef struct cp_sched cp_sched;

cp_status cp_sched_create(const cp_sched_opts *o, cp_sched **out, cp_error *err);
void cp_sched_free(cp_sched *s);
/* Queues a request (arrival order = call order).  CP_ERANGE when its
 * reservation alone exceeds kv_budget (it could never run), CP_EINVAL for a
 * prompt < 1 or max_new < 0. */
cp_status cp_sched_submit(cp_sched *s, uint32_t tenant, int prompt, int max_new, void *user, uint64_t *id, cp_error *err);
/* Marks a request cancelled: it gets no more work and retires at the next
 * cp_sched_next.  0 when no such request is queued or running. */
int cp_sched_cancel(cp_sched *s, uint64_t id);
/* Cancels every request held (shutting down). */
void cp_sched_cancel_all(cp_sched *s);
/* Plans the next step into *step (its lists are reset first). */
cp_status cp_sched_next(cp_sched *s, cp_sched_step *step, cp_error *err);
/* After the step ran: finished[j] non-zero when work j's request is done
 * (NULL: none).  Requests done retire into step->retired (appended). */
cp_status cp_sched_end(cp_sched *s, cp_sched_step *step, const uint8_t *finished, cp_error *err);
void cp_sched_step_free(cp_sched_step *step);

size_t cp_sched_pending(const cp_sched *s);  /* queued + running */
size_t cp_sched_running(const cp_sched *s);
long long cp_sched_kv_used(const cp_sched *s);
/* 1 queued, 2 running, 0 retired or unknown */
int cp_sched_where(const cp_sched *s, uint64_t id);

#endif
