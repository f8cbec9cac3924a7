/* The operator's figures, served as Prometheus text on /metrics (operator
 * keys only).  HTTP threads count outcomes; the engine thread adds each
 * request's token figures and publishes the pool's and the detector's state
 * after it; /metrics reads a consistent copy.  Aggregates only: no tenant,
 * key or text ever appears here. */
#ifndef CP_SRV_METRICS_H
#define CP_SRV_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../../kernels/status.h"

typedef enum srv_outcome {
    SRV_OUT_OK = 0,
    SRV_OUT_BAD_REQUEST,
    SRV_OUT_UNAUTHORIZED,
    SRV_OUT_FORBIDDEN,
    SRV_OUT_NOT_FOUND,
    SRV_OUT_METHOD,
    SRV_OUT_TOO_LARGE,
    SRV_OUT_QUEUE_FULL,
    SRV_OUT_UNAVAILABLE,
    SRV_OUT_ERROR,
    SRV_OUT_COUNT
} srv_outcome;

#define SRV_TTFT_BUCKETS 12
#define SRV_ITL_BUCKETS 12

/* Inter-token latency of one request (seconds between its consecutive tokens). */
typedef struct srv_itl {
    uint64_t buckets[SRV_ITL_BUCKETS];
    uint64_t count;
    double sum;
} srv_itl;
void srv_itl_add(srv_itl *h, double seconds);

typedef struct srv_figures {
    uint64_t outcomes[SRV_OUT_COUNT];
    uint64_t prompt, computed, reused, recomputed, generated;
    uint64_t ttft_buckets[SRV_TTFT_BUCKETS]; /* cumulative counts are made when rendering */
    uint64_t ttft_count;
    double ttft_sum;                         /* seconds */
    size_t queue_depth;
    size_t pool_bytes, pool_budget, pool_segments;
    uint64_t detector_failures, detector_messages;
    /* tenant controls */
    uint64_t purges, purged_segments, no_store, cancelled_queued, cancelled_running;
    size_t pool_pinned_blocks;
    uint64_t tenant_refusals;
    /* the admission check: requests refused by their connection's thread
     * before the queue (a prompt past the context or the KV budget), and
     * the jobs the engine thread took from the queue, started in the batch
     * or refused there */
    uint64_t refused_before_queue, engine_started, engine_refused;
    /* connections closed past their header or body deadline */
    uint64_t cut_headers, cut_body, cut_send;
    /* connections opened past --max-connections: answered 503 and closed */
    uint64_t over_cap;
    uint64_t pool_evictions, pool_quota_refusals;
    srv_itl itl;
    size_t running;
    /* continuous batching: forward steps, the sequences they carried, the
     * most one step carried */
    uint64_t batch_steps, batch_seqs;
    int batch_max_seqs;
    /* the most jobs the engine thread took between two steps while requests were in flight */
    int admitted_between_steps_max;
    /* where the engine thread's time went (make bench-serve): tokens the
     * steps carried by kind, the most one step carried, and seconds in the
     * forward, in the rest of each step, in taking jobs from the queue
     * (render, tokenize, detect) and waiting for work */
    uint64_t batch_prefill_tokens, batch_decode_tokens;
    int batch_max_tokens;
    double engine_forward_s, engine_step_other_s, engine_admit_s, engine_idle_s;
    uint64_t batch_prefill_steps;  /* steps that carried prefill work */
    double batch_prefill_forward_s; /* their forward's seconds (part of engine_forward_s) */
} srv_figures;

struct cp_tier;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    srv_figures f;
    struct cp_tier *tier; /* --tier: its figures are rendered too (set before the threads start) */
} srv_metrics;

cp_status srv_metrics_init(srv_metrics *m, cp_error *err);
void srv_metrics_destroy(srv_metrics *m);
srv_outcome srv_outcome_of_status(int http_status);
void srv_metrics_count(srv_metrics *m, srv_outcome o);
/* One served request: the operator's token figures and its time to first
 * token (queue wait included), in seconds. */
void srv_metrics_request(srv_metrics *m, int prompt, int computed, int reused, int recomputed, int generated, double ttft_s);
void srv_metrics_queue(srv_metrics *m, size_t depth);
void srv_metrics_state(srv_metrics *m, size_t pool_bytes, size_t pool_budget, size_t pool_segments, uint64_t det_failures,
                       uint64_t det_messages);
/* A purge done (segments erased); a no-store request served; a request
 * cancelled because its client went away, before it ran (queued) or while
 * it ran. */
void srv_metrics_purge(srv_metrics *m, uint64_t segments);
void srv_metrics_no_store(srv_metrics *m);
void srv_metrics_cancelled(srv_metrics *m, int while_queued);
void srv_metrics_pins(srv_metrics *m, size_t pinned_blocks);
/* The pool's running totals: segments evicted (budget, TTL, bucket), inserts refused by a tenant quota. */
void srv_metrics_pool_events(srv_metrics *m, uint64_t evictions, uint64_t quota_refusals);
/* A finished request's inter-token latencies, merged. */
void srv_metrics_itl(srv_metrics *m, const srv_itl *h);
/* The batcher's running totals: steps, sequences over them, the most in one step. */
void srv_metrics_batch(srv_metrics *m, uint64_t steps, uint64_t seqs, int max_seqs);
/* n jobs taken between two steps while requests were in flight */
void srv_metrics_admitted_between_steps(srv_metrics *m, int n);
/* The engine thread's time so far (srv_figures) and the batcher's token totals. */
typedef struct srv_engine_time {
    uint64_t prefill_tokens, decode_tokens;
    int max_tokens;
    double forward_s, step_other_s, admit_s, idle_s;
    uint64_t prefill_steps;
    double prefill_forward_s;
} srv_engine_time;
void srv_metrics_engine_time(srv_metrics *m, const srv_engine_time *t);
/* Requests in the engine now (in flight in the batcher). */
void srv_metrics_running(srv_metrics *m, size_t n);
/* A request refused for its tenant's --per-tenant-queue cap. */
void srv_metrics_tenant_refusal(srv_metrics *m);
/* A request refused by the admission check before it was queued. */
void srv_metrics_refused_before_queue(srv_metrics *m);
/* A job the engine thread took from the queue: started in the batch, or
 * refused there at submission (refused = 1). */
void srv_metrics_engine_took(srv_metrics *m, int refused);
/* A connection closed past a deadline: its headers', its body's, or its
 * answer's send (a client that stopped reading). */
typedef enum srv_cut_phase { SRV_CUT_HEADERS = 0, SRV_CUT_BODY, SRV_CUT_SEND } srv_cut_phase;
void srv_metrics_conn_cut(srv_metrics *m, srv_cut_phase phase);
/* A connection opened with every slot taken (answered 503, then closed). */
void srv_metrics_conn_over_cap(srv_metrics *m);
/* Prometheus text exposition format 0.0.4; malloc'd. */
char *srv_metrics_render(srv_metrics *m);

#endif
