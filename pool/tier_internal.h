/* Internals shared by the tier's files (tier.c and the tier_*.c it names):
 * the tier object, its connections, the writer's jobs, the bound tenants. */
#ifndef CP_TIER_INTERNAL_H
#define CP_TIER_INTERNAL_H

#include <hiredis/hiredis.h>
#include <pthread.h>

#include "tier.h"

#define TIER_WINDOW 16        /* the index window: the pool's smallest, so every segment it stores is indexable */
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

/* ---- tier.c ---- */
/* b[0..n) as lowercase hex into out (2n + 1 bytes) */
void tier_hex(const uint8_t *b, size_t n, char *out);

/* ---- tier_conn.c: each connection used by one thread at a time (rd under
 * rd_lock, wr by the writer) ---- */
/* 1 with a live connection; 0 while the breaker is open or reconnecting failed */
int tier_conn_ensure(cp_tier *t, tier_conn *k);
/* n pipelined commands; replies[i] set (NULL on failure, then all are
 * freed and the connection dropped).  1 on success. */
int tier_pipeline(cp_tier *t, tier_conn *k, size_t n, int *argc, const char ***argv, size_t **lens, redisReply **replies);
/* one command: its reply (the caller frees it), NULL on failure */
redisReply *tier_command(cp_tier *t, tier_conn *k, int argc, const char **argv, size_t *lens);

/* ---- tier_keys.c: tk is a tenant's key, NULL for the shared space ---- */
void tier_index_key(const cp_tier *t, const uint8_t *tk, const int32_t *tokens, char *out, size_t cap);
void tier_value_key(const cp_tier *t, const uint8_t *tk, const char *sha_hex, char *out, size_t cap);
void tier_epoch_key(const cp_tier *t, const uint8_t *tk, char *out, size_t cap);
/* what a value under key name `name` is sealed with and checked against */
cp_tier_check tier_check_of(const cp_tier *t, const char *name);
/* the tenant's key; 0 when it was never bound */
int tier_tenant_key_get(cp_tier *t, uint32_t id, uint8_t key[CP_TIER_KEY_BYTES]);
/* the tenant's key and the epoch this replica last read; 0 when never
 * bound or the epoch is not known */
int tier_tenant_epoch_get(cp_tier *t, uint32_t id, uint8_t key[CP_TIER_KEY_BYTES], uint32_t *epoch);

/* ---- tier_writer.c ---- */
void tier_job_free(tier_job *j);
/* queues j (takes it); 0 when the queue is full or stopping (j freed) */
int tier_enqueue(cp_tier *t, tier_job *j, int bounded);
/* the writer thread's body (arg: the tier) */
void *tier_writer_main(void *arg);

/* ---- tier_purge.c: the writer's side of a purge (its connection) ---- */
/* INCR of the tenant's epoch; 0 on a failure */
int tier_epoch_bump(cp_tier *t, tier_conn *k, const char *ekey);
/* SCAN ... MATCH pattern, UNLINK what it finds: how many segment values; -1 on a failure */
long tier_scan_delete(cp_tier *t, tier_conn *k, const char *pattern);

#endif
