/* Erasure on request (cp_pool_purge: a tenant's private segments, those
 * still pinned freed at their last release) and expiry (cp_pool_expire). */
#include "pool_internal.h"

/* Frees (zeroing) purged segments whose last pin is gone.  Write lock. */
static void reap_purged(cp_pool *p)
{
    for (uint32_t i = 0; i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (s && !s->live && atomic_load(&s->refcount) == 0) pool_evict(p, s, POOL_WHY_PURGE);
    }
}

void pool_reap_purged(cp_pool *p)
{
    pthread_rwlock_wrlock(&p->lock);
    reap_purged(p);
    pthread_rwlock_unlock(&p->lock);
}

size_t cp_pool_purge(cp_pool *p, uint32_t tenant)
{
    pthread_rwlock_wrlock(&p->lock);
    size_t n = 0;
    for (uint32_t i = 0; i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (!s || !s->live || s->scope != CP_SCOPE_PRIVATE || s->tenant != tenant) continue;
        n++; /* pinned or not: gone for every lookup from now on */
        if (atomic_load(&s->refcount) == 0) {
            pool_evict(p, s, POOL_WHY_PURGE);
            continue;
        }
        /* pinned by a request reading it: dead from now on (no lookup or
         * dedup finds it again), freed and zeroed when its last pin goes */
        pool_index_remove(p, s);
        pool_dedup_remove(p, s);
        s->live = 0;
    }
    p->st.purged += n;
    pthread_rwlock_unlock(&p->lock);
    return n;
}

size_t cp_pool_expire(cp_pool *p)
{
    pthread_rwlock_wrlock(&p->lock);
    size_t n = pool_expire_locked(p, pool_now(p));
    pthread_rwlock_unlock(&p->lock);
    return n;
}
