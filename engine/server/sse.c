#include "sse.h"

#include <errno.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "../../kernels/clock.h"
#include "sched.h"

enum { PH_WAIT = 0, PH_ROLE, PH_BODY, PH_FINAL, PH_USAGE, PH_DONE, PH_END };

typedef struct sse_stream {
    srv_job *job;
    srv_sched *sched;
    int fd;                      /* the connection's socket, or -1 */
    int beats;                   /* keep-alive comments sent while waiting */
    srv_result r;
    char id[64], model[SRV_MODEL_NAME_MAX + 1];
    int include_usage, phase;
    size_t sent;                 /* visible bytes of the job taken so far */
    char *out;                   /* the event being handed to the connection */
    size_t out_len, out_pos;
} sse_stream;

char *srv_sse_event(const char *payload, size_t *len)
{
    size_t n = strlen(payload);
    char *e = malloc(n + 9);
    if (!e) return NULL;
    memcpy(e, "data: ", 6);
    memcpy(e + 6, payload, n);
    memcpy(e + 6 + n, "\n\n", 3);
    *len = n + 8;
    return e;
}

static int keep_alive(sse_stream *s)
{
    s->out = strdup(": keep-alive\n\n");
    s->out_len = s->out ? strlen(s->out) : 0, s->out_pos = 0;
    return s->out ? 1 : -1;
}

/* The job has no token yet (queued, or in its prefill): a comment at once
 * and one each quiet interval, the client's socket watched meanwhile (a
 * client that leaves a queued request frees its place at once).  0 once
 * the job has its first token or is done, -2 when the client is gone. */
static int wait_first(sse_stream *s)
{
    if (!s->beats++) return keep_alive(s);
    for (double until = cp_now_ms() + SRV_SSE_KEEPALIVE_MS; cp_now_ms() < until;) {
        if (srv_job_wait_ms(s->job, SRV_JOB_STREAMING, 50) >= SRV_JOB_STREAMING) {
            pthread_mutex_lock(&s->job->mu);
            int failed = s->job->state == SRV_JOB_DONE && s->job->rc != CP_OK;
            pthread_mutex_unlock(&s->job->mu);
            s->phase = failed ? PH_FINAL : PH_ROLE; /* a refusal is the error event alone */
            return 0;
        }
        if (srv_peer_gone(s->fd)) return -2;
    }
    return keep_alive(s); /* a quiet interval: the next comment */
}

/* events hold generated text: wiped before they are freed */
static void drop_out(sse_stream *s)
{
    if (s->out) OPENSSL_cleanse(s->out, s->out_len);
    free(s->out);
    s->out = NULL;
}

/* The next event into s->out; 0 when there is none yet (the job is still
 * running), -1 when out of memory, -2 when the client is gone. */
static int next_event(sse_stream *s)
{
    char *payload = NULL;
    switch (s->phase) {
    case PH_WAIT: return wait_first(s);
    case PH_ROLE:
        s->phase = PH_BODY;
        if (s->r.kind != SRV_CHAT) return 0;
        payload = srv_json_chunk(&s->r, "", 0, 1, NULL, s->include_usage);
        break;
    case PH_BODY: {
        char *delta;
        size_t n;
        int done = srv_job_take(s->job, &s->sent, &delta, &n, SRV_SSE_KEEPALIVE_MS);
        if (delta) payload = srv_json_chunk(&s->r, delta, n, 0, NULL, s->include_usage);
        if (delta) OPENSSL_cleanse(delta, n);
        free(delta);
        if (!delta && done) {
            s->phase = PH_FINAL;
            return 0;
        }
        if (!delta) return keep_alive(s); /* a quiet interval: a client gone
                                            * away fails the write and cancels the job */
        break;
    }
    case PH_FINAL: {
        srv_job *j = s->job;
        pthread_mutex_lock(&j->mu);
        cp_status rc = j->rc;
        char msg[CP_ERR_MSG_MAX];
        memcpy(msg, j->err, sizeof msg);
        s->r.finish = j->finish;
        s->r.prompt_tokens = j->prompt_tokens, s->r.completion_tokens = j->completion_tokens;
        s->r.cached_tokens = j->cached_tokens;
        pthread_mutex_unlock(&j->mu);
        if (rc) { /* the headers are gone: the error is an event */
            payload = srv_json_error(msg, "server_error", NULL, NULL);
            s->phase = PH_DONE;
        } else {
            payload = srv_json_chunk(&s->r, NULL, 0, 0, s->r.finish, s->include_usage);
            s->phase = s->include_usage ? PH_USAGE : PH_DONE;
        }
        break;
    }
    case PH_USAGE:
        payload = srv_json_usage_chunk(&s->r);
        s->phase = PH_DONE;
        break;
    case PH_DONE:
        s->out = strdup("data: [DONE]\n\n");
        s->out_len = s->out ? strlen(s->out) : 0, s->out_pos = 0;
        s->phase = PH_END;
        return s->out ? 1 : -1;
    default: return 0;
    }
    if (!payload) return -1;
    s->out = srv_sse_event(payload, &s->out_len);
    s->out_pos = 0;
    OPENSSL_cleanse(payload, strlen(payload));
    free(payload);
    return s->out ? 1 : -1;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    sse_stream *s = cls;
    for (;;) {
        if (s->out && s->out_pos < s->out_len) {
            size_t k = s->out_len - s->out_pos < max ? s->out_len - s->out_pos : max;
            memcpy(buf, s->out + s->out_pos, k);
            s->out_pos += k;
            return (ssize_t)k;
        }
        drop_out(s);
        if (s->phase == PH_END) return MHD_CONTENT_READER_END_OF_STREAM;
        if (next_event(s) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void release(void *cls)
{
    sse_stream *s = cls;
    if (s->phase != PH_END) srv_sched_cancel(s->sched, s->job); /* the client went away */
    srv_job_unref(s->job);
    drop_out(s);
    free(s);
}

struct MHD_Response *srv_sse_response(srv_job *j, const srv_result *r, int include_usage, srv_sched *sched, int fd, int waiting)
{
    sse_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->sched = sched, s->fd = fd;
    s->phase = waiting ? PH_WAIT : PH_ROLE;
    s->r = *r;
    snprintf(s->id, sizeof s->id, "%s", r->id);
    snprintf(s->model, sizeof s->model, "%s", r->model);
    s->r.id = s->id, s->r.model = s->model;
    s->include_usage = include_usage;
    s->job = j;
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, s, release);
    if (!resp) {
        free(s);
        return NULL;
    }
    srv_job_ref(j);
    return resp;
}
