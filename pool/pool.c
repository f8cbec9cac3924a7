/* The pool's lifetime and options, its tenants' table, statistics, and
 * reads of a pinned segment (cp_pool_segment, cp_pool_kv_row). */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

#include "../kernels/clock.h"

void cp_pool_opts_default(cp_pool_opts *o)
{
    memset(o, 0, sizeof *o);
    o->budget_bytes = (size_t)1 << 30;
    o->policy = CP_EVICT_GDSF;
    o->windows[0] = 16, o->windows[1] = 32, o->windows[2] = 64, o->windows[3] = 128;
    o->n_windows = 4;
    o->bucket_cap = CP_POOL_BUCKET_CAP;
    o->max_request_tokens = (size_t)1 << 20;
    o->quota_window_s = 60;
}

double pool_now(const cp_pool *p) { return p->o.clock ? p->o.clock(p->o.clock_ctx) : cp_now_s(); }

/* ---- tenants ----------------------------------------------------------------- */

static size_t tenant_home(uint32_t id, size_t cap) { return id * 2654435761u & (cap - 1); }

pool_tenant *pool_tenant_find(cp_pool *p, uint32_t id, int create)
{
    size_t mask = p->ten_cap - 1;
    for (size_t j = tenant_home(id, p->ten_cap);; j = (j + 1) & mask) {
        pool_tenant *t = atomic_load_explicit(&p->ten[j], memory_order_acquire);
        if (!t) {
            if (!create) return NULL;
            /* reserve a place first: at most 3/4 of the slots are ever
             * taken, so every probe ends at an empty one */
            if (atomic_fetch_add(&p->ten_n, 1) >= p->ten_cap / 4 * 3) {
                atomic_fetch_sub(&p->ten_n, 1);
                return NULL;
            }
            pool_tenant *n = calloc(1, sizeof *n);
            if (!n) {
                atomic_fetch_sub(&p->ten_n, 1);
                return NULL;
            }
            n->id = id;
            n->win_start = pool_now(p);
            /* published whole: a reader sees the entry only after its fields */
            if (atomic_compare_exchange_strong_explicit(&p->ten[j], &t, n, memory_order_acq_rel, memory_order_acquire)) return n;
            free(n); /* another lookup took this slot first: t is its entry */
            atomic_fetch_sub(&p->ten_n, 1);
        }
        if (t->id == id) return t;
    }
}

/* Write lock: doubles the table (the entries stay where they are). */
static int tenant_grow(cp_pool *p)
{
    size_t cap = p->ten_cap * 2;
    _Atomic(pool_tenant *) *v = calloc(cap, sizeof *v);
    if (!v) return 0;
    for (size_t i = 0; i < p->ten_cap; i++) {
        pool_tenant *t = atomic_load_explicit(&p->ten[i], memory_order_relaxed);
        if (!t) continue;
        size_t j = tenant_home(t->id, cap);
        while (atomic_load_explicit(&v[j], memory_order_relaxed)) j = (j + 1) & (cap - 1);
        atomic_store_explicit(&v[j], t, memory_order_relaxed);
    }
    free((void *)p->ten);
    p->ten = v;
    p->ten_cap = cap;
    return 1;
}

pool_tenant *pool_tenant_get(cp_pool *p, uint32_t id)
{
    pool_tenant *t = pool_tenant_find(p, id, 0);
    if (t) return t;
    if ((atomic_load(&p->ten_n) + 1) * 2 > p->ten_cap && !tenant_grow(p)) return NULL;
    return pool_tenant_find(p, id, 1);
}

/* ---- segments ------------------------------------------------------------------ */

void pool_segment_destroy(cp_segment *s)
{
    if (!s) return;
    free(s->tokens);
    free(s->prefix);
    free(s->recompute);
    free(s->blocks);
    free(s);
}

/* Private KV may be a tenant's sensitive tokens: no trace of it is left in
 * a block that goes back to the slab, nor in a slab handed back to the
 * backend.  (On CUDA the zeroing is queued on the stream before any later
 * copy into the block, and cudaFree waits for the device.) */
void pool_zero_blocks(cp_pool *p, const cp_segment *s)
{
    for (uint32_t b = 0; b < s->n_blocks; b++) p->be->zero(p->be, cp_slab_block(&p->slab, s->blocks[b]), p->slab.block_bytes);
}

/* ---- lifetime ------------------------------------------------------------------- */

cp_status cp_pool_create(const cp_kv_layout *layout, cp_backend *be, const cp_pool_opts *opts, cp_pool **out, cp_error *err)
{
    *out = NULL;
    cp_status rc = cp_kv_layout_check(layout, err);
    if (rc) return rc;
    cp_pool *p = cp_calloc(1, sizeof *p, "pool", err);
    if (!p) return CP_ENOMEM;
    p->layout = *layout;
    p->be = be;
    if (opts) p->o = *opts;
    else cp_pool_opts_default(&p->o);
    if (p->o.n_windows < 1 || p->o.n_windows > CP_POOL_MAX_WINDOWS || p->o.bucket_cap < 1 ||
        p->o.bucket_cap > CP_POOL_BUCKET_CAP || p->o.max_request_tokens < 1)
        rc = cp_fail(err, CP_EINVAL, "pool: %d window sizes and a bucket cap of %d are not valid", p->o.n_windows, p->o.bucket_cap);
    for (int i = 0; rc == CP_OK && i < p->o.n_windows; i++)
        if (p->o.windows[i] < 1 || (i && p->o.windows[i] <= p->o.windows[i - 1]))
            rc = cp_fail(err, CP_EINVAL, "pool: window sizes must be positive and ascending");
    pthread_rwlock_init(&p->lock, NULL);
    if (rc == CP_OK && !(p->key_bits = calloc(POOL_KEY_BITS / 64, sizeof *p->key_bits)))
        rc = cp_fail(err, CP_ENOMEM, "pool: out of memory for the key filter");
    if (rc == CP_OK && !(p->ten = calloc(64, sizeof *p->ten))) rc = cp_fail(err, CP_ENOMEM, "pool: out of memory for the tenant table");
    if (rc == CP_OK) p->ten_cap = 64;
    if (rc == CP_OK) rc = cp_slab_init(&p->slab, be, cp_kv_block_bytes(layout), p->o.budget_bytes, err);
    if (rc == CP_OK) rc = cp_rollhash_init(&p->rh, p->o.hash_base, p->o.weak_hash_mod, err);
    if (rc == CP_OK) rc = cp_rollhash_reserve(&p->rh, p->o.max_request_tokens, err);
    if (rc == CP_OK) {
        p->st.bytes_budget = (size_t)p->slab.n_blocks * p->slab.block_bytes;
        p->last_expire = pool_now(p);
    }
    if (rc) {
        cp_pool_free(p);
        return rc;
    }
    *out = p;
    return CP_OK;
}

void cp_pool_free(cp_pool *p)
{
    if (!p) return;
    for (uint32_t i = 0; i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (s && s->scope == CP_SCOPE_PRIVATE) pool_zero_blocks(p, s); /* the slab goes back to the backend as it is */
        pool_segment_destroy(s);
    }
    free(p->segs);
    free(p->free_slots);
    free(p->heap);
    free(p->scratch);
    free(p->idx);
    free(p->key_bits);
    free(p->dd);
    for (size_t i = 0; p->ten && i < p->ten_cap; i++) free(atomic_load(&p->ten[i]));
    free((void *)p->ten);
    if (p->slab.base) cp_slab_free_all(&p->slab);
    cp_rollhash_free(&p->rh);
    pthread_rwlock_destroy(&p->lock);
    free(p);
}

const cp_kv_layout *cp_pool_layout(const cp_pool *p) { return &p->layout; }

const cp_segment *cp_pool_segment(const cp_pool *p, const cp_matches *m, size_t i)
{
    if (!m || m->pool != p || !m->pinned || i >= m->n) return NULL;
    pthread_rwlock_rdlock((pthread_rwlock_t *)&p->lock);
    uint32_t id = m->v[i].seg;
    const cp_segment *s = id < p->n_segs ? p->segs[id] : NULL;
    if (s && atomic_load(&s->refcount) <= 0) s = NULL; /* not pinned: may go at any moment */
    if (s && s->scope != CP_SCOPE_SHARED && s->tenant != m->tenant) s = NULL; /* private: its owner only */
    pthread_rwlock_unlock((pthread_rwlock_t *)&p->lock);
    return s;
}

int cp_pool_pins(cp_pool *p, uint32_t id)
{
    pthread_rwlock_rdlock(&p->lock);
    int n = id < p->n_segs && p->segs[id] ? (int)atomic_load(&p->segs[id]->refcount) : -1;
    pthread_rwlock_unlock(&p->lock);
    return n;
}

void *cp_pool_kv_row(const cp_pool *p, const cp_segment *s, int layer, int kv, uint32_t t)
{
    uint32_t bt = (uint32_t)p->layout.block_tokens;
    return (char *)cp_slab_block(&p->slab, s->blocks[t / bt]) + cp_kv_block_offset(&p->layout, layer, kv, (int)(t % bt));
}

void cp_pool_stats_get(cp_pool *p, cp_pool_stats *out)
{
    pthread_rwlock_rdlock(&p->lock);
    *out = p->st;
    out->lookups = atomic_load(&p->ctr.lookups);
    out->hit_segments = atomic_load(&p->ctr.hit_segments);
    out->hit_tokens = atomic_load(&p->ctr.hit_tokens);
    out->missed_tokens = atomic_load(&p->ctr.missed_tokens);
    out->verify_failures = atomic_load(&p->ctr.verify_failures);
    out->filter_absent_probes = atomic_load(&p->ctr.filter_absent_probes);
    out->filter_false_positives = atomic_load(&p->ctr.filter_false_positives);
    out->pinned_blocks = atomic_load(&p->pinned_blocks);
    pthread_rwlock_unlock(&p->lock);
}

int cp_pool_tenant_stats(cp_pool *p, uint32_t tenant, cp_tenant_stats *out)
{
    pthread_rwlock_rdlock(&p->lock);
    const pool_tenant *t = pool_tenant_find(p, tenant, 0);
    if (t) {
        *out = (cp_tenant_stats){ .lookups = atomic_load(&t->lookups),
                                  .hit_segments = atomic_load(&t->hit_segments),
                                  .hit_tokens = atomic_load(&t->hit_tokens),
                                  .missed_tokens = atomic_load(&t->missed_tokens),
                                  .inserts = t->inserts,
                                  .insert_refusals = t->insert_refusals,
                                  .evictions = t->evictions,
                                  .privacy_refusals = t->privacy_refusals,
                                  .bytes = t->bytes };
    }
    pthread_rwlock_unlock(&p->lock);
    return t != NULL;
}
