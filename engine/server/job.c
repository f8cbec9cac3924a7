#define _GNU_SOURCE /* POLLRDHUP */
#include "job.h"

#include <errno.h>
#include <poll.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "../../kernels/clock.h"

cp_status srv_job_create(srv_gen *gen, uint32_t tenant, srv_job **out, cp_error *err)
{
    *out = NULL;
    srv_job *j = cp_calloc(1, sizeof *j, "server job", err);
    if (!j) return CP_ENOMEM;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) {
        free(j);
        return cp_fail(err, CP_ENOMEM, "server: cannot create a job condition");
    }
    /* timed waits on the monotonic clock: a clock change cannot stall them */
    int ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&j->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok) {
        free(j);
        return cp_fail(err, CP_ENOMEM, "server: cannot create a job condition");
    }
    if (pthread_mutex_init(&j->mu, NULL) != 0) {
        pthread_cond_destroy(&j->cv);
        free(j);
        return cp_fail(err, CP_ENOMEM, "server: cannot create a job lock");
    }
    j->gen = *gen;
    memset(gen, 0, sizeof *gen);
    j->tenant = tenant;
    j->fd = -1;
    j->refs = 1;
    j->finish = "length";
    srv_text_init(&j->text, j->gen.stops, j->gen.n_stops);
    *out = j;
    return CP_OK;
}

void srv_job_ref(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void srv_job_unref(srv_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    srv_job_unref(j->joined);
    srv_text_free(&j->text); /* wipes the text the client was shown */
    srv_gen_free(&j->gen);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

srv_job_state srv_job_wait(srv_job *j, srv_job_state s)
{
    pthread_mutex_lock(&j->mu);
    while (j->state < s) pthread_cond_wait(&j->cv, &j->mu);
    srv_job_state now = j->state;
    pthread_mutex_unlock(&j->mu);
    return now;
}

int srv_job_take(srv_job *j, size_t *sent, char **delta, size_t *n, int timeout_ms)
{
    *delta = NULL, *n = 0;
    struct timespec until = cp_deadline_ms(timeout_ms);
    pthread_mutex_lock(&j->mu);
    while (j->text.visible <= *sent && j->state != SRV_JOB_DONE)
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT) break;
    if (j->text.visible > *sent) {
        size_t k = j->text.visible - *sent;
        char *d = malloc(k);
        if (d) { /* out of memory: the bytes stay for the next call */
            memcpy(d, j->text.buf + *sent, k);
            *delta = d, *n = k, *sent += k;
        }
    }
    int done = j->state == SRV_JOB_DONE && *sent >= j->text.visible;
    pthread_mutex_unlock(&j->mu);
    return done;
}

srv_job_state srv_job_wait_ms(srv_job *j, srv_job_state s, int timeout_ms)
{
    struct timespec until = cp_deadline_ms(timeout_ms);
    pthread_mutex_lock(&j->mu);
    while (j->state < s)
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT) break;
    srv_job_state now = j->state;
    pthread_mutex_unlock(&j->mu);
    return now;
}

int srv_job_cancelled(void *ctx)
{
    srv_job *j = ctx;
    pthread_mutex_lock(&j->mu);
    int c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

srv_job_state srv_job_cancel(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->cancelled = 1;
    srv_job_state s = j->state;
    pthread_mutex_unlock(&j->mu);
    return s;
}

int srv_job_start(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    int go = !j->cancelled;
    if (go) j->state = SRV_JOB_RUNNING, pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return go;
}

void srv_job_set_state(srv_job *j, srv_job_state s)
{
    pthread_mutex_lock(&j->mu);
    j->state = s;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

int srv_job_on_piece(void *ctx, const char *bytes, size_t n)
{
    srv_job *j = ctx;
    cp_error err;
    pthread_mutex_lock(&j->mu);
    cp_status rc = srv_text_push(&j->text, bytes, n, &err);
    if (rc) j->rc = rc, memcpy(j->err, err.msg, sizeof j->err);
    if (j->state < SRV_JOB_STREAMING) j->state = SRV_JOB_STREAMING;
    double now = cp_now_ms();
    if (j->last_piece_ms > 0) srv_itl_add(&j->itl, (now - j->last_piece_ms) / 1e3);
    j->last_piece_ms = now;
    int stop = rc != CP_OK || j->text.stopped || j->cancelled;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return stop;
}

int srv_peer_gone(int fd)
{
    if (fd < 0) return 0;
#ifdef POLLRDHUP
    /* the peer's FIN or reset, even behind bytes it sent after its request
     * (a peek at one byte saw a client that sent one more byte and closed
     * as still there, and its abandoned request ran) */
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return 1;
#endif
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}
