/* The engine: options, names, lifetime (see request.h). */
#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/log.h"
#include "engine_internal.h"

static const char *const segkv_names[] = { "in-context", "canonical", "strict" };

cp_status cp_segkv_from_name(const char *name, cp_segkv *out, cp_error *err)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, segkv_names[i]) == 0) return *out = (cp_segkv)i, CP_OK;
    return cp_fail(err, CP_EINVAL, "unknown segment KV mode '%.32s' (in-context, canonical, strict)", name);
}
const char *cp_segkv_name(cp_segkv s) { return (unsigned)s < 3 ? segkv_names[s] : "?"; }

int cp_usable_vocab(const cp_model *m, const cp_tokenizer *tok)
{
    return tok && cp_tokenizer_n_ids(tok) < m->cfg.vocab ? cp_tokenizer_n_ids(tok) : m->cfg.vocab;
}

void cp_engine_opts_default(cp_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->sharing = CP_SHARE_CACHEPRUNE;
    o->segment_kv = CP_SEGKV_IN_CONTEXT;
    o->admit_k = 1;
    o->chunk_size = 512;
    o->chunk_recompute = 0.15;
    o->mask_pad = 1;
    o->private_reuse = 1;
    o->deviation_layer = 1;
    o->gradual_start = 2;
    o->detect_memo = 1024;
    /* chosen from the measured frontier (docs/RESULTS.md, "Quality"): the
     * first k0 tokens of each reused segment plus deviation (epic) is the
     * cheapest method at every R measured (deviation needed 45 % more tokens
     * computed, gradual did not get there, the stored flags reached 77 %);
     * over all 150 rag-v1 requests R = 0.85 is the cheapest measured with
     * greedy agreement >= 95 %, KL <= 0.002 and ROUGE-L >= 0.97 (R is a
     * fraction of the reused tokens the chain proof does not show exact:
     * R 0.75 gave ROUGE-L 0.964, R 0.8 0.969, R 0.85 0.975; R 0.35 greedy
     * agreement 91.1 %) */
    o->recompute_method = CP_RECOMPUTE_EPIC;
    cp_annot_opts_default(&o->annot); /* first: it sets its own r (0.15, the stored flags' R), which the line below overrides */
    o->annot.r = 0.85;
    o->tpl = CP_TPL_PLAIN;
}

static const char *const stage_names[CP_STAGE_N] = { "queue",  "tokenize",  "detect", "lookup",      "tier",     "placement",
                                                     "selection", "prefill", "export", "first_token", "annotate", "store" };

const char *cp_stage_name(int stage) { return stage >= 0 && stage < CP_STAGE_N ? stage_names[stage] : NULL; }

void cp_response_free(cp_response *r)
{
    if (r->prompt_ids) OPENSSL_cleanse(r->prompt_ids, (size_t)r->prompt_tokens * sizeof *r->prompt_ids); /* the prompt's ids */
    free(r->ids);
    free(r->margins);
    free(r->text);
    free(r->prompt_ids);
    free(r->plan);
    free(r->plan_flags);
    free(r->sensitive);
    memset(r, 0, sizeof *r);
}

void cp_engine_set_tier(cp_engine *e, cp_tier *t) { cp_cache_set_tier(e->cache, t); }

void cp_engine_kv_layout(const cp_model *m, cp_kv_layout *out) { cp_engine_kv_layout_as(m, CP_F32, out); }

void cp_engine_kv_layout_as(const cp_model *m, cp_dtype kv_dtype, cp_kv_layout *out) { cp_cache_kv_layout(m, kv_dtype, out); }

/* Room for `need` slots in *st (need <= e->cap, checked by the caller): the
 * KV cache grows by doubling, up to the context, so a server sized by its
 * longest request pays for that request, not for the model's context.  The
 * old cache holds nothing between requests (each starts from a reset); it
 * is kept when the larger one cannot be made, and that request fails. */
cp_status cp_engine_grow_state(cp_engine *e, cp_state **st, int need, cp_error *err)
{
    if (need <= (*st)->capacity) return CP_OK;
    if (need > e->cap) return cp_fail(err, CP_ERANGE, "engine: %d slots exceed the context of %d", need, e->cap);
    long long want = (long long)(*st)->capacity * 2;
    if (want < need) want = need;
    if (want > e->cap) want = e->cap;
    cp_state *bigger = NULL;
    cp_status rc = cp_state_create_kv(e->m, (int)want, STATE_BATCH, e->o.kv_dtype, &bigger, err);
    if (rc) return cp_fail_wrap(err, "growing the request's KV cache to %lld slots", want);
    cp_state_free(e->m, *st);
    *st = bigger;
    return CP_OK;
}

cp_status cp_engine_create(cp_model *m, cp_tokenizer *tok, cp_pool *pool, cp_detect_chain *chain, const cp_engine_opts *o,
                           cp_engine **out, cp_error *err)
{
    *out = NULL;
    if (o->mask_pad < 0 || o->mask_pad > 64) return cp_fail(err, CP_ERANGE, "engine: --mask-pad %d is outside [0, 64]", o->mask_pad);
    /* the request caches hold KV in the pool's dtype, so segments move
     * between them as bytes (0 in the options: f32) */
    cp_dtype kvd = o->kv_dtype ? o->kv_dtype : CP_F32;
    cp_engine *e = cp_calloc(1, sizeof *e, "engine", err);
    if (!e) return CP_ENOMEM;
    e->m = m, e->tok = tok, e->chain = chain, e->o = *o;
    cp_cache_opts co = { .sharing = o->sharing, .private_reuse = o->private_reuse, .admit_k = o->admit_k, .chunk_size = o->chunk_size,
                         .chunk_recompute = o->chunk_recompute, .kv_dtype = kvd };
    cp_status crc = cp_cache_create(m, pool, &co, &e->cache, err);
    if (crc) {
        free(e);
        return crc;
    }
    e->cap = o->max_context > 0 ? o->max_context : m->cfg.max_pos;
    e->n_valid = cp_usable_vocab(m, tok);
    for (int32_t id = 0, n = tok ? cp_tokenizer_n_ids(tok) : 0; id < n; id++) { /* tok: NULL for an engine that only replays ids */
        const char *pc = cp_tokenizer_piece(tok, id);
        size_t l = pc ? strlen(pc) : 0;
        if (l > e->piece_max) e->piece_max = l;
    }
    /* sized for short requests; grow_state makes room for longer ones as they come */
    int first = e->cap < STATE_FIRST_SLOTS ? e->cap : STATE_FIRST_SLOTS;
    e->o.kv_dtype = kvd;
    cp_status rc = cp_state_create_kv(m, first, STATE_BATCH, kvd, &e->st, err);
    if (rc == CP_OK && o->segment_kv == CP_SEGKV_CANONICAL) rc = cp_state_create_kv(m, first, STATE_BATCH, kvd, &e->canon, err);
    if (rc == CP_OK && !(e->logits = cp_malloc((size_t)m->cfg.vocab * sizeof(float), "logits", err))) rc = CP_ENOMEM;
    if (rc == CP_OK && chain && o->detect_memo > 0) rc = cp_detect_memo_create(o->detect_memo, &e->memo, err);
    if (rc) {
        cp_engine_free(e);
        return rc;
    }
    *out = e;
    return CP_OK;
}

void cp_engine_free(cp_engine *e)
{
    if (!e) return;
    cp_state_free(e->m, e->st);
    cp_state_free(e->m, e->canon);
    free(e->logits);
    cp_annot_cells_free(&e->band_cells);
    cp_detect_memo_free(e->memo);
    cp_cache_free(e->cache);
    free(e);
}

const float *cp_engine_last_logits(const cp_engine *e) { return e->logits; }
const cp_state *cp_engine_request_state(const cp_engine *e) { return e->st; }

void cp_engine_purge_tenant(cp_engine *e, uint32_t tenant, size_t *segments, size_t *admissions, long *tier_segments)
{
    cp_cache_purge_tenant(e->cache, tenant, segments, admissions, tier_segments);
    if (e->memo) cp_detect_memo_purge(e->memo, tenant);
}

cp_model *cp_engine_model(const cp_engine *e) { return e->m; }
cp_pool *cp_engine_pool(const cp_engine *e) { return cp_cache_pool(e->cache); }

