/* Attention's two matmuls in bf16 through oneDNN (the CPU backend's amx
 * path, for prefills): Q, K and V rounded to bf16 once per call, QK^T per
 * head into f32 scores, the mask and softmax in f32 (ops_cpu.h's
 * cpu_attn_softmax_rows, the f32 attention's own), the probabilities
 * rounded to bf16, PV per head with f32 accumulation and output.  Same
 * arguments and results as cpu_attention (backend.h's cp_attn_args, the
 * export and the sensitive mass included), within bf16 rounding. */
#ifndef CP_ATTN_DNNL_H
#define CP_ATTN_DNNL_H

#include "../backend.h"
#include "gemm_dnnl.h"

/* The CPU backend computes an export (or a sensitive mass) of at least
 * this many queries with it; every call's output rows come from the f32
 * pair kernel (ops_cpu.h, cpu_attention_rows), which is batch-invariant
 * where these products are not. */
#define CP_DNNL_ATTN_MIN_N 16

typedef struct cp_dnnl_attn cp_dnnl_attn;

/* On mm's engine and stream (mm outlives it). */
cp_status cp_dnnl_attn_create(cp_dnnl_attn **out, cp_dnnl_mm *mm, cp_error *err);
void cp_dnnl_attn_destroy(cp_dnnl_attn *t);
/* a->out NULL (with an export or a sensitive mass): the QK^T products and
 * the softmax only, no V rounding, no PV -- what the backend asks for,
 * its output rows coming from the pair kernel; the export and the mass
 * are bit for bit those of a call with output rows. */
cp_status cp_dnnl_attention(cp_dnnl_attn *t, const cp_attn_args *a, cp_error *err);

#endif
