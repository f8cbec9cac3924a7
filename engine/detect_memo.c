/* The detection memo (detect_memo.h): entries in a chained hash index over
 * their keys, and one least-recently-used list per tenant, each bounded by
 * the capacity on its own -- what one tenant scans never pushes out
 * another's entry, so nothing in a tenant's timing moves with another's
 * traffic. */
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
    struct entry *hnext;      /* next in its hash bucket */
    struct entry *prev, *next; /* its tenant's list: head most recent, tail least */
} entry;

typedef struct tenant_list {
    uint32_t tenant;
    int size;
    entry *head, *tail;
} tenant_list;

struct cp_detect_memo {
    pthread_mutex_t mu; /* serve prepares jobs on one thread and purges tenants on another */
    int cap;            /* entries per tenant */
    entry **bucket;     /* n_buckets chains */
    size_t n_buckets, size;
    tenant_list **t; /* the tenants holding entries, by tenant id */
    size_t n_t, cap_t;
};

static size_t bucket_of(size_t n_buckets, const uint8_t key[32])
{
    uint64_t h;
    memcpy(&h, key, sizeof h); /* a SHA-256 digest: any 8 bytes are uniform */
    return (size_t)(h % n_buckets);
}

cp_status cp_detect_memo_create(int capacity, cp_detect_memo **out, cp_error *err)
{
    *out = NULL;
    if (capacity < 1 || capacity > (1 << 20)) return cp_fail(err, CP_ERANGE, "detection memo: capacity %d is outside [1, 2^20]", capacity);
    cp_detect_memo *m = calloc(1, sizeof *m);
    if (m) m->n_buckets = 64, m->bucket = calloc(m->n_buckets, sizeof *m->bucket);
    if (!m || !m->bucket) {
        if (m) free(m->bucket);
        free(m);
        return cp_fail(err, CP_ENOMEM, "detection memo: out of memory");
    }
    if (pthread_mutex_init(&m->mu, NULL)) {
        free(m->bucket), free(m);
        return cp_fail(err, CP_ENOMEM, "detection memo: cannot make its lock");
    }
    m->cap = capacity;
    *out = m;
    return CP_OK;
}

static void entry_free(entry *x)
{
    if (x->v) OPENSSL_cleanse(x->v, x->n * sizeof *x->v);
    free(x->v);
    OPENSSL_cleanse(x, sizeof *x);
    free(x);
}

void cp_detect_memo_free(cp_detect_memo *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n_t; i++) {
        for (entry *x = m->t[i]->head, *next; x; x = next) next = x->next, entry_free(x);
        free(m->t[i]);
    }
    pthread_mutex_destroy(&m->mu);
    free(m->t), free(m->bucket), free(m);
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

/* Where tenant's list is, or goes, in m->t (sorted by tenant). */
static size_t tenant_at(const cp_detect_memo *m, uint32_t tenant)
{
    size_t lo = 0, hi = m->n_t;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->t[mid]->tenant < tenant) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static tenant_list *tenant_find(const cp_detect_memo *m, uint32_t tenant)
{
    size_t i = tenant_at(m, tenant);
    return i < m->n_t && m->t[i]->tenant == tenant ? m->t[i] : NULL;
}

/* tenant's list, made if it has none; NULL: out of memory */
static tenant_list *tenant_get(cp_detect_memo *m, uint32_t tenant)
{
    size_t i = tenant_at(m, tenant);
    if (i < m->n_t && m->t[i]->tenant == tenant) return m->t[i];
    if (m->n_t == m->cap_t) {
        size_t cap = m->cap_t ? m->cap_t * 2 : 16;
        tenant_list **t = realloc(m->t, cap * sizeof *t);
        if (!t) return NULL;
        m->t = t, m->cap_t = cap;
    }
    tenant_list *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->tenant = tenant;
    memmove(m->t + i + 1, m->t + i, (m->n_t - i) * sizeof *m->t);
    m->t[i] = l;
    m->n_t++;
    return l;
}

static void list_unlink(tenant_list *l, entry *x)
{
    if (x->prev) x->prev->next = x->next;
    else l->head = x->next;
    if (x->next) x->next->prev = x->prev;
    else l->tail = x->prev;
}

static void list_push_head(tenant_list *l, entry *x)
{
    x->prev = NULL, x->next = l->head;
    if (l->head) l->head->prev = x;
    l->head = x;
    if (!l->tail) l->tail = x;
}

static entry *find(const cp_detect_memo *m, const uint8_t key[32])
{
    for (entry *x = m->bucket[bucket_of(m->n_buckets, key)]; x; x = x->hnext)
        if (memcmp(x->key, key, 32) == 0) return x;
    return NULL;
}

/* x out of the index and its tenant's list, freed */
static void drop(cp_detect_memo *m, tenant_list *l, entry *x)
{
    entry **p = &m->bucket[bucket_of(m->n_buckets, x->key)];
    while (*p != x) p = &(*p)->hnext;
    *p = x->hnext;
    list_unlink(l, x);
    l->size--, m->size--;
    entry_free(x);
}

/* Twice the buckets once the entries outnumber them (out of memory: the
 * chains grow longer instead). */
static void grow_index(cp_detect_memo *m)
{
    if (m->size < m->n_buckets) return;
    size_t n = m->n_buckets * 2;
    entry **b = calloc(n, sizeof *b);
    if (!b) return;
    for (size_t i = 0; i < m->n_buckets; i++)
        for (entry *x = m->bucket[i], *next; x; x = next) {
            next = x->hnext;
            size_t k = bucket_of(n, x->key);
            x->hnext = b[k], b[k] = x;
        }
    free(m->bucket);
    m->bucket = b, m->n_buckets = n;
}

static int memo_get(cp_detect_memo *m, const uint8_t key[32], cp_spans *out, cp_error *err)
{
    entry *x = find(m, key);
    if (!x) return 0;
    for (size_t k = 0; k < x->n; k++)
        if (cp_spans_add(out, x->v[k].start, x->v[k].end, x->v[k].type, x->v[k].score, err) != CP_OK) return -1;
    out->wholly = x->wholly;
    tenant_list *l = tenant_find(m, x->tenant);
    list_unlink(l, x), list_push_head(l, x); /* the most recent now */
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
    int held = find(m, key) != NULL;
    pthread_mutex_unlock(&m->mu);
    return held;
}

/* keeps x (its spans set) unless key is held or tenant's list cannot be
 * made; returns whether it was kept */
static int memo_put(cp_detect_memo *m, entry *x)
{
    if (find(m, x->key)) return 0;
    tenant_list *l = tenant_get(m, x->tenant);
    if (!l) return 0;
    if (l->size == m->cap) drop(m, l, l->tail); /* the tenant's least recently used out: never another's */
    grow_index(m);
    const size_t b = bucket_of(m->n_buckets, x->key);
    x->hnext = m->bucket[b];
    m->bucket[b] = x;
    list_push_head(l, x);
    l->size++, m->size++;
    return 1;
}

void cp_detect_memo_put(cp_detect_memo *m, const uint8_t key[32], uint32_t tenant, const cp_spans *s)
{
    if (s->n > CP_DETECT_MEMO_SPANS) return;
    entry *x = calloc(1, sizeof *x);
    if (!x || (s->n && !(x->v = malloc(s->n * sizeof *x->v)))) { /* not kept: the next turn scans it again */
        free(x);
        return;
    }
    if (s->n) memcpy(x->v, s->v, s->n * sizeof *x->v);
    memcpy(x->key, key, 32);
    x->tenant = tenant, x->wholly = s->wholly, x->n = s->n;
    pthread_mutex_lock(&m->mu);
    int kept = memo_put(m, x);
    pthread_mutex_unlock(&m->mu);
    if (!kept) entry_free(x);
}

size_t cp_detect_memo_purge(cp_detect_memo *m, uint32_t tenant)
{
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    size_t i = tenant_at(m, tenant);
    if (i < m->n_t && m->t[i]->tenant == tenant) {
        tenant_list *l = m->t[i];
        while (l->head) drop(m, l, l->head), n++;
        memmove(m->t + i, m->t + i + 1, (m->n_t - i - 1) * sizeof *m->t);
        m->n_t--;
        free(l);
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}

size_t cp_detect_memo_size(cp_detect_memo *m)
{
    pthread_mutex_lock(&m->mu);
    size_t n = m->size;
    pthread_mutex_unlock(&m->mu);
    return n;
}
