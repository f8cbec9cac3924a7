/* Placement of a request's hits into its KV state, and the chain proof over
 * them (see cache.h). */
#include "cache_internal.h"

#include <stdlib.h>
#include <string.h>

static int by_hit_pos(const void *a, const void *b)
{
    const cp_rule_hit *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Which reused tokens have exact KV: the request's hits, as the pool stores
 * them, through the chain proof (cp_rule_exact). */
static cp_status mark_exact(cp_cache *c, const cp_cache_req *r, const cp_cache_hits *hits, uint8_t *exact, cp_error *err)
{
    const cp_matches *lists[2] = { &hits->priv, &hits->shared };
    size_t n = hits->priv.n + hits->shared.n, m = 0;
    memset(exact, 0, (size_t)r->T);
    if (n == 0) return CP_OK;
    cp_rule_hit *h = malloc(n * sizeof *h);
    if (!h) return cp_fail(err, CP_ENOMEM, "cache: out of memory ordering %zu hits", n);
    for (int w = 0; w < 2; w++)
        for (size_t k = 0; k < lists[w]->n; k++) {
            const cp_match *mt = &lists[w]->v[k];
            if (!mt->len) continue;
            const cp_segment *sg = cp_pool_segment(c->pool, lists[w], k); /* pinned: checked by the caller */
            /* a hit the request may not read proves nothing, and nothing past it */
            h[m++] = (cp_rule_hit){ .pos = mt->pos, .len = mt->len, .start_pos = sg ? sg->start_pos : -1, .shared = w == 1,
                                    .context = sg && sg->has_context ? sg->context : NULL };
        }
    qsort(h, m, sizeof *h, by_hit_pos);
    cp_rule_prompt p = cp_cache_rule_prompt(c, r);
    cp_rule_exact(&p, h, m, exact);
    free(h);
    return CP_OK;
}

cp_status cp_cache_place(cp_cache *c, const cp_cache_req *r, const cp_cache_hits *h, cp_state *st, cp_cache_plan *p, cp_error *err)
{
    const cp_matches *lists[2] = { &h->priv, &h->shared };
    if (!c->pool) return CP_OK; /* nothing to place, nothing exact */
    cp_status rc = CP_OK;
    const int L = c->m->cfg.n_layers;
    const cp_kv_layout *lay = cp_pool_layout(c->pool);
    const int bt = lay->block_tokens;
    /* every hit's pool blocks as runs of one placement (the model places
     * them on the threads where it can) */
    size_t blocks = 0;
    for (int w = 0; w < 2; w++)
        for (size_t k = 0; k < lists[w]->n; k++) blocks += (lists[w]->v[k].len + (uint32_t)bt - 1) / (uint32_t)bt;
    cp_kv_run *runs = malloc((blocks ? blocks : 1) * sizeof *runs);
    const void **rows = malloc((blocks ? blocks : 1) * 2 * (size_t)L * sizeof *rows);
    int32_t *pos = malloc((size_t)r->T * sizeof *pos);
    if (!runs || !rows || !pos) rc = cp_fail(err, CP_ENOMEM, "cache: out of memory placing hits");
    for (int i = 0; i < r->T && rc == CP_OK; i++) pos[i] = i;
    int n_runs = 0;
    for (int w = 0; w < 2 && rc == CP_OK; w++)
        for (size_t k = 0; k < lists[w]->n && rc == CP_OK; k++) {
            const cp_match *mt = &lists[w]->v[k];
            if (mt->len == 0) continue;
            const cp_segment *sg = cp_pool_segment(c->pool, lists[w], k); /* valid while the request holds its pins */
            if (!sg) {
                rc = cp_fail(err, CP_EINVAL, "cache: match %zu is not a segment this request may read", k);
                break;
            }
            for (uint32_t t0 = 0; t0 < mt->len; t0 += (uint32_t)bt) {
                const void **kp = rows + (size_t)n_runs * 2 * L, **vp = kp + L;
                for (int l = 0; l < L; l++) {
                    kp[l] = cp_pool_kv_row(c->pool, sg, l, 0, t0);
                    vp[l] = cp_pool_kv_row(c->pool, sg, l, 1, t0);
                }
                const uint32_t nt = mt->len - t0 < (uint32_t)bt ? mt->len - t0 : (uint32_t)bt;
                runs[n_runs++] = (cp_kv_run){ .slot0 = (int)(mt->pos + t0), .n = (int)nt, .pos = pos + mt->pos + t0, .k_pre = kp, .v = vp };
            }
            for (uint32_t t = 0; t < mt->len; t++) {
                int rec = (sg->recompute[t / 64] >> (t % 64)) & 1;
                p->state[mt->pos + t] = rec ? CP_CACHE_RECOMPUTE : CP_CACHE_REUSED;
                p->shared_hit[mt->pos + t] = w == 1;
                p->seg_off[mt->pos + t] = (uint8_t)(t < 255 ? t : 255);
            }
            p->segments_hit++;
            if (w == 0) p->private_hit_tokens += (int)mt->len;
            else p->shared_hit_tokens += (int)mt->len;
        }
    if (rc == CP_OK && n_runs) rc = cp_state_place_kv_runs(c->m, st, runs, n_runs, cp_kv_row(lay), err);
    if (rc == CP_OK) rc = mark_exact(c, r, h, p->exact, err);
    free(runs), free(rows), free(pos);
    return rc;
}
