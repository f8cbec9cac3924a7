// Attention on the device: queries against the first n_keys cache slots of
// one layer, visible by position (backend.h: causal by position, optional
// sliding window, GQA), f32 in and out, f32 accumulation.
//
// attn_tile_kernel is flash-style: a block holds QT query rows of one head
// and streams the keys in tiles of KT through shared memory with an online
// softmax, so no score matrix is ever stored.  A lane scores one key of the
// tile; each lane then owns head_dim/32 output columns.  Tiles no query of
// the block can see are skipped (causal: about half of a prompt's tiles).
// For few queries (decode) the keys are also split across blocks (grid z)
// and a second kernel merges the partial (max, sum, accumulator) triples.
//
// The export for the annotator (head-mean probabilities and the per-row
// max-over-heads sensitive mass) is a second sweep that recomputes each score
// and normalises it with the log-sum-exp the first sweep saved: one block per
// query row, one thread per key, summing the heads before one plain add.
// Reference: cpu_attention (kernels/cpu/ops_cpu.c); microbenchmark:
// profiling/bench_cuda.cu.
#include <limits.h>
#include <math.h>

#include "cuda_impl.cuh"

namespace {

constexpr int QT = 16, KT = 32, WARPS = 4, RPW = QT / WARPS;

__device__ __forceinline__ bool visible(int32_t kp, int32_t qp, int window)
{
    return kp <= qp && (window == 0 || kp > qp - window);
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

size_t tile_smem_bytes(int D) { return (size_t)(QT * D + KT * (D + 1) + KT * D) * sizeof(float); }

// grid (query tiles, heads, key splits); 128 threads.  With one split the
// result goes to out (and lse); with several, each block writes its partial
// (m, l, acc[D]) to part[((split * n) + row) * n_heads + head].
template <int DL>
__global__ void __launch_bounds__(WARPS * 32) attn_tile_kernel(cp_attn_args a, float scale, int keys_per_split, float *part, float *lse)
{
    extern __shared__ float smem[];
    __shared__ int32_t kpos_s[KT], qpos_s[QT];
    const int D = a.head_dim, qld = a.n_heads * D, kld = a.n_kv_heads * D;
    const int h = blockIdx.y, g = h / (a.n_heads / a.n_kv_heads), q0 = blockIdx.x * QT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float *qs = smem, *ks = qs + QT * D, *vs = ks + KT * (D + 1);

    for (int e = tid; e < QT * D; e += blockDim.x) {
        int r = e / D, d = e - r * D;
        qs[e] = q0 + r < a.n ? a.q[(size_t)(q0 + r) * qld + (size_t)h * D + d] : 0.f;
    }
    if (tid < QT) qpos_s[tid] = q0 + tid < a.n ? a.q_pos[q0 + tid] : INT_MIN; // INT_MIN sees nothing
    __syncthreads();
    int32_t qmin = INT_MAX, qmax = INT_MIN;
    for (int r = 0; r < QT && q0 + r < a.n; r++) qmin = min(qmin, qpos_s[r]), qmax = max(qmax, qpos_s[r]);

    float m[RPW], l[RPW], acc[RPW][DL]; // registers: every index below is a compile-time constant after unrolling
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        m[rr] = -INFINITY, l[rr] = 0.f;
#pragma unroll
        for (int t = 0; t < DL; t++) acc[rr][t] = 0.f;
    }
    const int k_begin = blockIdx.z * keys_per_split, k_end = min(a.n_keys, k_begin + keys_per_split);
    for (int k0 = k_begin; k0 < k_end; k0 += KT) {
        __syncthreads(); // the previous tile is consumed
        if (tid < KT) kpos_s[tid] = k0 + tid < k_end ? a.k_pos[k0 + tid] : INT_MAX;
        __syncthreads();
        bool any = false; // block-uniform: every thread reads the same positions
        for (int j = 0; j < KT; j++) any |= kpos_s[j] <= qmax && (a.window == 0 || kpos_s[j] > qmin - a.window);
        if (!any) continue;
        for (int e = tid; e < KT * D; e += blockDim.x) {
            int j = e / D, d = e - j * D;
            bool ok = k0 + j < k_end;
            size_t at = (size_t)(k0 + j) * kld + (size_t)g * D + d;
            ks[j * (D + 1) + d] = ok ? a.k[at] : 0.f; // +1: lanes read different rows, same column
            vs[j * D + d] = ok ? a.v[at] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = warp * RPW + rr;
            const int32_t qp = qpos_s[r];
            float s = -INFINITY;
            if (visible(kpos_s[lane], qp, a.window)) {
                const float *qr = qs + r * D, *kr = ks + lane * (D + 1);
                float dot = 0.f;
                for (int d = 0; d < D; d++) dot += qr[d] * kr[d];
                s = dot * scale;
            }
            float mnew = fmaxf(m[rr], warp_max(s));
            if (mnew == -INFINITY) continue; // warp-uniform: nothing visible yet
            float alpha = expf(m[rr] - mnew), p = s == -INFINITY ? 0.f : expf(s - mnew);
            l[rr] = l[rr] * alpha + warp_sum(p);
#pragma unroll
            for (int t = 0; t < DL; t++) acc[rr][t] *= alpha;
            for (int j = 0; j < KT; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int t = 0; t < DL; t++) {
                    int d = lane + 32 * t;
                    if (d < D) acc[rr][t] += pj * vs[j * D + d];
                }
            }
            m[rr] = mnew;
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int row = q0 + warp * RPW + rr;
        if (row >= a.n) continue;
        if (gridDim.z == 1) {
            float inv = l[rr] > 0.f ? 1.f / l[rr] : 0.f; // a row that sees nothing is zero, as on the CPU
#pragma unroll
            for (int t = 0; t < DL; t++) {
                int d = lane + 32 * t;
                if (d < D) a.out[(size_t)row * qld + (size_t)h * D + d] = acc[rr][t] * inv;
            }
            if (lse && lane == 0) lse[(size_t)row * a.n_heads + h] = l[rr] > 0.f ? m[rr] + logf(l[rr]) : -INFINITY;
        } else {
            float *pp = part + (((size_t)blockIdx.z * a.n + row) * a.n_heads + h) * (D + 2);
            if (lane == 0) pp[0] = m[rr], pp[1] = l[rr];
#pragma unroll
            for (int t = 0; t < DL; t++) {
                int d = lane + 32 * t;
                if (d < D) pp[2 + d] = acc[rr][t];
            }
        }
    }
}

// grid (n, n_heads), head_dim threads (at least 32): merges the splits.
__global__ void attn_merge_kernel(cp_attn_args a, int splits, const float *part, float *lse)
{
    const int row = blockIdx.x, h = blockIdx.y, D = a.head_dim;
    const size_t stride = (size_t)a.n * a.n_heads * (D + 2);
    const float *p0 = part + ((size_t)row * a.n_heads + h) * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, p0[s * stride]);
    float L = 0.f;
    for (int s = 0; s < splits; s++)
        if (p0[s * stride] != -INFINITY) L += p0[s * stride + 1] * expf(p0[s * stride] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < splits; s++)
            if (p0[s * stride] != -INFINITY) o += p0[s * stride + 2 + d] * expf(p0[s * stride] - M);
        a.out[(size_t)row * a.n_heads * D + (size_t)h * D + d] = L > 0.f ? o / L : 0.f;
    }
    if (lse && threadIdx.x == 0) lse[(size_t)row * a.n_heads + h] = L > 0.f ? M + logf(L) : -INFINITY;
}

// grid (n), 256 threads; dynamic shared: the query row (n_heads * D floats)
// then one float per warp and head for the sensitive mass.
__global__ void attn_export_kernel(cp_attn_args a, float scale, const float *lse)
{
    extern __shared__ float sm[];
    const int i = blockIdx.x, D = a.head_dim, H = a.n_heads, group = a.n_heads / a.n_kv_heads;
    const int kld = a.n_kv_heads * D, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *qrow = sm, *sens = sm + H * D; // sens[h * nw + warp]
    for (int e = threadIdx.x; e < H * D; e += blockDim.x) qrow[e] = a.q[(size_t)i * H * D + e];
    for (int e = threadIdx.x; e < H * nw; e += blockDim.x) sens[e] = 0.f;
    __syncthreads();
    const int32_t qp = a.q_pos[i];
    for (int h = 0; h < H; h++) {
        const float L = lse[(size_t)i * H + h];
        float mine = 0.f;
        for (int j = threadIdx.x; j < a.n_keys; j += blockDim.x) {
            float p = 0.f;
            if (L != -INFINITY && visible(a.k_pos[j], qp, a.window)) {
                const float *kr = a.k + (size_t)j * kld + (size_t)(h / group) * D, *qr = qrow + h * D;
                float dot = 0.f;
                for (int d = 0; d < D; d++) dot += qr[d] * kr[d];
                p = expf(dot * scale - L);
            }
            if (a.export_a) a.export_a[(size_t)i * a.export_ld + j] += a.export_weight * p; // one thread owns (i, j)
            if (a.sens_cols && a.sens_cols[j]) mine += p;
        }
        mine = warp_sum(mine);
        if (lane == 0) sens[h * nw + warp] = mine;
    }
    __syncthreads();
    if (a.sens_mass && threadIdx.x == 0) {
        float best = a.sens_mass[i];
        for (int h = 0; h < H; h++) {
            float s = 0.f;
            for (int w = 0; w < nw; w++) s += sens[h * nw + w];
            best = fmaxf(best, s);
        }
        a.sens_mass[i] = best;
    }
}

template <int DL>
bool launch_tile(cp_backend *be, const cp_attn_args &a, float scale, int splits, int keys_per_split, float *part, float *lse)
{
    cuda_impl *im = impl_of(be);
    size_t smem = tile_smem_bytes(a.head_dim);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(attn_tile_kernel<DL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return cp_cuda_note(be, e, "attention shared memory"), false;
    }
    dim3 grid((a.n + QT - 1) / QT, a.n_heads, splits);
    attn_tile_kernel<DL><<<grid, WARPS * 32, smem, im->stream>>>(a, scale, keys_per_split, part, lse);
    cp_cuda_note(be, cudaGetLastError(), "attention launch");
    return true;
}

} // namespace

static bool attention_v1(cp_backend *be, const cp_attn_args *a, float scale, float *lse);

void cp_cuda_attention(cp_backend *be, const cp_attn_args *a)
{
    cuda_impl *im = impl_of(be);
    if (a->n <= 0 || a->n_keys <= 0) return;
    const int D = a->head_dim;
    if (D < 1 || D > 256 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads) {
        cp_cuda_note_status(be, CP_EUNSUPPORTED, "attention: head_dim must be 1..256 and heads a multiple of KV heads");
        return;
    }
    const float scale = 1.0f / sqrtf((float)D);
    const bool want_export = a->export_a || a->sens_mass;
    float *lse = NULL;
    if (want_export) {
        if (!cp_cuda_grow(be, (void **)&im->lse, &im->lse_floats, (size_t)a->n * a->n_heads, sizeof(float), "attention lse")) return;
        lse = im->lse;
    }
    if (!(im->attn_mma && cp_cuda_attention_mma(be, a, lse)) && !attention_v1(be, a, scale, lse)) return;
    if (want_export) {
        const int threads = 256;
        size_t smem = ((size_t)a->n_heads * D + (size_t)a->n_heads * (threads / 32)) * sizeof(float);
        if (smem > 48 * 1024) {
            cudaError_t e = cudaFuncSetAttribute(attn_export_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return cp_cuda_note(be, e, "attention export shared memory");
        }
        attn_export_kernel<<<a->n, threads, smem, im->stream>>>(*a, scale, lse);
        cp_cuda_note(be, cudaGetLastError(), "attention export launch");
    }
}

// The batched entry (backend.h): the calls queued one after another on the
// stream -- a launch each costs microseconds, not a fork and join, so the
// per-sequence loop is what the CPU's single region buys there.
void cp_cuda_attention_batch(cp_backend *be, const cp_attn_args *a, int count)
{
    for (int c = 0; c < count; c++) cp_cuda_attention(be, &a[c]);
}

// Variant 1: the f32 tile kernel, keys split across blocks when the query
// tiles alone cannot fill the device (decode), then merged.
static bool attention_v1(cp_backend *be, const cp_attn_args *a, float scale, float *lse)
{
    cuda_impl *im = impl_of(be);
    const int D = a->head_dim;
    int qtiles = (a->n + QT - 1) / QT, key_tiles = (a->n_keys + KT - 1) / KT;
    int splits = 1, want_blocks = 2 * im->n_sm;
    if (qtiles * a->n_heads < want_blocks) {
        splits = (want_blocks + qtiles * a->n_heads - 1) / (qtiles * a->n_heads);
        if (splits > key_tiles) splits = key_tiles;
        if (splits < 1) splits = 1;
    }
    int keys_per_split = ((key_tiles + splits - 1) / splits) * KT;
    splits = (a->n_keys + keys_per_split - 1) / keys_per_split;
    float *part = NULL;
    if (splits > 1) {
        size_t need = (size_t)splits * a->n * a->n_heads * (D + 2);
        if (!cp_cuda_grow(be, (void **)&im->attn_part, &im->attn_part_floats, need, sizeof(float), "attention splits")) return false;
        part = im->attn_part;
    }
    bool ok;
    switch ((D + 31) / 32) {
    case 1: ok = launch_tile<1>(be, *a, scale, splits, keys_per_split, part, lse); break;
    case 2: ok = launch_tile<2>(be, *a, scale, splits, keys_per_split, part, lse); break;
    case 3: ok = launch_tile<3>(be, *a, scale, splits, keys_per_split, part, lse); break;
    case 4: ok = launch_tile<4>(be, *a, scale, splits, keys_per_split, part, lse); break;
    case 5: case 6: ok = launch_tile<6>(be, *a, scale, splits, keys_per_split, part, lse); break;
    default: ok = launch_tile<8>(be, *a, scale, splits, keys_per_split, part, lse); break;
    }
    if (!ok) return false;
    if (splits > 1) {
        attn_merge_kernel<<<dim3(a->n, a->n_heads), D < 32 ? 32 : (D > 256 ? 256 : D), 0, im->stream>>>(*a, splits, part, lse);
        cp_cuda_note(be, cudaGetLastError(), "attention merge launch");
    }
    return true;
}
