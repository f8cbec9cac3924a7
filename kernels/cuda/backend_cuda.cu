// The CUDA backend: device memory and every op on one non-blocking stream,
// the sticky error that sync() reports, NVTX ranges, and the op table.  The
// ops live beside it: ops_cuda.cu (embed, RMSNorm, RoPE, SwiGLU, sampling),
// gemm_cuda.cu (cuBLASLt), attn_cuda.cu (attention and its export).
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "annot_cuda.h"
#include "cuda_impl.cuh"

void cp_cuda_note(cp_backend *be, cudaError_t e, const char *what)
{
    cuda_impl *im = impl_of(be);
    if (e == cudaSuccess || im->sticky != CP_OK) return;
    im->sticky = e == cudaErrorMemoryAllocation ? CP_ENOMEM : CP_EDEVICE;
    snprintf(im->sticky_msg, sizeof im->sticky_msg, "%s: %s", what, cudaGetErrorString(e));
}

void cp_cuda_note_status(cp_backend *be, cp_status s, const char *what)
{
    cuda_impl *im = impl_of(be);
    if (s == CP_OK || im->sticky != CP_OK) return;
    im->sticky = s;
    snprintf(im->sticky_msg, sizeof im->sticky_msg, "%s", what);
}

bool cp_cuda_grow(cp_backend *be, void **buf, size_t *have, size_t want, size_t elem, const char *what)
{
    if (want <= *have && *buf) return true;
    cuda_impl *im = impl_of(be);
    // the old buffer may still be read by queued work: free it in stream order
    if (*buf) cudaFreeAsync(*buf, im->stream);
    *buf = NULL;
    *have = 0;
    size_t n = want + want / 4; // headroom: prompts grow a little at a time
    cudaError_t e = cudaMallocAsync(buf, n * elem, im->stream);
    if (e != cudaSuccess) {
        *buf = NULL;
        cp_cuda_note(be, e, what);
        return false;
    }
    *have = n;
    return true;
}

namespace {

cp_status fail_cuda(cp_error *err, cudaError_t e, const char *what, size_t bytes)
{
    return cp_fail(err, e == cudaErrorMemoryAllocation ? CP_ENOMEM : CP_EDEVICE, "cuda backend: %s (%zu bytes): %s", what,
                   bytes, cudaGetErrorString(e));
}

void cuda_destroy(cp_backend *be)
{
    cuda_impl *im = impl_of(be);
    if (im) {
        if (im->stream) cudaStreamSynchronize(im->stream);
        cp_cuda_gemm_plans_free(im);
        if (im->xbf) cudaFree(im->xbf);
        if (im->attn_part) cudaFree(im->attn_part);
        if (im->lse) cudaFree(im->lse);
        if (im->workspace) cudaFree(im->workspace);
        if (im->lt) cublasLtDestroy(im->lt);
        if (im->stream) cudaStreamDestroy(im->stream);
        free(im);
    }
    free(be);
}

cp_status cuda_alloc(cp_backend *, size_t bytes, void **out, cp_error *err)
{
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        return fail_cuda(err, e, "cudaMalloc", bytes);
    }
    return CP_OK;
}

void cuda_free(cp_backend *, void *p) { cudaFree(p); }

cp_status cuda_upload(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    // synchronous: the host buffer may be reused as soon as we return
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl_of(be)->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(impl_of(be)->stream);
    return e == cudaSuccess ? CP_OK : fail_cuda(err, e, "upload", bytes);
}

cp_status cuda_download(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_of(be)->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(impl_of(be)->stream);
    return e == cudaSuccess ? CP_OK : fail_cuda(err, e, "download", bytes);
}

void cuda_copy(cp_backend *be, void *dst, const void *src, size_t bytes)
{
    cp_cuda_note(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_of(be)->stream), "copy");
}

void cuda_zero(cp_backend *be, void *dst, size_t bytes)
{
    cp_cuda_note(be, cudaMemsetAsync(dst, 0, bytes, impl_of(be)->stream), "zero");
}

cp_status cuda_sync(cp_backend *be, cp_error *err)
{
    cuda_impl *im = impl_of(be);
    cp_cuda_note(be, cudaStreamSynchronize(im->stream), "stream synchronize");
    cp_status rc = im->sticky;
    if (rc != CP_OK) cp_fail(err, rc, "cuda backend: %s", im->sticky_msg);
    im->sticky = CP_OK;
    return rc;
}

cp_status cuda_annot_open(cp_backend *be, const float *A, size_t lda, int T, const uint8_t *sens, cp_annot_dev *out, cp_error *err)
{
    return cp_cuda_annot_dev_open(be, A, lda, T, sens, out, err);
}
void cuda_annot_close(cp_backend *, cp_annot_dev *d) { cp_cuda_annot_dev_close(d); }

void cuda_range_push(cp_backend *, const char *name) { nvtxRangePushA(name); }
void cuda_range_pop(cp_backend *) { nvtxRangePop(); }

} // namespace

extern "C" int cp_backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

extern "C" cp_status cp_backend_cuda_create(cp_backend **out, cp_error *err)
{
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return cp_fail(err, CP_EDEVICE, "no CUDA device available: %s",
                       e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    cp_backend *be = static_cast<cp_backend *>(calloc(1, sizeof(cp_backend)));
    cuda_impl *im = static_cast<cuda_impl *>(calloc(1, sizeof(cuda_impl)));
    if (!be || !im) {
        free(be);
        free(im);
        return cp_fail(err, CP_ENOMEM, "cuda backend: out of memory");
    }
    be->impl = im;
    be->name = "cuda";
    be->matrix_dtype = CP_BF16;
    be->destroy = cuda_destroy;
    cp_status rc = CP_OK;
    if ((e = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking)) != cudaSuccess)
        rc = fail_cuda(err, e, "stream create", 0);
    else if (cublasLtCreate(&im->lt) != CUBLAS_STATUS_SUCCESS)
        rc = cp_fail(err, CP_EDEVICE, "cuda backend: cublasLtCreate failed");
    else {
        im->workspace_bytes = (size_t)32 << 20; // cuBLASLt's recommended size on Hopper
        const char *g = getenv("CP_CUDA_GEMM");
        if (g && strcmp(g, "f32") == 0) be->matrix_dtype = CP_F32; // the exact variant: f32 weights, SIMT GEMMs
        const char *at = getenv("CP_CUDA_ATTN");
        im->attn_mma = at && strcmp(at, "mma") == 0;
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&im->n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            im->n_sm = 1;
        if ((e = cudaMalloc(&im->workspace, im->workspace_bytes)) != cudaSuccess)
            rc = fail_cuda(err, e, "cuBLASLt workspace", im->workspace_bytes);
    }
    if (rc != CP_OK) {
        cuda_destroy(be);
        return rc;
    }
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->copy = cuda_copy;
    be->zero = cuda_zero;
    be->sync = cuda_sync;
    be->embed = cp_cuda_embed;
    be->rmsnorm = cp_cuda_rmsnorm;
    be->matmul = cp_cuda_matmul;
    be->rope = cp_cuda_rope;
    be->attention = cp_cuda_attention;
    be->attention_batch = cp_cuda_attention_batch;
    be->swiglu = cp_cuda_swiglu;
    be->place_kv = cp_cuda_place_kv;
    /* no kv_store_bf16 / place_kv_bf16: the cache stays f32 here, and
     * cp_state_create_kv refuses --kv-dtype bf16 by name */
    be->range_push = cuda_range_push;
    be->range_pop = cuda_range_pop;
    be->sample = cp_cuda_sample;
    be->annot_open = cuda_annot_open;
    be->annot_close = cuda_annot_close;
    *out = be;
    return CP_OK;
}
