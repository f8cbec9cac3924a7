#include "metrics.h"

#include "../../pool/tier.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const outcome_names[SRV_OUT_COUNT] = { "ok",           "bad_request",      "unauthorized",
                                                          "forbidden",    "not_found",        "method_not_allowed",
                                                          "too_large",    "queue_full",       "unavailable",
                                                          "error" };
/* upper bounds in seconds; the last one is +Inf */
static const double ttft_le[SRV_TTFT_BUCKETS - 1] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 };

cp_status srv_metrics_init(srv_metrics *m, cp_error *err)
{
    memset(m, 0, sizeof *m);
    if (pthread_mutex_init(&m->mu, NULL)) return cp_fail(err, CP_ENOMEM, "server: cannot create the metrics lock");
    return CP_OK;
}

void srv_metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

srv_outcome srv_outcome_of_status(int s)
{
    switch (s) {
    case 200: return SRV_OUT_OK;
    case 400:
    case 501: /* a transfer coding not served: the request's framing, not a fault here */
        return SRV_OUT_BAD_REQUEST;
    case 401: return SRV_OUT_UNAUTHORIZED;
    case 403: return SRV_OUT_FORBIDDEN;
    case 404: return SRV_OUT_NOT_FOUND;
    case 405: return SRV_OUT_METHOD;
    case 413: return SRV_OUT_TOO_LARGE;
    case 429: return SRV_OUT_QUEUE_FULL;
    case 503: return SRV_OUT_UNAVAILABLE;
    default: return SRV_OUT_ERROR;
    }
}

void srv_metrics_count(srv_metrics *m, srv_outcome o)
{
    pthread_mutex_lock(&m->mu);
    m->f.outcomes[(unsigned)o < SRV_OUT_COUNT ? o : SRV_OUT_ERROR]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_request(srv_metrics *m, int prompt, int computed, int reused, int recomputed, int generated, double ttft_s)
{
    int b = 0;
    while (b < SRV_TTFT_BUCKETS - 1 && ttft_s > ttft_le[b]) b++;
    pthread_mutex_lock(&m->mu);
    m->f.prompt += (uint64_t)prompt, m->f.computed += (uint64_t)computed, m->f.reused += (uint64_t)reused;
    m->f.recomputed += (uint64_t)recomputed, m->f.generated += (uint64_t)generated;
    m->f.ttft_buckets[b]++;
    m->f.ttft_count++;
    m->f.ttft_sum += ttft_s;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_queue(srv_metrics *m, size_t depth)
{
    pthread_mutex_lock(&m->mu);
    m->f.queue_depth = depth;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_purge(srv_metrics *m, uint64_t segments)
{
    pthread_mutex_lock(&m->mu);
    m->f.purges++, m->f.purged_segments += segments;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_no_store(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->f.no_store++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_cancelled(srv_metrics *m, int while_queued)
{
    pthread_mutex_lock(&m->mu);
    if (while_queued) m->f.cancelled_queued++;
    else m->f.cancelled_running++;
    pthread_mutex_unlock(&m->mu);
}

static const double itl_le[SRV_ITL_BUCKETS - 1] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5 };

void srv_itl_add(srv_itl *h, double s)
{
    int b = 0;
    while (b < SRV_ITL_BUCKETS - 1 && s > itl_le[b]) b++;
    h->buckets[b]++;
    h->count++;
    h->sum += s;
}

void srv_metrics_itl(srv_metrics *m, const srv_itl *h)
{
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < SRV_ITL_BUCKETS; i++) m->f.itl.buckets[i] += h->buckets[i];
    m->f.itl.count += h->count, m->f.itl.sum += h->sum;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_running(srv_metrics *m, size_t n)
{
    pthread_mutex_lock(&m->mu);
    m->f.running = n;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_admitted_between_steps(srv_metrics *m, int n)
{
    pthread_mutex_lock(&m->mu);
    if (n > m->f.admitted_between_steps_max) m->f.admitted_between_steps_max = n;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_batch(srv_metrics *m, uint64_t steps, uint64_t seqs, int max_seqs)
{
    pthread_mutex_lock(&m->mu);
    m->f.batch_steps = steps, m->f.batch_seqs = seqs, m->f.batch_max_seqs = max_seqs;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_engine_time(srv_metrics *m, const srv_engine_time *t)
{
    pthread_mutex_lock(&m->mu);
    m->f.batch_prefill_tokens = t->prefill_tokens, m->f.batch_decode_tokens = t->decode_tokens, m->f.batch_max_tokens = t->max_tokens;
    m->f.engine_forward_s = t->forward_s, m->f.engine_step_other_s = t->step_other_s;
    m->f.engine_admit_s = t->admit_s, m->f.engine_idle_s = t->idle_s;
    m->f.batch_prefill_steps = t->prefill_steps, m->f.batch_prefill_forward_s = t->prefill_forward_s;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_pool_events(srv_metrics *m, uint64_t evictions, uint64_t quota_refusals)
{
    pthread_mutex_lock(&m->mu);
    m->f.pool_evictions = evictions, m->f.pool_quota_refusals = quota_refusals;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_tenant_refusal(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->f.tenant_refusals++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_refused_before_queue(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->f.refused_before_queue++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_engine_took(srv_metrics *m, int refused)
{
    pthread_mutex_lock(&m->mu);
    if (refused) m->f.engine_refused++;
    else m->f.engine_started++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_conn_cut(srv_metrics *m, srv_cut_phase phase)
{
    pthread_mutex_lock(&m->mu);
    if (phase == SRV_CUT_SEND) m->f.cut_send++;
    else if (phase == SRV_CUT_BODY) m->f.cut_body++;
    else m->f.cut_headers++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_conn_over_cap(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->f.over_cap++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_pins(srv_metrics *m, size_t pinned_blocks)
{
    pthread_mutex_lock(&m->mu);
    m->f.pool_pinned_blocks = pinned_blocks;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_state(srv_metrics *m, size_t pool_bytes, size_t pool_budget, size_t pool_segments, uint64_t det_failures,
                       uint64_t det_messages)
{
    pthread_mutex_lock(&m->mu);
    m->f.pool_bytes = pool_bytes, m->f.pool_budget = pool_budget, m->f.pool_segments = pool_segments;
    m->f.detector_failures = det_failures, m->f.detector_messages = det_messages;
    pthread_mutex_unlock(&m->mu);
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int failed;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)k;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
}

static void counter(sbuf *b, const char *name, const char *help, uint64_t v)
{
    put(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void gauge(sbuf *b, const char *name, const char *help, double v)
{
    put(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

/* the shared tier's figures (its own lock; aggregates only, as the rest) */
static void tier_figures(sbuf *b, cp_tier *t)
{
    cp_tier_stats s;
    cp_tier_stats_get(t, &s);
    counter(b, "cacheprune_tier_hits_total", "Segments fetched from the tier and placed in the pool.", s.hits);
    counter(b, "cacheprune_tier_misses_total", "Tier lookups that found nothing usable.", s.misses);
    counter(b, "cacheprune_tier_read_bytes_total", "Bytes of values read from the tier.", s.bytes_read);
    counter(b, "cacheprune_tier_written_bytes_total", "Bytes of values written to the tier.", s.bytes_written);
    counter(b, "cacheprune_tier_writes_total", "Segments written through to the tier.", s.writes);
    counter(b, "cacheprune_tier_write_drops_total", "Write-throughs dropped (queue full, tier down, error).", s.write_drops);
    counter(b, "cacheprune_tier_kept_local_total", "Segments never written: a sensitive token, no mask, an unbound tenant.",
            s.kept_local);
    counter(b, "cacheprune_tier_errors_total", "Failed tier calls (timeouts, refused connections, error replies).", s.errors);
    counter(b, "cacheprune_tier_bad_values_total", "Tier values that failed a check (dropped).", s.bad_values);
    counter(b, "cacheprune_tier_bad_auth_total", "Tier values whose MAC did not verify under the tier key (dropped).", s.bad_auth);
    counter(b, "cacheprune_tier_bad_range_total", "Authentic tier values out of range: K/V, token ids, positions (dropped).",
            s.bad_range);
    counter(b, "cacheprune_tier_stale_total", "Private tier values written before their tenant's last purge (dropped).", s.stale);
    counter(b, "cacheprune_tier_epoch_purges_total", "Tenants' local private segments dropped for a purge seen in the tier's epoch.",
            s.epoch_purges);
    counter(b, "cacheprune_tier_dangling_total", "Tier index entries whose value was gone (deleted).", s.dangling);
    counter(b, "cacheprune_tier_quota_refusals_total", "Inserts refused by a tenant's quota across replicas (served, not stored).",
            s.quota_refusals);
    counter(b, "cacheprune_tier_breaker_opens_total", "Times a tier connection's circuit breaker opened.", s.breaker_opens);
    put(b, "# HELP cacheprune_tier_lookup_seconds Time in tier lookups.\n# TYPE cacheprune_tier_lookup_seconds summary\n"
           "cacheprune_tier_lookup_seconds_sum %.9g\ncacheprune_tier_lookup_seconds_count %llu\n",
        s.lookup_ms_sum / 1e3, (unsigned long long)s.lookup_ms_n);
}

char *srv_metrics_render(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    srv_figures c = m->f; /* a consistent copy */
    pthread_mutex_unlock(&m->mu);
    sbuf b = { malloc(4096), 0, 4096, 0 };
    if (!b.p) return NULL;
    put(&b, "# HELP cacheprune_requests_total HTTP requests by outcome.\n# TYPE cacheprune_requests_total counter\n");
    for (int i = 0; i < SRV_OUT_COUNT; i++)
        put(&b, "cacheprune_requests_total{outcome=\"%s\"} %llu\n", outcome_names[i], (unsigned long long)c.outcomes[i]);
    counter(&b, "cacheprune_prompt_tokens_total", "Prompt tokens of served requests.", c.prompt);
    counter(&b, "cacheprune_computed_tokens_total", "Prompt tokens computed (fresh or recomputed).", c.computed);
    counter(&b, "cacheprune_reused_tokens_total", "Prompt tokens whose KV came from the pool unchanged.", c.reused);
    counter(&b, "cacheprune_recomputed_tokens_total", "Prompt tokens found in the pool and recomputed.", c.recomputed);
    counter(&b, "cacheprune_generated_tokens_total", "Tokens generated.", c.generated);
    put(&b, "# HELP cacheprune_ttft_seconds Time to first token, queue wait included.\n"
            "# TYPE cacheprune_ttft_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < SRV_TTFT_BUCKETS; i++) {
        cum += c.ttft_buckets[i];
        if (i < SRV_TTFT_BUCKETS - 1) put(&b, "cacheprune_ttft_seconds_bucket{le=\"%g\"} %llu\n", ttft_le[i], (unsigned long long)cum);
        else put(&b, "cacheprune_ttft_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    put(&b, "cacheprune_ttft_seconds_sum %.9g\ncacheprune_ttft_seconds_count %llu\n", c.ttft_sum, (unsigned long long)c.ttft_count);
    put(&b, "# HELP cacheprune_inter_token_seconds Time between consecutive generated tokens.\n"
            "# TYPE cacheprune_inter_token_seconds histogram\n");
    cum = 0;
    for (int i = 0; i < SRV_ITL_BUCKETS; i++) {
        cum += c.itl.buckets[i];
        if (i < SRV_ITL_BUCKETS - 1) put(&b, "cacheprune_inter_token_seconds_bucket{le=\"%g\"} %llu\n", itl_le[i], (unsigned long long)cum);
        else put(&b, "cacheprune_inter_token_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    put(&b, "cacheprune_inter_token_seconds_sum %.9g\ncacheprune_inter_token_seconds_count %llu\n", c.itl.sum,
        (unsigned long long)c.itl.count);
    gauge(&b, "cacheprune_queue_depth", "Requests waiting for the engine.", (double)c.queue_depth);
    gauge(&b, "cacheprune_running_requests", "Requests in the engine now.", (double)c.running);
    counter(&b, "cacheprune_batch_steps_total", "Forward steps the engine ran (continuous batching).", c.batch_steps);
    counter(&b, "cacheprune_batch_sequences_total", "Requests' shares summed over those steps (/ steps: the mean batch).",
            c.batch_seqs);
    gauge(&b, "cacheprune_batch_max_sequences", "The most requests one forward step carried.", (double)c.batch_max_seqs);
    gauge(&b, "cacheprune_admitted_between_steps_max",
          "The most requests the engine thread took between two steps while others were in flight (1: admission takes turns with them).",
          (double)c.admitted_between_steps_max);
    put(&b, "# HELP cacheprune_batch_tokens_total Prompt positions (prefill) and generated tokens (decode) the steps carried.\n"
            "# TYPE cacheprune_batch_tokens_total counter\n"
            "cacheprune_batch_tokens_total{kind=\"prefill\"} %llu\ncacheprune_batch_tokens_total{kind=\"decode\"} %llu\n",
        (unsigned long long)c.batch_prefill_tokens, (unsigned long long)c.batch_decode_tokens);
    gauge(&b, "cacheprune_batch_max_tokens", "The most tokens one forward step computed (at most --step-tokens).", (double)c.batch_max_tokens);
    put(&b, "# HELP cacheprune_engine_seconds_total The engine thread's time: forward steps, the rest of each step (retrieve, "
            "sample, store, stream), taking jobs (render, tokenize, detect), idle.\n"
            "# TYPE cacheprune_engine_seconds_total counter\n"
            "cacheprune_engine_seconds_total{phase=\"forward\"} %.6f\ncacheprune_engine_seconds_total{phase=\"step_other\"} %.6f\n"
            "cacheprune_engine_seconds_total{phase=\"admit\"} %.6f\ncacheprune_engine_seconds_total{phase=\"idle\"} %.6f\n",
        c.engine_forward_s, c.engine_step_other_s, c.engine_admit_s, c.engine_idle_s);
    counter(&b, "cacheprune_batch_prefill_steps_total", "Forward steps that carried prefill work (the rest decoded only).",
            c.batch_prefill_steps);
    put(&b, "# HELP cacheprune_batch_prefill_step_seconds_total Seconds in the forwards of steps that carried prefill work.\n"
            "# TYPE cacheprune_batch_prefill_step_seconds_total counter\ncacheprune_batch_prefill_step_seconds_total %.6f\n",
        c.batch_prefill_forward_s);
    gauge(&b, "cacheprune_pool_bytes", "Bytes of KV held by the pool.", (double)c.pool_bytes);
    gauge(&b, "cacheprune_pool_budget_bytes", "The pool's budget in bytes.", (double)c.pool_budget);
    gauge(&b, "cacheprune_pool_segments", "Segments in the pool.", (double)c.pool_segments);
    counter(&b, "cacheprune_detector_failures_total", "Detector failures; each marked its message wholly sensitive.",
            c.detector_failures);
    counter(&b, "cacheprune_detector_messages_total", "Messages the detector chain ran on.", c.detector_messages);
    gauge(&b, "cacheprune_pool_pinned_blocks", "Pool blocks pinned by requests (0 between requests).", (double)c.pool_pinned_blocks);
    counter(&b, "cacheprune_purges_total", "Purge requests done.", c.purges);
    counter(&b, "cacheprune_purged_segments_total", "Private segments erased by purges.", c.purged_segments);
    counter(&b, "cacheprune_pool_evictions_total", "Segments the pool evicted (budget, TTL, full bucket).", c.pool_evictions);
    counter(&b, "cacheprune_pool_quota_refusals_total", "Inserts refused by a tenant's quota (the request was still served).",
            c.pool_quota_refusals);
    counter(&b, "cacheprune_tenant_queue_refusals_total", "Requests refused (429) at their tenant's --per-tenant-queue cap.",
            c.tenant_refusals);
    counter(&b, "cacheprune_refused_before_queue_total",
            "Requests refused (400) by their connection's thread before the queue: a prompt past the context or the KV budget.",
            c.refused_before_queue);
    put(&b, "# HELP cacheprune_engine_jobs_total Jobs the engine thread took from the queue: started in the batch, or refused there.\n"
            "# TYPE cacheprune_engine_jobs_total counter\n"
            "cacheprune_engine_jobs_total{result=\"started\"} %llu\ncacheprune_engine_jobs_total{result=\"refused\"} %llu\n",
        (unsigned long long)c.engine_started, (unsigned long long)c.engine_refused);
    put(&b, "# HELP cacheprune_connections_cut_total Connections closed past their header, body or send deadline.\n"
            "# TYPE cacheprune_connections_cut_total counter\n"
            "cacheprune_connections_cut_total{phase=\"headers\"} %llu\ncacheprune_connections_cut_total{phase=\"body\"} %llu\n"
            "cacheprune_connections_cut_total{phase=\"send\"} %llu\n",
        (unsigned long long)c.cut_headers, (unsigned long long)c.cut_body, (unsigned long long)c.cut_send);
    counter(&b, "cacheprune_connections_over_cap_total",
            "Connections opened while --max-connections were open: answered 503 with Retry-After, then closed.", c.over_cap);
    counter(&b, "cacheprune_no_store_requests_total", "Requests served with cache no-store.", c.no_store);
    put(&b, "# HELP cacheprune_cancelled_total Requests cancelled because the client went away.\n"
            "# TYPE cacheprune_cancelled_total counter\n"
            "cacheprune_cancelled_total{when=\"queued\"} %llu\ncacheprune_cancelled_total{when=\"running\"} %llu\n",
        (unsigned long long)c.cancelled_queued, (unsigned long long)c.cancelled_running);
    if (m->tier) tier_figures(&b, m->tier);
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
