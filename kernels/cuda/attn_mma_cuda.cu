// Attention variant 2 (CP_CUDA_ATTN=mma): the flash-style prefill on the
// tensor cores.  Q, K and V are rounded to bf16 (K/V as their tiles are
// staged in shared memory), scores and the softmax stay f32, P is rounded to
// bf16 for the P.V product; mma.sync m16n8k16 (bf16 in, f32 accumulate).
// A block holds 64 query rows of one head (16 a warp) and streams 64-key
// tiles; the P fragments of S are reused as the A operand of P.V without a
// trip through shared memory (the FlashAttention-2 arrangement).  Masking is
// by position as in variant 1 (backend.h), tiles no query sees are skipped.
// head_dim 64 and 128; anything else, and decode-sized batches, stay with
// variant 1 (attn_cuda.cu), which is also this one's reference on the device.
// Not yet run on a GPU: gpu_check validates it against the CPU on
// bf16-representable inputs, bench_cuda times it beside variant 1 and SDPA.
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cuda_impl.cuh"

namespace {

constexpr int BR = 64, BC = 64, WARPS = 4;

__device__ __forceinline__ bool visible(int32_t kp, int32_t qp, int window)
{
    return kp <= qp && (window == 0 || kp > qp - window);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x (low half) = lo: the smaller column
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 lo, __nv_bfloat16 hi)
{
    __nv_bfloat162 v = __halves2bfloat162(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// D[16x8] += A[16x16] . B[16x8], bf16 operands, f32 accumulators
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Fragment ownership (PTX ISA, mma.m16n8k16): lane = 4 g + t.  A: rows g and
// g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9.  B: k = 2t, 2t + 1 and
// 2t + 8, 2t + 9 of column g.  C: rows g, g + 8, columns 2t, 2t + 1.
template <int D>
__global__ void __launch_bounds__(WARPS * 32) attn_mma_kernel(cp_attn_args a, float scale, float *lse)
{
    constexpr int LD = D + 8; // padded shared rows: the B loads below spread over the banks
    __shared__ __align__(16) __nv_bfloat16 ks[BC * LD], vs[BC * LD];
    __shared__ int32_t kpos_s[BC], qpos_s[BR];
    const int qld = a.n_heads * D, kld = a.n_kv_heads * D;
    const int h = blockIdx.y, gk = h / (a.n_heads / a.n_kv_heads), q0 = blockIdx.x * BR;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8; // this thread's two query rows

    if (tid < BR) qpos_s[tid] = q0 + tid < a.n ? a.q_pos[q0 + tid] : INT_MIN;
    // Q as A fragments, D / 16 k-steps
    uint32_t qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const int c0 = kk * 16 + 2 * t, c1 = c0 + 8;
        const float *x0 = a.q + (size_t)r0 * qld + (size_t)h * D, *x1 = a.q + (size_t)r1 * qld + (size_t)h * D;
        bool v0 = r0 < a.n, v1 = r1 < a.n;
        qa[kk][0] = pack_bf16(v0 ? x0[c0] : 0.f, v0 ? x0[c0 + 1] : 0.f);
        qa[kk][1] = pack_bf16(v1 ? x1[c0] : 0.f, v1 ? x1[c0 + 1] : 0.f);
        qa[kk][2] = pack_bf16(v0 ? x0[c1] : 0.f, v0 ? x0[c1 + 1] : 0.f);
        qa[kk][3] = pack_bf16(v1 ? x1[c1] : 0.f, v1 ? x1[c1 + 1] : 0.f);
    }
    __syncthreads();
    int32_t qmin = INT_MAX, qmax = INT_MIN;
    for (int r = 0; r < BR && q0 + r < a.n; r++) qmin = min(qmin, qpos_s[r]), qmax = max(qmax, qpos_s[r]);
    const int32_t qp0 = qpos_s[warp * 16 + g], qp1 = qpos_s[warp * 16 + g + 8];

    float o[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int k0 = 0; k0 < a.n_keys; k0 += BC) {
        __syncthreads(); // the previous tile is consumed
        if (tid < BC) kpos_s[tid] = k0 + tid < a.n_keys ? a.k_pos[k0 + tid] : INT_MAX;
        __syncthreads();
        bool any = false; // block-uniform
        for (int j = 0; j < BC; j++) any |= kpos_s[j] <= qmax && (a.window == 0 || kpos_s[j] > qmin - a.window);
        if (!any) continue;
        for (int e = tid; e < BC * D; e += blockDim.x) {
            int j = e / D, d = e - j * D;
            bool ok = k0 + j < a.n_keys;
            size_t at = (size_t)(k0 + j) * kld + (size_t)gk * D + d;
            ks[j * LD + d] = __float2bfloat16_rn(ok ? a.k[at] : 0.f);
            vs[j * LD + d] = __float2bfloat16_rn(ok ? a.v[at] : 0.f);
        }
        __syncthreads();
        // S = Q K^T for this warp's 16 rows and the tile's 64 keys
        float s[BC / 8][4];
#pragma unroll
        for (int nb = 0; nb < BC / 8; nb++) {
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
            const __nv_bfloat16 *krow = ks + (nb * 8 + g) * LD;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t b0 = *reinterpret_cast<const uint32_t *>(krow + kk * 16 + 2 * t);
                uint32_t b1 = *reinterpret_cast<const uint32_t *>(krow + kk * 16 + 8 + 2 * t);
                mma_bf16(s[nb], qa[kk], b0, b1);
            }
        }
        // mask, scale, the rows' new maxima (a row's values sit in the 4 lanes of a quad)
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < BC / 8; nb++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                int32_t kp = kpos_s[nb * 8 + 2 * t + c];
                s[nb][c] = visible(kp, qp0, a.window) ? s[nb][c] * scale : -INFINITY;
                s[nb][2 + c] = visible(kp, qp1, a.window) ? s[nb][2 + c] * scale : -INFINITY;
                mx0 = fmaxf(mx0, s[nb][c]), mx1 = fmaxf(mx1, s[nb][2 + c]);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1)), mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1)), mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float al0 = n0 == -INFINITY ? 1.f : expf(m0 - n0), al1 = n1 == -INFINITY ? 1.f : expf(m1 - n1);
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int nb = 0; nb < BC / 8; nb++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                s[nb][c] = s[nb][c] == -INFINITY ? 0.f : expf(s[nb][c] - n0);
                s[nb][2 + c] = s[nb][2 + c] == -INFINITY ? 0.f : expf(s[nb][2 + c] - n1);
                sum0 += s[nb][c], sum1 += s[nb][2 + c];
            }
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1), sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1), sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
        l0 = l0 * al0 + sum0, l1 = l1 * al1 + sum1, m0 = n0, m1 = n1;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) o[nd][0] *= al0, o[nd][1] *= al0, o[nd][2] *= al1, o[nd][3] *= al1;
        // O += P V: two S blocks of 8 keys make one A fragment of 16 keys
#pragma unroll
        for (int kb = 0; kb < BC / 16; kb++) {
            uint32_t pa[4] = { pack_bf16(s[2 * kb][0], s[2 * kb][1]), pack_bf16(s[2 * kb][2], s[2 * kb][3]),
                               pack_bf16(s[2 * kb + 1][0], s[2 * kb + 1][1]), pack_bf16(s[2 * kb + 1][2], s[2 * kb + 1][3]) };
            const __nv_bfloat16 *v0 = vs + (kb * 16 + 2 * t) * LD, *v8 = v0 + 8 * LD;
#pragma unroll
            for (int nd = 0; nd < D / 8; nd++) {
                const int col = nd * 8 + g;
                uint32_t b0 = pack_bf16(v0[col], v0[LD + col]), b1 = pack_bf16(v8[col], v8[LD + col]);
                mma_bf16(o[nd], pa, b0, b1);
            }
        }
    }
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f; // a row that sees nothing is zero
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) {
        const int col = h * D + nd * 8 + 2 * t;
        if (r0 < a.n) a.out[(size_t)r0 * qld + col] = o[nd][0] * inv0, a.out[(size_t)r0 * qld + col + 1] = o[nd][1] * inv0;
        if (r1 < a.n) a.out[(size_t)r1 * qld + col] = o[nd][2] * inv1, a.out[(size_t)r1 * qld + col + 1] = o[nd][3] * inv1;
    }
    if (lse && t == 0) {
        if (r0 < a.n) lse[(size_t)r0 * a.n_heads + h] = l0 > 0.f ? m0 + logf(l0) : -INFINITY;
        if (r1 < a.n) lse[(size_t)r1 * a.n_heads + h] = l1 > 0.f ? m1 + logf(l1) : -INFINITY;
    }
}

} // namespace

bool cp_cuda_attention_mma(cp_backend *be, const cp_attn_args *a, float *lse)
{
    if ((a->head_dim != 64 && a->head_dim != 128) || a->n < 64) return false;
    const float scale = 1.0f / sqrtf((float)a->head_dim);
    dim3 grid((a->n + BR - 1) / BR, a->n_heads);
    cudaStream_t st = impl_of(be)->stream;
    if (a->head_dim == 64) attn_mma_kernel<64><<<grid, WARPS * 32, 0, st>>>(*a, scale, lse);
    else attn_mma_kernel<128><<<grid, WARPS * 32, 0, st>>>(*a, scale, lse);
    cp_cuda_note(be, cudaGetLastError(), "attention (mma) launch");
    return true;
}
