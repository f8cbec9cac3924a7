/* The CPU backend's state and what its files share: backend_cpu.c
 * (creation, the op table, memory, the small ops, the describe and compute
 * lines), backend_cpu_matmul.c (the weight matrices: packing, reading
 * back, embedding rows, matmul by dtype and layout) and backend_cpu_attn.c
 * (attention, one call or a batch).  Internal to those files; backend.h is
 * the interface. */
#ifndef CP_BACKEND_CPU_IMPL_H
#define CP_BACKEND_CPU_IMPL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../dtype.h"
#include "ops_cpu.h"
#include "gemm_bf16_packed.h"
#ifndef CP_NO_BLAS
#include "../q8.h"
#include "gemm_bf16.h"
#include "gemm_amx.h"
#include "gemm_dnnl.h"
#include "gemm_f32.h"
#include "gemm_i8.h"
#include "gemm_i8_prefill.h"
#include "attn_dnnl.h"
#include "cpu_runtime.h"
#include <omp.h>
#endif

#ifndef CP_NO_BLAS
/* the layouts pack_matrix makes (cp_matrix.layout; CP_LAYOUT_ROWS is
 * row-major): oneDNN's, bf16p's (gemm_bf16_packed.h), the AMX tiles'
 * (gemm_amx.h: its padding follows from the shape) or, f32 matrices,
 * f32p's (gemm_f32.h) */
enum { PACK_DNNL = 1, PACK_BF16P, PACK_AMX, PACK_F32P };

/* int8 on the amx path: the tile kernel past this many rows, the vnni
 * panel kernels at and below it (the same integers and epilogue: bit-equal) */
#define AMX_I8_MIN_ROWS 16
#endif

typedef struct cpu_impl {
    float *scratch; /* attention scores, grown on demand */
    size_t scratch_floats;
    float *kv_wide; /* a bf16 cache's K and V widened for attention, grown on demand */
    size_t kv_wide_floats;
    /* attention_batch's decode items, their first pairs and scratch
     * offsets (ops_cpu.h, cpu_attention_decode_many), grown on demand */
    cp_attn_args *batch_args;
    int *batch_first;
    size_t *batch_off, batch_cap;
    cp_status sticky;
    char sticky_msg[256];
    /* attention's pair and softmax kernels (ops_cpu.h): dot_isa's; the
     * libc-only build's CPU_ATTN_AUTO (zero: only the portable ones) */
    cpu_attn_kernel attn_k;
#ifndef CP_NO_BLAS
    cpu_features feat;
    cpu_isa isa;     /* the bf16 path (gemm_bf16.h) */
    cpu_isa dot_isa; /* the small-batch kernels' ISA (amx: the widest f32 one) */
    q8_isa q8;       /* the int8 kernels' (gemm_i8.h) */
    int bf16p;       /* matrices packed at load into bf16p's layout, run by bf16p_gemm at every n (forced avx512bf16) */
    int amx;          /* the amx path with the tile kernels ready (cp_amx_ready): bf16 and int8 GEMMs on tiles */
    char amx_why[200]; /* the amx path without them: why (cp_amx_ready's message) */
    cp_dnnl_mm *dnnl; /* made when bf16 matrices meet the amx path */
    float *gemm_scratch; /* widened weight blocks, grown on demand */
    size_t gemm_scratch_floats;
    size_t n_packed; /* packed matrices alive (pack_matrix, free_matrix): the describe line counts them */
    cp_dnnl_attn *attn; /* bf16 attention for exports of 16+ rows on the amx path, and on the int8 vnni path (i8_attn) */
    int i8_attn;        /* int8 matrices: exports through attn (the CPU has AVX512_BF16 or AMX-BF16) */
#endif
    char desc[512];
} cpu_impl;

/* the first failure of a queued op, reported by the next sync (backend_cpu.c) */
void cpu_stick(cpu_impl *im, cp_status rc, const char *msg);
cp_status cpu_alloc(cp_backend *be, size_t bytes, void **out, cp_error *err);
cp_status cpu_upload(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err);

/* the matrix ops (backend_cpu_matmul.c) */
void cpu_embed_op(cp_backend *be, float *out, const cp_matrix *table, const int32_t *ids, int n, int dim);
void cpu_matmul_op(cp_backend *be, float *y, int ldy, const float *x, const cp_matrix *w, const float *bias, int n, int in, int out,
                   int accumulate);
int cpu_norm_matmuls_op(cp_backend *be, const float *x, const float *norm_w, float eps, int n, int in, const cp_mm_out *outs, int count);
int cpu_swiglu_matmul_op(cp_backend *be, float *y, int ldy, const float *gate, const float *up, const cp_matrix *w, int n, int in, int out,
                         int accumulate);
int cpu_mlp_op(cp_backend *be, float *x, const float *norm_w, float eps, int n, int hidden, const cp_matrix *gate, const cp_matrix *up,
               const cp_matrix *down, int inter);
#ifndef CP_NO_BLAS
cp_status cpu_pack_matrix(cp_backend *be, const void *w, int rows, int cols, cp_matrix *out, size_t *bytes, cp_error *err);
cp_status cpu_download_matrix(cp_backend *be, void *dst, const cp_matrix *w, cp_error *err);
void cpu_free_matrix(cp_backend *be, cp_matrix *w);
#endif

/* the attention ops (backend_cpu_attn.c) */
void cpu_attention_op(cp_backend *be, const cp_attn_args *a);
void cpu_attention_batch_op(cp_backend *be, const cp_attn_args *a, int count);

#endif
