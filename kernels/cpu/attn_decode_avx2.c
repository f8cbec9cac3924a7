/* The attention pair kernel on AVX2 + FMA (ops_cpu.h, cpu_attention_decode
 * and cpu_attention_rows): attn_decode.c's AVX-512 kernel on 8 lanes, for
 * the x86-64 CPUs without AVX-512 (AMD before Zen 4, Intel's client parts
 * and servers before Skylake-SP).  Built in the BLAS builds only.
 *
 * Why: on such a CPU every prefill's attention went through the portable
 * loops -- a horizontal sum per key and head, every slot of the cache
 * visited whether the row sees it or not -- at ~10 GFLOP/s on two Zen 3
 * cores, two thirds of a kit-model prefill (docs/RESULTS.md).  Here, as
 * in the AVX-512 kernel, only the row's visible key range is read, the
 * scores of 8 keys for one head come from hd/8 FMAs a key and one
 * transposing reduction, the softmax runs 8 lanes with cp_exp8_nonpos,
 * and the weighted sum keeps up to 4 heads x 16 dims in registers while
 * the value rows stream past once per 16 dims.
 *
 * Every (row, KV head) pair runs the same code in the same order whatever
 * the other rows are or which thread takes it: a row's output is bit for
 * bit its lone run's (continuous batching relies on that).  A prefill's
 * rows go through the block kernel (cpu_attn_rows_block_avx2), which runs
 * each row's pair arithmetic but reads every 8-key block of K once for a
 * run of rows and every value row once for 4 (row, head) vectors: a pair
 * alone streamed its KV head's whole range from L2 for each row
 * (one thread, 180 rows over 700 keys at the kit model's heads: 5.3 ->
 * 3.2 ms). */
#ifndef CP_NO_BLAS
#include "ops_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "exp_avx2.h"

#define T2 __attribute__((target("avx2,fma")))
#define T2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

/* r[j] = the sum of a[j]'s 8 lanes, j = 0..7: two levels of horizontal
 * adds within the 128-bit halves, then the halves added */
T2_INLINE __m256 hsum8(const __m256 a[8])
{
    const __m256 b0 = _mm256_hadd_ps(a[0], a[1]), b1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 b2 = _mm256_hadd_ps(a[4], a[5]), b3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 c0 = _mm256_hadd_ps(b0, b1), c1 = _mm256_hadd_ps(b2, b3); /* half h of c0: a[0..3]'s half-h sums */
    return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
}

/* s[0..7] = scale * q . k_j for the 8 key rows k + j * ldk (hd floats,
 * hd % 8 == 0) */
T2_INLINE void scores8(const float *q, const float *k, size_t ldk, int hd, float scale, float *s)
{
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        const __m256 qd = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8 /* the accumulators stay in registers only when unrolled */
        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + (size_t)j * ldk + d), acc[j]);
    }
    _mm256_storeu_ps(s, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));
}

/* rows [0, nr) of bf16 (src, ld apart) widened into dst (hd apart), rows
 * [nr, rows) zero: the tile a block of keys or values is read from */
T2 static void widen_rows8(float *dst, const uint16_t *src, size_t ld, int nr, int rows, int hd)
{
    for (int j = 0; j < rows; j++) {
        float *o = dst + (size_t)j * hd;
        if (j >= nr) {
            for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(o + d, _mm256_setzero_ps());
            continue;
        }
        const uint16_t *r = src + (size_t)j * ld;
        for (int d = 0; d < hd; d += 8) {
            const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(r + d)));
            _mm256_storeu_ps(o + d, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    }
}

/* rows [0, nr) of f32 copied into dst, the rest of 8 zero (a tail block) */
T2 static void copy_rows8(float *dst, const float *src, size_t ld, int nr, int hd)
{
    for (int j = 0; j < 8; j++)
        for (int d = 0; d < hd; d += 8)
            _mm256_storeu_ps(dst + (size_t)j * hd + d, j < nr ? _mm256_loadu_ps(src + (size_t)j * ld + d) : _mm256_setzero_ps());
}

/* out_m[c0 .. c0 + 16) += sum_j P_m[j] v_j[...] for NV vectors m, each
 * its own score row P[m] and output row out[m] (a pair's heads, or the
 * heads of several rows): NV x 2 accumulators in registers, one chain per
 * vector and 8 dims over the keys in order, each value vector loaded once
 * for all NV */
T2_INLINE void pv_list8(const int NV, const float *const *P, float *const *out, const float *v, size_t ldv, int nk, int c0)
{
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int m = 0; m < NV; m++)
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) acc[m][c] = _mm256_loadu_ps(out[m] + c0 + 8 * c);
    for (int j = 0; j < nk; j++) {
        __m256 x0 = _mm256_loadu_ps(v + (size_t)j * ldv + c0), x1 = _mm256_loadu_ps(v + (size_t)j * ldv + c0 + 8);
        __asm__("" : "+x"(x0), "+x"(x1)); /* loaded once into registers, not once a vector as a memory operand */
#pragma GCC unroll 4
        for (int m = 0; m < NV; m++) {
            const __m256 p = _mm256_broadcast_ss(P[m] + j);
            acc[m][0] = _mm256_fmadd_ps(p, x0, acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(p, x1, acc[m][1]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < NV; m++)
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) _mm256_storeu_ps(out[m] + c0 + 8 * c, acc[m][c]);
}

/* pv_list8 over every 16 dims for nv vectors, 4 at a time: NV a constant
 * in each instance */
T2 static void pv_lists8(const float *const *P, float *const *out, int nv, const float *v, size_t ldv, int nk, int hd)
{
    for (int m0 = 0; m0 < nv; m0 += 4) {
        const int m = nv - m0 < 4 ? nv - m0 : 4;
        for (int c0 = 0; c0 < hd; c0 += 16) {
            switch (m) {
            case 1: pv_list8(1, P + m0, out + m0, v, ldv, nk, c0); break;
            case 2: pv_list8(2, P + m0, out + m0, v, ldv, nk, c0); break;
            case 3: pv_list8(3, P + m0, out + m0, v, ldv, nk, c0); break;
            default: pv_list8(4, P + m0, out + m0, v, ldv, nk, c0); break;
            }
        }
    }
}

/* one pair's weighted sum: nh heads' score rows ldp apart, output rows hd
 * apart, through pv_lists8 four heads at a time */
T2 static void pv_rows8(const float *P, size_t ldp, int nh, const float *v, size_t ldv, int nk, float *out, int hd)
{
    for (int h0 = 0; h0 < nh; h0 += 4) {
        const float *Ph[4];
        float *Oh[4];
        const int m = nh - h0 < 4 ? nh - h0 : 4;
        for (int h = 0; h < m; h++) Ph[h] = P + (size_t)(h0 + h) * ldp, Oh[h] = out + (size_t)(h0 + h) * hd;
        pv_lists8(Ph, Oh, m, v, ldv, nk, hd);
    }
}

/* lanes j < n all ones (n >= 8: every lane) */
T2_INLINE __m256i first_lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* the visible keys among the 8 slots at kp (in: the slots that exist;
 * the others are not read): k <= qp and k > lo, as all ones */
T2_INLINE __m256i visible8(const int32_t *kp, __m256i in, __m256i vq, __m256i vlo)
{
    const __m256i k = _mm256_maskload_epi32(kp, in);
    return _mm256_and_si256(_mm256_andnot_si256(_mm256_cmpgt_epi32(k, vq), _mm256_cmpgt_epi32(k, vlo)), in);
}

T2_INLINE float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

T2_INLINE float hadd8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* row = e^(row - max) over the visible keys, 0 elsewhere, for the slots
 * [0, nk) (row holds whole 8-key blocks); returns 1 / the sum (the range
 * holds a visible key: its max's own term is 1) */
T2 static float softmax_row8(float *row, const int32_t *kp, int nk, int32_t qp, int32_t lo)
{
    const __m256i vq = _mm256_set1_epi32(qp), vlo = _mm256_set1_epi32(lo);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmx = ninf;
    for (int j = 0; j < nk; j += 8) {
        const __m256 vis = _mm256_castsi256_ps(visible8(kp + j, first_lanes(nk - j), vq, vlo));
        vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(row + j), vis));
    }
    const __m256 mx = _mm256_set1_ps(hmax8(vmx));
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < nk; j += 8) {
        const __m256 vis = _mm256_castsi256_ps(visible8(kp + j, first_lanes(nk - j), vq, vlo));
        const __m256 e = _mm256_and_ps(vis, cp_exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row + j), mx)));
        _mm256_storeu_ps(row + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / hadd8(sum);
}

/* The export and the sensitive mass of row i's heads from the pair's own
 * scores: S's rows hold e^(s - max) over the slots [klo, klo + nk) (0
 * where a key is not seen), inv each head's 1 / sum.  The general
 * kernels' arithmetic on them (p = e x inv, export += w x p head after
 * head, the mass a sum of p over sensitive slots, kept when larger): the
 * export row read and written once a block of keys for up to 16 heads, the
 * sensitive slots' mask made once for them. */
T2 static void pair_export8(const cp_attn_args *a, int i, const float *S, size_t ldS, const float *inv, int group, int klo, int nk)
{
    i = cpu_attn_export_dst(a, i);
    if (i < 0) return; /* a row no export wants */
    float *ex = a->export_a ? a->export_a + (size_t)i * a->export_ld + klo : NULL;
    const uint8_t *sc = a->sens_mass ? a->sens_cols + klo : NULL;
    const __m256 vw = _mm256_set1_ps(a->export_weight);
    for (int h0 = 0; h0 < group; h0 += 16) {
        const int nh = group - h0 < 16 ? group - h0 : 16;
        __m256 m[16];
        for (int h = 0; h < nh; h++) m[h] = _mm256_setzero_ps();
        for (int j = 0; j < nk; j += 8) {
            const __m256i in = first_lanes(nk - j);
            __m256 hit = _mm256_setzero_ps();
            if (sc) {
                uint8_t cb[8] = { 0 }; /* a copy: sens_cols ends at n_keys */
                memcpy(cb, sc + j, (size_t)(nk - j < 8 ? nk - j : 8));
                int64_t c8;
                memcpy(&c8, cb, sizeof c8);
                const __m256i c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(c8));
                hit = _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpeq_epi32(c, _mm256_setzero_si256()), in));
            }
            __m256 e = ex ? _mm256_maskload_ps(ex + j, in) : _mm256_setzero_ps();
            for (int h = 0; h < nh; h++) {
                const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(S + (size_t)(h0 + h) * ldS + j), _mm256_set1_ps(inv[h0 + h]));
                if (ex) e = _mm256_add_ps(e, _mm256_mul_ps(vw, p));
                if (sc) m[h] = _mm256_add_ps(m[h], _mm256_and_ps(hit, p));
            }
            if (ex) _mm256_maskstore_ps(ex + j, in, e);
        }
        for (int h = 0; sc && h < nh; h++) {
            const float v = hadd8(m[h]);
            if (v > a->sens_mass[i]) a->sens_mass[i] = v;
        }
    }
}

T2 void cpu_attn_rows_together_avx2(const cp_attn_args *a, int i0, int m, const int *khi, int kl, int g, float *S, float *tile)
{
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const size_t qld = (size_t)a->n_heads * hd, kld = (size_t)a->n_kv_heads * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    int hi = khi[0], nc = khi[0] - kl;
    for (int t = 1; t < m; t++) {
        if (khi[t] > hi) hi = khi[t];
        if (khi[t] - kl < nc) nc = khi[t] - kl;
    }
    const int nu = hi - kl;
    const size_t ldS = ((size_t)nu + 7) & ~(size_t)7;
    float *inv = S + (size_t)m * group * ldS;
    float *P[CPU_ATTN_ROW_BLOCK * 16], *O[CPU_ATTN_ROW_BLOCK * 16]; /* every (row, head) vector: group <= 16 */
    for (int t = 0; t < m; t++)
        for (int h = 0; h < group; h++) {
            P[t * group + h] = S + ((size_t)t * group + h) * ldS;
            O[t * group + h] = a->out + (size_t)(i0 + t) * qld + ((size_t)g * group + h) * hd;
            for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(O[t * group + h] + d, _mm256_setzero_ps());
        }
    /* the scores of every key of the rows' range, one 8-key block of K at
     * a time for all of their vectors (it stays in L1 between them): each
     * key's score is its own sum, whichever block it is read in */
    const float *kf = a->k + (size_t)kl * kld + (size_t)g * hd, *vf = a->v + (size_t)kl * kld + (size_t)g * hd;
    for (int j0 = 0; j0 < nu; j0 += 8) {
        const int nb = nu - j0 < 8 ? nu - j0 : 8;
        const float *kb = kf + (size_t)j0 * kld;
        size_t ldk = kld;
        if (nb < 8) copy_rows8(tile, kb, kld, nb, hd), kb = tile, ldk = (size_t)hd;
        for (int t = 0; t < m; t++) {
            const float *q = a->q + (size_t)(i0 + t) * qld + (size_t)g * group * hd;
            for (int h = 0; h < group; h++) scores8(q + (size_t)h * hd, kb, ldk, hd, scale, P[t * group + h] + j0);
        }
    }
    /* each row's softmax and export over its own range, as its pair */
    for (int t = 0; t < m; t++) {
        const int nk = khi[t] - kl;
        const int32_t qp = a->q_pos[i0 + t], lo = a->window ? qp - a->window : INT32_MIN;
        for (int h = 0; h < group; h++) inv[t * group + h] = softmax_row8(P[t * group + h], a->k_pos + kl, nk, qp, lo);
        if (a->export_a || a->sens_mass) pair_export8(a, i0 + t, P[t * group], ldS, inv + (size_t)t * group, group, kl, nk);
    }
    /* the weighted sums: the keys every row sees for all vectors together,
     * then each row's further keys alone -- each chain over its keys in
     * order, as in its pair */
    pv_lists8((const float *const *)P, O, m * group, vf, kld, nc, hd);
    for (int t = 0; t < m; t++) {
        const int nk = khi[t] - kl;
        if (nk == nc) continue;
        const float *Pt[16];
        for (int h = 0; h < group; h++) Pt[h] = P[t * group + h] + nc;
        pv_lists8(Pt, O + (size_t)t * group, group, vf + (size_t)nc * kld, kld, nk - nc, hd);
    }
    for (int v = 0; v < m * group; v++) {
        const __m256 s = _mm256_set1_ps(inv[v]);
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(O[v] + d, _mm256_mul_ps(_mm256_loadu_ps(O[v] + d), s));
    }
}

T2 void cpu_attn_decode_pair_avx2(const cp_attn_args *a, int i, int g, float *S, float *tile)
{
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const size_t qld = (size_t)a->n_heads * hd, kld = (size_t)a->n_kv_heads * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *q = a->q + (size_t)i * qld + (size_t)g * group * hd;
    float *out = a->out + (size_t)i * qld + (size_t)g * group * hd;
    for (int h = 0; h < group; h++)
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(out + (size_t)h * hd + d, _mm256_setzero_ps());
    int klo, khi;
    cpu_attn_key_range(a, i, 1, &klo, &khi);
    if (khi <= klo) return; /* no key visible: zeros, as cpu_attention gives */
    const int nk = khi - klo;
    const size_t ldS = ((size_t)nk + 7) & ~(size_t)7; /* whole 8-key blocks of scores */
    const int bf = a->k16 != NULL;
    const float *kf = bf ? NULL : a->k + (size_t)klo * kld + (size_t)g * hd;
    const float *vf = bf ? NULL : a->v + (size_t)klo * kld + (size_t)g * hd;
    const uint16_t *kh = bf ? a->k16 + (size_t)klo * kld + (size_t)g * hd : NULL;
    const uint16_t *vh = bf ? a->v16 + (size_t)klo * kld + (size_t)g * hd : NULL;
    /* scores, 8 keys at a time: a bf16 block (or a short last one) first
     * widened into tile, then read by every head of the group */
    for (int j0 = 0; j0 < nk; j0 += 8) {
        const int nb = nk - j0 < 8 ? nk - j0 : 8;
        const float *kb = kf + (size_t)j0 * kld;
        size_t ldk = kld;
        if (bf) widen_rows8(tile, kh + (size_t)j0 * kld, kld, nb, 8, hd), kb = tile, ldk = (size_t)hd;
        else if (nb < 8) copy_rows8(tile, kb, kld, nb, hd), kb = tile, ldk = (size_t)hd;
        for (int h = 0; h < group; h++) scores8(q + (size_t)h * hd, kb, ldk, hd, scale, S + (size_t)h * ldS + j0);
    }
    const int32_t qp = a->q_pos[i], lo = a->window ? qp - a->window : INT32_MIN;
    float *inv = S + (size_t)group * ldS;
    for (int h = 0; h < group; h++) inv[h] = softmax_row8(S + (size_t)h * ldS, a->k_pos + klo, nk, qp, lo);
    if (a->export_a || a->sens_mass) pair_export8(a, i, S, ldS, inv, group, klo, nk);
    /* the weighted sum: f32 values straight from the cache; bf16 ones
     * widened CPU_ATTN_DECODE_TILE rows at a time */
    if (!bf) {
        pv_rows8(S, ldS, group, vf, kld, nk, out, hd);
    } else {
        for (int j0 = 0; j0 < nk; j0 += CPU_ATTN_DECODE_TILE) {
            const int nb = nk - j0 < CPU_ATTN_DECODE_TILE ? nk - j0 : CPU_ATTN_DECODE_TILE;
            widen_rows8(tile, vh + (size_t)j0 * kld, kld, nb, nb, hd);
            pv_rows8(S + j0, ldS, group, tile, (size_t)hd, nb, out, hd);
        }
    }
    for (int h = 0; h < group; h++) {
        const __m256 s = _mm256_set1_ps(inv[h]);
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(out + (size_t)h * hd + d, _mm256_mul_ps(_mm256_loadu_ps(out + (size_t)h * hd + d), s));
    }
}
#endif
#endif
