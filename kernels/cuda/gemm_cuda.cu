// The projections through cuBLASLt: activations (f32) are rounded to bf16
// once per call, weights are bf16 as loaded, products accumulate in f32 and
// land in f32 (optionally added to y: the residual stream).  cuBLASLt's
// heuristic is asked once per shape; the plan (descriptors + algorithm) is
// cached.  Bias, when there is one, is added by a tiny kernel afterwards.
//
// Row-major y[n, out] = x[n, in] . W[out, in]^T is, in cuBLAS's column-major
// terms, D[out, n] = A^T . B with A = W (k = in rows, out columns, lda = in,
// transposed) and B = x (in rows, n columns, ldb = in).
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_impl.cuh"

namespace {

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t count)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void add_bias_kernel(float *y, int ldy, const float *bias, int out)
{
    float *row = y + (size_t)blockIdx.x * ldy;
    for (int j = threadIdx.x; j < out; j += blockDim.x) row[j] += bias[j];
}

// The exact variant (CP_CUDA_GEMM=f32): weights kept f32 on the device
// (matrix dtype f32), activations f32, f32 accumulation: the CPU reference's
// numbers to f32 rounding, for parity checks on models whose outputs are
// sensitive to bf16 rounding (the random-weight fixtures, F16/F32 weights).
// A plain shared-memory tiled kernel, one output per thread: correct first,
// not fast.
constexpr int GT = 16;
__global__ void gemm_f32_kernel(float *y, int ldy, const float *x, const float *w, int n, int in, int out, int accumulate)
{
    __shared__ float xs[GT][GT + 1], ws[GT][GT + 1];
    const int row = blockIdx.y * GT + threadIdx.y, col = blockIdx.x * GT + threadIdx.x;
    const int wrow = blockIdx.x * GT + threadIdx.y; // the W row this thread loads
    float acc = 0.f;
    for (int k0 = 0; k0 < in; k0 += GT) {
        int k = k0 + threadIdx.x;
        xs[threadIdx.y][threadIdx.x] = row < n && k < in ? x[(size_t)row * in + k] : 0.f;
        ws[threadIdx.y][threadIdx.x] = wrow < out && k < in ? w[(size_t)wrow * in + k] : 0.f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < GT; t++) acc += xs[threadIdx.y][t] * ws[threadIdx.x][t];
        __syncthreads();
    }
    if (row < n && col < out) {
        float *yo = y + (size_t)row * ldy + col;
        *yo = accumulate ? *yo + acc : acc;
    }
}

void plan_destroy(cp_gemm_plan *p)
{
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

// The largest power of two (up to 256) dividing the address: cuBLASLt's
// heuristic assumes 256-byte aligned operands unless told otherwise, and a
// y or W inside a larger buffer may be less aligned.  (B is our own bf16
// scratch: always aligned.)
int alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

// Builds a plan for (m = out, n, k = in, ldc); false when cuBLASLt has no
// algorithm for it (noted as the sticky error).
bool plan_make(cp_backend *be, cp_gemm_plan *p, int m, int n, int k, int ldc, int accumulate, int align_a, int align_c)
{
    cuda_impl *im = impl_of(be);
    memset(p, 0, sizeof *p);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasStatus_t st = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, m, k);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, n, k);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, m, n, ldc);
    cublasLtMatmulPreference_t pref = NULL;
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &im->workspace_bytes,
                                                  sizeof im->workspace_bytes);
    uint32_t al_a = (uint32_t)align_a, al_c = (uint32_t)align_c;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulAlgoGetHeuristic(im->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &h, &found);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1 || h.state != CUBLAS_STATUS_SUCCESS) {
        char msg[96];
        snprintf(msg, sizeof msg, "cuBLASLt has no bf16 plan for m %d n %d k %d (status %d)", m, n, k, (int)st);
        cp_cuda_note_status(be, CP_EDEVICE, msg);
        plan_destroy(p);
        return false;
    }
    p->algo = h.algo;
    p->m = m, p->n = n, p->k = k, p->ldc = ldc, p->accumulate = accumulate, p->align_a = align_a, p->align_c = align_c;
    p->used = 1;
    return true;
}

const cp_gemm_plan *plan_for(cp_backend *be, int m, int n, int k, int ldc, int accumulate, int align_a, int align_c)
{
    cuda_impl *im = impl_of(be);
    for (int i = 0; i < im->n_plans; i++) {
        const cp_gemm_plan *p = &im->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->ldc == ldc && p->accumulate == accumulate && p->align_a == align_a &&
            p->align_c == align_c)
            return p;
    }
    int slot = im->n_plans < CP_GEMM_PLANS ? im->n_plans++ : (im->next_victim++ % CP_GEMM_PLANS);
    plan_destroy(&im->plans[slot]);
    if (!plan_make(be, &im->plans[slot], m, n, k, ldc, accumulate, align_a, align_c)) {
        if (slot == im->n_plans - 1) im->n_plans--;
        return NULL;
    }
    return &im->plans[slot];
}

} // namespace

void cp_cuda_gemm_plans_free(cuda_impl *im)
{
    for (int i = 0; i < im->n_plans; i++) plan_destroy(&im->plans[i]);
    im->n_plans = 0;
}

void cp_cuda_matmul(cp_backend *be, float *y, int ldy, const float *x, const cp_matrix *wm, const float *bias, int n, int in, int out,
                    int accumulate)
{
    if (n <= 0 || in <= 0 || out <= 0) return;
    const void *w = wm->data; // row-major: this backend packs nothing
    cuda_impl *im = impl_of(be);
    if (be->matrix_dtype == CP_F32) {
        dim3 grid((out + GT - 1) / GT, (n + GT - 1) / GT);
        gemm_f32_kernel<<<grid, dim3(GT, GT), 0, im->stream>>>(y, ldy, x, static_cast<const float *>(w), n, in, out, accumulate);
        cp_cuda_note(be, cudaGetLastError(), "f32 gemm launch");
        if (bias) {
            add_bias_kernel<<<n, 256, 0, im->stream>>>(y, ldy, bias, out);
            cp_cuda_note(be, cudaGetLastError(), "bias launch");
        }
        return;
    }
    size_t count = (size_t)n * in;
    if (!cp_cuda_grow(be, (void **)&im->xbf, &im->xbf_elems, count, sizeof(__nv_bfloat16), "bf16 activations")) return;
    size_t blocks = (count + 255) / 256, cap = (size_t)im->n_sm * 8;
    f32_to_bf16_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, im->stream>>>(im->xbf, x, count);
    cp_cuda_note(be, cudaGetLastError(), "bf16 conversion launch");
    const cp_gemm_plan *p = plan_for(be, out, n, in, ldy, accumulate, alignment(w), alignment(y));
    if (!p) return;
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t st = cublasLtMatmul(im->lt, p->op, &alpha, w, p->a, im->xbf, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                       im->workspace, im->workspace_bytes, im->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char msg[96];
        snprintf(msg, sizeof msg, "cublasLtMatmul m %d n %d k %d failed (status %d)", out, n, in, (int)st);
        cp_cuda_note_status(be, CP_EDEVICE, msg);
        return;
    }
    if (bias) {
        add_bias_kernel<<<n, 256, 0, im->stream>>>(y, ldy, bias, out);
        cp_cuda_note(be, cudaGetLastError(), "bias launch");
    }
}
