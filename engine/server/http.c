#include "http.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "../../kernels/clock.h"
#include "../../kernels/log.h"
#include "../json_fields.h"
#include "sse.h"

/* One open connection, as the deadline watchdog sees it.  Its socket stays
 * open while the entry is listed: libmicrohttpd reports a connection closed
 * (notify_conn, under cmu) before it closes the socket, so the watchdog's
 * shutdown under cmu never reaches a descriptor reused by another. */
typedef enum conn_phase {
    CONN_HEADERS = 0, /* waiting for a request's headers: the header deadline */
    CONN_BODY,        /* headers in, body (or the answer's sending) under way: the body deadline */
    CONN_BUSY,        /* the request is whole: the engine and the stream set the pace */
    CONN_CUT          /* past its deadline: shut down, waiting for libmicrohttpd to close it */
} conn_phase;

typedef struct conn_entry {
    int fd;
    int over_cap; /* opened with --max-connections open: its request is answered 503 */
    conn_phase phase;
    double deadline_ms;
    struct conn_entry *prev, *next;
} conn_entry;

struct srv_http {
    struct MHD_Daemon *d;
    /* the connections' deadlines */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    conn_entry *conns;
    unsigned open_conns; /* listed in conns */
    pthread_t watchdog;
    int watchdog_stop;
    srv_http_opts o;
    char served_name[SRV_MODEL_NAME_MAX + 1];
    const srv_keys *keys;
    srv_sched *sched;
    srv_metrics *metrics;
    long long started;
    pthread_mutex_t mu;
    size_t active;
    int closing;
};

typedef enum route { R_NONE = 0, R_HEALTH, R_MODELS, R_CHAT, R_COMPLETIONS, R_METRICS, R_PURGE } route;

/* One HTTP request (MHD's per-request context). */
typedef struct http_req {
    route rt;
    srv_principal who;
    char *body;
    size_t len, cap;
    int too_large, oom, answered;
    size_t dropped; /* body bytes read past --max-body (chunked) */
} http_req;

/* libmicrohttpd's unescape step, left out: a path is routed as sent
 * (route_of matches it exactly), so /v1/cacheprune%2fpurge or
 * /metrics%00.css is not the endpoint a proxy's rules took it for not to
 * be.  No endpoint reads a query argument. */
static size_t keep_escaped(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls, (void)c;
    return strlen(s);
}

static route route_of(const char *url)
{
    static const struct {
        const char *path;
        route r;
    } table[] = { { "/health", R_HEALTH },
                  { "/v1/models", R_MODELS },
                  { "/v1/chat/completions", R_CHAT },
                  { "/v1/completions", R_COMPLETIONS },
                  { "/metrics", R_METRICS },
                  { "/v1/cacheprune/purge", R_PURGE } };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (strcmp(url, table[i].path) == 0) return table[i].r;
    return R_NONE;
}

/* ---- answers ----------------------------------------------------------------------- */

/* Response bodies hold generated text: wiped before they are freed. */
static void wipe_free(void *p)
{
    if (p) OPENSSL_cleanse(p, strlen(p));
    free(p);
}

/* Queues body (malloc'd; taken) with status and an optional extra header. */
static enum MHD_Result respond(srv_http *h, struct MHD_Connection *c, http_req *r, unsigned status, const char *ctype, char *body,
                               const char *hname, const char *hvalue)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    struct MHD_Response *resp;
    if (!body) {
        status = 500, ctype = "application/json", hname = NULL;
        resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    } else {
        resp = MHD_create_response_from_buffer_with_free_callback(strlen(body), body, wipe_free);
        if (!resp) wipe_free(body);
    }
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (hname) MHD_add_response_header(resp, hname, hvalue);
    /* too many connections, or shutting down: try again shortly (a 503 is
     * answered before the body is read, so libmicrohttpd closes the
     * connection after it and says so: Connection: close) */
    if (status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    if (r) r->answered = 1;
    srv_metrics_count(h->metrics, srv_outcome_of_status((int)status));
    return ok;
}

static enum MHD_Result fail(srv_http *h, struct MHD_Connection *c, http_req *r, unsigned status, const char *type, const char *param,
                            const char *code, const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static enum MHD_Result fail(srv_http *h, struct MHD_Connection *c, http_req *r, unsigned status, const char *type, const char *param,
                            const char *code, const char *fmt, ...)
{
    char msg[CP_ERR_MSG_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *hn = NULL, *hv = NULL;
    if (status == 401) hn = MHD_HTTP_HEADER_WWW_AUTHENTICATE, hv = "Bearer";
    if (status == 429) hn = MHD_HTTP_HEADER_RETRY_AFTER, hv = "1";
    enum MHD_Result res = respond(h, c, r, status, "application/json", srv_json_error(msg, type, param, code), hn, hv);
    OPENSSL_cleanse(msg, sizeof msg); /* it may quote the value it refused */
    return res;
}

static enum MHD_Result method_not_allowed(srv_http *h, struct MHD_Connection *c, http_req *r, const char *allow)
{
    char msg[96];
    snprintf(msg, sizeof msg, "this path takes %s only", allow);
    return respond(h, c, r, 405, "application/json", srv_json_error(msg, "invalid_request_error", NULL, "method_not_allowed"),
                   MHD_HTTP_HEADER_ALLOW, allow);
}

/* ---- generation ---------------------------------------------------------------------- */

static void new_id(char *out, size_t cap, srv_kind kind)
{
    unsigned char b[12] = { 0 };
    if (RAND_bytes(b, sizeof b) != 1) cp_warn("serve: no random bytes for a response id");
    int k = snprintf(out, cap, "%s", kind == SRV_CHAT ? "chatcmpl-" : "cmpl-");
    for (size_t i = 0; i < sizeof b && k + 2 < (int)cap; i++) k += snprintf(out + k, cap - (size_t)k, "%02x", b[i]);
}

/* The connection's socket, or -1. */
static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Has the client closed its end?  The connection's own thread asks (thread
 * per connection: nobody else reads this socket meanwhile). */
static int peer_gone(struct MHD_Connection *c) { return srv_peer_gone(conn_fd(c)); }

/* Waits up to limit_ms (< 0: no limit) for the job to reach state s,
 * watching the client meanwhile: a client that leaves cancels its job
 * (queued: it leaves the queue and never runs; running: it stops at its
 * next token and stores nothing not yet stored).  1 when the state was
 * reached, 0 when the client left, -1 when the limit came first. */
static int wait_or_cancel(srv_http *h, struct MHD_Connection *c, srv_job *j, srv_job_state s, int limit_ms)
{
    double until = cp_now_ms() + limit_ms; /* the clock, not a count of waits: a broadcast ends one early */
    while (srv_job_wait_ms(j, s, 50) < s) {
        if (peer_gone(c)) {
            srv_sched_cancel(h->sched, j);
            return 0;
        }
        if (limit_ms >= 0 && cp_now_ms() >= until) return -1;
    }
    return 1;
}

/* The engine refused the request: its fault (400) or ours (500). */
static enum MHD_Result engine_error(srv_http *h, struct MHD_Connection *c, http_req *r, srv_kind kind, cp_status rc, const char *msg)
{
    const char *param = kind == SRV_CHAT ? "messages" : "prompt";
    switch (rc) {
    case CP_ERANGE: return fail(h, c, r, 400, "invalid_request_error", param, "context_length_exceeded", "%s", msg);
    case CP_EINVAL:
    case CP_EFORMAT:
    case CP_EUNSUPPORTED: return fail(h, c, r, 400, "invalid_request_error", param, NULL, "%s", msg);
    default: return fail(h, c, r, 500, "server_error", NULL, NULL, "%s", msg);
    }
}

static enum MHD_Result answer_whole(srv_http *h, struct MHD_Connection *c, http_req *r, srv_job *j, srv_result *res)
{
    if (!wait_or_cancel(h, c, j, SRV_JOB_DONE, -1)) return MHD_NO; /* nobody to answer */
    pthread_mutex_lock(&j->mu); /* done: nothing writes it any more */
    if (j->cancelled) { /* the queue saw the client leave first (a closed or half-closed socket): nobody to answer */
        pthread_mutex_unlock(&j->mu);
        return MHD_NO;
    }
    cp_status rc = j->rc;
    res->finish = j->finish;
    res->prompt_tokens = j->prompt_tokens, res->completion_tokens = j->completion_tokens, res->cached_tokens = j->cached_tokens;
    char *body = rc ? NULL : srv_json_response(res, j->text.buf, j->text.len);
    char msg[CP_ERR_MSG_MAX];
    memcpy(msg, j->err, sizeof msg);
    pthread_mutex_unlock(&j->mu);
    if (rc) return engine_error(h, c, r, res->kind, rc, msg);
    return respond(h, c, r, 200, "application/json", body, NULL, NULL);
}

static enum MHD_Result answer_stream(srv_http *h, struct MHD_Connection *c, http_req *r, srv_job *j, srv_result *res, int usage)
{
    /* the status line waits for the first token, one keep-alive interval at
     * most: a request the engine refuses at once (a prompt past the context)
     * is still a plain 400; one still waiting then (queued behind others)
     * gets its 200 and keep-alive comments until its first token, and a
     * refusal after that is the stream's error event */
    int got = wait_or_cancel(h, c, j, SRV_JOB_STREAMING, SRV_SSE_KEEPALIVE_MS);
    if (!got) return MHD_NO;
    if (got > 0) { /* reached at once: the first token, or the job done */
        if (srv_job_wait(j, SRV_JOB_STREAMING) == SRV_JOB_DONE) {
            pthread_mutex_lock(&j->mu);
            if (j->cancelled) { /* as in answer_whole: the client is gone */
                pthread_mutex_unlock(&j->mu);
                return MHD_NO;
            }
            cp_status rc = j->rc;
            char msg[CP_ERR_MSG_MAX];
            memcpy(msg, j->err, sizeof msg);
            pthread_mutex_unlock(&j->mu);
            if (rc) return engine_error(h, c, r, res->kind, rc, msg);
        }
    }
    struct MHD_Response *resp = srv_sse_response(j, res, usage, h->sched, conn_fd(c), got < 0);
    if (!resp) return respond(h, c, r, 500, "application/json", NULL, NULL, NULL);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    r->answered = 1;
    srv_metrics_count(h->metrics, SRV_OUT_OK);
    return ok;
}

static enum MHD_Result generate(srv_http *h, struct MHD_Connection *c, http_req *r)
{
    srv_kind kind = r->rt == R_CHAT ? SRV_CHAT : SRV_COMPLETION;
    if (r->oom) return fail(h, c, r, 500, "server_error", NULL, NULL, "out of memory reading the request body");
    if (r->too_large)
        return fail(h, c, r, 413, "invalid_request_error", NULL, "request_too_large", "the request body is over %zu bytes",
                    h->o.max_body);
    char param[64];
    cp_error err = { 0 };
    srv_gen g;
    if (srv_gen_parse(r->body ? r->body : "", r->len, kind, h->o.max_tokens_cap, &g, param, sizeof param, &err)) {
        srv_gen_free(&g);
        enum MHD_Result res = fail(h, c, r, err.code == CP_ENOMEM ? 500 : 400, "invalid_request_error", param, NULL, "%s", err.msg);
        OPENSSL_cleanse(&err, sizeof err); /* its message may quote the value it refused */
        return res;
    }
    /* here, on the connection's thread: a request bound to fail at its
     * start (past the context, or the KV budget) is refused before the queue
     * and never costs the engine thread its tokenizing */
    cp_status crc = srv_sched_check(h->sched, &g, &err);
    if (crc) {
        srv_gen_free(&g);
        if (crc != CP_ENOMEM) srv_metrics_refused_before_queue(h->metrics);
        return engine_error(h, c, r, kind, crc, err.msg);
    }
    int stream = g.stream, usage = g.include_usage;
    srv_job *j;
    if (srv_job_create(&g, r->who.tenant, &j, &err)) {
        srv_gen_free(&g);
        return fail(h, c, r, 500, "server_error", NULL, NULL, "%s", err.msg);
    }
    j->fd = conn_fd(c); /* the queue drops it unstarted if the client leaves before its turn */
    srv_submit s = srv_sched_submit(h->sched, j);
    if (s != SRV_SUBMIT_OK) {
        srv_job_unref(j);
        if (s == SRV_SUBMIT_FULL)
            return fail(h, c, r, 429, "rate_limit_error", NULL, "queue_full", "the request queue is full: retry later");
        if (s == SRV_SUBMIT_TENANT_FULL) {
            srv_metrics_tenant_refusal(h->metrics);
            return fail(h, c, r, 429, "rate_limit_error", NULL, "tenant_queue_full",
                        "this key's tenant has its most requests in flight (--per-tenant-queue): retry later");
        }
        return fail(h, c, r, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
    }
    char id[64];
    new_id(id, sizeof id, kind);
    srv_result res = { .kind = kind, .id = id, .created = (long long)time(NULL),
                       .model = j->gen.model ? j->gen.model : h->served_name };
    enum MHD_Result ok = stream ? answer_stream(h, c, r, j, &res, usage) : answer_whole(h, c, r, j, &res);
    srv_job_unref(j);
    return ok;
}

/* ---- erasure ---------------------------------------------------------------------- */

/* POST /v1/cacheprune/purge: the caller's own tenant, or with an operator
 * key {"tenant": "name"} any tenant.  It queues like a request (in its tenant's order) and
 * runs on the engine thread between requests. */
static enum MHD_Result purge(srv_http *h, struct MHD_Connection *c, http_req *r)
{
    if (r->oom) return fail(h, c, r, 500, "server_error", NULL, NULL, "out of memory reading the request body");
    if (r->too_large)
        return fail(h, c, r, 413, "invalid_request_error", NULL, "request_too_large", "the request body is over %zu bytes",
                    h->o.max_body);
    uint32_t target = r->who.tenant;
    if (r->len) {
        cJSON *j = NULL;
        cp_error err = { 0 };
        if (cp_json_parse_strict(r->body, r->len, &j, &err) || !cJSON_IsObject(j)) {
            cJSON_Delete(j);
            return fail(h, c, r, 400, "invalid_request_error", NULL, NULL, "the purge body must be a JSON object");
        }
        /* one field, once: a misspelt one ("Tenant") would otherwise purge
         * the caller's own tenant and answer 200, and of a repeated one
         * readers keeping the first and the last would purge different
         * tenants */
        static const char *const keys[] = { "tenant", NULL };
        if (cp_json_known_keys(j, "the purge body", keys, &err)) {
            cJSON_Delete(j);
            return fail(h, c, r, 400, "invalid_request_error", NULL, "unknown_field", "%s (it takes one field, 'tenant')", err.msg);
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tenant");
        int known = 0, bad = 0;
        uint32_t id = 0;
        if (t && !cJSON_IsNull(t)) {
            bad = !cJSON_IsString(t) || cp_tenant_id_check(t->valuestring, strlen(t->valuestring), &err) != CP_OK;
            if (!bad) known = cp_tenant_find(h->o.tenants, t->valuestring, strlen(t->valuestring), &id);
            else if (cJSON_IsString(t)) OPENSSL_cleanse(t->valuestring, strlen(t->valuestring));
        }
        int named = t && !cJSON_IsNull(t);
        cJSON_Delete(j);
        if (bad) return fail(h, c, r, 400, "invalid_request_error", "tenant", NULL, "'tenant' must be a tenant id (1-256 bytes of UTF-8)");
        if (named && !(known && id == r->who.tenant) && !r->who.operator_)
            return fail(h, c, r, 403, "permission_error", "tenant", "forbidden", "only an operator key may purge another tenant");
        if (named && !known) /* no key names it: it never stored anything */
            return respond(h, c, r, 200, "application/json",
                           strdup("{\"object\":\"cacheprune.purge\",\"segments\":0,\"admission_records\":0,\"levels\":{\"pool\":0}}"), NULL, NULL);
        if (named) target = id;
    }
    srv_gen none = { 0 };
    srv_job *job;
    cp_error err = { 0 };
    if (srv_job_create(&none, target, &job, &err)) return fail(h, c, r, 500, "server_error", NULL, NULL, "%s", err.msg);
    job->purge = 1, job->purge_tenant = target;
    srv_submit s = srv_sched_submit(h->sched, job);
    if (s != SRV_SUBMIT_OK) {
        srv_job_unref(job);
        if (s == SRV_SUBMIT_CLOSED) return fail(h, c, r, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        /* a purge is never held to --per-tenant-queue: only the queue's room */
        return fail(h, c, r, 429, "rate_limit_error", NULL, "queue_full", "the request queue is full: retry later");
    }
    srv_job *ran = job->joined ? job->joined : job; /* a purge of the tenant already queued: that one's answer */
    srv_job_wait(ran, SRV_JOB_DONE); /* not cancelled by a client leaving: an erasure asked for is done */
    /* what each level dropped: this replica's pool, and the tier's values
     * (null: Redis could not be reached); other replicas drop theirs at the
     * tenant's next request there, when they read its purge epoch */
    char body[256], tier[40] = "";
    if (ran->purged_tiered && ran->purged_tier >= 0) snprintf(tier, sizeof tier, ",\"tier\":%ld", ran->purged_tier);
    else if (ran->purged_tiered) snprintf(tier, sizeof tier, ",\"tier\":null");
    snprintf(body, sizeof body, "{\"object\":\"cacheprune.purge\",\"segments\":%zu,\"admission_records\":%zu,\"levels\":{\"pool\":%zu%s}}",
             ran->purged_segments, ran->purged_admissions, ran->purged_segments, tier);
    srv_job_unref(job);
    return respond(h, c, r, 200, "application/json", strdup(body), NULL, NULL);
}

/* ---- the API key's header ---------------------------------------------------------------- */

/* how many headers a request has of one name (any case) */
typedef struct header_count {
    const char *name;
    int n;
} header_count;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind, (void)value;
    header_count *hc = cls;
    if (key && strcasecmp(key, hc->name) == 0) hc->n++;
    return MHD_YES;
}

static int headers_named(struct MHD_Connection *c, const char *name)
{
    header_count hc = { name, 0 };
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &hc);
    return hc.n;
}

static enum MHD_Result spaced_name(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind, (void)value;
    if (key && strpbrk(key, " \t")) *(int *)cls = 1;
    return MHD_YES;
}

/* How this request's body is framed, if a proxy in front could read it
 * another way (RFC 9112 6.1-6.3): 0 when it is plain; else the status to
 * refuse it with (400, or 501 for a transfer coding not served), and the
 * connection is closed after that answer -- what follows on it is not
 * a request boundary anyone agrees on. */
static unsigned framing_problem(struct MHD_Connection *c, const char **why)
{
    int spaced = 0;
    MHD_get_connection_values(c, MHD_HEADER_KIND, spaced_name, &spaced);
    const int cl = headers_named(c, MHD_HTTP_HEADER_CONTENT_LENGTH), te = headers_named(c, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *tv = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (spaced) return *why = "a header name holds a space or a tab (\"Content-Length : 5\")", 400;
    if (cl > 1 || te > 1) return *why = "one Content-Length or Transfer-Encoding header, not two", 400;
    if (cl && te) return *why = "Content-Length and Transfer-Encoding together: one of them frames the body", 400;
    if (te && (!tv || strcasecmp(tv, "chunked") != 0)) return *why = "Transfer-Encoding: chunked is the only transfer coding served", 501;
    return 0;
}

/* The Authorization header's value, or NULL when there is none; *forged
 * when it cannot be trusted as one value: sent twice (readers keeping the
 * first and the last would disagree about who is asking), or cut by a NUL.
 * libmicrohttpd 0.9.75 hands a header's value as a C string, so a NUL sent
 * inside the line silently cuts the value there ("Bearer KEY\0junk" reads
 * "Bearer KEY"); it gives no line length.  A line it parsed ends in the NUL
 * it wrote over its CR (and its LF), so the byte after a whole value is NUL,
 * and after a cut one it is the rest of the line.  (The rest of a line that
 * starts with a NUL again looks like a line end: what cannot be told apart
 * without the line's length, which this libmicrohttpd does not keep.) */
static const char *auth_header(struct MHD_Connection *c, int *forged)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    *forged = headers_named(c, MHD_HTTP_HEADER_AUTHORIZATION) > 1 || (v && v[strlen(v) + 1] != 0);
    return v;
}

/* ---- slow clients: per-connection deadlines ----------------------------------------------- */

/* Each connection's socket send buffer (the kernel doubles it): an
 * answer's stream is a few KB a second; 256 connections hold 32 MB. */
#define SRV_SNDBUF_BYTES (64 * 1024)

/* The watchdog's period: a deadline is kept to within it. */
#define WATCHDOG_MS 100

/* Past --max-connections, libmicrohttpd takes this many more connections
 * (a sixteenth, 4 to 64), each only to answer its request 503 with
 * Retry-After and close: a client finds out the server is full instead of
 * being reset.  Such a connection's headers have SRV_OVER_CAP_HEADER_S
 * (or the header deadline, if shorter): a flood of them cycles these
 * slots, never the served ones.  Past these too, libmicrohttpd resets. */
#define SRV_OVER_CAP_SLOTS(max) ((max) / 16 < 4 ? 4u : (max) / 16 > 64 ? 64u : (max) / 16)
#define SRV_OVER_CAP_HEADER_S 2.0

static double phase_deadline(const srv_http *h, conn_phase p)
{
    double now = cp_now_ms();
    return p == CONN_HEADERS ? now + h->o.header_timeout_s * 1e3 : p == CONN_BODY ? now + h->o.body_timeout_s * 1e3 : 0;
}

/* The connection's entry (notify_conn's), or NULL where it has none (out
 * of memory at its start); its fields are read and written under cmu. */
static conn_entry *entry_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The connection enters phase p, its deadline counted from now (one cut
 * stays cut). */
static void set_phase(srv_http *h, struct MHD_Connection *c, conn_phase p)
{
    conn_entry *e = entry_of(c);
    if (!e) return;
    pthread_mutex_lock(&h->cmu);
    if (e->phase != CONN_CUT) e->phase = p, e->deadline_ms = phase_deadline(h, p);
    pthread_mutex_unlock(&h->cmu);
}

/* whether the connection was opened with every served slot taken */
static int over_cap(srv_http *h, struct MHD_Connection *c)
{
    const conn_entry *e = entry_of(c);
    if (!e) return 0;
    pthread_mutex_lock(&h->cmu);
    const int over = e->over_cap;
    pthread_mutex_unlock(&h->cmu);
    return over;
}

static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code)
{
    srv_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_entry *e = ci ? calloc(1, sizeof *e) : NULL;
        if (!e) { /* out of memory: no deadline of ours, libmicrohttpd's idle timeout still holds */
            cp_warn("serve: http: a connection without a deadline (out of memory)");
            return;
        }
        e->fd = ci->connect_fd;
        /* a fixed send buffer: Linux grows an unset one to megabytes, which
         * a client that stops reading fills with everything it pipelined
         * before a write would block and --send-timeout could count */
        const int sndbuf = SRV_SNDBUF_BYTES;
        if (setsockopt(e->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf) != 0) cp_debug("serve: http: SO_SNDBUF not set");
        e->phase = CONN_HEADERS;
        e->deadline_ms = phase_deadline(h, CONN_HEADERS);
        pthread_mutex_lock(&h->cmu);
        if (++h->open_conns > h->o.max_connections) {
            const double soon = cp_now_ms() + SRV_OVER_CAP_HEADER_S * 1e3;
            e->over_cap = 1;
            if (soon < e->deadline_ms) e->deadline_ms = soon;
        }
        e->next = h->conns;
        if (h->conns) h->conns->prev = e;
        h->conns = e;
        pthread_mutex_unlock(&h->cmu);
        *socket_context = e;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        conn_entry *e = *socket_context;
        pthread_mutex_lock(&h->cmu);
        if (e->prev) e->prev->next = e->next;
        else h->conns = e->next;
        if (e->next) e->next->prev = e->prev;
        h->open_conns--;
        pthread_mutex_unlock(&h->cmu);
        free(e);
        *socket_context = NULL;
    }
}

/* Cuts every connection past its deadline: shutdown() wakes its thread,
 * whose read fails, and libmicrohttpd closes it and frees its slot. */
static void *watchdog(void *arg)
{
    srv_http *h = arg;
    pthread_mutex_lock(&h->cmu);
    while (!h->watchdog_stop) {
        double now = cp_now_ms();
        for (conn_entry *e = h->conns; e; e = e->next)
            if ((e->phase == CONN_HEADERS || e->phase == CONN_BODY) && now >= e->deadline_ms) {
                shutdown(e->fd, SHUT_RDWR);
                srv_metrics_conn_cut(h->metrics, e->phase == CONN_BODY ? SRV_CUT_BODY : SRV_CUT_HEADERS);
                e->phase = CONN_CUT;
            }
        struct timespec until = cp_deadline_ms(WATCHDOG_MS);
        pthread_cond_timedwait(&h->ccv, &h->cmu, &until);
    }
    pthread_mutex_unlock(&h->cmu);
    return NULL;
}

/* ---- routing ------------------------------------------------------------------------- */

static enum MHD_Result first_call(srv_http *h, struct MHD_Connection *c, http_req *r, const char *url, const char *method,
                                  const char *version)
{
    /* HEAD wherever GET is (RFC 9110 9.3.2): libmicrohttpd sends the GET
     * answer's headers without its body */
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0, post = strcmp(method, "POST") == 0;
    r->rt = route_of(url);
    /* RFC 9112 3.2: an HTTP/1.1 request without Host, or any with two, is a 400 */
    const int hosts = headers_named(c, MHD_HTTP_HEADER_HOST);
    if ((hosts == 0 && version && strcmp(version, MHD_HTTP_VERSION_1_1) == 0) || hosts > 1)
        return respond(h, c, r, 400, "application/json",
                       srv_json_error("one Host header is needed (HTTP/1.1), never two", "invalid_request_error", NULL, NULL),
                       MHD_HTTP_HEADER_CONNECTION, "close");
    if (r->rt == R_HEALTH) /* open: load balancers probe it without a key */
        return get ? respond(h, c, r, 200, "application/json", strdup("{\"status\":\"ok\"}"), NULL, NULL)
                   : method_not_allowed(h, c, r, "GET, HEAD");
    /* a body's length said twice or two ways: libmicrohttpd reads one, a
     * proxy in front may have framed by the other -- the two would disagree
     * about where this request ends and the next begins */
    const char *why = NULL;
    const unsigned framing = framing_problem(c, &why);
    if (framing)
        return respond(h, c, r, framing, "application/json", srv_json_error(why, "invalid_request_error", NULL, NULL),
                       MHD_HTTP_HEADER_CONNECTION, "close");
    /* the key before anything else: without one nothing is served or told */
    int forged;
    const char *auth = auth_header(c, &forged);
    if (forged)
        return fail(h, c, r, 401, "authentication_error", NULL, "invalid_api_key",
                    "one Authorization header, with no control bytes, is needed");
    switch (srv_authenticate(h->keys, auth, &r->who)) {
    case SRV_AUTH_OK: break;
    case SRV_AUTH_MISSING:
        return fail(h, c, r, 401, "authentication_error", NULL, "invalid_api_key", "missing API key (Authorization: Bearer KEY)");
    case SRV_AUTH_MALFORMED:
        return fail(h, c, r, 401, "authentication_error", NULL, "invalid_api_key", "the Authorization header must be 'Bearer KEY'");
    default: return fail(h, c, r, 401, "authentication_error", NULL, "invalid_api_key", "invalid API key");
    }
    switch (r->rt) {
    case R_NONE:
        return fail(h, c, r, 404, "invalid_request_error", NULL, "not_found",
                    "unknown path (served: /v1/chat/completions, /v1/completions, /v1/models, /v1/cacheprune/purge, /health, /metrics)");
    case R_MODELS:
        if (!get) return method_not_allowed(h, c, r, "GET, HEAD");
        return respond(h, c, r, 200, "application/json", srv_json_models(h->served_name, h->started), NULL, NULL);
    case R_METRICS:
        if (!get) return method_not_allowed(h, c, r, "GET, HEAD");
        if (!r->who.operator_)
            return fail(h, c, r, 403, "permission_error", NULL, "forbidden", "/metrics needs an operator key");
        return respond(h, c, r, 200, "text/plain; version=0.0.4", srv_metrics_render(h->metrics), NULL, NULL);
    default: break;
    }
    if (!post) return method_not_allowed(h, c, r, "POST");
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) { /* refused before a byte of it is read */
        char *end;
        unsigned long long n = strtoull(cl, &end, 10);
        if (end != cl && n > h->o.max_body)
            return fail(h, c, r, 413, "invalid_request_error", NULL, "request_too_large", "the request body is over %zu bytes",
                        h->o.max_body);
    }
    return MHD_YES; /* read the body */
}

static int append_body(http_req *r, const char *data, size_t n, size_t max)
{
    if (r->oom || r->too_large || r->len + n > max) return r->too_large |= !r->oom, 0;
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n + 1) cap *= 2;
        if (cap > max + 1) cap = max + 1;
        char *b = malloc(cap); /* not realloc: the old copy is wiped */
        if (!b) return r->oom = 1, 0;
        if (r->body) memcpy(b, r->body, r->len), OPENSSL_cleanse(r->body, r->cap);
        free(r->body);
        r->body = b, r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = 0;
    return 1;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                              const char *upload, size_t *upload_size, void **con_cls)
{
    srv_http *h = cls;
    http_req *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *con_cls = r;
        pthread_mutex_lock(&h->mu);
        h->active++;
        int closing = h->closing;
        pthread_mutex_unlock(&h->mu);
        set_phase(h, c, CONN_BODY); /* the headers are in: now the body's deadline */
        if (closing) return fail(h, c, r, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        if (over_cap(h, c)) {
            srv_metrics_conn_over_cap(h->metrics);
            return fail(h, c, r, 503, "server_error", NULL, "too_many_connections",
                        "every connection slot is taken (--max-connections %u): try again shortly", h->o.max_connections);
        }
        return first_call(h, c, r, url, method, version);
    }
    if (r->answered) { /* the rest of a refused body is dropped */
        OPENSSL_cleanse((void *)upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        /* past the limit without a Content-Length (chunked): the rest is
         * read and dropped (libmicrohttpd 0.9.75 takes no answer before the
         * body ends), then refused -- up to --max-body more: past that the
         * connection is closed unanswered, or one client could stream
         * gigabytes at the server until --body-timeout */
        if (!append_body(r, upload, *upload_size, h->o.max_body) && r->too_large &&
            (r->dropped += *upload_size) > h->o.max_body) {
            OPENSSL_cleanse((void *)upload, *upload_size);
            return MHD_NO;
        }
        /* the bytes sit in libmicrohttpd's read buffer, which outlives the
         * request on a kept-alive connection and is freed unwiped: consumed,
         * they are ours to wipe */
        OPENSSL_cleanse((void *)upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    set_phase(h, c, CONN_BUSY); /* the request is whole */
    return r->rt == R_PURGE ? purge(h, c, r) : generate(h, c, r);
}

/* The phase the connection is in (CONN_BUSY where it has no entry) */
static conn_phase phase_of(srv_http *h, struct MHD_Connection *c)
{
    const conn_entry *e = entry_of(c);
    if (!e) return CONN_BUSY;
    pthread_mutex_lock(&h->cmu);
    const conn_phase p = e->phase;
    pthread_mutex_unlock(&h->cmu);
    return p;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    srv_http *h = cls;
    /* libmicrohttpd's idle timeout (--send-timeout): counted in the phase
     * the connection was in -- an answer it could not write, or a body
     * that went silent for that long before the watchdog's body deadline
     * came; a connection the watchdog cut was counted there */
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) {
        const conn_phase p = phase_of(h, c);
        if (p != CONN_CUT) srv_metrics_conn_cut(h->metrics, p == CONN_HEADERS ? SRV_CUT_HEADERS : p == CONN_BODY ? SRV_CUT_BODY : SRV_CUT_SEND);
    }
    set_phase(h, c, CONN_HEADERS); /* kept alive: the next request's headers have their deadline */
    http_req *r = *con_cls;
    if (!r) return;
    if (r->body) OPENSSL_cleanse(r->body, r->cap); /* it held the prompt */
    free(r->body);
    free(r);
    *con_cls = NULL;
    pthread_mutex_lock(&h->mu);
    h->active--;
    pthread_mutex_unlock(&h->mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    cp_debug("serve: http: %s", line);
}

static void stop_watchdog(srv_http *h)
{
    pthread_mutex_lock(&h->cmu);
    h->watchdog_stop = 1;
    pthread_cond_broadcast(&h->ccv);
    pthread_mutex_unlock(&h->cmu);
    pthread_join(h->watchdog, NULL);
}

cp_status srv_http_start(int fd, const srv_http_opts *o, const srv_keys *keys, srv_sched *sched, srv_metrics *metrics, srv_http **out,
                         cp_error *err)
{
    *out = NULL;
    srv_http *h = cp_calloc(1, sizeof *h, "http server", err);
    if (!h) return CP_ENOMEM;
    h->o = *o;
    if (!(h->o.header_timeout_s > 0)) h->o.header_timeout_s = SRV_HEADER_TIMEOUT_DEFAULT;
    if (!(h->o.body_timeout_s > 0)) h->o.body_timeout_s = SRV_BODY_TIMEOUT_DEFAULT;
    if (!(h->o.send_timeout_s > 0)) h->o.send_timeout_s = SRV_SEND_TIMEOUT_DEFAULT;
    snprintf(h->served_name, sizeof h->served_name, "%s", o->served_name);
    h->keys = keys, h->sched = sched, h->metrics = metrics;
    h->started = (long long)time(NULL);
    pthread_condattr_t ca;
    int ok = pthread_condattr_init(&ca) == 0;
    /* the watchdog's waits on the monotonic clock: a clock change cannot stall it */
    int cv = ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&h->ccv, &ca) == 0;
    if (ok) pthread_condattr_destroy(&ca);
    int mu = pthread_mutex_init(&h->mu, NULL) == 0, cmu = pthread_mutex_init(&h->cmu, NULL) == 0;
    if (!cv || !mu || !cmu) {
        if (cv) pthread_cond_destroy(&h->ccv);
        if (mu) pthread_mutex_destroy(&h->mu);
        if (cmu) pthread_mutex_destroy(&h->cmu);
        free(h);
        return cp_fail(err, CP_ENOMEM, "server: cannot create the http locks");
    }
    if (pthread_create(&h->watchdog, NULL, watchdog, h)) {
        pthread_cond_destroy(&h->ccv), pthread_mutex_destroy(&h->mu), pthread_mutex_destroy(&h->cmu);
        free(h);
        return cp_fail(err, CP_ENOMEM, "server: cannot start the connection watchdog");
    }
    /* libmicrohttpd's own timeout is an idle one (any byte resets it): it
     * closes connections that went quiet; the watchdog's deadlines close
     * those that trickle.  Idle connections between requests and slow
     * requests are the watchdog's (the header and body deadlines are
     * shorter), and a connection is not idle while its handler runs (a
     * long generation) or its stream sends a keep-alive each second: what
     * is left to the idle timeout is an answer the client does not read,
     * which held its slot (and the engine's work for the requests it had
     * pipelined behind it) for as long as the timeout */
    const unsigned idle_s = (unsigned)ceil(h->o.send_timeout_s);
    /* Each connection's buffer holds its requests' headers (the key) and
     * whatever of a body arrived with them.  libmicrohttpd zeroes it between
     * the requests of a kept-alive connection, but a buffer of 32 KB or less
     * (its default) is malloc'd and freed unwiped at the close, with the
     * body of a request answered before it was read (a wrong key, a 404, a
     * 413) still in it.  Above 32 KB it is mapped and unmapped: its pages go
     * back to the kernel, and nothing of them stays in the process. */
    const size_t conn_buffer = (size_t)64 << 10;
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, handle, h, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED, completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, notify_conn, h, MHD_OPTION_CONNECTION_LIMIT, o->max_connections + SRV_OVER_CAP_SLOTS(o->max_connections),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_per_address, MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, conn_buffer,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_UNESCAPE_CALLBACK, keep_escaped, NULL, MHD_OPTION_END);
    if (!h->d) {
        stop_watchdog(h);
        pthread_cond_destroy(&h->ccv), pthread_mutex_destroy(&h->mu), pthread_mutex_destroy(&h->cmu);
        free(h);
        return cp_fail(err, CP_EIO, "server: libmicrohttpd did not start on the listening socket");
    }
    *out = h;
    return CP_OK;
}

int srv_http_quiesce(srv_http *h)
{
    pthread_mutex_lock(&h->mu);
    h->closing = 1;
    pthread_mutex_unlock(&h->mu);
    /* a request still arriving (headers or body) was never accepted: cut
     * now, not at its deadline -- a client trickling its body would hold
     * the drain (and the exit status) for as long as it trickled */
    pthread_mutex_lock(&h->cmu);
    for (conn_entry *e = h->conns; e; e = e->next)
        if (e->phase == CONN_HEADERS || e->phase == CONN_BODY) e->deadline_ms = 0;
    pthread_cond_broadcast(&h->ccv);
    pthread_mutex_unlock(&h->cmu);
    return (int)MHD_quiesce_daemon(h->d);
}

size_t srv_http_active(srv_http *h)
{
    pthread_mutex_lock(&h->mu);
    size_t n = h->active;
    pthread_mutex_unlock(&h->mu);
    return n;
}

void srv_http_stop(srv_http *h)
{
    if (!h) return;
    stop_watchdog(h);
    MHD_stop_daemon(h->d); /* every connection closed: notify_conn freed its entry */
    for (conn_entry *e = h->conns, *n; e; e = n) n = e->next, free(e);
    pthread_cond_destroy(&h->ccv);
    pthread_mutex_destroy(&h->cmu);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
