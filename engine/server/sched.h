/* The engine side of the server: the one queue of jobs (queue.h) and the
 * one engine thread that owns the model, the pool and the detector chain,
 * and runs the jobs continuously batched (engine/batch/batcher.h) — one
 * queue over one batch scheduler.
 *
 * Jobs leave the queue in the order they were accepted, whatever they would
 * hit in the cache: a hit never buys an earlier slot (THREAT_MODEL.md,
 * scheduling).  Between steps the engine thread takes queued jobs, oldest
 * first, into the batcher while fewer than `concurrency` are in flight —
 * in one round only those queued when it began, so a step runs between two
 * rounds whatever keeps arriving — and retires from the batch the jobs
 * whose clients left before their first token (the queue hands them over);
 * every step decodes one token for each running job and carries one
 * prefill chunk, and each job's tokens reach its text as they come.  A full
 * queue refuses the job at once (the HTTP side answers 429).
 *
 * A purge runs on the engine thread between steps.  Like a queued job it
 * waits for its turn, and then also for the purged tenant's jobs in flight
 * (taken before it) to finish, admitting nothing meanwhile: everything the
 * tenant asked for before the purge is stored before it and erased by it,
 * and no request holds a pin on what it erases.
 *
 * The HTTP side uses only srv_sched_check / submit / cancel / close /
 * pending and the job's own functions (job.h). */
#ifndef CP_SRV_SCHED_H
#define CP_SRV_SCHED_H

#include <stddef.h>

#include "../request.h"
#include "job.h"
#include "metrics.h"
#include "queue.h"

/* What the engine thread owns once the scheduler starts (borrowed: they
 * must outlive the scheduler, and nothing else may touch them meanwhile). */
typedef struct srv_engine {
    cp_engine *engine;
    cp_pool *pool;           /* may be NULL (sharing none) */
    cp_detect_chain *chain;
    int report_reuse;        /* cached_tokens shows shared reuse too */
    /* batching (0: the defaults below) */
    int concurrency;         /* jobs in flight together */
    int step_tokens;         /* tokens one step carries (> concurrency) */
    int prefill_tokens;      /* ... when none of its jobs decodes (0: step_tokens) */
    size_t kv_bytes;         /* KV memory the jobs in flight may reserve */
} srv_engine;

#define SRV_CONCURRENCY_DEFAULT 8
#define SRV_KV_BYTES_DEFAULT ((size_t)1024 << 20)

typedef struct srv_sched srv_sched;

/* per_tenant: the most queued + running requests one tenant may have (0 =
 * no cap) among n_tenants tenants (ids 0 .. n_tenants - 1: the keys'). */
cp_status srv_sched_start(const srv_engine *eng, size_t max_queue, size_t per_tenant, uint32_t n_tenants, srv_metrics *metrics,
                          srv_sched **out, cp_error *err);

/* The admission check, on the caller's thread before the job is queued:
 * everything the batcher would refuse the job for at its start that needs
 * no model — its shape, its prompt rendered and tokenized against the
 * context, prompt + max_tokens against the KV budget (CP_ERANGE for both)
 * — so that a request bound to fail never reaches the queue and never
 * costs the engine thread anything.  It reads only what is fixed while the
 * scheduler runs (tokenizer, template, context, budget): any thread may
 * call it.  A request that sent no max_tokens gets what the context leaves
 * after its prompt, if that is less than its default (g->max_tokens). */
cp_status srv_sched_check(srv_sched *s, srv_gen *g, cp_error *err);

/* srv_queue_push on the scheduler's queue (queue.h). */
srv_submit srv_sched_submit(srv_sched *s, srv_job *j);
/* The client of generation j went away: srv_queue_cancel (queue.h).  Still
 * queued, the job leaves at once, answered and counted as cancelled; taken,
 * it leaves the batch at the next step without its first token, or stops
 * at its next token, storing nothing not yet stored (counted when it
 * stops). */
void srv_sched_cancel(srv_sched *s, srv_job *j);
/* Refuses new jobs from now on; accepted ones still run. */
void srv_sched_close(srv_sched *s);
/* Jobs accepted and not yet done (queued or running). */
size_t srv_sched_pending(srv_sched *s);
/* Closes, lets every accepted job finish, stops the engine thread. */
void srv_sched_stop(srv_sched *s);

#endif
