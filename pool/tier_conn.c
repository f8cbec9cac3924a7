/* The tier's connections to Redis: each with its circuit breaker (after a
 * failure no attempt for the cooldown, then a reconnect with AUTH and
 * SELECT), pipelined commands, SIGPIPE kept from the process. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tier_internal.h"

#include "../kernels/clock.h"
#include "../kernels/log.h"

/* hiredis writes with write(2): a peer gone raises SIGPIPE in the calling
 * thread, which would kill the process.  Blocked around each call, and a
 * SIGPIPE it raised consumed, so the process's own handling is untouched. */
typedef struct pipe_guard {
    sigset_t old;
    int pending_before;
} pipe_guard;

static void guard_enter(pipe_guard *g)
{
    sigset_t s, pend;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &s, &g->old);
    sigpending(&pend);
    g->pending_before = sigismember(&pend, SIGPIPE) == 1;
}

static void guard_leave(pipe_guard *g)
{
    sigset_t s, pend;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    sigpending(&pend);
    if (!g->pending_before && sigismember(&pend, SIGPIPE) == 1) {
        struct timespec zero = { 0, 0 };
        while (sigtimedwait(&s, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static void conn_fail(cp_tier *t, tier_conn *k, const char *what)
{
    if (!k->down)
        cp_warn("tier: redis %s:%d %s (%s: %s); serving from the local pool, retrying in %.1f s", t->o.url.host, t->o.url.port,
                "unavailable", k->name, what, t->o.cooldown_s);
    k->down = 1;
    if (k->c) redisFree(k->c);
    k->c = NULL;
    k->open_until = cp_now_s() + t->o.cooldown_s;
    pthread_mutex_lock(&t->st_lock);
    t->st.errors++, t->st.breaker_opens++;
    pthread_mutex_unlock(&t->st_lock);
}

static struct timeval tv_of(double s)
{
    struct timeval tv = { (time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6) };
    return tv;
}

/* a command on a fresh connection during setup: 1 when its reply is OK */
static int setup_cmd(redisContext *c, int argc, const char **argv, const size_t *lens, char *why, size_t cap)
{
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (!r) return snprintf(why, cap, "%s failed: %s", argv[0], c->errstr), 0;
    int ok = r->type == REDIS_REPLY_STATUS;
    if (!ok) snprintf(why, cap, "%s refused%s", argv[0], r->type == REDIS_REPLY_ERROR ? " (an error reply)" : "");
    freeReplyObject(r);
    return ok;
}

/* 1 with a live connection; 0 while the breaker is open or reconnecting failed */
int tier_conn_ensure(cp_tier *t, tier_conn *k)
{
    if (k->c) return 1;
    if (cp_now_s() < k->open_until) return 0;
    redisContext *c = redisConnectWithTimeout(t->o.url.host, t->o.url.port, tv_of(t->o.timeout_s));
    char why[160] = "out of memory";
    int ok = c && !c->err;
    if (c && c->err) snprintf(why, sizeof why, "connect: %s", c->errstr);
    if (ok && redisSetTimeout(c, tv_of(t->o.timeout_s)) != REDIS_OK) ok = 0, snprintf(why, sizeof why, "setting the timeout");
    if (ok && t->password) {
        const char *argv[2] = { "AUTH", t->password };
        size_t lens[2] = { 4, t->o.password_len };
        ok = setup_cmd(c, 2, argv, lens, why, sizeof why);
    }
    if (ok && t->o.url.db) {
        char db[8];
        snprintf(db, sizeof db, "%d", t->o.url.db);
        const char *argv[2] = { "SELECT", db };
        size_t lens[2] = { 6, strlen(db) };
        ok = setup_cmd(c, 2, argv, lens, why, sizeof why);
    }
    k->c = c;
    if (!ok) {
        conn_fail(t, k, why);
        return 0;
    }
    if (k->down) {
        cp_warn("tier: redis %s:%d reachable again (%s)", t->o.url.host, t->o.url.port, k->name);
        STAT_ADD(t, reconnects, 1);
    }
    k->down = 0;
    return 1;
}

/* n pipelined commands; replies[i] set (NULL on failure, then all are
 * freed and the connection dropped).  1 on success. */
int tier_pipeline(cp_tier *t, tier_conn *k, size_t n, int *argc, const char ***argv, size_t **lens, redisReply **replies)
{
    if (!tier_conn_ensure(t, k)) return 0;
    pipe_guard g;
    guard_enter(&g);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = redisAppendCommandArgv(k->c, argc[i], argv[i], lens[i]) == REDIS_OK;
    size_t got = 0;
    for (; ok && got < n; got++) {
        void *r = NULL;
        ok = redisGetReply(k->c, &r) == REDIS_OK && r;
        replies[got] = r;
        if (!ok) break;
    }
    guard_leave(&g);
    if (!ok) {
        for (size_t i = 0; i < got; i++) freeReplyObject(replies[i]), replies[i] = NULL;
        conn_fail(t, k, k->c && k->c->err ? k->c->errstr : "no reply");
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (replies[i]->type == REDIS_REPLY_ERROR) STAT_ADD(t, errors, 1);
    return 1;
}

redisReply *tier_command(cp_tier *t, tier_conn *k, int argc, const char **argv, size_t *lens)
{
    redisReply *r = NULL;
    if (!tier_pipeline(t, k, 1, &argc, &argv, &lens, &r)) return NULL;
    return r;
}
