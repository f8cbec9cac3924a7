// The CUDA backend's small ops: embedding gather, RMSNorm, RoPE, SwiGLU,
// placement of reused KV and sampling.  Each is memory-bound; the references
// are kernels/cpu/ops_cpu.c, the microbenchmarks profiling/bench_cuda.cu.
#include <math.h>

#include "cuda_impl.cuh"

namespace {

__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(float v) { return v; }

// One block per row of the table (bf16, or f32 in the exact variant).
template <class T> __global__ void embed_kernel(float *out, const T *table, const int32_t *ids, int dim)
{
    const T *src = table + (size_t)ids[blockIdx.x] * dim;
    float *dst = out + (size_t)blockIdx.x * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = widen(src[j]);
}

// One block per row: the sum of squares reduced with warp shuffles, then the
// scale; the row is read twice (the second time from L1/L2).
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

// HF rotate-half: one block per row, one thread per (head, pair).
__global__ void rope_kernel(float *x, int ld, const float *cos, const float *sin, int n_heads, int head_dim)
{
    int half = head_dim / 2;
    float *row = x + (size_t)blockIdx.x * ld;
    const float *c = cos + (size_t)blockIdx.x * half, *s = sin + (size_t)blockIdx.x * half;
    for (int t = threadIdx.x; t < n_heads * half; t += blockDim.x) {
        int h = t / half, k = t - h * half;
        float *v = row + (size_t)h * head_dim;
        float a = v[k], b = v[k + half];
        v[k] = a * c[k] - b * s[k];
        v[k + half] = b * c[k] + a * s[k];
    }
}

// Reused KV into the cache: one block per row, one thread per (head, pair):
// the stored pre-RoPE K and V are read once, k_pre and v written as they
// are and k rotated to the row's new position (rotate-half, as rope_kernel).
__global__ void place_kv_kernel(float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld,
                                const float *cos, const float *sin, int n_kv_heads, int head_dim)
{
    const int half = head_dim / 2, row = n_kv_heads * head_dim;
    const float *sk = src_k + (size_t)blockIdx.x * src_ld, *sv = src_v + (size_t)blockIdx.x * src_ld;
    const float *c = cos + (size_t)blockIdx.x * half, *s = sin + (size_t)blockIdx.x * half;
    float *kr = k + (size_t)blockIdx.x * row, *kp = k_pre + (size_t)blockIdx.x * row, *vr = v + (size_t)blockIdx.x * row;
    for (int t = threadIdx.x; t < n_kv_heads * half; t += blockDim.x) {
        int h = t / half, i = h * head_dim + (t - h * half);
        float a = sk[i], b = sk[i + half];
        kp[i] = a, kp[i + half] = b;
        vr[i] = sv[i], vr[i + half] = sv[i + half];
        kr[i] = a * c[t - h * half] - b * s[t - h * half];
        kr[i + half] = b * c[t - h * half] + a * s[t - h * half];
    }
}

__global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t count)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + __expf(-g)) * up[i];
    }
}

// ---- sampling: one block of SAMPLE_THREADS, the same algorithm as
// cpu_sample (bisection for the top-p threshold, then a walk in index order)

#define SAMPLE_THREADS 1024

// block-wide sum of a double (every thread gets the result)
__device__ double block_sum(double v, double *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += red[i];
    return t;
}

__global__ void sample_kernel(const float *l, int n, float temp, float top_p, float u, int32_t *out)
{
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ double red[32];
    __shared__ double part[SAMPLE_THREADS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // argmax, lowest index on ties
    float bv = -INFINITY;
    int bi = n;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (l[i] > bv || (l[i] == bv && i < bi)) bv = l[i], bi = i;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
    __syncthreads();
    bv = best_v[0], bi = best_i[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++)
        if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) bv = best_v[w], bi = best_i[w];
    if (temp == 0.f) {
        if (threadIdx.x == 0) *out = bi;
        return;
    }
    // each thread owns a contiguous slice, so the final walk is in index order
    int per = (n + blockDim.x - 1) / blockDim.x, i0 = threadIdx.x * per, i1 = min(n, i0 + per);
    double total = 0;
    for (int i = i0; i < i1; i++) total += exp(((double)l[i] - bv) / temp);
    double target = top_p * block_sum(total, red), lo = 0, hi = 1;
    for (int it = 0; it < 60; it++) {
        double mid = 0.5 * (lo + hi), m = 0;
        for (int i = i0; i < i1; i++) {
            double p = exp(((double)l[i] - bv) / temp);
            if (p >= mid) m += p;
        }
        if (block_sum(m, red) >= target) lo = mid;
        else hi = mid;
    }
    double mine = 0;
    for (int i = i0; i < i1; i++) {
        double p = exp(((double)l[i] - bv) / temp);
        if (p >= lo) mine += p;
    }
    part[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) { // a serial scan over the slices: SAMPLE_THREADS adds, once
        double kept = 0;
        for (int t = 0; t < (int)blockDim.x; t++) kept += part[t];
        double want = u * kept, acc = 0;
        int pick = bi, t = 0;
        for (; t < (int)blockDim.x && acc + part[t] <= want; t++) acc += part[t];
        if (t < (int)blockDim.x) {
            int a0 = t * per, a1 = min(n, a0 + per);
            for (int i = a0; i < a1; i++) {
                double p = exp(((double)l[i] - bv) / temp);
                if (p < lo) continue;
                pick = i;
                if ((acc += p) > want) break;
            }
        } else {
            for (int i = n - 1; i >= 0; i--) // rounding: the last kept id
                if (exp(((double)l[i] - bv) / temp) >= lo) {
                    pick = i;
                    break;
                }
        }
        *out = pick;
    }
}

int rows_threads(int work) { return work >= 1024 ? 1024 : work >= 256 ? 256 : work > 32 ? ((work + 31) / 32) * 32 : 32; }

} // namespace

void cp_cuda_embed(cp_backend *be, float *out, const cp_matrix *table, const int32_t *ids, int n, int dim)
{
    if (n <= 0) return;
    if (be->matrix_dtype == CP_F32)
        embed_kernel<<<n, rows_threads(dim), 0, impl_of(be)->stream>>>(out, static_cast<const float *>(table->data), ids, dim);
    else
        embed_kernel<<<n, rows_threads(dim), 0, impl_of(be)->stream>>>(out, static_cast<const __nv_bfloat16 *>(table->data), ids,
                                                                       dim);
    cp_cuda_note(be, cudaGetLastError(), "embed launch");
}

void cp_cuda_rmsnorm(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    if (n <= 0) return;
    rmsnorm_kernel<<<n, 256, 0, impl_of(be)->stream>>>(out, x, w, dim, eps);
    cp_cuda_note(be, cudaGetLastError(), "rmsnorm launch");
}

void cp_cuda_rope(cp_backend *be, float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim)
{
    if (n <= 0) return;
    rope_kernel<<<n, rows_threads(n_heads * head_dim / 2), 0, impl_of(be)->stream>>>(x, ld, cos, sin, n_heads, head_dim);
    cp_cuda_note(be, cudaGetLastError(), "rope launch");
}

void cp_cuda_swiglu(cp_backend *be, float *out, const float *gate, const float *up, size_t count)
{
    if (!count) return;
    cuda_impl *im = impl_of(be);
    size_t blocks = (count + 255) / 256, cap = (size_t)im->n_sm * 8;
    swiglu_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, im->stream>>>(out, gate, up, count);
    cp_cuda_note(be, cudaGetLastError(), "swiglu launch");
}

void cp_cuda_place_kv(cp_backend *be, float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n,
                      const float *cos, const float *sin, int n_kv_heads, int head_dim)
{
    if (n <= 0) return;
    place_kv_kernel<<<n, rows_threads(n_kv_heads * head_dim / 2), 0, impl_of(be)->stream>>>(k, k_pre, v, src_k, src_v, src_ld, cos,
                                                                                           sin, n_kv_heads, head_dim);
    cp_cuda_note(be, cudaGetLastError(), "place_kv launch");
}

int32_t cp_cuda_sample(cp_backend *be, const float *logits, int n, float temperature, float top_p, float u)
{
    if (n < 1 || !(temperature >= 0) || !(top_p > 0 && top_p <= 1) || !(u >= 0 && u < 1)) return -1;
    cuda_impl *im = impl_of(be);
    int32_t *d_out = NULL, id = -1;
    // the result travels through the front of the attention scratch
    if (!cp_cuda_grow(be, (void **)&im->attn_part, &im->attn_part_floats, 1, sizeof(float), "sample result")) return -1;
    d_out = reinterpret_cast<int32_t *>(im->attn_part);
    sample_kernel<<<1, SAMPLE_THREADS, 0, im->stream>>>(logits, n, temperature, top_p, u, d_out);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(&id, d_out, sizeof id, cudaMemcpyDeviceToHost, im->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(im->stream);
    cp_cuda_note(be, e, "sample");
    return e == cudaSuccess ? id : -1;
}
