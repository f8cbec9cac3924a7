/* Decode attention on AVX-512 (ops_cpu.h, cpu_attention_decode): one query
 * row against one KV head's keys, for all the query heads of its group in
 * one pass over the keys.  Built in the BLAS builds only (the device
 * check's libc-only build keeps the portable kernel of ops_cpu.c).
 *
 * Why hand-written: at 1k context a decode token's attention was 672
 * one-row BLAS calls (24 layers x 14 heads x 2 products) on one thread
 * with a scalar expf, ~10-20 % of a token (docs/RESULTS.md, where a decode
 * token's time goes).  Here the scores of 16 keys for one head come
 * from hd/16 FMAs a key on the key rows as they lie and one transposing
 * reduction (no per-key horizontal sum), the softmax runs 16 lanes with
 * cp_exp16_nonpos, and the weighted sum keeps up to 8 heads x 32 dims in
 * registers while the value rows stream past once per 32 dims.
 *
 * Every (row, KV head) pair runs the same code in the same order whatever
 * the other rows are or which thread takes it: a row's output is bit for
 * bit its lone run's (continuous batching relies on that).  A prefill's
 * rows on an f32 cache go through the block kernel
 * (cpu_attn_rows_block_avx512), which runs each row's pair arithmetic but
 * reads every 16-key block of K once for a run of rows and every value
 * row once for 8 (row, head) vectors: a pair alone streamed its KV head's
 * whole range from L2 for each row (make bench-export, cp-books-6m's heads,
 * 352 reuse rows over 1024 keys: 4.07 -> 2.44 ms a layer). */
#ifndef CP_NO_BLAS
#include "ops_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "exp_avx512.h"

#define T512 __attribute__((target("avx512f")))
#define T512_INLINE __attribute__((target("avx512f"), always_inline)) static inline

/* r[j] = the sum of a[j]'s 16 lanes, j = 0..15: four levels of pairwise
 * merges (45 shuffles and adds for 16 sums, against 16 separate
 * reductions' ~100) */
T512_INLINE __m512 hsum16(const __m512 a[16])
{
    __m512 b[8], c[4];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) /* within each 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] */
        b[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) /* lane L: the L-th quarter's sums of a[4k..4k+3] */
        c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(e01, e23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* s[0..15] = scale * q . k_j for the 16 key rows k + j * ldk (hd floats,
 * hd % 16 == 0) */
T512_INLINE void scores16(const float *q, const float *k, size_t ldk, int hd, float scale, float *s)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 16) {
        const __m512 qd = _mm512_loadu_ps(q + d);
#pragma GCC unroll 16 /* the accumulators stay in registers only when unrolled */
        for (int j = 0; j < 16; j++) acc[j] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k + (size_t)j * ldk + d), acc[j]);
    }
    _mm512_storeu_ps(s, _mm512_mul_ps(hsum16(acc), _mm512_set1_ps(scale)));
}

/* rows [0, nr) of bf16 (src, ld apart) widened into dst (hd apart), rows
 * [nr, 16) zero: the tile a block of keys or values is read from */
T512 static void widen_rows(float *dst, const uint16_t *src, size_t ld, int nr, int rows, int hd)
{
    for (int j = 0; j < rows; j++) {
        float *o = dst + (size_t)j * hd;
        if (j >= nr) {
            for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(o + d, _mm512_setzero_ps());
            continue;
        }
        const uint16_t *r = src + (size_t)j * ld;
        for (int d = 0; d < hd; d += 16) {
            const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(r + d)));
            _mm512_storeu_ps(o + d, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
    }
}

/* rows [0, nr) of f32 copied into dst, the rest of 16 zero (a tail block) */
T512 static void copy_rows(float *dst, const float *src, size_t ld, int nr, int hd)
{
    for (int j = 0; j < 16; j++)
        for (int d = 0; d < hd; d += 16)
            _mm512_storeu_ps(dst + (size_t)j * hd + d, j < nr ? _mm512_loadu_ps(src + (size_t)j * ld + d) : _mm512_setzero_ps());
}

/* out_m[c0 .. c0 + 16 CB) += sum_j P_m[j] v_j[...] for NV vectors m, each
 * its own score row P[m] and output row out[m] (a pair's heads, or the
 * heads of several rows): one chain per vector and 16 dims over the keys in
 * order, NV x CB accumulators in registers, each value vector loaded once
 * for all NV */
T512_INLINE void pv_list(const int NV, const int CB, const float *const *P, float *const *out, const float *v, size_t ldv, int nk, int c0)
{
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (int m = 0; m < NV; m++)
#pragma GCC unroll 2
        for (int c = 0; c < CB; c++) acc[m][c] = _mm512_loadu_ps(out[m] + c0 + 16 * c);
    for (int j = 0; j < nk; j++) {
        __m512 x[2];
#pragma GCC unroll 2
        for (int c = 0; c < CB; c++) x[c] = _mm512_loadu_ps(v + (size_t)j * ldv + c0 + 16 * c);
#pragma GCC unroll 8
        for (int m = 0; m < NV; m++) {
            const __m512 p = _mm512_set1_ps(P[m][j]);
#pragma GCC unroll 2
            for (int c = 0; c < CB; c++) acc[m][c] = _mm512_fmadd_ps(p, x[c], acc[m][c]);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < NV; m++)
#pragma GCC unroll 2
        for (int c = 0; c < CB; c++) _mm512_storeu_ps(out[m] + c0 + 16 * c, acc[m][c]);
}

/* pv_list over every 32 (or, for an odd count of 16s, 16) dims for nv
 * vectors, 8 at a time: NV and CB constants in each instance */
T512 static void pv_lists(const float *const *P, float *const *out, int nv, const float *v, size_t ldv, int nk, int hd)
{
    for (int m0 = 0; m0 < nv; m0 += 8) {
        const int m = nv - m0 < 8 ? nv - m0 : 8;
        for (int c0 = 0; c0 < hd; c0 += 32) {
            const int cb = hd - c0 >= 32 ? 2 : 1;
#define PVL_CASE(M)                                                                      \
    case M:                                                                              \
        if (cb == 2) pv_list(M, 2, P + m0, out + m0, v, ldv, nk, c0);                    \
        else pv_list(M, 1, P + m0, out + m0, v, ldv, nk, c0);                            \
        break;
            switch (m) {
                PVL_CASE(1) PVL_CASE(2) PVL_CASE(3) PVL_CASE(4) PVL_CASE(5) PVL_CASE(6) PVL_CASE(7) PVL_CASE(8)
            }
#undef PVL_CASE
        }
    }
}

/* one pair's weighted sum: nh heads' score rows ldp apart, output rows hd
 * apart, through pv_lists */
T512 static void pv_rows(const float *P, size_t ldp, int nh, const float *v, size_t ldv, int nk, float *out, int hd)
{
    const float *Ph[16];
    float *Oh[16];
    for (int h0 = 0; h0 < nh; h0 += 16) {
        const int m = nh - h0 < 16 ? nh - h0 : 16;
        for (int h = 0; h < m; h++) Ph[h] = P + (size_t)(h0 + h) * ldp, Oh[h] = out + (size_t)(h0 + h) * hd;
        pv_lists(Ph, Oh, m, v, ldv, nk, hd);
    }
}

/* the visible keys among the 16 slots at kp (in: the slots that exist) */
T512_INLINE __mmask16 visible16(const int32_t *kp, __mmask16 in, __m512i vq, __m512i vlo)
{
    const __m512i k = _mm512_maskz_loadu_epi32(in, kp);
    return in & _mm512_cmple_epi32_mask(k, vq) & _mm512_cmpgt_epi32_mask(k, vlo);
}

/* row = e^(row - max) over the visible keys, 0 elsewhere; returns 1 / the
 * sum (the range holds a visible key: its max's own term is 1) */
T512 float cpu_attn_softmax_row16(float *row, const int32_t *kp, int nk, int32_t qp, int32_t lo)
{
    const __m512i vq = _mm512_set1_epi32(qp), vlo = _mm512_set1_epi32(lo);
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __mmask16 vis = visible16(kp + j, in, vq, vlo);
        vmx = _mm512_mask_max_ps(vmx, vis, vmx, _mm512_maskz_loadu_ps(vis, row + j));
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __mmask16 vis = visible16(kp + j, in, vq, vlo);
        const __m512 e = _mm512_maskz_mov_ps(vis, cp_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(vis, row + j), mx)));
        _mm512_mask_storeu_ps(row + j, in, e);
        sum = _mm512_add_ps(sum, e);
    }
    return 1.0f / _mm512_reduce_add_ps(sum);
}

/* The export and the sensitive mass of row i's heads h0 .. h0 + group
 * from the pair's own scores: S's rows hold e^(s - max) over the slots
 * [klo, klo + nk) (0 where a key is not seen), inv each head's 1 / sum.
 * The general kernels' arithmetic on them (p = e x inv, export += w x p,
 * the mass a sum of p over sensitive slots, kept when larger). */
T512 static void cpu_attn_pair_export(const cp_attn_args *a, int i, const float *S, size_t ldS, const float *inv, int group, int klo, int nk)
{
    i = cpu_attn_export_dst(a, i);
    if (i < 0) return; /* a row no export wants */
    float *ex = a->export_a ? a->export_a + (size_t)i * a->export_ld + klo : NULL;
    const uint8_t *sc = a->sens_mass ? a->sens_cols + klo : NULL;
    const __m512 vw = _mm512_set1_ps(a->export_weight);
    for (int h = 0; h < group; h++) {
        const float *row = S + (size_t)h * ldS;
        const __m512 vi = _mm512_set1_ps(inv[h]);
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < nk; j += 16) {
            const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1);
            const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, row + j), vi);
            if (ex) _mm512_mask_storeu_ps(ex + j, in, _mm512_add_ps(_mm512_maskz_loadu_ps(in, ex + j), _mm512_mul_ps(vw, p)));
            if (sc) {
                uint8_t tail[16] = { 0 }; /* a short last block read from a copy: sens_cols ends at n_keys */
                const uint8_t *cb = sc + j;
                if (in != 0xffff) memcpy(tail, cb, (size_t)(nk - j)), cb = tail;
                const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)cb));
                m = _mm512_mask_add_ps(m, in & _mm512_test_epi32_mask(c, c), m, p);
            }
        }
        if (sc) {
            const float v = _mm512_reduce_add_ps(m);
            if (v > a->sens_mass[i]) a->sens_mass[i] = v;
        }
    }
}

T512 void cpu_attn_decode_pair_avx512(const cp_attn_args *a, int i, int g, float *S, float *tile)
{
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const size_t qld = (size_t)a->n_heads * hd, kld = (size_t)a->n_kv_heads * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *q = a->q + (size_t)i * qld + (size_t)g * group * hd;
    float *out = a->out + (size_t)i * qld + (size_t)g * group * hd;
    for (int h = 0; h < group; h++)
        for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(out + (size_t)h * hd + d, _mm512_setzero_ps());
    int klo, khi;
    cpu_attn_key_range(a, i, 1, &klo, &khi);
    if (khi <= klo) return; /* no key visible: zeros, as cpu_attention gives */
    const int nk = khi - klo;
    const size_t ldS = ((size_t)nk + 15) & ~(size_t)15; /* whole 16-key blocks of scores */
    const int bf = a->k16 != NULL;
    const float *kf = bf ? NULL : a->k + (size_t)klo * kld + (size_t)g * hd;
    const float *vf = bf ? NULL : a->v + (size_t)klo * kld + (size_t)g * hd;
    const uint16_t *kh = bf ? a->k16 + (size_t)klo * kld + (size_t)g * hd : NULL;
    const uint16_t *vh = bf ? a->v16 + (size_t)klo * kld + (size_t)g * hd : NULL;
    /* scores, 16 keys at a time: a bf16 block (or a short last one) first
     * widened into tile, the same 4 KB then read by every head of the group */
    for (int j0 = 0; j0 < nk; j0 += 16) {
        const int nb = nk - j0 < 16 ? nk - j0 : 16;
        const float *kb = kf + (size_t)j0 * kld;
        size_t ldk = kld;
        if (bf) widen_rows(tile, kh + (size_t)j0 * kld, kld, nb, 16, hd), kb = tile, ldk = (size_t)hd;
        else if (nb < 16) copy_rows(tile, kb, kld, nb, hd), kb = tile, ldk = (size_t)hd;
        for (int h = 0; h < group; h++) scores16(q + (size_t)h * hd, kb, ldk, hd, scale, S + (size_t)h * ldS + j0);
    }
    const int32_t qp = a->q_pos[i], lo = a->window ? qp - a->window : INT32_MIN;
    float *inv = S + (size_t)group * ldS;
    for (int h = 0; h < group; h++) inv[h] = cpu_attn_softmax_row16(S + (size_t)h * ldS, a->k_pos + klo, nk, qp, lo);
    if (a->export_a || a->sens_mass) cpu_attn_pair_export(a, i, S, ldS, inv, group, klo, nk);
    /* the weighted sum: f32 values straight from the cache; bf16 ones
     * widened CPU_ATTN_DECODE_TILE rows at a time */
    if (!bf) {
        pv_rows(S, ldS, group, vf, kld, nk, out, hd);
    } else {
        for (int j0 = 0; j0 < nk; j0 += CPU_ATTN_DECODE_TILE) {
            const int nb = nk - j0 < CPU_ATTN_DECODE_TILE ? nk - j0 : CPU_ATTN_DECODE_TILE;
            widen_rows(tile, vh + (size_t)j0 * kld, kld, nb, nb, hd);
            pv_rows(S + j0, ldS, group, tile, (size_t)hd, nb, out, hd);
        }
    }
    for (int h = 0; h < group; h++) {
        const __m512 s = _mm512_set1_ps(inv[h]);
        for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(out + (size_t)h * hd + d, _mm512_mul_ps(_mm512_loadu_ps(out + (size_t)h * hd + d), s));
    }
}

T512 void cpu_attn_rows_together_avx512(const cp_attn_args *a, int i0, int m, const int *khi, int kl, int g, float *S, float *tile)
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
    const size_t ldS = ((size_t)nu + 15) & ~(size_t)15; /* whole 16-key blocks of scores */
    float *inv = S + (size_t)m * group * ldS;
    float *P[CPU_ATTN_ROW_BLOCK * 16], *O[CPU_ATTN_ROW_BLOCK * 16]; /* every (row, head) vector: group <= 16 */
    for (int t = 0; t < m; t++)
        for (int h = 0; h < group; h++) {
            P[t * group + h] = S + ((size_t)t * group + h) * ldS;
            O[t * group + h] = a->out + (size_t)(i0 + t) * qld + ((size_t)g * group + h) * hd;
            for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(O[t * group + h] + d, _mm512_setzero_ps());
        }
    /* the scores of every key of the rows' range, one 16-key block of K at
     * a time for all of their vectors (it stays in L1 between them): each
     * key's score is its own sum, whichever block it is read in */
    const float *kf = a->k + (size_t)kl * kld + (size_t)g * hd, *vf = a->v + (size_t)kl * kld + (size_t)g * hd;
    for (int j0 = 0; j0 < nu; j0 += 16) {
        const int nb = nu - j0 < 16 ? nu - j0 : 16;
        const float *kb = kf + (size_t)j0 * kld;
        size_t ldk = kld;
        if (nb < 16) copy_rows(tile, kb, kld, nb, hd), kb = tile, ldk = (size_t)hd;
        for (int t = 0; t < m; t++) {
            const float *q = a->q + (size_t)(i0 + t) * qld + (size_t)g * group * hd;
            for (int h = 0; h < group; h++) scores16(q + (size_t)h * hd, kb, ldk, hd, scale, P[t * group + h] + j0);
        }
    }
    /* each row's softmax and export over its own range, as its pair */
    for (int t = 0; t < m; t++) {
        const int nk = khi[t] - kl;
        const int32_t qp = a->q_pos[i0 + t], lo = a->window ? qp - a->window : INT32_MIN;
        for (int h = 0; h < group; h++) inv[t * group + h] = cpu_attn_softmax_row16(P[t * group + h], a->k_pos + kl, nk, qp, lo);
        if (a->export_a || a->sens_mass) cpu_attn_pair_export(a, i0 + t, P[t * group], ldS, inv + (size_t)t * group, group, kl, nk);
    }
    /* the weighted sums: the keys every row sees for all vectors together,
     * then each row's further keys alone -- each chain over its keys in
     * order, as in its pair */
    pv_lists((const float *const *)P, O, m * group, vf, kld, nc, hd);
    for (int t = 0; t < m; t++) {
        const int nk = khi[t] - kl;
        if (nk == nc) continue;
        const float *Pt[16];
        for (int h = 0; h < group; h++) Pt[h] = P[t * group + h] + nc;
        pv_lists(Pt, O + (size_t)t * group, group, vf + (size_t)nc * kld, kld, nk - nc, hd);
    }
    for (int v = 0; v < m * group; v++) {
        const __m512 s = _mm512_set1_ps(inv[v]);
        for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(O[v] + d, _mm512_mul_ps(_mm512_loadu_ps(O[v] + d), s));
    }
}

#endif
#endif
