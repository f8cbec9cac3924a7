// The CUDA backend (skeleton): device memory on one stream, the RMSNorm
// kernel, and a cuBLASLt handle with its workspace for the GEMMs to come.
// Ops not written yet stay NULL in the table; cp_model_load refuses a backend
// with missing ops, naming the first, instead of failing inside a forward.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../backend.h"
}

namespace {

struct cuda_impl {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    cp_status sticky;
    char sticky_msg[160];
};

cuda_impl *impl_of(cp_backend *be) { return static_cast<cuda_impl *>(be->impl); }

// Records the first failure of a queued op; sync() reports it.
void note(cp_backend *be, cudaError_t e, const char *what)
{
    cuda_impl *im = impl_of(be);
    if (e == cudaSuccess || im->sticky != CP_OK) return;
    im->sticky = CP_EDEVICE;
    snprintf(im->sticky_msg, sizeof im->sticky_msg, "%s: %s", what, cudaGetErrorString(e));
}

cp_status fail_cuda(cp_error *err, cudaError_t e, const char *what, size_t bytes)
{
    return cp_fail(err, e == cudaErrorMemoryAllocation ? CP_ENOMEM : CP_EDEVICE, "cuda backend: %s (%zu bytes): %s", what,
                   bytes, cudaGetErrorString(e));
}

// One block per row: sum of squares reduced with warp shuffles, then scale.
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *orow = out + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    __shared__ float warp_sums[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        ss = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) warp_sums[0] = ss;
    }
    __syncthreads();
    float r = rsqrtf(warp_sums[0] / dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) orow[j] = xr[j] * r * w[j];
}

void cuda_destroy(cp_backend *be)
{
    cuda_impl *im = impl_of(be);
    if (im) {
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
    note(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_of(be)->stream), "copy");
}

void cuda_zero(cp_backend *be, void *dst, size_t bytes)
{
    note(be, cudaMemsetAsync(dst, 0, bytes, impl_of(be)->stream), "zero");
}

cp_status cuda_sync(cp_backend *be, cp_error *err)
{
    cuda_impl *im = impl_of(be);
    note(be, cudaStreamSynchronize(im->stream), "stream synchronize");
    cp_status rc = im->sticky;
    if (rc != CP_OK) cp_fail(err, rc, "cuda backend: %s", im->sticky_msg);
    im->sticky = CP_OK;
    return rc;
}

void cuda_rmsnorm(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    if (n <= 0) return;
    rmsnorm_kernel<<<n, 256, 0, impl_of(be)->stream>>>(out, x, w, dim, eps);
    note(be, cudaGetLastError(), "rmsnorm launch");
}

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
    be->rmsnorm = cuda_rmsnorm;
    *out = be;
    return CP_OK;
}
