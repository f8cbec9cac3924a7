/* CPU reference kernels: plain C + OpenMP + BLAS, f32.  These are what the
 * CUDA kernels are checked against. */
#ifndef CP_OPS_CPU_H
#define CP_OPS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h"

void cpu_embed(float *out, const float *table, const int32_t *ids, int n, int dim);
/* the same from a bf16 table (widened exactly) */
void cpu_embed_bf16(float *out, const uint16_t *table, const int32_t *ids, int n, int dim);
/* y[i, 0:out] += bias (row stride ldy) */
void cpu_add_bias(float *y, int ldy, const float *bias, int n, int out);
void cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);
void cpu_matmul(float *y, int ldy, const float *x, const float *w, const float *bias, int n, int in, int out,
                int accumulate);
void cpu_rope(float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim);
void cpu_swiglu(float *out, const float *gate, const float *up, size_t count);
void cpu_place_kv(float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n, const float *cos,
                  const float *sin, int n_kv_heads, int head_dim);
/* the backend's sample op (backend.h), in double: the device's reference */
int32_t cpu_sample(const float *logits, int n, float temperature, float top_p, float u);

/* Attention with a caller-provided score scratch of at least
 * cpu_attention_scratch_floats(a) floats.  Returns nothing: shapes are the
 * caller's responsibility (model/ checks them once at load). */
size_t cpu_attention_scratch_floats(const cp_attn_args *a);
void cpu_attention(const cp_attn_args *a, float *scratch);
/* bf16 KV (kernels/backend.h: kv_store_bf16, place_kv_bf16) */
void cpu_kv_store_bf16(uint16_t *dst, float *src, size_t count);
void cpu_place_kv_bf16(uint16_t *k, uint16_t *k_pre, uint16_t *v, const uint16_t *src_k, const uint16_t *src_v, size_t src_ld, int n,
                       const float *cos, const float *sin, int n_kv_heads, int head_dim);

/* Its parts, shared with the bf16 attention (attn_dnnl.c).  Query rows go
 * in blocks so the score matrix stays bounded (CPU_ATTN_QBLOCK x n_keys)
 * for long prompts.  key_range: the slots [klo, khi) some query of rows
 * [q0, q0 + nq) can see (klo >= khi: none).  softmax_rows: S [nq, nk]
 * holds the scaled scores of those rows against slots [klo, klo + nk);
 * they become probabilities (the mask applied, in f32), added to the
 * export and the sensitive mass where asked. */
#define CPU_ATTN_QBLOCK 256
void cpu_attn_key_range(const cp_attn_args *a, int q0, int nq, int *klo, int *khi);
void cpu_attn_softmax_rows(const cp_attn_args *a, float *S, int q0, int nq, int klo, int nk);

#endif
