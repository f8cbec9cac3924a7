/* The KV Retriever.  For a request of n tokens:
 *   1. prefix rolling hashes of the request, and for each position the next
 *      sensitive token, O(n);
 *   2. for each window size w, every clean window [i, i+w) is probed in the
 *      index, O(n) per w; each candidate (a segment indexed by its first w
 *      tokens) is extended by binary search on prefix hashes, O(log L),
 *      never past a sensitive token;
 *   3. the non-overlapping choice covering the most tokens, by a right-to-
 *      left DP over positions where a candidate from p may be cut to any
 *      length k >= w (a prefix hit): f[p] = max(f[p+1], max_k k + f[p+k]),
 *      the inner max a range maximum of q + f[q] in a segment tree:
 *      O((n + candidates) log n);
 *   4. only the chosen matches are verified (SHA-256 for a full segment,
 *      token ids for a prefix); a failure (a hash collision) drops that
 *      candidate and the choice is made again. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

typedef struct cand {
    uint32_t pos, max_len, min_len, seg;
    int bad;
} cand;

typedef struct work {
    uint64_t *pre;      /* request prefix hashes */
    uint32_t *next_sens; /* first sensitive index >= i */
    cand *c;
    size_t nc, cap;
    uint32_t *first;    /* candidates by start: first[p] .. first[p+1] */
    int64_t *f;         /* best coverage of [p, n) */
    int32_t *choice;    /* candidate used at p, or -1 */
    uint32_t *len_at;   /* its length */
    int64_t *tree;      /* segment tree over q + f[q]: values */
    uint32_t *tree_arg; /* and where */
    size_t tsize;
} work;

static void work_free(work *w)
{
    free(w->pre), free(w->next_sens), free(w->c), free(w->first), free(w->f), free(w->choice), free(w->len_at);
    free(w->tree), free(w->tree_arg);
}

static int visible(const cp_segment *s, const cp_lookup *q)
{
    return q->private_only ? s->scope == CP_SCOPE_PRIVATE && s->tenant == q->tenant : s->scope == CP_SCOPE_SHARED;
}

/* longest L in [lo, hi] with request[pos, pos+L) == segment[0, L) by hash;
 * lo is known to agree */
static uint32_t extend(const cp_pool *p, const work *w, const cp_segment *s, uint32_t pos, uint32_t lo, uint32_t hi)
{
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (cp_rollhash_range(&p->rh, w->pre, pos, pos + mid) == s->prefix[mid]) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static int add_cand(work *w, cand c)
{
    if (w->nc == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        cand *v = realloc(w->c, cap * sizeof *v);
        if (!v) return 0;
        w->c = v;
        w->cap = cap;
    }
    w->c[w->nc++] = c;
    return 1;
}

static int by_pos(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* segment tree: point set, range max (with the position of the max) */
static void tree_set(work *w, size_t q, int64_t v)
{
    size_t i = q + w->tsize;
    w->tree[i] = v;
    w->tree_arg[i] = (uint32_t)q;
    for (i /= 2; i >= 1; i /= 2) {
        size_t l = 2 * i, r = l + 1;
        int take_l = w->tree[l] >= w->tree[r];
        w->tree[i] = take_l ? w->tree[l] : w->tree[r];
        w->tree_arg[i] = take_l ? w->tree_arg[l] : w->tree_arg[r];
    }
}

static int64_t tree_max(const work *w, size_t lo, size_t hi, uint32_t *arg) /* inclusive */
{
    int64_t best = INT64_MIN;
    for (size_t l = lo + w->tsize, r = hi + w->tsize + 1; l < r; l /= 2, r /= 2) {
        if (l & 1) {
            if (w->tree[l] > best) best = w->tree[l], *arg = w->tree_arg[l];
            l++;
        }
        if (r & 1) {
            r--;
            if (w->tree[r] > best) best = w->tree[r], *arg = w->tree_arg[r];
        }
    }
    return best;
}

/* The DP of step 3 over the candidates not marked bad; fills out. */
static cp_status choose(work *w, size_t n, cp_matches *out, cp_error *err)
{
    for (size_t i = 0; i < 2 * w->tsize; i++) w->tree[i] = INT64_MIN, w->tree_arg[i] = 0;
    w->f[n] = 0;
    tree_set(w, n, (int64_t)n);
    for (size_t p = n; p-- > 0;) {
        w->f[p] = w->f[p + 1];
        w->choice[p] = -1;
        for (uint32_t k = w->first[p]; k < w->first[p + 1]; k++) {
            const cand *c = &w->c[k];
            if (c->bad) continue;
            uint32_t arg = 0;
            int64_t v = tree_max(w, p + c->min_len, p + c->max_len, &arg) - (int64_t)p;
            if (v > w->f[p]) {
                w->f[p] = v;
                w->choice[p] = (int32_t)k;
                w->len_at[p] = arg - (uint32_t)p;
            }
        }
        tree_set(w, p, (int64_t)p + w->f[p]);
    }
    out->n = 0;
    for (size_t p = 0; p < n;) {
        if (w->choice[p] < 0) {
            p++;
            continue;
        }
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 16;
            cp_match *v = realloc(out->v, cap * sizeof *v);
            if (!v) return cp_fail(err, CP_ENOMEM, "retriever: out of memory");
            out->v = v;
            out->cap = cap;
        }
        out->v[out->n++] = (cp_match){ (uint32_t)p, w->len_at[p], w->c[w->choice[p]].seg };
        p += w->len_at[p];
    }
    return CP_OK;
}

static int verify(const cp_pool *p, const cp_lookup *q, const cp_match *m)
{
    const cp_segment *s = p->segs[m->seg];
    if (m->len == s->len) {
        uint8_t sha[32];
        const void *parts[2] = { p->layout.fingerprint, q->tokens + m->pos };
        size_t lens[2] = { CP_FINGERPRINT_BYTES, m->len * sizeof(int32_t) };
        cp_sha256(parts, lens, 2, sha);
        return memcmp(sha, s->sha, 32) == 0;
    }
    return memcmp(q->tokens + m->pos, s->tokens, m->len * sizeof(int32_t)) == 0;
}

cp_status cp_pool_lookup(cp_pool *p, const cp_lookup *q, cp_matches *out, cp_error *err)
{
    if (out->pinned && out->n)
        return cp_fail(err, CP_EINVAL, "pool lookup: the matches passed in still hold %zu pins: release them first", out->n);
    out->n = 0;
    out->pinned = 0;
    if (!q->fingerprint || memcmp(q->fingerprint, p->layout.fingerprint, CP_FINGERPRINT_BYTES) != 0)
        return cp_fail(err, CP_EINVAL, "pool lookup: the model fingerprint is not this pool's");
    if (q->n > p->o.max_request_tokens)
        return cp_fail(err, CP_ERANGE, "pool lookup: %zu tokens, more than the pool's limit of %zu", q->n, p->o.max_request_tokens);
    size_t n = q->n;
    work w = { 0 };
    w.tsize = 1;
    while (w.tsize < n + 1) w.tsize *= 2;
    w.pre = malloc((n + 1) * sizeof *w.pre);
    w.next_sens = malloc((n + 1) * sizeof *w.next_sens);
    w.first = calloc(n + 2, sizeof *w.first);
    w.f = malloc((n + 1) * sizeof *w.f);
    w.choice = malloc((n + 1) * sizeof *w.choice);
    w.len_at = malloc((n + 1) * sizeof *w.len_at);
    w.tree = malloc(2 * w.tsize * sizeof *w.tree);
    w.tree_arg = malloc(2 * w.tsize * sizeof *w.tree_arg);
    if (!w.pre || !w.next_sens || !w.first || !w.f || !w.choice || !w.len_at || !w.tree || !w.tree_arg) {
        work_free(&w);
        return cp_fail(err, CP_ENOMEM, "pool lookup: out of memory for a %zu-token request", n);
    }
    cp_rollhash_prefix(&p->rh, q->tokens, n, w.pre);
    w.next_sens[n] = (uint32_t)n;
    for (size_t i = n; i-- > 0;) w.next_sens[i] = q->sensitive && q->sensitive[i] ? (uint32_t)i : w.next_sens[i + 1];

    cp_status rc = CP_OK;
    uint64_t absent = 0, false_pos = 0;
    pthread_rwlock_rdlock(&p->lock); /* shared with other lookups, to the end: never the write lock */
    for (int wi = 0; wi < p->o.n_windows && rc == CP_OK; wi++) {
        uint32_t win = (uint32_t)p->o.windows[wi];
        size_t last = q->prefix_only ? (n >= win ? 1 : 0) : (n >= win ? n - win + 1 : 0);
        for (size_t i = 0; i < last && rc == CP_OK; i++) {
            if (w.next_sens[i] < i + win) { /* skip to after the sensitive token */
                i = w.next_sens[i];
                continue;
            }
            uint64_t key = pool_index_key((int)win, cp_rollhash_range(&p->rh, w.pre, i, i + win));
            const pool_bucket *b = pool_bucket_find(p, key);
            if (!b) absent++, false_pos += pool_key_maybe(p, key);
            for (uint32_t j = 0; b && j < b->n; j++) {
                const cp_segment *s = p->segs[b->ids[j]];
                if (!visible(s, q) || (uint32_t)s->window != win) continue;
                uint32_t hi = s->len, lim = w.next_sens[i] - (uint32_t)i;
                if (hi > lim) hi = lim;
                if (hi > n - i) hi = (uint32_t)(n - i);
                uint32_t L = extend(p, &w, s, (uint32_t)i, win, hi);
                if (q->whole_only && L != s->len) continue;
                cand c = { (uint32_t)i, L, q->whole_only ? L : win, s->id, 0 };
                if (!add_cand(&w, c)) rc = cp_fail(err, CP_ENOMEM, "retriever: out of memory");
            }
        }
    }
    if (rc == CP_OK && w.nc) {
        qsort(w.c, w.nc, sizeof *w.c, by_pos);
        for (size_t k = 0; k < w.nc; k++) w.first[w.c[k].pos + 1]++;
        for (size_t i = 1; i <= n + 1; i++) w.first[i] += w.first[i - 1];
        /* choose, verify the chosen, drop what fails, choose again */
        for (;;) {
            if ((rc = choose(&w, n, out, err))) break;
            int failed = 0;
            for (size_t m = 0; m < out->n; m++) {
                if (verify(p, q, &out->v[m])) continue;
                failed = 1;
                for (uint32_t k = w.first[out->v[m].pos]; k < w.first[out->v[m].pos + 1]; k++)
                    if (w.c[k].seg == out->v[m].seg) w.c[k].bad = 1;
            }
            if (!failed) break;
            atomic_fetch_add_explicit(&p->ctr.verify_failures, 1, memory_order_relaxed);
        }
    }
    if (rc == CP_OK) {
        /* pin, and the bookkeeping, still under the read lock: atomics only,
         * so lookups never wait for one another */
        double now = pool_now(p);
        size_t covered = 0;
        for (size_t m = 0; m < out->n; m++) {
            cp_segment *s = p->segs[out->v[m].seg];
            if (atomic_fetch_add(&s->refcount, 1) == 0) atomic_fetch_add(&p->pinned_blocks, s->n_blocks);
            pool_touch(p, s, now);
            covered += out->v[m].len;
        }
        atomic_fetch_add_explicit(&p->ctr.lookups, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->ctr.hit_segments, out->n, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->ctr.hit_tokens, covered, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->ctr.missed_tokens, n - covered, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->ctr.filter_absent_probes, absent, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->ctr.filter_false_positives, false_pos, memory_order_relaxed);
        pool_tenant *t = pool_tenant_find(p, q->tenant, 1); /* NULL: no room until an insert grows the table */
        if (t) {
            atomic_fetch_add_explicit(&t->lookups, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->hit_segments, out->n, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->hit_tokens, covered, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->missed_tokens, n - covered, memory_order_relaxed);
        }
        out->pool = p;
        out->tenant = q->tenant;
        out->pinned = 1;
    }
    pthread_rwlock_unlock(&p->lock);
    work_free(&w);
    if (rc) out->n = 0;
    return rc;
}

void cp_pool_release(cp_pool *p, cp_matches *m)
{
    if (!m->pinned || m->pool != p) return; /* nothing held, or not held here */
    /* the read lock keeps the segment table from moving under us; the
     * segments themselves stay put while pinned */
    int reap = 0;
    pthread_rwlock_rdlock(&p->lock);
    for (size_t i = 0; i < m->n; i++) {
        cp_segment *s = p->segs[m->v[i].seg];
        reap |= !s->live; /* purged while pinned: freed below once no pin is left */
        if (atomic_fetch_sub(&s->refcount, 1) == 1) atomic_fetch_sub(&p->pinned_blocks, s->n_blocks);
    }
    pthread_rwlock_unlock(&p->lock);
    m->pinned = 0;
    if (reap) pool_reap_purged(p);
}

void cp_matches_free(cp_matches *m)
{
    free(m->v);
    memset(m, 0, sizeof *m);
}
