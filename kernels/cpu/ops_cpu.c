#include "ops_cpu.h"

#include <math.h>
#include <string.h>
#ifndef CP_NO_BLAS
#include <cblas.h>
#include <omp.h>
#endif

#include "gemm_bf16.h"

void cpu_embed(float *out, const float *table, const int32_t *ids, int n, int dim)
{
    for (int i = 0; i < n; i++) memcpy(out + (size_t)i * dim, table + (size_t)ids[i] * dim, (size_t)dim * sizeof(float));
}

void cpu_embed_bf16(float *out, const uint16_t *table, const int32_t *ids, int n, int dim)
{
    for (int i = 0; i < n; i++) {
        const uint16_t *row = table + (size_t)ids[i] * dim;
        float *o = out + (size_t)i * dim;
        for (int j = 0; j < dim; j++) o[j] = cp_bf16_to_f32(row[j]);
    }
}

void cpu_add_bias(float *y, int ldy, const float *bias, int n, int out)
{
#pragma omp parallel for schedule(static) if ((long)n * out > CPU_SERIAL_ELEMS)
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) y[(size_t)i * ldy + j] += bias[j];
}

void cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
#pragma omp parallel for schedule(static) if ((long)n * dim > CPU_SERIAL_ELEMS)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        for (int j = 0; j < dim; j++) oi[j] = xi[j] * r * w[j];
    }
}

void cpu_matmul(float *y, int ldy, const float *x, const float *w, const float *bias, int n, int in, int out,
                int accumulate)
{
#ifdef CP_NO_BLAS
    /* the device check's reference, built where there is no BLAS: plain
     * loops with double accumulation */
#pragma omp parallel for schedule(static) if (n * (long)out > 4096)
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) {
            const float *xi = x + (size_t)i * in, *wj = w + (size_t)j * in;
            double acc = 0;
            for (int k = 0; k < in; k++) acc += (double)xi[k] * wj[k];
            float *yo = y + (size_t)i * ldy + j;
            *yo = (float)(accumulate ? *yo + acc : acc);
        }
#else
    float beta = accumulate ? 1.0f : 0.0f;
    if (n == 1) {
        /* decode: a matrix-vector product streams W once; sgemm's packing
         * would copy it first */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, beta, y, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, beta, y, ldy);
    }
#endif
    if (bias) cpu_add_bias(y, ldy, bias, n, out);
}

/* One head's rotation, o = x rotated by the position's (c, s): the
 * reference arithmetic (o may be x) */
static void rope_head_c(float *o, const float *x, const float *c, const float *s, int half)
{
    for (int j = 0; j < half; j++) {
        float a = x[j], b = x[j + half];
        o[j] = a * c[j] - b * s[j];
        o[j + half] = b * c[j] + a * s[j];
    }
}

/* Placement's rows, each rotated head by head by rot: K_pre and V copied,
 * K rotated from the copied K_pre (bit-equal to rotating in place) */
typedef void (*rope_head_fn)(float *o, const float *x, const float *c, const float *s, int half);
static void place_rows(float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n, const float *cos,
                       const float *sin, int n_kv_heads, int head_dim, rope_head_fn rot)
{
    const size_t row = (size_t)n_kv_heads * head_dim;
    const int half = head_dim / 2;
    for (int t = 0; t < n; t++) {
        float *kp = k_pre + t * row, *ko = k + t * row;
        memcpy(kp, src_k + t * src_ld, row * sizeof(float));
        memcpy(v + t * row, src_v + t * src_ld, row * sizeof(float));
        for (int h = 0; h < n_kv_heads; h++)
            rot(ko + (size_t)h * head_dim, kp + (size_t)h * head_dim, cos + (size_t)t * half, sin + (size_t)t * half, half);
    }
}

void cpu_rope(float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim)
{
    int half = head_dim / 2;
#pragma omp parallel for schedule(static) if ((long)n * n_heads * head_dim > CPU_SERIAL_ELEMS)
    for (int i = 0; i < n; i++) {
        const float *c = cos + (size_t)i * half, *s = sin + (size_t)i * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)i * ld + (size_t)h * head_dim;
            rope_head_c(v, v, c, s, half);
        }
    }
}

void cpu_swiglu(float *out, const float *gate, const float *up, size_t count)
{
#pragma omp parallel for schedule(static) if (count > CPU_SERIAL_SWIGLU)
    for (size_t i = 0; i < count; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}


size_t cpu_attention_scratch_floats(const cp_attn_args *a)
{
#ifndef CP_NO_BLAS
    if (cpu_attention_decode_fits(a)) return cpu_attention_decode_scratch_floats(a);
#endif
    return cpu_attention_general_scratch_floats(a);
}

/* at most 2^18 floats of scores (1 MB: in L2 when the export pass reads
 * them; 4 MB was 1.2-1.4x slower, make bench-export) to an export pass, at
 * least one head */
#define EXPORT_SCORE_FLOATS ((size_t)1 << 18)
int cpu_attn_export_heads(const cp_attn_args *a)
{
    const size_t rows = a->n < CPU_ATTN_QBLOCK ? (size_t)a->n : CPU_ATTN_QBLOCK, per = rows * (size_t)(a->n_keys > 0 ? a->n_keys : 1);
    const size_t h = EXPORT_SCORE_FLOATS / per;
    return h < 1 ? 1 : h > (size_t)a->n_heads ? a->n_heads : (int)h;
}

size_t cpu_attention_general_scratch_floats(const cp_attn_args *a)
{
    size_t rows = a->n < CPU_ATTN_QBLOCK ? (size_t)a->n : CPU_ATTN_QBLOCK;
    return rows * (size_t)a->n_keys * (size_t)(a->out ? 1 : cpu_attn_export_heads(a));
}

/* C[M, N] = alpha * A[M, K] . op(B) with op(B) = B[N, K]^T (trans_b) or
 * B[K, N]; row-major, beta 0: attention's two products */
static void attn_gemm(int trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float *C,
                      int ldc)
{
#ifdef CP_NO_BLAS
#pragma omp parallel for schedule(static) if (M > 4)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)A[(size_t)i * lda + k] * (trans_b ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
            C[(size_t)i * ldc + j] = (float)(alpha * acc);
        }
#else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc);
#endif
}

static inline int visible(int32_t kp, int32_t qp, int window)
{
    return kp <= qp && (window == 0 || kp > qp - window);
}

int cpu_attn_block_rows(const cp_attn_args *a, int q0)
{
    const int lim = a->n - q0 < CPU_ATTN_QBLOCK ? a->n - q0 : CPU_ATTN_QBLOCK;
    int i = 1;
    while (i < lim && a->q_pos[q0 + i] - a->q_pos[q0] < CPU_ATTN_QBLOCK) i++;
    return i;
}

/* a key some row with a position in [qmin, qmax] sees */
static inline int seen_by_some(int32_t kp, int32_t qmin, int32_t qmax, int window)
{
    return kp <= qmax && (window == 0 || kp > qmin - window);
}

void cpu_attn_key_range(const cp_attn_args *a, int q0, int nq, int *klo_out, int *khi_out)
{
    int32_t qmin = a->q_pos[q0], qmax = a->q_pos[q0];
    for (int i = 1; i < nq; i++) {
        if (a->q_pos[q0 + i] < qmin) qmin = a->q_pos[q0 + i];
        if (a->q_pos[q0 + i] > qmax) qmax = a->q_pos[q0 + i];
    }
    /* the first visible slot from the front, the last from the back: a
     * prefill row's scan stops at its own slot, a decode row's at once
     * (every pair call asks: a whole scan per call was ~6 % of a prefill
     * on the kit model) */
    const int n = a->n_keys;
    int klo = 0, khi = n;
    while (klo < n && !seen_by_some(a->k_pos[klo], qmin, qmax, a->window)) klo++;
    if (klo == n) khi = 0;
    while (khi > klo && !seen_by_some(a->k_pos[khi - 1], qmin, qmax, a->window)) khi--;
    *klo_out = klo, *khi_out = khi;
}

#if defined(__x86_64__) && !defined(CP_NO_BLAS)
#include <immintrin.h>

#include "exp_avx512.h"

/* One head's rotation, 16 pairs at a time: cpu_rope's operations (two
 * products, then their difference or sum; never a fused multiply-add), so
 * bit for bit its values.  o may be x: a block's two halves are read
 * before either is written.  (The scalar loop does not vectorize at -O2:
 * RoPE was 7 % of a kit-model prefill's layer time.) */
__attribute__((target("avx512f"))) static void rope_head16(float *o, const float *x, const float *c, const float *s, int half)
{
    for (int k = 0; k < half; k += 16) {
        const __mmask16 m = half - k >= 16 ? 0xffff : (__mmask16)((1u << (half - k)) - 1);
        const __m512 a = _mm512_maskz_loadu_ps(m, x + k), b = _mm512_maskz_loadu_ps(m, x + k + half);
        const __m512 vc = _mm512_maskz_loadu_ps(m, c + k), vs = _mm512_maskz_loadu_ps(m, s + k);
        _mm512_mask_storeu_ps(o + k, m, _mm512_sub_ps(_mm512_mul_ps(a, vc), _mm512_mul_ps(b, vs)));
        _mm512_mask_storeu_ps(o + k + half, m, _mm512_add_ps(_mm512_mul_ps(b, vc), _mm512_mul_ps(a, vs)));
    }
}

__attribute__((target("avx512f"))) void cpu_rope_avx512(float *x, int ld, const float *cos, const float *sin, int n, int n_heads,
                                                        int head_dim)
{
    const int half = head_dim / 2;
    const long chunk = cpu_claim_sixteenth(n);
#pragma omp parallel for schedule(dynamic, chunk) if ((long)n * n_heads * head_dim > CPU_SERIAL_ELEMS)
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)i * ld + (size_t)h * head_dim;
            rope_head16(v, v, cos + (size_t)i * half, sin + (size_t)i * half, half);
        }
}

void cpu_place_kv_avx512(float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n,
                         const float *cos, const float *sin, int n_kv_heads, int head_dim)
{
    place_rows(k, k_pre, v, src_k, src_v, src_ld, n, cos, sin, n_kv_heads, head_dim, rope_head16);
}

/* One row of cpu_attn_softmax_rows on 16 lanes: the portable loop's
 * operations (masked max, e^(s - max) by cp_exp16_nonpos, a sum, one
 * scale), then the export and the sensitive mass in the same pass. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void softmax_row_avx512(float *row, const int32_t *kp, int nk, int32_t qp,
                                                                                    int32_t lo, float *ex, float w,
                                                                                    const uint8_t *sc, float *mass, int keep)
{
    const __m512i vq = _mm512_set1_epi32(qp), vlo = _mm512_set1_epi32(lo);
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    int j0 = nk, j1 = 0; /* the 16-key blocks from the first to the last with a key the row sees */
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512i k = _mm512_maskz_loadu_epi32(in, kp + j);
        const __mmask16 vis = in & _mm512_cmple_epi32_mask(k, vq) & _mm512_cmpgt_epi32_mask(k, vlo);
        vmx = _mm512_mask_max_ps(vmx, vis, vmx, _mm512_maskz_loadu_ps(vis, row + j));
        if (vis) j0 = j < j0 ? j : j0, j1 = j + 16;
    }
    /* Without keep, the blocks outside [j0, j1) are skipped: each would add
     * +0 to every sum and export element (exact: they start at +0 or hold
     * sums of non-negative terms), and their probabilities are not kept --
     * the causal triangle of a prefill's block is half of its scores. */
    if (keep || j0 >= j1) j0 = 0, j1 = nk;
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
    __m512 sum = _mm512_setzero_ps();
    for (int j = j0; j < nk && j < j1; j += 16) {
        const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512i k = _mm512_maskz_loadu_epi32(in, kp + j);
        const __mmask16 vis = in & _mm512_cmple_epi32_mask(k, vq) & _mm512_cmpgt_epi32_mask(k, vlo);
        const __m512 e = _mm512_maskz_mov_ps(vis, cp_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(vis, row + j), mx)));
        _mm512_mask_storeu_ps(row + j, in, e);
        sum = _mm512_add_ps(sum, e);
    }
    const float total = _mm512_reduce_add_ps(sum);
    const __m512 inv = _mm512_set1_ps(total > 0 ? 1.0f / total : 0.0f), vw = _mm512_set1_ps(w);
    __m512 m = _mm512_setzero_ps();
    for (int j = j0; j < nk && j < j1; j += 16) {
        const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, row + j), inv);
        if (keep) _mm512_mask_storeu_ps(row + j, in, p);
        if (ex) _mm512_mask_storeu_ps(ex + j, in, _mm512_add_ps(_mm512_maskz_loadu_ps(in, ex + j), _mm512_mul_ps(vw, p)));
        if (sc) {
            const __mmask16 s = _mm512_test_epi32_mask(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(in, sc + j)), _mm512_set1_epi32(0xff));
            m = _mm512_mask_add_ps(m, s, m, p);
        }
    }
    if (sc) {
        const float v = _mm512_reduce_add_ps(m);
        if (v > *mass) *mass = v;
    }
}
#endif

/* One row of the softmax: query q0 + i's scores against slots [klo, klo +
 * nk) become probabilities (kept in row when keep; the AVX-512 row
 * otherwise leaves e^(s - max) there), added to the export and the
 * sensitive mass.  Loops in forms the vectorizer takes (branch-free
 * selects for the keys a row sees, cpu_exp_nonpos for e^x), and the
 * AVX-512 row above where the CPU has it: with libm's scalar expf and a
 * branch per key this was most of an exporting prefill's time (the
 * annotator's layers).  Each row is computed alone, the same way whatever
 * rows or heads share the call. */
static void softmax_row(const cp_attn_args *a, float *row, int q, int klo, int nk, int avx512, int keep)
{
    const int32_t qp = a->q_pos[q], *kp = a->k_pos + klo;
    const int32_t lo = a->window ? qp - a->window : INT32_MIN; /* keys after lo (positions are >= 0) */
    float *ex = a->export_a ? a->export_a + (size_t)q * a->export_ld + klo : NULL;
    const uint8_t *sc = a->sens_mass ? a->sens_cols + klo : NULL;
#if defined(__x86_64__) && !defined(CP_NO_BLAS)
    if (avx512) {
        softmax_row_avx512(row, kp, nk, qp, lo, ex, a->export_weight, sc, sc ? a->sens_mass + q : NULL, keep);
        return;
    }
#else
    (void)avx512;
#endif
    (void)keep; /* the portable loops read the probabilities back from row */
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < nk; j++) {
        const float v = (kp[j] <= qp) & (kp[j] > lo) ? row[j] : -INFINITY;
        mx = v > mx ? v : mx;
    }
#pragma omp simd
    for (int j = 0; j < nk; j++) {
        const float e = cpu_exp_nonpos(row[j] - mx); /* a key not seen: dropped by the select */
        row[j] = (kp[j] <= qp) & (kp[j] > lo) ? e : 0.0f;
    }
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < nk; j++) sum += row[j];
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;
#pragma omp simd
    for (int j = 0; j < nk; j++) row[j] *= inv;
    if (ex) {
        const float w = a->export_weight;
#pragma omp simd
        for (int j = 0; j < nk; j++) ex[j] += w * row[j];
    }
    if (sc) {
        float m = 0;
#pragma omp simd reduction(+ : m)
        for (int j = 0; j < nk; j++) m += sc[j] ? row[j] : 0.0f;
        if (m > a->sens_mass[q]) a->sens_mass[q] = m;
    }
}

static int softmax_avx512(cpu_attn_kernel kernel)
{
#if defined(__x86_64__) && !defined(CP_NO_BLAS)
    return (kernel == CPU_ATTN_AUTO || kernel == CPU_ATTN_AVX512) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    (void)kernel;
    return 0;
#endif
}

void cpu_attn_softmax_rows(const cp_attn_args *a, float *S, int q0, int nq, int klo, int nk)
{
    cpu_attn_softmax_rows_kernel(a, S, q0, nq, klo, nk, CPU_ATTN_AUTO);
}

void cpu_attn_softmax_rows_kernel(const cp_attn_args *a, float *S, int q0, int nq, int klo, int nk, cpu_attn_kernel kernel)
{
    const int avx512 = softmax_avx512(kernel);
#pragma omp parallel for schedule(static) if (nq > 4)
    for (int i = 0; i < nq; i++) softmax_row(a, S + (size_t)i * nk, q0 + i, klo, nk, avx512, 1);
}

void cpu_attn_export_rows(const cp_attn_args *a, float *S, int nh, int q0, int nq, int klo, int nk)
{
    cpu_attn_export_rows_kernel(a, S, nh, q0, nq, klo, nk, CPU_ATTN_AUTO);
}

/* Why one region for every head: the per-head loop made a parallel
 * region (and a pass over the block's export rows) per head and block;
 * here each row's export stays in L1 while its heads are added. */
void cpu_attn_export_rows_kernel(const cp_attn_args *a, float *S, int nh, int q0, int nq, int klo, int nk, cpu_attn_kernel kernel)
{
    const int avx512 = softmax_avx512(kernel);
#pragma omp parallel for schedule(dynamic, 4) if ((long)nq * nh * nk > 16384) /* causal rows skip different key counts */
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < nh; h++) softmax_row(a, S + ((size_t)h * nq + i) * nk, q0 + i, klo, nk, avx512, 0);
}

static void attention_general(const cp_attn_args *a, float *S, cpu_attn_kernel kernel);

void cpu_attention(const cp_attn_args *a, float *S)
{
    cpu_attention_with(a, S, CPU_ATTN_AUTO);
}

void cpu_attention_with(const cp_attn_args *a, float *S, cpu_attn_kernel kernel)
{
#ifndef CP_NO_BLAS
    /* decode (and a few rows): the threaded kernel, not per-head BLAS
     * calls; the libc-only build keeps its double-precision reference */
    if (cpu_attention_decode_fits(a)) {
        cpu_attention_decode(a, S, kernel);
        return;
    }
#endif
    attention_general(a, S, kernel);
}

/* cpu_attention_general without output rows: each head's QK^T product as
 * the loop below makes it (the same call, into its own part of S), then
 * one export pass over a chunk of heads */
static void attention_export_only(const cp_attn_args *a, float *S, cpu_attn_kernel kernel)
{
    const int hd = a->head_dim, qld = a->n_heads * hd, kld = a->n_kv_heads * hd;
    const int group = a->n_heads / a->n_kv_heads, hc = cpu_attn_export_heads(a);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int q0 = 0, nq = 0; q0 < a->n; q0 += nq) {
        nq = cpu_attn_block_rows(a, q0);
        int klo, khi;
        cpu_attn_key_range(a, q0, nq, &klo, &khi);
        if (khi <= klo) continue; /* no key visible: nothing to add */
        const int nk = khi - klo;
        for (int h0 = 0; h0 < a->n_heads; h0 += hc) {
            const int nh = a->n_heads - h0 < hc ? a->n_heads - h0 : hc;
            for (int h = h0; h < h0 + nh; h++) {
                const float *kb = a->k + (size_t)klo * kld + (size_t)(h / group) * hd;
                attn_gemm(1, nq, nk, hd, scale, a->q + (size_t)q0 * qld + (size_t)h * hd, qld, kb, kld, S + (size_t)(h - h0) * nq * nk, nk);
            }
            cpu_attn_export_rows_kernel(a, S, nh, q0, nq, klo, nk, kernel);
        }
    }
}

void cpu_attention_general(const cp_attn_args *a, float *S)
{
    attention_general(a, S, CPU_ATTN_AUTO);
}

static void attention_general(const cp_attn_args *a, float *S, cpu_attn_kernel kernel)
{
    const int hd = a->head_dim, qld = a->n_heads * hd, kld = a->n_kv_heads * hd;
    const int group = a->n_heads / a->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    if (!a->out) {
        attention_export_only(a, S, kernel);
        return;
    }
    for (int q0 = 0, nq; q0 < a->n; q0 += nq) {
        nq = cpu_attn_block_rows(a, q0);
        int klo, khi; /* the key range any query of the block can see: skip the rest */
        cpu_attn_key_range(a, q0, nq, &klo, &khi);
        for (int h = 0; h < a->n_heads; h++) {
            float *out = a->out + (size_t)q0 * qld + (size_t)h * hd;
            if (khi <= klo) {
                for (int i = 0; i < nq; i++) memset(out + (size_t)i * qld, 0, (size_t)hd * sizeof(float));
                continue;
            }
            const int nk = khi - klo, g = h / group;
            const float *kb = a->k + (size_t)klo * kld + (size_t)g * hd;
            const float *vb = a->v + (size_t)klo * kld + (size_t)g * hd;
            attn_gemm(1, nq, nk, hd, scale, a->q + (size_t)q0 * qld + (size_t)h * hd, qld, kb, kld, S, nk);
            cpu_attn_softmax_rows_kernel(a, S, q0, nq, klo, nk, kernel);
            attn_gemm(0, nq, hd, nk, 1.0f, S, nk, vb, kld, out, qld);
        }
    }
}

size_t cpu_attention_decode_scratch_floats(const cp_attn_args *a)
{
    const size_t group = (size_t)(a->n_heads / a->n_kv_heads);
    return (size_t)a->n * a->n_kv_heads * CPU_ATTN_DECODE_PER(group, a->n_keys, a->head_dim);
}

size_t cpu_attention_kv16_scratch_floats(const cp_attn_args *a)
{
    return cpu_attention_decode_scratch_floats(a);
}

static inline const float *kv_row(const float *f, const uint16_t *h, size_t off, float *w, int hd)
{
    if (f) return f + off;
#pragma omp simd
    for (int d = 0; d < hd; d++) w[d] = cp_bf16_to_f32(h[off + d]);
    return w;
}

/* The portable decode kernel: one query row i against one KV head g (its
 * group of query heads), f32 or bf16 KV: the scores of every key for the
 * group's heads (S: group x n_keys), the softmax, and the weighted sum of
 * the values into out -- a bf16 row widened into w (head_dim floats) once
 * for the whole group; mx and inv (group floats each): each head's max
 * score and 1 / its sum.  Loops gcc vectorizes; what the device check's
 * libc-only build runs, and the fallback where AVX-512 is missing. */
void cpu_attn_decode_pair_c(const cp_attn_args *a, int i, int g, float *S, float *w)
{
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads, nk = a->n_keys;
    const size_t qld = (size_t)a->n_heads * hd, kld = (size_t)a->n_kv_heads * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const int32_t qp = a->q_pos[i];
    const float *q = a->q + (size_t)i * qld + (size_t)g * group * hd;
    float *out = a->out + (size_t)i * qld + (size_t)g * group * hd;
    float *mx = S + (size_t)group * nk, *inv = mx + group;
    for (int h = 0; h < group; h++) mx[h] = -INFINITY;
    int any = 0;
    for (int j = 0; j < nk; j++) {
        if (!visible(a->k_pos[j], qp, a->window)) {
            for (int h = 0; h < group; h++) S[(size_t)h * nk + j] = 0; /* read (and dropped) by the vectorized softmax */
            continue;
        }
        any = 1;
        const float *kr = kv_row(a->k, a->k16, (size_t)j * kld + (size_t)g * hd, w, hd);
        for (int h = 0; h < group; h++) {
            const float *qh = q + (size_t)h * hd;
            float acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int d = 0; d < hd; d++) acc += qh[d] * kr[d];
            float sc = acc * scale;
            S[(size_t)h * nk + j] = sc;
            if (sc > mx[h]) mx[h] = sc;
        }
    }
    for (int h = 0; h < group; h++) memset(out + (size_t)h * hd, 0, (size_t)hd * sizeof(float));
    if (!any) return; /* no key visible: zeros, as cpu_attention gives */
    for (int h = 0; h < group; h++) {
        float *row = S + (size_t)h * nk, sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < nk; j++) {
            int vis = visible(a->k_pos[j], qp, a->window);
            float e = vis ? cpu_exp_nonpos(row[j] - mx[h]) : 0.0f;
            row[j] = e;
            sum += e;
        }
        inv[h] = 1.0f / sum; /* > 0: the max's own term is 1 */
    }
    const int er = cpu_attn_export_dst(a, i);
    if ((a->export_a || a->sens_mass) && er >= 0) /* from these scores, with the general kernels' arithmetic */
        for (int h = 0; h < group; h++) {
            const float *row = S + (size_t)h * nk;
            float *ex = a->export_a ? a->export_a + (size_t)er * a->export_ld : NULL;
            const float w = a->export_weight, iv = inv[h];
            float m = 0;
            for (int j = 0; j < nk; j++) {
                const float p = row[j] * iv;
                if (ex) ex[j] += w * p;
                if (a->sens_mass && a->sens_cols[j]) m += p;
            }
            if (a->sens_mass && m > a->sens_mass[er]) a->sens_mass[er] = m;
        }
    for (int j = 0; j < nk; j++) {
        if (!visible(a->k_pos[j], qp, a->window)) continue;
        const float *vr = kv_row(a->v, a->v16, (size_t)j * kld + (size_t)g * hd, w, hd);
        for (int h = 0; h < group; h++) {
            const float p = S[(size_t)h * nk + j];
            float *o = out + (size_t)h * hd;
#pragma omp simd
            for (int d = 0; d < hd; d++) o[d] += p * vr[d];
        }
    }
    for (int h = 0; h < group; h++)
        for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] *= inv[h];
}

cpu_attn_kernel cpu_attn_pair_kernel(int head_dim, cpu_attn_kernel k)
{
    if (k == CPU_ATTN_PORTABLE) return k;
#if !defined(CP_NO_BLAS) && defined(__x86_64__)
    if (head_dim % 16) return CPU_ATTN_PORTABLE;
    if (k != CPU_ATTN_AVX2 && __builtin_cpu_supports("avx512f")) return CPU_ATTN_AVX512;
    if (k != CPU_ATTN_AVX512 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CPU_ATTN_AVX2;
#else
    (void)head_dim;
#endif
    return CPU_ATTN_PORTABLE;
}

const char *cpu_attn_kernel_name(cpu_attn_kernel k)
{
    return k == CPU_ATTN_AVX512 ? "AVX-512" : k == CPU_ATTN_AVX2 ? "AVX2" : k == CPU_ATTN_PORTABLE ? "portable loops" : "automatic";
}

/* one (row i, KV head g) pair of a decode call with kernel k (S its
 * scratch of CPU_ATTN_DECODE_PER floats, the tile at its end) */
static inline void decode_pair(const cp_attn_args *a, cpu_attn_kernel k, int i, int g, float *S, size_t per)
{
    float *w = S + per - CPU_ATTN_DECODE_TILE * (size_t)a->head_dim;
#if !defined(CP_NO_BLAS) && defined(__x86_64__)
    if (k == CPU_ATTN_AVX512) {
        cpu_attn_decode_pair_avx512(a, i, g, S, w);
        return;
    }
    if (k == CPU_ATTN_AVX2) {
        cpu_attn_decode_pair_avx2(a, i, g, S, w);
        return;
    }
#else
    (void)k; /* the portable loops are all this build has */
#endif
    cpu_attn_decode_pair_c(a, i, g, S, w);
}

/* Threaded above 2^18 multiply-adds (~10 us on one core, several times a
 * fork and join): at 14 heads x 64 dims from 293 keys on */
#define DECODE_PARALLEL_FMAS (1L << 18)

void cpu_attention_decode(const cp_attn_args *a, float *scratch, cpu_attn_kernel kernel)
{
    const int pairs = a->n * a->n_kv_heads, group = a->n_heads / a->n_kv_heads;
    const size_t per = CPU_ATTN_DECODE_PER((size_t)group, a->n_keys, a->head_dim);
    const cpu_attn_kernel k = cpu_attn_pair_kernel(a->head_dim, kernel);
    /* (row, KV head) pairs over the threads: the 0.5B shape's decode row
     * is 2 pairs, one a core; each pair's arithmetic is the same on any
     * thread and beside any other rows */
    const long fmas = (long)a->n * a->n_heads * a->n_keys * a->head_dim;
    if (a->export_a || a->sens_mass) { /* a row's KV heads add into its one export row: a row a thread, its heads in order */
#pragma omp parallel for schedule(static) if (a->n > 1 && fmas > DECODE_PARALLEL_FMAS)
        for (int i = 0; i < a->n; i++)
            for (int g = 0; g < a->n_kv_heads; g++) decode_pair(a, k, i, g, scratch + ((size_t)i * a->n_kv_heads + g) * per, per);
        return;
    }
#pragma omp parallel for schedule(static) if (pairs > 1 && fmas > DECODE_PARALLEL_FMAS)
    for (int p = 0; p < pairs; p++) decode_pair(a, k, p / a->n_kv_heads, p % a->n_kv_heads, scratch + (size_t)p * per, per);
}

/* an exporting call's row is one work item, its KV heads in order: they
 * add into the row's one export row and sensitive mass (two threads
 * adding into it raced, and their order changed its bits) */
static int decode_exports(const cp_attn_args *a) { return a->export_a || a->sens_mass; }

size_t cpu_attention_decode_many_plan(const cp_attn_args *a, int count, int *first, size_t *off)
{
    size_t floats = 0;
    int pairs = 0;
    for (int c = 0; c < count; c++) {
        const size_t group = (size_t)(a[c].n_heads / a[c].n_kv_heads);
        first[c] = pairs, off[c] = floats;
        pairs += decode_exports(&a[c]) ? a[c].n : a[c].n * a[c].n_kv_heads;
        floats += (size_t)a[c].n * a[c].n_kv_heads * CPU_ATTN_DECODE_PER(group, a[c].n_keys, a[c].head_dim);
    }
    first[count] = pairs;
    return floats;
}

/* the call work item p belongs to: the last c with first[c] <= p */
static int decode_item_call(const int *first, int count, int p)
{
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (first[mid] <= p) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void cpu_attention_decode_many(const cp_attn_args *a, int count, const int *first, const size_t *off, float *scratch,
                               cpu_attn_kernel kernel)
{
    long fmas = 0;
    for (int c = 0; c < count; c++) fmas += (long)a[c].n * a[c].n_heads * a[c].n_keys * a[c].head_dim;
    const int pairs = first[count];
    /* dynamic: the sequences' key counts differ, so equal shares of pairs
     * are not equal work; which thread takes a pair changes no bit */
#pragma omp parallel for schedule(dynamic, 1) if (pairs > 1 && fmas > DECODE_PARALLEL_FMAS)
    for (int p = 0; p < pairs; p++) {
        const int c = decode_item_call(first, count, p), r = p - first[c];
        const cp_attn_args *ac = &a[c];
        const size_t per = CPU_ATTN_DECODE_PER((size_t)(ac->n_heads / ac->n_kv_heads), ac->n_keys, ac->head_dim);
        const cpu_attn_kernel k = cpu_attn_pair_kernel(ac->head_dim, kernel);
        if (decode_exports(ac))
            for (int g = 0; g < ac->n_kv_heads; g++)
                decode_pair(ac, k, r, g, scratch + off[c] + ((size_t)r * ac->n_kv_heads + g) * per, per);
        else
            decode_pair(ac, k, r / ac->n_kv_heads, r % ac->n_kv_heads, scratch + off[c] + (size_t)r * per, per);
    }
}

#ifndef CP_NO_BLAS
/* whether a call's rows go CPU_ATTN_ROW_BLOCK at a time through the AVX2
 * or AVX-512 block kernel (the same bits as its pairs): an f32 cache,
 * several rows */
static int rows_in_blocks(const cp_attn_args *a, cpu_attn_kernel k)
{
#if defined(__x86_64__)
    return (k == CPU_ATTN_AVX2 || k == CPU_ATTN_AVX512) && !a->k16 && a->n > 1 && a->n_heads / a->n_kv_heads <= 16;
#else
    (void)a, (void)k;
    return 0;
#endif
}

size_t cpu_attention_rows_scratch_floats(const cp_attn_args *a, int threads, cpu_attn_kernel kernel)
{
    const size_t group = (size_t)(a->n_heads / a->n_kv_heads);
    const size_t pairs = rows_in_blocks(a, cpu_attn_pair_kernel(a->head_dim, kernel)) ? CPU_ATTN_ROW_BLOCK : 1;
    return (size_t)(threads > 1 ? threads : 1) * pairs * CPU_ATTN_DECODE_PER(group, a->n_keys, a->head_dim);
}

#if defined(__x86_64__)
typedef void (*attn_pair_fn)(const cp_attn_args *, int, int, float *, float *);
typedef void (*attn_run_fn)(const cp_attn_args *, int, int, const int *, int, int, float *, float *);

/* Rows [i0, i0 + nr) of a block kernel: runs of consecutive rows that see
 * keys from one first slot and end within CPU_ATTN_ROW_SLACK slots of each
 * other go together (keys scored past a row's own range are work thrown
 * away: a reuse prefill's rows come a few at each segment's start, then
 * the tail and the question in a row); a row in no run is a pair of its
 * own, as are all where a row's vectors outnumber what a run holds (more
 * than 16 query heads a KV head) or the cache is bf16 */
static void rows_in_runs(const cp_attn_args *a, int i0, int nr, int g, float *S, float *tile, attn_pair_fn pair, attn_run_fn run)
{
    int klo[CPU_ATTN_ROW_BLOCK], khi[CPU_ATTN_ROW_BLOCK];
    if (nr > CPU_ATTN_ROW_BLOCK) nr = CPU_ATTN_ROW_BLOCK;
    if (a->n_heads / a->n_kv_heads > 16 || a->k16) {
        for (int r = 0; r < nr; r++) pair(a, i0 + r, g, S, tile);
        return;
    }
    for (int r = 0; r < nr; r++) cpu_attn_key_range(a, i0 + r, 1, &klo[r], &khi[r]);
    for (int r = 0, e; r < nr; r = e) {
        int lo = khi[r], hi = khi[r];
        for (e = r + 1; khi[r] > klo[r] && e < nr && khi[e] > klo[e] && klo[e] == klo[r]; e++) {
            const int l2 = khi[e] < lo ? khi[e] : lo, h2 = khi[e] > hi ? khi[e] : hi;
            if (h2 - l2 > CPU_ATTN_ROW_SLACK) break;
            lo = l2, hi = h2;
        }
        if (e - r == 1) pair(a, i0 + r, g, S, tile);
        else run(a, i0 + r, e - r, khi + r, klo[r], g, S, tile);
    }
}

void cpu_attn_rows_block_avx2(const cp_attn_args *a, int i0, int nr, int g, float *S, float *tile)
{
    rows_in_runs(a, i0, nr, g, S, tile, cpu_attn_decode_pair_avx2, cpu_attn_rows_together_avx2);
}

void cpu_attn_rows_block_avx512(const cp_attn_args *a, int i0, int nr, int g, float *S, float *tile)
{
    rows_in_runs(a, i0, nr, g, S, tile, cpu_attn_decode_pair_avx512, cpu_attn_rows_together_avx512);
}
#endif

static void rows_block(const cp_attn_args *a, cpu_attn_kernel k, int b, int g, float *S, size_t per)
{
    const int i0 = b * CPU_ATTN_ROW_BLOCK, nr = a->n - i0 < CPU_ATTN_ROW_BLOCK ? a->n - i0 : CPU_ATTN_ROW_BLOCK;
#if defined(__x86_64__)
    float *tile = S + CPU_ATTN_ROW_BLOCK * per - CPU_ATTN_DECODE_TILE * (size_t)a->head_dim;
    if (k == CPU_ATTN_AVX512) cpu_attn_rows_block_avx512(a, i0, nr, g, S, tile);
    else cpu_attn_rows_block_avx2(a, i0, nr, g, S, tile);
#else
    (void)a, (void)k, (void)i0, (void)nr, (void)g, (void)S, (void)per;
#endif
}

void cpu_attention_rows(const cp_attn_args *a, float *scratch, int threads, cpu_attn_kernel kernel)
{
    const int pairs = a->n * a->n_kv_heads;
    const size_t per = CPU_ATTN_DECODE_PER((size_t)(a->n_heads / a->n_kv_heads), a->n_keys, a->head_dim);
    const cpu_attn_kernel k = cpu_attn_pair_kernel(a->head_dim, kernel);
    const long fmas = (long)a->n * a->n_heads * a->n_keys * a->head_dim;
    if (threads < 1) threads = 1;
    if (rows_in_blocks(a, k)) {
        const int blocks = (a->n + CPU_ATTN_ROW_BLOCK - 1) / CPU_ATTN_ROW_BLOCK, items = blocks * a->n_kv_heads;
        const size_t tp = CPU_ATTN_ROW_BLOCK * per;
        if (a->export_a || a->sens_mass) { /* as below: a block's rows on one thread, their heads in order */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (blocks > 1 && fmas > DECODE_PARALLEL_FMAS)
            for (int b = 0; b < blocks; b++)
                for (int g = 0; g < a->n_kv_heads; g++) rows_block(a, k, b, g, scratch + (size_t)omp_get_thread_num() * tp, per);
            return;
        }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (items > 1 && fmas > DECODE_PARALLEL_FMAS)
        for (int p = 0; p < items; p++)
            rows_block(a, k, p / a->n_kv_heads, p % a->n_kv_heads, scratch + (size_t)omp_get_thread_num() * tp, per);
        return;
    }
    if (a->export_a || a->sens_mass) { /* a row's KV heads add into its one export row: a row a thread, its heads in order */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (a->n > 1 && fmas > DECODE_PARALLEL_FMAS)
        for (int i = 0; i < a->n; i++)
            for (int g = 0; g < a->n_kv_heads; g++) decode_pair(a, k, i, g, scratch + (size_t)omp_get_thread_num() * per, per);
        return;
    }
    /* dynamic: a causal prefill's rows see more keys the later they come;
     * which thread (and so which scratch) takes a pair changes no bit */
#pragma omp parallel for schedule(dynamic, 2) num_threads(threads) if (pairs > 1 && fmas > DECODE_PARALLEL_FMAS)
    for (int p = 0; p < pairs; p++)
        decode_pair(a, k, p / a->n_kv_heads, p % a->n_kv_heads, scratch + (size_t)omp_get_thread_num() * per, per);
}
#endif

void cpu_attention_kv16(const cp_attn_args *a, float *scratch)
{
    cpu_attention_decode(a, scratch, CPU_ATTN_AUTO);
}

/* mass of the unnormalised probabilities at or above t */
static double mass_from(const float *l, int n, float mx, float temp, double t)
{
    double m = 0;
    for (int i = 0; i < n; i++) {
        double p = exp(((double)l[i] - mx) / temp);
        if (p >= t) m += p;
    }
    return m;
}

int32_t cpu_sample(const float *l, int n, float temp, float top_p, float u)
{
    if (n < 1 || !(temp >= 0) || !(top_p > 0 && top_p <= 1) || !(u >= 0 && u < 1)) return -1;
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    if (temp == 0) return best;
    float mx = l[best];
    double target = top_p * mass_from(l, n, mx, temp, 0), lo = 0, hi = 1; /* the top id has p = 1 */
    for (int it = 0; it < 60; it++) { /* the largest t whose kept mass still reaches top_p */
        double mid = 0.5 * (lo + hi);
        if (mass_from(l, n, mx, temp, mid) >= target) lo = mid;
        else hi = mid;
    }
    double kept = mass_from(l, n, mx, temp, lo), want = u * kept, acc = 0;
    int last = best;
    for (int i = 0; i < n; i++) {
        double p = exp(((double)l[i] - mx) / temp);
        if (p < lo) continue;
        last = i;
        if ((acc += p) > want) return i;
    }
    return last;
}

/* One pass per row: K_pre and V copied, K rotated from the copied K_pre
 * with cpu_rope's arithmetic (bit-equal to rotating in place).  No OpenMP:
 * placement comes in runs of a pool block (16 rows) per layer, and a
 * parallel region per run cost more than the rows (measured with
 * profiling/prof_reuse: placement's wall time, most of it waking threads). */
void cpu_place_kv(float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n, const float *cos,
                  const float *sin, int n_kv_heads, int head_dim)
{
    place_rows(k, k_pre, v, src_k, src_v, src_ld, n, cos, sin, n_kv_heads, head_dim, rope_head_c);
}

void cpu_kv_store_bf16(uint16_t *dst, float *src, size_t count)
{
#pragma omp parallel for schedule(static) if (count > 65536)
    for (size_t i = 0; i < count; i++) {
        dst[i] = cp_f32_to_bf16(src[i]);
        src[i] = cp_bf16_to_f32(dst[i]);
    }
}

/* The reused K is rotated in f32 from the stored bf16 K_pre and rounded
 * once: the same arithmetic as the in-place path (which rounds K_pre first,
 * kv_store_bf16, then rotates the rounded values with the same RoPE tables),
 * so a segment placed at position p holds bit for bit the K that computing
 * that K_pre at p stores; against rotating exact f32 values the one rounding
 * adds at most half a bf16 ulp (2^-9 relative) per element. */
void cpu_place_kv_bf16(uint16_t *k, uint16_t *k_pre, uint16_t *v, const uint16_t *src_k, const uint16_t *src_v, size_t src_ld, int n,
                       const float *cos, const float *sin, int n_kv_heads, int head_dim)
{
    const size_t row = (size_t)n_kv_heads * head_dim;
    const int half = head_dim / 2;
    for (int t = 0; t < n; t++) {
        memcpy(k_pre + t * row, src_k + t * src_ld, row * sizeof *k_pre);
        memcpy(v + t * row, src_v + t * src_ld, row * sizeof *v);
        const float *c = cos + (size_t)t * half, *s = sin + (size_t)t * half;
        for (int h = 0; h < n_kv_heads; h++) {
            const uint16_t *x = k_pre + t * row + (size_t)h * head_dim;
            uint16_t *o = k + t * row + (size_t)h * head_dim;
            for (int j = 0; j < half; j++) { /* cpu_rope's arithmetic, on the widened values */
                float a = cp_bf16_to_f32(x[j]), b = cp_bf16_to_f32(x[j + half]);
                o[j] = cp_f32_to_bf16(a * c[j] - b * s[j]);
                o[j + half] = cp_f32_to_bf16(b * c[j] + a * s[j]);
            }
        }
    }
}
