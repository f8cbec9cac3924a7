/* The server's one queue: every generation and purge waits here, in
 * its order (below), between its HTTP thread and the engine thread
 * (engine/server/sched.h), which takes them into the one batch scheduler
 * (engine/batch/batcher.h) as room frees up.
 *
 * Its rules:
 *   - order: a tenant's jobs leave in arrival order; between tenants, the
 *     one with the fewest generations in the engine first (ties: arrival
 *     order), so places in flight are shared evenly among tenants with work
 *     waiting and one tenant's backlog never holds back another's request
 *     -- never by what the jobs would hit in the cache (a hit never buys an
 *     earlier slot: THREAT_MODEL.md, scheduling);
 *   - bounded: a full queue refuses a job at once (the HTTP side answers
 *     429), and so does a closed one; its last eighth takes only a tenant's
 *     first queued generation (a few tenants at their caps cannot fill it);
 *   - a per-tenant cap: a tenant has at most per_tenant generations queued
 *     or in the engine together, so one tenant's flood fills its own share,
 *     never the queue (an id past the key table is refused: fail closed);
 *     a tenant's slot comes back when its answer is ready;
 *   - cancel is one operation here whatever the job's state: a queued job
 *     leaves at once (its place and its tenant's slot free for the next
 *     request) and is answered as cancelled; a job the engine has taken is
 *     handed to the engine thread (srv_queue_next_cancelled), which retires
 *     it from the batch at its next step if it has no token yet, and one
 *     already streaming stops at its next token (srv_job_on_piece).
 * Every function is safe from any thread. */
#ifndef CP_SRV_QUEUE_H
#define CP_SRV_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "job.h"
#include "metrics.h"

typedef enum srv_submit { SRV_SUBMIT_OK = 0, SRV_SUBMIT_FULL, SRV_SUBMIT_TENANT_FULL, SRV_SUBMIT_CLOSED } srv_submit;

typedef struct srv_queue srv_queue;

/* cap >= 1 jobs; per_tenant: the most queued + running generations one of
 * n_tenants tenants (ids 0 .. n_tenants - 1) may have, 0 = no cap.
 * metrics (may be NULL) gets the queue's length and its cancellations. */
cp_status srv_queue_create(size_t cap, size_t per_tenant, uint32_t n_tenants, srv_metrics *metrics, srv_queue **out, cp_error *err);
/* Once the engine thread is gone: what is still held is released. */
void srv_queue_free(srv_queue *q);

/* HTTP side */
/* Accepts the job (taking a reference) or refuses it at once: closed, full,
 * or (a generation, not a purge) its tenant at its cap.  A purge of a
 * tenant whose purge is still queued joins that one instead of taking a
 * place: j->joined (referenced) holds the answer. */
srv_submit srv_queue_push(srv_queue *q, srv_job *j);
/* The client of generation j went away (see above).  A purge is never
 * cancelled: an erasure asked for is done. */
void srv_queue_cancel(srv_queue *q, srv_job *j);
/* Refuses new jobs from now on; accepted ones still run. */
void srv_queue_close(srv_queue *q);
/* Jobs accepted and not yet answered (queued or taken). */
size_t srv_queue_pending(srv_queue *q);

/* engine side */
/* What may(ctx, job) answers: the job may start now; it may not, nor may any
 * generation (no room in flight: a purge answering it holds only its own
 * tenant); or it may not, but other tenants' jobs may pass it. */
enum { SRV_MAY_WAIT = 0, SRV_MAY_START = 1, SRV_MAY_WAIT_TENANT = 2 };
/* The job to start now (NULL when none may, or the queue is empty), out of
 * the queue and counted as taken: of the tenants' oldest jobs that may
 * start, the one whose tenant has the fewest generations taken (ties: the
 * oldest); a tenant's later jobs wait behind its oldest, and
 * the other tenants' pass a job answered SRV_MAY_WAIT_TENANT (or a purge
 * answered SRV_MAY_WAIT).  *round bounds one round of taking: SIZE_MAX on
 * the first call of a round, which then takes at most the jobs queued when
 * it began. */
srv_job *srv_queue_take(srv_queue *q, size_t *round, int (*may)(void *ctx, const srv_job *head), void *ctx);
/* A taken job whose client left since the last call (a reference for the
 * caller to drop), or NULL. */
srv_job *srv_queue_next_cancelled(srv_queue *q);
/* A taken generation's tenant slot back (before its answer is published: a
 * client that sends its next request at once must not find the finished
 * one still counted). */
void srv_queue_release(srv_queue *q, const srv_job *j);
/* A taken job is answered: no longer counted, and the queue's reference
 * dropped. */
void srv_queue_done(srv_queue *q, srv_job *j);
/* The engine thread, idle with nothing handed off: blocks until a job is
 * queued, a running job is cancelled (srv_queue_next_cancelled has one) or
 * the queue stops; 0 once it has stopped with nothing queued, else 1. */
int srv_queue_wait(srv_queue *q);
/* An event that wakes srv_queue_wait_since: a job the engine thread handed
 * off is ready (sched.c). */
void srv_queue_kick(srv_queue *q);
/* The queue's event count (a job pushed, withdrawn or cancelled, a kick,
 * the stop), and a wait until it moves past `seen`: the engine thread's
 * idle wait while jobs it handed off are being prepared, when queued jobs
 * may be unable to start until one of them is back (srv_queue_wait would
 * return at once for them).  Returns as srv_queue_wait does. */
uint64_t srv_queue_events(srv_queue *q);
int srv_queue_wait_since(srv_queue *q, uint64_t seen);
/* Closes the queue and wakes the engine thread to drain it and return. */
void srv_queue_stop(srv_queue *q);

#endif
