/* The shared segment tier on Redis (see tier.h): the connections with their
 * circuit breakers, the writer thread and its queue, lookups that fill the
 * local pool, purges. */
#include "tier.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/clock.h"
#include "../kernels/log.h"

#define TIER_WINDOW 16        /* the index window: the pool's smallest, so every segment it stores is indexable */
#define TIER_MAX_PROBES 32768 /* positions one fill asks about */
#define TIER_MAX_FETCH 64     /* segments one fill fetches */
#define TIER_MAX_CANDS 16     /* index fields one position considers */
#define TIER_KEY_MAX 256
#define TIER_PREFIX_MAX 64

/* one connection and its breaker; used by one thread at a time */
typedef struct tier_conn {
    redisContext *c;
    double open_until; /* breaker: no attempt before this (monotonic s) */
    int down;          /* warned as down, not yet reconnected */
    const char *name;  /* "lookup" / "writer", for the warnings */
} tier_conn;

typedef enum { JOB_PUT, JOB_PURGE } job_kind;

typedef struct tier_job {
    struct tier_job *next;
    job_kind kind;
    char vkey[TIER_KEY_MAX], ikey[TIER_KEY_MAX], field[65], len[16];
    uint8_t *val;
    size_t n;
    /* purge: the key pattern, the result, who frees the job */
    long result;
    int done, abandoned;
} tier_job;

typedef struct tier_tenant {
    int bound;
    uint8_t key[CP_TIER_KEY_BYTES];
    /* the purge epoch this replica last read for the tenant; its local
     * private segments and its private writes are of that epoch */
    int epoch_known;
    uint32_t epoch;
} tier_tenant;

struct cp_tier {
    cp_tier_opts o;
    char prefix[TIER_PREFIX_MAX + 1];
    char *password;
    uint8_t *key; /* the value key (o.key_len bytes) */
    cp_kv_layout l;
    cp_backend *be;
    char fp[17]; /* the model fingerprint's first 8 bytes in hex */
    pthread_mutex_t rd_lock;
    tier_conn rd, wr;
    pthread_mutex_t ten_lock;
    tier_tenant *ten;
    size_t ten_cap;
    pthread_mutex_t q_lock;
    pthread_cond_t q_work, q_progress;
    tier_job *head, *tail;
    size_t q_n, q_bytes;
    int busy, stop;
    pthread_t writer;
    int writer_started;
    pthread_mutex_t st_lock;
    cp_tier_stats st;
};

#define STAT_ADD(t, field, v)                                                                                                   \
    do {                                                                                                                       \
        pthread_mutex_lock(&(t)->st_lock);                                                                                     \
        (t)->st.field += (v);                                                                                                  \
        pthread_mutex_unlock(&(t)->st_lock);                                                                                   \
    } while (0)

void cp_tier_opts_default(cp_tier_opts *o)
{
    memset(o, 0, sizeof *o);
    o->prefix = "cacheprune";
    o->timeout_s = 0.25;
    o->cooldown_s = 1.0;
    o->ttl_s = 86400;
    o->queue_cap = 256;
    o->queue_bytes = (size_t)256 << 20;
    o->drain_s = 5;
    o->quota_window_s = 60;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = d[b[i] >> 4], out[2 * i + 1] = d[b[i] & 15];
    out[2 * n] = 0;
}

/* ---- connections ---------------------------------------------------------------------- */

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
static int conn_ensure(cp_tier *t, tier_conn *k)
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
static int pipeline(cp_tier *t, tier_conn *k, size_t n, int *argc, const char ***argv, size_t **lens, redisReply **replies)
{
    if (!conn_ensure(t, k)) return 0;
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

static redisReply *command(cp_tier *t, tier_conn *k, int argc, const char **argv, size_t *lens)
{
    redisReply *r = NULL;
    if (!pipeline(t, k, 1, &argc, &argv, &lens, &r)) return NULL;
    return r;
}

/* ---- keys ------------------------------------------------------------------------------ */

/* the key space: "PREFIX:s:FP" or "PREFIX:p:TK:FP" */
static void space_of(const cp_tier *t, const uint8_t *tk, char *out, size_t cap)
{
    if (!tk) {
        snprintf(out, cap, "%s:s:%s", t->prefix, t->fp);
        return;
    }
    char h[2 * CP_TIER_KEY_BYTES + 1];
    hex(tk, CP_TIER_KEY_BYTES, h);
    snprintf(out, cap, "%s:p:%s:%s", t->prefix, h, t->fp);
}

static void window_hash(const cp_tier *t, const int32_t *tokens, char out[17])
{
    uint8_t w[4] = { TIER_WINDOW, 0, 0, 0 }, h[32];
    const void *parts[3] = { t->l.fingerprint, w, tokens };
    size_t lens[3] = { CP_FINGERPRINT_BYTES, 4, TIER_WINDOW * sizeof *tokens };
    cp_sha256(parts, lens, 3, h);
    hex(h, 8, out);
}

static void index_key(const cp_tier *t, const uint8_t *tk, const int32_t *tokens, char *out, size_t cap)
{
    char sp[128], h[17];
    space_of(t, tk, sp, sizeof sp);
    window_hash(t, tokens, h);
    snprintf(out, cap, "%s:i:%d:%s", sp, TIER_WINDOW, h);
}

static void value_key(const cp_tier *t, const uint8_t *tk, const char *sha_hex, char *out, size_t cap)
{
    char sp[128];
    space_of(t, tk, sp, sizeof sp);
    snprintf(out, cap, "%s:v:%s", sp, sha_hex);
}

/* what a value under key name `name` is sealed with and checked against */
static cp_tier_check check_of(const cp_tier *t, const char *name)
{
    return (cp_tier_check){ .key = t->key, .key_len = t->o.key_len, .name = name, .name_len = strlen(name), .max_len = 1u << 20,
                            .vocab = t->o.vocab, .max_pos = t->o.max_pos, .kv_bound = CP_TIER_KV_BOUND };
}

static void epoch_key(const cp_tier *t, const uint8_t *tk, char *out, size_t cap)
{
    char h[2 * CP_TIER_KEY_BYTES + 1];
    hex(tk, CP_TIER_KEY_BYTES, h);
    snprintf(out, cap, "%s:e:%s", t->prefix, h);
}

/* the tenant's key; 0 when it was never bound */
static int tenant_key(cp_tier *t, uint32_t id, uint8_t key[CP_TIER_KEY_BYTES])
{
    pthread_mutex_lock(&t->ten_lock);
    int ok = id < t->ten_cap && t->ten[id].bound;
    if (ok) memcpy(key, t->ten[id].key, CP_TIER_KEY_BYTES);
    pthread_mutex_unlock(&t->ten_lock);
    return ok;
}

/* the tenant's key and the epoch this replica last read; 0 when never
 * bound or the epoch is not known (then nothing private of it is written
 * to or taken from the tier) */
static int tenant_epoch(cp_tier *t, uint32_t id, uint8_t key[CP_TIER_KEY_BYTES], uint32_t *epoch)
{
    pthread_mutex_lock(&t->ten_lock);
    int ok = id < t->ten_cap && t->ten[id].bound && t->ten[id].epoch_known;
    if (ok) memcpy(key, t->ten[id].key, CP_TIER_KEY_BYTES), *epoch = t->ten[id].epoch;
    pthread_mutex_unlock(&t->ten_lock);
    return ok;
}

cp_status cp_tier_bind_tenant(cp_tier *t, uint32_t id, const char *name, size_t len, cp_error *err)
{
    if (id >= (1u << 24)) return cp_fail(err, CP_ERANGE, "tier: tenant number %u out of range", id);
    pthread_mutex_lock(&t->ten_lock);
    if (id >= t->ten_cap) {
        size_t cap = t->ten_cap ? t->ten_cap : 64;
        while (cap <= id) cap *= 2;
        tier_tenant *v = realloc(t->ten, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&t->ten_lock);
            return cp_fail(err, CP_ENOMEM, "tier: out of memory binding tenant %u", id);
        }
        memset(v + t->ten_cap, 0, (cap - t->ten_cap) * sizeof *v);
        t->ten = v, t->ten_cap = cap;
    }
    uint8_t key[CP_TIER_KEY_BYTES];
    cp_tier_tenant_key(name, len, key);
    if (!t->ten[id].bound || memcmp(key, t->ten[id].key, sizeof key) != 0) t->ten[id].epoch_known = 0;
    memcpy(t->ten[id].key, key, sizeof key);
    t->ten[id].bound = 1;
    pthread_mutex_unlock(&t->ten_lock);
    return CP_OK;
}

/* ---- the writer ------------------------------------------------------------------------ */

static void job_free(tier_job *j)
{
    if (!j) return;
    free(j->val);
    free(j);
}

static void do_put(cp_tier *t, tier_job *j)
{
    char ttl[24];
    snprintf(ttl, sizeof ttl, "%lld", (long long)(t->o.ttl_s > 1 ? t->o.ttl_s : 1));
    /* the value before its index entry: an entry never points at a value not yet there */
    const char *a0[5] = { "SET", j->vkey, (const char *)j->val, "EX", ttl };
    size_t l0[5] = { 3, strlen(j->vkey), j->n, 2, strlen(ttl) };
    const char *a1[4] = { "HSET", j->ikey, j->field, j->len };
    size_t l1[4] = { 4, strlen(j->ikey), strlen(j->field), strlen(j->len) };
    const char *a2[3] = { "EXPIRE", j->ikey, ttl };
    size_t l2[3] = { 6, strlen(j->ikey), strlen(ttl) };
    int argc[3] = { 5, 4, 3 };
    const char **argv[3] = { a0, a1, a2 };
    size_t *lens[3] = { l0, l1, l2 };
    redisReply *r[3] = { 0 };
    int ok = pipeline(t, &t->wr, 3, argc, argv, lens, r);
    for (int i = 0; i < 3; i++) {
        if (r[i] && r[i]->type == REDIS_REPLY_ERROR) ok = 0;
        if (r[i]) freeReplyObject(r[i]);
    }
    pthread_mutex_lock(&t->st_lock);
    if (ok) t->st.writes++, t->st.bytes_written += j->n;
    else t->st.write_drops++;
    pthread_mutex_unlock(&t->st_lock);
}

/* a key name of a segment value (":v:" in it), not an index */
static int names_value(const char *s, size_t n)
{
    for (size_t i = 0; i + 3 <= n; i++)
        if (s[i] == ':' && s[i + 1] == 'v' && s[i + 2] == ':') return 1;
    return 0;
}

/* SCAN ... MATCH pattern, UNLINK what it finds: the number of segment
 * values (":v:" keys) among what it found; -1 on a failure */
static long scan_delete(cp_tier *t, tier_conn *k, const char *pattern)
{
    char cursor[32] = "0";
    long values = 0;
    do {
        const char *a[6] = { "SCAN", cursor, "MATCH", pattern, "COUNT", "1000" };
        size_t l[6] = { 4, strlen(cursor), 5, strlen(pattern), 5, 4 };
        redisReply *r = command(t, k, 6, a, l);
        if (!r) return -1;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[0]->len >= sizeof cursor || r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            return -1;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len);
        cursor[r->element[0]->len] = 0;
        redisReply *keys = r->element[1];
        if (keys->elements) {
            const char **a2 = malloc((keys->elements + 1) * sizeof *a2);
            size_t *l2 = malloc((keys->elements + 1) * sizeof *l2);
            redisReply *d = NULL;
            if (a2 && l2) {
                a2[0] = "UNLINK", l2[0] = 6;
                for (size_t i = 0; i < keys->elements; i++) {
                    const redisReply *e = keys->element[i];
                    if (e->type != REDIS_REPLY_STRING) break; /* hostile or broken: the whole batch is refused below */
                    a2[i + 1] = e->str, l2[i + 1] = e->len;
                    values += names_value(e->str, e->len);
                    if (i + 1 == keys->elements) d = command(t, k, (int)keys->elements + 1, a2, l2);
                }
            }
            free(a2), free(l2);
            if (!d || d->type != REDIS_REPLY_INTEGER) {
                if (d) freeReplyObject(d);
                freeReplyObject(r);
                return -1;
            }
            freeReplyObject(d);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return values;
}

/* the purge's first step: the tenant's epoch moves (INCR, no TTL), so every
 * replica drops what it holds of the tenant at its next request, and no
 * private value written before is used again; 0 on a failure */
static int epoch_bump(cp_tier *t, tier_conn *k, const char *ekey)
{
    const char *a[2] = { "INCR", ekey };
    size_t l[2] = { 4, strlen(ekey) };
    redisReply *r = command(t, k, 2, a, l);
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    if (r) freeReplyObject(r);
    return ok;
}

static void *writer_main(void *arg)
{
    cp_tier *t = arg;
    pthread_mutex_lock(&t->q_lock);
    for (;;) {
        while (!t->head && !t->stop) pthread_cond_wait(&t->q_work, &t->q_lock);
        if (!t->head) break; /* stopping, nothing left */
        tier_job *j = t->head;
        t->head = j->next;
        if (!t->head) t->tail = NULL;
        t->q_n--, t->q_bytes -= j->n;
        t->busy = 1;
        pthread_mutex_unlock(&t->q_lock);
        long res = 0;
        if (j->kind == JOB_PUT) {
            do_put(t, j);
        } else {
            /* a purge is retried once past an open breaker: erasure matters more than a write */
            if (!conn_ensure(t, &t->wr)) t->wr.open_until = 0;
            res = epoch_bump(t, &t->wr, j->ikey) ? scan_delete(t, &t->wr, j->vkey) : -1;
            if (res > 0) STAT_ADD(t, purged_keys, (uint64_t)res);
        }
        pthread_mutex_lock(&t->q_lock);
        t->busy = 0;
        if (j->kind == JOB_PURGE) {
            j->result = res, j->done = 1;
            if (j->abandoned) job_free(j);
        } else {
            job_free(j);
        }
        pthread_cond_broadcast(&t->q_progress);
    }
    pthread_mutex_unlock(&t->q_lock);
    return NULL;
}

/* queues j (takes it); 0 when the queue is full or stopping (j freed) */
static int enqueue(cp_tier *t, tier_job *j, int bounded)
{
    pthread_mutex_lock(&t->q_lock);
    int ok = !t->stop && (!bounded || (t->q_n < t->o.queue_cap && t->q_bytes + j->n <= t->o.queue_bytes));
    if (ok) {
        j->next = NULL;
        if (t->tail) t->tail->next = j;
        else t->head = j;
        t->tail = j;
        t->q_n++, t->q_bytes += j->n;
        pthread_cond_signal(&t->q_work);
    }
    pthread_mutex_unlock(&t->q_lock);
    if (!ok) job_free(j);
    return ok;
}

/* ---- life ------------------------------------------------------------------------------ */

static int prefix_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > TIER_PREFIX_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        /* no ':' (it separates the key's parts) and nothing SCAN's MATCH would read as a pattern */
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

cp_status cp_tier_create(const cp_tier_opts *o, const cp_kv_layout *l, cp_backend *be, cp_tier **out, cp_error *err)
{
    *out = NULL;
    const char *prefix = o->prefix ? o->prefix : "cacheprune";
    if (!prefix_ok(prefix))
        return cp_fail(err, CP_EINVAL, "--tier-prefix: 1..%d letters, digits, '_', '-' or '.'", TIER_PREFIX_MAX);
    if (!o->url.host[0] || o->url.port <= 0) return cp_fail(err, CP_EINVAL, "tier: no endpoint");
    if (!o->key || o->key_len < CP_TIER_VALUE_KEY_MIN)
        return cp_fail(err, CP_EINVAL, "tier: no value key of at least %d bytes (--tier-key-file): values could be forged", CP_TIER_VALUE_KEY_MIN);
    if (o->vocab == 0 || o->max_pos == 0) return cp_fail(err, CP_EINVAL, "tier: the model's vocabulary and context are needed to check values");
    if (!(o->timeout_s > 0 && o->timeout_s <= 60) || !(o->cooldown_s >= 0 && o->cooldown_s <= 3600) || !(o->ttl_s >= 1) ||
        o->queue_cap == 0 || !(o->quota_window_s >= 0.001))
        return cp_fail(err, CP_EINVAL, "tier: timeout, cooldown, TTL or queue size out of range");
    cp_tier *t = calloc(1, sizeof *t);
    if (!t) return cp_fail(err, CP_ENOMEM, "tier: out of memory");
    t->o = *o;
    snprintf(t->prefix, sizeof t->prefix, "%s", prefix);
    t->o.prefix = t->prefix;
    t->l = *l;
    t->be = be;
    hex(l->fingerprint, 8, t->fp);
    t->rd.name = "lookup", t->wr.name = "writer";
    if (o->password) {
        if (!(t->password = malloc(o->password_len + 1))) {
            free(t);
            return cp_fail(err, CP_ENOMEM, "tier: out of memory");
        }
        memcpy(t->password, o->password, o->password_len);
        t->password[o->password_len] = 0;
    }
    if (!(t->key = malloc(o->key_len))) {
        free(t->password);
        free(t);
        return cp_fail(err, CP_ENOMEM, "tier: out of memory");
    }
    memcpy(t->key, o->key, o->key_len);
    t->o.password = NULL, t->o.key = NULL; /* the caller's copies are not ours to keep pointing at */
    pthread_mutex_init(&t->rd_lock, NULL);
    pthread_mutex_init(&t->ten_lock, NULL);
    pthread_mutex_init(&t->q_lock, NULL);
    pthread_mutex_init(&t->st_lock, NULL);
    pthread_cond_init(&t->q_work, NULL);
    pthread_cond_init(&t->q_progress, NULL);
    if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
        cp_tier_free(t);
        return cp_fail(err, CP_ENOMEM, "tier: cannot start the writer thread");
    }
    t->writer_started = 1;
    *out = t;
    return CP_OK;
}

int cp_tier_drain(cp_tier *t, double max_s)
{
    double end = cp_now_s() + max_s;
    pthread_mutex_lock(&t->q_lock);
    while ((t->head || t->busy) && cp_now_s() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&t->q_progress, &t->q_lock, &ts);
    }
    int empty = !t->head && !t->busy;
    pthread_mutex_unlock(&t->q_lock);
    return empty;
}

void cp_tier_free(cp_tier *t)
{
    if (!t) return;
    if (t->writer_started) {
        if (!cp_tier_drain(t, t->o.drain_s)) cp_warn("tier: %zu pending writes not drained in %.1f s: dropped", t->q_n, t->o.drain_s);
        pthread_mutex_lock(&t->q_lock);
        t->stop = 1;
        /* what is left is dropped: the writer finishes the job in hand only */
        size_t dropped = 0;
        for (tier_job *j = t->head, *nx; j; j = nx) {
            nx = j->next;
            if (j->kind == JOB_PURGE) {
                j->result = -1, j->done = 1;
                if (j->abandoned) job_free(j);
            } else {
                job_free(j), dropped++;
            }
        }
        t->head = t->tail = NULL;
        t->q_n = t->q_bytes = 0;
        pthread_cond_broadcast(&t->q_work);
        pthread_mutex_unlock(&t->q_lock);
        STAT_ADD(t, write_drops, dropped);
        pthread_join(t->writer, NULL);
    }
    if (t->rd.c) redisFree(t->rd.c);
    if (t->wr.c) redisFree(t->wr.c);
    if (t->password) {
        volatile char *v = t->password;
        for (size_t i = 0; i < t->o.password_len; i++) v[i] = 0;
        free(t->password);
    }
    if (t->key) {
        volatile uint8_t *v = t->key;
        for (size_t i = 0; i < t->o.key_len; i++) v[i] = 0;
        free(t->key);
    }
    free(t->ten);
    pthread_mutex_destroy(&t->rd_lock);
    pthread_mutex_destroy(&t->ten_lock);
    pthread_mutex_destroy(&t->q_lock);
    pthread_mutex_destroy(&t->st_lock);
    pthread_cond_destroy(&t->q_work);
    pthread_cond_destroy(&t->q_progress);
    free(t);
}

void cp_tier_stats_get(cp_tier *t, cp_tier_stats *out)
{
    pthread_mutex_lock(&t->st_lock);
    *out = t->st;
    pthread_mutex_unlock(&t->st_lock);
}

/* ---- write-through --------------------------------------------------------------------- */

/* K and V rows of w into kv ([layer][K, V][len][row]) in host memory */
static cp_status copy_kv(cp_tier *t, const cp_tier_write *w, uint8_t *kv, cp_error *err)
{
    size_t row = cp_kv_row(&t->l), esz = cp_dtype_size(t->l.dtype), rb = row * esz, part = (size_t)w->len * rb;
    for (int l = 0; l < t->l.n_layers; l++)
        for (int s = 0; s < 2; s++) {
            const uint8_t *src = (const uint8_t *)(s ? w->kv->v[l] : w->kv->k[l]);
            uint8_t *dst = kv + ((size_t)l * 2 + (size_t)s) * part;
            if (w->kv->stride == row) {
                cp_status rc = t->be->download(t->be, dst, src, part, err);
                if (rc) return rc;
            } else {
                for (uint32_t i = 0; i < w->len; i++) {
                    cp_status rc = t->be->download(t->be, dst + i * rb, src + (size_t)i * w->kv->stride * esz, rb, err);
                    if (rc) return rc;
                }
            }
        }
    return CP_OK;
}

int cp_tier_put(cp_tier *t, const cp_tier_write *w)
{
    uint8_t tk[CP_TIER_KEY_BYTES];
    uint32_t epoch = 0;
    int keep = !w->sensitive || !w->kv || w->len < TIER_WINDOW;
    for (uint32_t i = 0; !keep && i < w->len; i++) keep = w->sensitive[i] != 0;
    /* a private write carries the epoch its request saw: none known, none written */
    if (!keep && w->scope == CP_SCOPE_PRIVATE) keep = !tenant_epoch(t, w->tenant, tk, &epoch);
    if (keep) {
        STAT_ADD(t, kept_local, 1);
        return 0;
    }
    size_t n = cp_tier_value_bytes(&t->l, w->len), kvoff = n - (size_t)t->l.n_layers * 2 * w->len * cp_kv_row(&t->l) *
                                                                   cp_dtype_size(t->l.dtype);
    tier_job *j = calloc(1, sizeof *j);
    uint8_t *val = malloc(n), *kv = malloc(n - kvoff + 1), *rec = calloc(((size_t)w->len + 7) / 8, 1);
    cp_error err = { 0 };
    int ok = j && val && kv && rec && copy_kv(t, w, kv, &err) == CP_OK;
    if (ok) {
        for (uint32_t i = 0; w->recompute && i < w->len; i++)
            if (w->recompute[i]) rec[i / 8] |= (uint8_t)(1u << (i % 8));
        cp_tier_seg s = { .shared = w->scope == CP_SCOPE_SHARED, .len = w->len, .start_pos = w->start_pos, .tokens = w->tokens,
                          .recompute = rec, .kv = kv };
        if (!s.shared) memcpy(s.owner, tk, sizeof tk), s.epoch = epoch;
        cp_tier_segment_sha(&t->l, w->tokens, w->len, s.sha);
        char sha[65];
        hex(s.sha, 32, sha);
        j->kind = JOB_PUT;
        value_key(t, s.shared ? NULL : tk, sha, j->vkey, sizeof j->vkey);
        cp_tier_check k = check_of(t, j->vkey);
        ok = cp_tier_value_encode(&t->l, &k, &s, val, &err) == CP_OK;
        if (ok) {
            index_key(t, s.shared ? NULL : tk, w->tokens, j->ikey, sizeof j->ikey);
            snprintf(j->field, sizeof j->field, "%s", sha);
            snprintf(j->len, sizeof j->len, "%u", w->len);
            j->val = val, j->n = n;
            val = NULL;
        }
    }
    free(kv), free(rec), free(val);
    if (!ok) {
        if (err.code) cp_warn("tier: a write-through was dropped: %s", err.msg);
        job_free(j);
        STAT_ADD(t, write_drops, 1);
        return 0;
    }
    if (!enqueue(t, j, 1)) {
        STAT_ADD(t, write_drops, 1);
        return 0;
    }
    return 1;
}

/* ---- purge ----------------------------------------------------------------------------- */

long cp_tier_purge(cp_tier *t, uint32_t tenant, double max_s)
{
    uint8_t tk[CP_TIER_KEY_BYTES];
    if (!tenant_key(t, tenant, tk)) return 0; /* never bound: nothing of it was ever written */
    tier_job *j = calloc(1, sizeof *j);
    if (!j) return -1;
    char h[2 * CP_TIER_KEY_BYTES + 1];
    hex(tk, CP_TIER_KEY_BYTES, h);
    j->kind = JOB_PURGE;
    snprintf(j->vkey, sizeof j->vkey, "%s:p:%s:*", t->prefix, h);
    epoch_key(t, tk, j->ikey, sizeof j->ikey);
    /* this replica re-reads the epoch at the tenant's next request too */
    pthread_mutex_lock(&t->ten_lock);
    t->ten[tenant].epoch_known = 0;
    pthread_mutex_unlock(&t->ten_lock);
    /* behind every write queued before it, never refused for room */
    if (!enqueue(t, j, 0)) return -1;
    double end = cp_now_s() + max_s;
    pthread_mutex_lock(&t->q_lock);
    while (!j->done && cp_now_s() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&t->q_progress, &t->q_lock, &ts);
    }
    long res = -1;
    if (j->done) {
        res = j->result;
        job_free(j);
    } else {
        j->abandoned = 1; /* the writer frees it when it gets there */
    }
    pthread_mutex_unlock(&t->q_lock);
    if (res < 0) cp_warn("tier: a purge did not reach redis; the tenant's keys there stay until their TTL");
    return res;
}

/* ---- the purge epoch ------------------------------------------------------------------- */

/* a GET reply of an epoch: absent is 0 (never purged, or Redis lost it:
 * any change drops the local copies, so a reset errs on the safe side);
 * anything but a short decimal is unreadable */
static int epoch_parse(const redisReply *r, uint32_t *out)
{
    if (r->type == REDIS_REPLY_NIL) return *out = 0, 1;
    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 20) return 0;
    unsigned long long v = 0;
    for (size_t i = 0; i < r->len; i++) {
        if (r->str[i] < '0' || r->str[i] > '9') return 0;
        v = v * 10 + (unsigned)(r->str[i] - '0');
    }
    *out = (uint32_t)v; /* the value header keeps 32 bits: epochs 2^32 purges apart are not told apart */
    return 1;
}

int cp_tier_epoch_sync(cp_tier *t, uint32_t tenant)
{
    uint8_t tk[CP_TIER_KEY_BYTES];
    if (!tenant_key(t, tenant, tk)) return 0;
    char ekey[TIER_KEY_MAX];
    epoch_key(t, tk, ekey, sizeof ekey);
    const char *a[2] = { "GET", ekey };
    size_t l[2] = { 3, strlen(ekey) };
    pthread_mutex_lock(&t->rd_lock);
    redisReply *r = command(t, &t->rd, 2, a, l);
    pthread_mutex_unlock(&t->rd_lock);
    uint32_t now = 0;
    int read = r && epoch_parse(r, &now);
    if (r) freeReplyObject(r);
    pthread_mutex_lock(&t->ten_lock);
    tier_tenant *e = &t->ten[tenant];
    int drop = !read || !e->epoch_known || e->epoch != now, moved = read && e->epoch_known && e->epoch != now;
    e->epoch_known = read, e->epoch = now;
    pthread_mutex_unlock(&t->ten_lock);
    if (moved) STAT_ADD(t, epoch_purges, 1); /* a purge through another replica (a first read is none) */
    return drop;
}

/* ---- lookups --------------------------------------------------------------------------- */

typedef struct tier_cand {
    uint32_t pos, len;
    int priv;
    char sha[65];
    size_t q; /* its index query */
} tier_cand;

static int sha_hex_ok(const char *s, size_t n)
{
    if (n != 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* fields of one HGETALL reply into cands (at most TIER_MAX_CANDS of them) */
static size_t parse_fields(const redisReply *r, uint32_t pos, int priv, size_t q, tier_cand *out)
{
    size_t k = 0;
    if (r->type != REDIS_REPLY_ARRAY) return 0;
    for (size_t i = 0; i + 1 < r->elements && k < TIER_MAX_CANDS; i += 2) {
        const redisReply *f = r->element[i], *v = r->element[i + 1];
        if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING || !sha_hex_ok(f->str, f->len) || v->len == 0 || v->len > 9)
            continue;
        char num[10];
        memcpy(num, v->str, v->len);
        num[v->len] = 0;
        char *end;
        unsigned long len = strtoul(num, &end, 10);
        if (*end || len < TIER_WINDOW) continue;
        out[k] = (tier_cand){ .pos = pos, .len = (uint32_t)len, .priv = priv, .q = q };
        memcpy(out[k].sha, f->str, 64);
        out[k].sha[64] = 0;
        k++;
    }
    return k;
}

/* drops a bad or dangling entry: its index field, and the value when given */
static void drop_entry(cp_tier *t, const char *ikey, const char *field, const char *vkey)
{
    const char *a0[3] = { "HDEL", ikey, field }, *a1[2] = { "UNLINK", vkey };
    size_t l0[3] = { 4, strlen(ikey), strlen(field) }, l1[2] = { 6, vkey ? strlen(vkey) : 0 };
    int argc[2] = { 3, 2 };
    const char **argv[2] = { a0, a1 };
    size_t *lens[2] = { l0, l1 };
    redisReply *r[2] = { 0 };
    if (pipeline(t, &t->rd, vkey ? 2 : 1, argc, argv, lens, r))
        for (int i = 0; i < 2; i++)
            if (r[i]) freeReplyObject(r[i]);
}

/* a checked value into the pool: 1 when stored (or already there) */
static int place(cp_tier *t, cp_pool *pool, uint32_t tenant, const cp_tier_seg *s)
{
    size_t part = (size_t)s->len * cp_kv_row(&t->l) * cp_dtype_size(t->l.dtype), total = (size_t)t->l.n_layers * 2 * part;
    const void **kp = malloc((size_t)t->l.n_layers * sizeof *kp), **vp = malloc((size_t)t->l.n_layers * sizeof *vp);
    uint8_t *flags = calloc(s->len, 1), *sens = calloc(s->len, 1);
    void *dev = NULL;
    cp_error err = { 0 };
    int ok = kp && vp && flags && sens && t->be->alloc(t->be, total, &dev, &err) == CP_OK && t->be->upload(t->be, dev, s->kv, total, &err) == CP_OK;
    if (ok) {
        for (int l = 0; l < t->l.n_layers; l++) {
            kp[l] = (const uint8_t *)dev + (size_t)(2 * l) * part;
            vp[l] = (const uint8_t *)dev + (size_t)(2 * l + 1) * part;
        }
        for (uint32_t i = 0; i < s->len; i++) flags[i] = (s->recompute[i / 8] >> (i % 8)) & 1;
        cp_kv_source src = { kp, vp, cp_kv_row(&t->l) };
        /* sens all zero: no segment holding a sensitive token is ever written to the tier */
        cp_insert in = { .tenant = tenant, .scope = s->shared ? CP_SCOPE_SHARED : CP_SCOPE_PRIVATE, .fingerprint = t->l.fingerprint,
                         .tokens = s->tokens, .len = s->len, .start_pos = s->start_pos, .recompute = flags, .sensitive = sens,
                         .kv = &src };
        uint32_t id;
        int dd;
        ok = cp_pool_insert(pool, &in, &id, &dd, &err) == CP_OK;
    }
    if (dev) t->be->free(t->be, dev);
    free(kp), free(vp), free(flags), free(sens);
    return ok;
}

/* fetches one candidate and places it: the request tokens it covers from
 * its position (0: not used) */
static uint32_t fetch(cp_tier *t, cp_pool *pool, uint32_t tenant, const uint8_t *tk, uint32_t epoch, const tier_cand *c,
                      const char *ikey, const int32_t *tokens, size_t n)
{
    char vkey[TIER_KEY_MAX];
    value_key(t, c->priv ? tk : NULL, c->sha, vkey, sizeof vkey);
    const char *a[2] = { "GET", vkey };
    size_t l[2] = { 3, strlen(vkey) };
    redisReply *r = command(t, &t->rd, 2, a, l);
    if (!r) return 0;
    uint32_t used = 0;
    if (r->type == REDIS_REPLY_NIL) { /* evicted or expired while its index entry stayed */
        STAT_ADD(t, dangling, 1);
        drop_entry(t, ikey, c->sha, NULL);
    } else if (r->type == REDIS_REPLY_STRING) {
        cp_tier_seg s;
        cp_error err = { 0 };
        char sha[65];
        cp_tier_check k = check_of(t, vkey);
        cp_status rc = cp_tier_value_decode(&t->l, &k, (const uint8_t *)r->str, r->len, &s, &err);
        int ok = rc == CP_OK, stale = 0;
        if (ok) {
            hex(s.sha, 32, sha);
            if (strcmp(sha, c->sha) != 0) ok = 0, snprintf(err.msg, sizeof err.msg, "tier value: not the segment its key names");
            else if (s.shared != !c->priv || (c->priv && memcmp(s.owner, tk, CP_TIER_KEY_BYTES) != 0))
                ok = 0, snprintf(err.msg, sizeof err.msg, "tier value: scope or owner is not its key space's");
            else if (c->priv && s.epoch != epoch) /* written before the tenant's last purge (a request in flight then) */
                ok = 0, stale = 1;
        }
        STAT_ADD(t, bytes_read, r->len);
        if (!ok) {
            if (!stale) cp_warn("tier: a stored value was rejected (%s): dropped", err.msg);
            pthread_mutex_lock(&t->st_lock);
            t->st.stale += stale;
            t->st.bad_values += !stale;
            t->st.bad_auth += rc == CP_EPERM;
            t->st.bad_range += rc == CP_ERANGE;
            pthread_mutex_unlock(&t->st_lock);
            drop_entry(t, ikey, c->sha, vkey);
        } else {
            uint32_t m = 0;
            while (m < s.len && c->pos + m < n && s.tokens[m] == tokens[c->pos + m]) m++;
            if (m >= TIER_WINDOW && place(t, pool, tenant, &s)) used = m;
        }
    }
    freeReplyObject(r);
    return used;
}

static int cand_cmp(const void *a, const void *b)
{
    const tier_cand *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    if (x->priv != y->priv) return x->priv ? -1 : 1; /* the tenant's own first, as the engine's lookups */
    return x->len > y->len ? -1 : x->len < y->len;
}

size_t cp_tier_fill(cp_tier *t, cp_pool *pool, uint32_t tenant, const int32_t *tokens, size_t n, const uint8_t *skip,
                    int want_private, int want_shared)
{
    if (n < TIER_WINDOW || (!want_private && !want_shared)) return 0;
    uint8_t tk[CP_TIER_KEY_BYTES];
    uint32_t epoch = 0;
    /* private values only under the epoch this request read (cp_tier_epoch_sync) */
    int priv = want_private && tenant_epoch(t, tenant, tk, &epoch);
    int spaces = priv + (want_shared ? 1 : 0);
    if (!spaces) return 0;
    /* free[p]: tokens from p on that nothing covers and none is sensitive */
    uint32_t *freerun = malloc((n + 1) * sizeof *freerun);
    if (!freerun) return 0;
    freerun[n] = 0;
    size_t npos = 0;
    for (size_t p = n; p-- > 0;) freerun[p] = skip[p] ? 0 : freerun[p + 1] + 1;
    for (size_t p = 0; p < n; p++) npos += freerun[p] >= TIER_WINDOW;
    if (npos > TIER_MAX_PROBES) npos = TIER_MAX_PROBES;
    if (npos == 0) {
        free(freerun);
        return 0;
    }
    size_t nq = npos * (size_t)spaces, inserted = 0, ncand = 0;
    char *keys = malloc(nq * TIER_KEY_MAX + 1);
    uint32_t *qpos = malloc((nq + 1) * sizeof *qpos);
    int *argc = malloc((nq + 1) * sizeof *argc);
    const char **argv = malloc((nq * 2 + 1) * sizeof *argv), ***av = malloc((nq + 1) * sizeof *av);
    size_t *lens = malloc((nq * 2 + 1) * sizeof *lens), **lv = malloc((nq + 1) * sizeof *lv);
    redisReply **rep = calloc(nq + 1, sizeof *rep);
    tier_cand *cand = malloc((nq * TIER_MAX_CANDS + 1) * sizeof *cand);
    if (!keys || !qpos || !argc || !argv || !av || !lens || !lv || !rep || !cand) goto out;
    size_t q = 0;
    for (size_t p = 0; p < n && q < nq; p++) {
        if (freerun[p] < TIER_WINDOW) continue;
        for (int sp = 0; sp < spaces; sp++, q++) {
            char *k = keys + q * TIER_KEY_MAX;
            index_key(t, sp == 0 && priv ? tk : NULL, tokens + p, k, TIER_KEY_MAX);
            qpos[q] = (uint32_t)p;
            argc[q] = 2;
            argv[2 * q] = "HGETALL", lens[2 * q] = 7;
            argv[2 * q + 1] = k, lens[2 * q + 1] = strlen(k);
            av[q] = argv + 2 * q, lv[q] = lens + 2 * q;
        }
    }
    pthread_mutex_lock(&t->rd_lock);
    double t0 = cp_now_s();
    if (pipeline(t, &t->rd, nq, argc, av, lv, rep)) {
        for (q = 0; q < nq; q++) {
            int is_priv = priv && (spaces == 1 || q % 2 == 0);
            ncand += parse_fields(rep[q], qpos[q], is_priv, q, cand + ncand);
        }
        qsort(cand, ncand, sizeof *cand, cand_cmp);
        size_t covered_to = 0, fetched = 0; /* request tokens before covered_to are placed already */
        for (size_t i = 0; i < ncand && fetched < TIER_MAX_FETCH && t->rd.c; i++) {
            if (cand[i].pos < covered_to) continue;
            fetched++;
            uint32_t m = fetch(t, pool, tenant, tk, epoch, &cand[i], keys + cand[i].q * TIER_KEY_MAX, tokens, n);
            if (m) covered_to = cand[i].pos + m, inserted++;
        }
    }
    double ms = (cp_now_s() - t0) * 1e3;
    pthread_mutex_unlock(&t->rd_lock);
    pthread_mutex_lock(&t->st_lock);
    t->st.lookups++;
    t->st.hits += inserted;
    t->st.misses += inserted == 0;
    t->st.lookup_ms_sum += ms, t->st.lookup_ms_n++;
    pthread_mutex_unlock(&t->st_lock);
out:
    for (size_t i = 0; rep && i < nq; i++)
        if (rep[i]) freeReplyObject(rep[i]);
    free(freerun), free(keys), free(qpos), free(argc), free(argv), free(av), free(lens), free(lv), free(rep), free(cand);
    return inserted;
}

/* ---- quotas across replicas ------------------------------------------------------------ */

/* the counter keys of the tenant's current window (and of the one before) */
static int quota_keys(cp_tier *t, uint32_t tenant, char *bytes, char *segs, char *prev_b, char *prev_s, size_t cap)
{
    uint8_t tk[CP_TIER_KEY_BYTES];
    if (!t->o.quota_bytes && !t->o.quota_segments) return 0;
    if (!tenant_key(t, tenant, tk)) return 0;
    char h[2 * CP_TIER_KEY_BYTES + 1];
    hex(tk, CP_TIER_KEY_BYTES, h);
    /* wall-clock windows: every replica must agree on where one starts */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long w = (long long)(((double)ts.tv_sec + ts.tv_nsec * 1e-9) / t->o.quota_window_s);
    snprintf(bytes, cap, "%s:q:%s:%lld:bytes", t->prefix, h, w);
    snprintf(segs, cap, "%s:q:%s:%lld:segs", t->prefix, h, w);
    snprintf(prev_b, cap, "%s:q:%s:%lld:bytes", t->prefix, h, w - 1);
    snprintf(prev_s, cap, "%s:q:%s:%lld:segs", t->prefix, h, w - 1);
    return 1;
}

int cp_tier_quota_allow(cp_tier *t, uint32_t tenant, size_t bytes)
{
    char kb[TIER_KEY_MAX], ks[TIER_KEY_MAX], pb[TIER_KEY_MAX], ps[TIER_KEY_MAX];
    if (!quota_keys(t, tenant, kb, ks, pb, ps, sizeof kb)) return 1;
    const char *a[3] = { "MGET", kb, ks };
    size_t l[3] = { 4, strlen(kb), strlen(ks) };
    pthread_mutex_lock(&t->rd_lock);
    redisReply *r = command(t, &t->rd, 3, a, l);
    pthread_mutex_unlock(&t->rd_lock);
    if (!r) return 1;
    unsigned long long used_b = 0, used_s = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
        if (r->element[0]->type == REDIS_REPLY_STRING) used_b = strtoull(r->element[0]->str, NULL, 10);
        if (r->element[1]->type == REDIS_REPLY_STRING) used_s = strtoull(r->element[1]->str, NULL, 10);
    }
    freeReplyObject(r);
    int ok = (!t->o.quota_bytes || used_b + bytes <= t->o.quota_bytes) && (!t->o.quota_segments || used_s + 1 <= t->o.quota_segments);
    if (!ok) STAT_ADD(t, quota_refusals, 1);
    return ok;
}

void cp_tier_quota_charge(cp_tier *t, uint32_t tenant, size_t bytes)
{
    char kb[TIER_KEY_MAX], ks[TIER_KEY_MAX], pb[TIER_KEY_MAX], ps[TIER_KEY_MAX], n[24];
    if (!quota_keys(t, tenant, kb, ks, pb, ps, sizeof kb)) return;
    snprintf(n, sizeof n, "%zu", bytes);
    const char *a0[3] = { "INCRBY", kb, n }, *a1[2] = { "INCR", ks }, *a2[3] = { "UNLINK", pb, ps };
    size_t l0[3] = { 6, strlen(kb), strlen(n) }, l1[2] = { 4, strlen(ks) }, l2[3] = { 6, strlen(pb), strlen(ps) };
    int argc[3] = { 3, 2, 3 };
    const char **argv[3] = { a0, a1, a2 };
    size_t *lens[3] = { l0, l1, l2 };
    redisReply *r[3] = { 0 };
    pthread_mutex_lock(&t->rd_lock);
    if (pipeline(t, &t->rd, 3, argc, argv, lens, r))
        for (int i = 0; i < 3; i++) freeReplyObject(r[i]);
    pthread_mutex_unlock(&t->rd_lock);
}
