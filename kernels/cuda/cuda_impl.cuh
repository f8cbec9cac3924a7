// What the CUDA backend's files share: the backend's private state (one
// stream, the cuBLASLt handle, workspace and plan cache, grown scratch) and
// the sticky-error helper.  Only kernels/cuda/*.cu include it.
#ifndef CP_CUDA_IMPL_CUH
#define CP_CUDA_IMPL_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "../backend.h"
}

// One cached GEMM plan: the shape it was made for, its descriptors and the
// algorithm cuBLASLt's heuristic chose (asking costs more than a small GEMM).
struct cp_gemm_plan {
    int m, n, k, ldc, accumulate, align_a, align_c, used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

#define CP_GEMM_PLANS 64

struct cuda_impl {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    cp_gemm_plan plans[CP_GEMM_PLANS];
    int n_plans, next_victim;
    // activations converted to bf16 for the GEMMs, grown on demand
    __nv_bfloat16 *xbf;
    size_t xbf_elems;
    // decode attention's per-split partial results, grown on demand
    float *attn_part;
    size_t attn_part_floats;
    // the attention export's per-(query, head) log-sum-exp
    float *lse;
    size_t lse_floats;
    int n_sm;
    int attn_mma; // CP_CUDA_ATTN=mma at creation: prefill attention on the tensor cores (variant 2)
    cp_status sticky;
    char sticky_msg[160];
};

static inline cuda_impl *impl_of(cp_backend *be) { return static_cast<cuda_impl *>(be->impl); }

// Records the first failure of a queued op; sync() reports it.
void cp_cuda_note(cp_backend *be, cudaError_t e, const char *what);
void cp_cuda_note_status(cp_backend *be, cp_status s, const char *what);
// Grows a device scratch buffer to at least `bytes`; false (noted) on failure.
bool cp_cuda_grow(cp_backend *be, void **buf, size_t *have, size_t want, size_t elem, const char *what);

// The ops of the table, one file each group.
void cp_cuda_embed(cp_backend *be, float *out, const cp_matrix *table, const int32_t *ids, int n, int dim);
void cp_cuda_rmsnorm(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
void cp_cuda_rope(cp_backend *be, float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim);
void cp_cuda_swiglu(cp_backend *be, float *out, const float *gate, const float *up, size_t count);
void cp_cuda_place_kv(cp_backend *be, float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n,
                      const float *cos, const float *sin, int n_kv_heads, int head_dim);
void cp_cuda_matmul(cp_backend *be, float *y, int ldy, const float *x, const cp_matrix *w, const float *bias, int n, int in, int out,
                    int accumulate);
void cp_cuda_attention(cp_backend *be, const cp_attn_args *a);
void cp_cuda_attention_batch(cp_backend *be, const cp_attn_args *a, int count);
// variant 2 (attn_mma_cuda.cu): false when the shape is not one it takes
bool cp_cuda_attention_mma(cp_backend *be, const cp_attn_args *a, float *lse);
int32_t cp_cuda_sample(cp_backend *be, const float *logits, int n, float temperature, float top_p, float u);
void cp_cuda_gemm_plans_free(cuda_impl *im);

#endif
