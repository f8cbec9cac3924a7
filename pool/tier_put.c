/* cp_tier_put: a segment's write-through, sealed into a value and queued
 * for the writer; whatever holds a sensitive token, or is private without
 * a known epoch, stays local. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier_internal.h"

#include "../kernels/log.h"

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
    if (!keep && w->scope == CP_SCOPE_PRIVATE) keep = !tier_tenant_epoch_get(t, w->tenant, tk, &epoch);
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
        tier_hex(s.sha, 32, sha);
        j->kind = JOB_PUT;
        tier_value_key(t, s.shared ? NULL : tk, sha, j->vkey, sizeof j->vkey);
        cp_tier_check k = tier_check_of(t, j->vkey);
        ok = cp_tier_value_encode(&t->l, &k, &s, val, &err) == CP_OK;
        if (ok) {
            tier_index_key(t, s.shared ? NULL : tk, w->tokens, j->ikey, sizeof j->ikey);
            snprintf(j->field, sizeof j->field, "%s", sha);
            snprintf(j->len, sizeof j->len, "%u", w->len);
            j->val = val, j->n = n;
            val = NULL;
        }
    }
    free(kv), free(rec), free(val);
    if (!ok) {
        if (err.code) cp_warn("tier: a write-through was dropped: %s", err.msg);
        tier_job_free(j);
        STAT_ADD(t, write_drops, 1);
        return 0;
    }
    if (!tier_enqueue(t, j, 1)) {
        STAT_ADD(t, write_drops, 1);
        return 0;
    }
    return 1;
}
