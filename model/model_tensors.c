/* The model's weight tensors in one fixed order, and freeing a model: the
 * parts of a model that need only libc, so the device check (built where
 * there is no cJSON or OpenSSL) links them too. */
#include <stdlib.h>

#include "model.h"

size_t cp_model_tensor_refs(cp_model *m, cp_tensor_ref *out, size_t cap)
{
    const cp_config *c = &m->cfg;
    const int64_t H = c->hidden, I = c->intermediate, Q = (int64_t)c->n_heads * c->head_dim,
                  KV = (int64_t)c->n_kv_heads * c->head_dim, V = c->vocab;
    size_t n = 0;
#define REF(name, ptr, r, cl, mat)                                                                                           \
    do {                                                                                                                 \
        if (n < cap) out[n] = (cp_tensor_ref){ name, (void **)(ptr), r, cl, mat };                                      \
        n++;                                                                                                             \
    } while (0)
    REF("embed", &m->embed, V, H, 1);
    if (!c->tie_embeddings) REF("lm_head", &m->lm_head, V, H, 1);
    REF("final_norm", &m->final_norm, H, 1, 0);
    for (int l = 0; l < c->n_layers; l++) {
        cp_layer_weights *w = &m->layers[l];
        REF("attn_norm", &w->attn_norm, H, 1, 0);
        REF("mlp_norm", &w->mlp_norm, H, 1, 0);
        REF("wq", &w->wq, Q, H, 1);
        REF("wk", &w->wk, KV, H, 1);
        REF("wv", &w->wv, KV, H, 1);
        REF("wo", &w->wo, H, Q, 1);
        if (c->qkv_bias) {
            REF("bq", &w->bq, Q, 1, 0);
            REF("bk", &w->bk, KV, 1, 0);
            REF("bv", &w->bv, KV, 1, 0);
        }
        REF("w_gate", &w->w_gate, I, H, 1);
        REF("w_up", &w->w_up, I, H, 1);
        REF("w_down", &w->w_down, H, I, 1);
    }
#undef REF
    return n;
}

void cp_model_free(cp_model *m)
{
    if (!m) return;
    cp_backend *be = m->be;
    if (m->lm_head == m->embed) m->lm_head = NULL; /* tied: freed once, as embed */
    if (m->layers) {
        size_t n = cp_model_tensor_refs(m, NULL, 0);
        cp_tensor_ref *refs = malloc(n * sizeof *refs);
        if (refs) {
            cp_model_tensor_refs(m, refs, n);
            for (size_t i = 0; i < n; i++)
                if (*refs[i].slot) be->free(be, *refs[i].slot), *refs[i].slot = NULL;
            free(refs);
        } else { /* no memory even to list them: the layers leak, the rest goes */
            for (int l = 0; l < m->cfg.n_layers; l++) m->layers[l] = (cp_layer_weights){ 0 };
        }
        free(m->layers);
    }
    /* what is left when the loader failed before the layer table */
    void *rest[] = { m->embed, m->final_norm, m->lm_head };
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        if (rest[i]) be->free(be, rest[i]);
    free(m->rope_inv_freq);
    free(m);
}
