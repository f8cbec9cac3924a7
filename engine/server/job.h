/* One generation request between an HTTP thread and the engine thread.
 *
 * The HTTP side fills the request (gen, tenant) and submits the job; from
 * then on the engine side moves it QUEUED -> RUNNING -> STREAMING (the first
 * token is out) -> DONE and appends the text the client may see; the HTTP
 * side waits on those transitions and reads that text.  Everything shared
 * is under the job's lock; the job is freed when both sides let go. */
#ifndef CP_SRV_JOB_H
#define CP_SRV_JOB_H

#include <pthread.h>
#include <stdint.h>

#include "../../kernels/status.h"
#include "metrics.h"
#include "openai.h"
#include "textout.h"

typedef enum srv_job_state { SRV_JOB_QUEUED = 0, SRV_JOB_RUNNING, SRV_JOB_STREAMING, SRV_JOB_DONE } srv_job_state;

typedef struct srv_job {
    /* the request: written before submit, read-only after */
    srv_gen gen;
    uint32_t tenant;
    int fd; /* the client's socket (srv_peer_gone), -1 when none */
    double t_submit_ms;
    /* a purge (POST /v1/cacheprune/purge) instead of a generation: it runs on
     * the engine thread, between requests, so it never races a request's pins */
    int purge;
    uint32_t purge_tenant;
    /* a purge of a tenant whose purge was already queued joins that one
     * (srv_queue_push): the answer is joined's, which holds a reference */
    struct srv_job *joined;
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job_state state;
    srv_text text;
    int cancelled;
    cp_status rc;
    char err[CP_ERR_MSG_MAX];
    int prompt_tokens, completion_tokens, cached_tokens;
    const char *finish;
    size_t purged_segments, purged_admissions;
    int purged_tiered;  /* the server has a tier: purged_tier is its figure */
    long purged_tier;   /* segment values deleted from the tier; -1: Redis could not be reached */
    double last_piece_ms; /* 0 before the first token */
    srv_itl itl;
    int refs;
} srv_job;

/* A new job holding one reference (the caller's); gen is moved into it. */
cp_status srv_job_create(srv_gen *gen, uint32_t tenant, srv_job **out, cp_error *err);
void srv_job_ref(srv_job *j);
void srv_job_unref(srv_job *j);

/* HTTP side */
/* Blocks until the job's state is at least s; returns the state. */
srv_job_state srv_job_wait(srv_job *j, srv_job_state s);
/* Blocks until there is visible text past *sent or the job is done (or
 * timeout_ms passed): *delta (malloc'd, may be NULL when nothing new) gets
 * the new text and *sent moves past it; returns 1 once the job is done and
 * every visible byte has been taken. */
int srv_job_take(srv_job *j, size_t *sent, char **delta, size_t *n, int timeout_ms);
/* The client is gone: a queued job never runs, a running one stops at its
 * next token.  Returns the state the job was in. */
srv_job_state srv_job_cancel(srv_job *j);
/* srv_job_wait for at most timeout_ms: the state reached. */
srv_job_state srv_job_wait_ms(srv_job *j, srv_job_state s, int timeout_ms);
/* cp_request.cancelled for this job (ctx = the job) */
int srv_job_cancelled(void *ctx);
/* Has the peer of connected socket fd closed its end (EOF or a reset)?  A
 * byte waiting (a pipelined request) is not a close; a close behind bytes
 * it sent after its request is (POLLRDHUP).  Asked by the thread
 * that serves the connection, or by the queue for a job still queued (its
 * connection's thread is waiting on it then: the socket is that client's). */
int srv_peer_gone(int fd);

/* engine side */
void srv_job_set_state(srv_job *j, srv_job_state s);
/* QUEUED -> RUNNING unless the job was cancelled (then 0: drop it): one
 * step under the lock, so a cancel sees the job either queued (never runs)
 * or running (stops at its next token), never in between. */
int srv_job_start(srv_job *j);
/* cp_request.on_piece for this job (ctx = the job) */
int srv_job_on_piece(void *ctx, const char *bytes, size_t n);

#endif
