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
#define REF(name, ptr, r, cl)                                                                                                \
    do {                                                                                                                 \
        if (n < cap) out[n] = (cp_tensor_ref){ name, (void **)(ptr), r, cl, 0, NULL };                                   \
        n++;                                                                                                             \
    } while (0)
#define MAT(name, mp, r, cl)                                                                                                 \
    do {                                                                                                                 \
        if (n < cap) out[n] = (cp_tensor_ref){ name, &(mp)->data, r, cl, 1, mp };                                        \
        n++;                                                                                                             \
    } while (0)
    MAT("embed", &m->embed, V, H);
    if (!c->tie_embeddings) MAT("lm_head", &m->lm_head, V, H);
    REF("final_norm", &m->final_norm, H, 1);
    for (int l = 0; l < c->n_layers; l++) {
        cp_layer_weights *w = &m->layers[l];
        REF("attn_norm", &w->attn_norm, H, 1);
        REF("mlp_norm", &w->mlp_norm, H, 1);
        MAT("wq", &w->wq, Q, H);
        MAT("wk", &w->wk, KV, H);
        MAT("wv", &w->wv, KV, H);
        MAT("wo", &w->wo, H, Q);
        if (c->qkv_bias) {
            REF("bq", &w->bq, Q, 1);
            REF("bk", &w->bk, KV, 1);
            REF("bv", &w->bv, KV, 1);
        }
        MAT("w_gate", &w->w_gate, I, H);
        MAT("w_up", &w->w_up, I, H);
        MAT("w_down", &w->w_down, H, I);
    }
#undef MAT
#undef REF
    return n;
}

void cp_model_free(cp_model *m)
{
    if (!m) return;
    cp_backend *be = m->be;
    if (m->lm_head.data == m->embed.data) m->lm_head = (cp_matrix){ 0 }; /* tied: freed once, as embed */
    if (m->layers) {
        size_t n = cp_model_tensor_refs(m, NULL, 0);
        cp_tensor_ref *refs = malloc(n * sizeof *refs);
        if (refs) {
            cp_model_tensor_refs(m, refs, n);
            for (size_t i = 0; i < n; i++)
                if (refs[i].mat) cp_matrix_free(be, refs[i].mat);
                else if (*refs[i].slot) be->free(be, *refs[i].slot), *refs[i].slot = NULL;
            free(refs);
        } else { /* no memory even to list them: the layers leak, the rest goes */
            for (int l = 0; l < m->cfg.n_layers; l++) m->layers[l] = (cp_layer_weights){ 0 };
        }
        free(m->layers);
    }
    /* what is left when the loader failed before the layer table */
    cp_matrix_free(be, &m->embed);
    cp_matrix_free(be, &m->lm_head);
    if (m->final_norm) be->free(be, m->final_norm);
    free(m->rope_inv_freq);
    free(m->rope_cos), free(m->rope_sin);
    free(m);
}
