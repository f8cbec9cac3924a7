/* The detection memo (detect_memo.h): a fixed table of entries, a chained
 * hash index over their keys and a least-recently-used list through them. */
#include "detect_memo.h"

#include <openssl/crypto.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/sha256.h"

typedef struct entry {
    uint8_t key[32];
    uint32_t tenant;
    int wholly;
    cp_span *v; /* n spans (NULL when none) */
    size_t n;
    int hnext;       /* next entry in its hash bucket, -1 at the end */
    int prev, next;  /* the LRU list: head most recent, tail least */
} entry;

struct cp_detect_memo {
    pthread_mutex_t mu; /* serve prepares jobs on one thread and purges tenants on another */
    entry *e;
    int cap, size;
    int *bucket; /* n_buckets heads, -1 when empty */
    int n_buckets;
    int head, tail;
    int free_top; /* a stack of unused entries through hnext */
};

static uint32_t bucket_of(const cp_detect_memo *m, const uint8_t key[32])
{
    uint32_t h;
    memcpy(&h, key, sizeof h); /* a SHA-256 digest: any 4 bytes are uniform */
    return h % (uint32_t)m->n_buckets;
}

cp_status cp_detect_memo_create(int capacity, cp_detect_memo **out, cp_error *err)
{
    *out = NULL;
    if (capacity < 1 || capacity > (1 << 20)) return cp_fail(err, CP_ERANGE, "detection memo: capacity %d is outside [1, 2^20]", capacity);
    cp_detect_memo *m = calloc(1, sizeof *m);
    if (m) m->e = calloc((size_t)capacity, sizeof *m->e), m->bucket = malloc((size_t)capacity * 2 * sizeof *m->bucket);
    if (!m || !m->e || !m->bucket) {
        if (m) free(m->e), free(m->bucket);
        free(m);
        return cp_fail(err, CP_ENOMEM, "detection memo: out of memory for %d entries", capacity);
    }
    if (pthread_mutex_init(&m->mu, NULL)) {
        free(m->e), free(m->bucket), free(m);
        return cp_fail(err, CP_ENOMEM, "detection memo: cannot make its lock");
    }
    m->cap = capacity, m->n_buckets = capacity * 2, m->head = m->tail = -1;
    for (int b = 0; b < m->n_buckets; b++) m->bucket[b] = -1;
    for (int i = 0; i < capacity; i++) m->e[i].hnext = i + 1 < capacity ? i + 1 : -1;
    m->free_top = 0;
    *out = m;
    return CP_OK;
}

static void entry_clear(entry *x)
{
    if (x->v) OPENSSL_cleanse(x->v, x->n * sizeof *x->v);
    free(x->v);
    OPENSSL_cleanse(x, sizeof *x);
}

void cp_detect_memo_free(cp_detect_memo *m)
{
    if (!m) return;
    for (int i = m->head, next; i >= 0; i = next) { /* the held entries are the LRU list's */
        next = m->e[i].next;
        entry_clear(&m->e[i]);
    }
    pthread_mutex_destroy(&m->mu);
    free(m->e), free(m->bucket), free(m);
}

void cp_detect_memo_key(uint32_t tenant, cp_role role, const char *text, size_t len, uint8_t key[32])
{
    uint8_t head[16] = { 'c', 'p', 'd', 'm' }; /* domain, tenant, role, length: the text's bytes cannot shift into them */
    uint64_t n = len;
    memcpy(head + 4, &tenant, 4);
    head[8] = (uint8_t)role;
    memcpy(head + 9, &n, 7);
    const void *parts[2] = { head, text };
    const size_t lens[2] = { sizeof head, len };
    cp_sha256(parts, lens, 2, key);
}

static void lru_unlink(cp_detect_memo *m, int i)
{
    entry *x = &m->e[i];
    if (x->prev >= 0) m->e[x->prev].next = x->next;
    else m->head = x->next;
    if (x->next >= 0) m->e[x->next].prev = x->prev;
    else m->tail = x->prev;
}

static void lru_push_head(cp_detect_memo *m, int i)
{
    entry *x = &m->e[i];
    x->prev = -1, x->next = m->head;
    if (m->head >= 0) m->e[m->head].prev = i;
    m->head = i;
    if (m->tail < 0) m->tail = i;
}

static int find(const cp_detect_memo *m, const uint8_t key[32])
{
    for (int i = m->bucket[bucket_of(m, key)]; i >= 0; i = m->e[i].hnext)
        if (memcmp(m->e[i].key, key, 32) == 0) return i;
    return -1;
}

/* entry i out of the index, the list and the table, back on the free stack */
static void drop(cp_detect_memo *m, int i)
{
    int *p = &m->bucket[bucket_of(m, m->e[i].key)];
    while (*p != i) p = &m->e[*p].hnext;
    *p = m->e[i].hnext;
    lru_unlink(m, i);
    entry_clear(&m->e[i]);
    m->e[i].hnext = m->free_top;
    m->free_top = i;
    m->size--;
}

static int memo_get(cp_detect_memo *m, const uint8_t key[32], cp_spans *out, cp_error *err)
{
    int i = find(m, key);
    if (i < 0) return 0;
    const entry *x = &m->e[i];
    for (size_t k = 0; k < x->n; k++)
        if (cp_spans_add(out, x->v[k].start, x->v[k].end, x->v[k].type, x->v[k].score, err) != CP_OK) return -1;
    out->wholly = x->wholly;
    lru_unlink(m, i), lru_push_head(m, i); /* the most recent now */
    return 1;
}

int cp_detect_memo_get(cp_detect_memo *m, const uint8_t key[32], cp_spans *out, cp_error *err)
{
    pthread_mutex_lock(&m->mu);
    int r = memo_get(m, key, out, err);
    pthread_mutex_unlock(&m->mu);
    return r;
}

int cp_detect_memo_has(cp_detect_memo *m, const uint8_t key[32])
{
    pthread_mutex_lock(&m->mu);
    int held = find(m, key) >= 0;
    pthread_mutex_unlock(&m->mu);
    return held;
}

static void memo_put(cp_detect_memo *m, const uint8_t key[32], uint32_t tenant, cp_span *v, const cp_spans *s)
{
    if (find(m, key) >= 0) {
        if (v) OPENSSL_cleanse(v, s->n * sizeof *v);
        free(v);
        return;
    }
    if (m->free_top < 0) drop(m, m->tail); /* full: the least recently used out */
    const int i = m->free_top;
    m->free_top = m->e[i].hnext;
    entry *x = &m->e[i];
    memcpy(x->key, key, 32);
    x->tenant = tenant, x->wholly = s->wholly, x->v = v, x->n = s->n;
    const uint32_t b = bucket_of(m, key);
    x->hnext = m->bucket[b];
    m->bucket[b] = i;
    lru_push_head(m, i);
    m->size++;
}

void cp_detect_memo_put(cp_detect_memo *m, const uint8_t key[32], uint32_t tenant, const cp_spans *s)
{
    if (s->n > CP_DETECT_MEMO_SPANS) return;
    cp_span *v = NULL;
    if (s->n && !(v = malloc(s->n * sizeof *v))) return; /* not kept: the next turn scans it again */
    if (s->n) memcpy(v, s->v, s->n * sizeof *v);
    pthread_mutex_lock(&m->mu);
    memo_put(m, key, tenant, v, s);
    pthread_mutex_unlock(&m->mu);
}

size_t cp_detect_memo_purge(cp_detect_memo *m, uint32_t tenant)
{
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = m->head, next; i >= 0; i = next) {
        next = m->e[i].next;
        if (m->e[i].tenant == tenant) drop(m, i), n++;
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}

size_t cp_detect_memo_size(cp_detect_memo *m)
{
    pthread_mutex_lock(&m->mu);
    size_t n = (size_t)m->size;
    pthread_mutex_unlock(&m->mu);
    return n;
}
