/* e^x on 16 AVX-512 lanes: the one copy of the vector exponential the CPU
 * kernels share (attn_dnnl.c's fused softmax, the SwiGLU of
 * gemm_i8_prefill.c and gemm_amx_tiles.c, attn_decode.c's decode softmax).  It is cpu_exp_nonpos (ops_cpu.h) on 16
 * lanes -- the same operations in the same order, mul then add and never a
 * fused multiply-add (the C11 build does not contract the scalar one), so
 * for x <= 0 a lane is bit for bit the scalar function's value and a
 * vectorized softmax keeps its C fallback's results.
 *
 * Callers compile these inside their own target("avx512f...") functions
 * (static inline: each caller's target is a superset of avx512f). */
#ifndef CP_EXP_AVX512_H
#define CP_EXP_AVX512_H

#if defined(__x86_64__)
#include <immintrin.h>

/* x already in [-87, 88]: Cody-Waite reduction by ln 2 (n = floor(x log2 e
 * + 1/2), the high part of ln 2 exact in n * it), a degree-6 Taylor
 * polynomial, and the product with 2^n (n in [-126, 127]: a normal
 * float); relative error ~2e-7.  floor by roundscale and the scaling by
 * scalef give the scalar function's values (its floor from a truncation,
 * its 2^n built in the exponent field: both exact) in two instructions
 * instead of eight. */
__attribute__((target("avx512f"))) static inline __m512 cp_exp16_clamped(__m512 x)
{
    const __m512 y = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _mm512_set1_ps(0.5f));
    const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145752f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(1.42860677e-6f)));
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_add_ps(_mm512_set1_ps(1.0f / 120), _mm512_mul_ps(r, p));
    p = _mm512_add_ps(_mm512_set1_ps(1.0f / 24), _mm512_mul_ps(r, p));
    p = _mm512_add_ps(_mm512_set1_ps(1.0f / 6), _mm512_mul_ps(r, p));
    p = _mm512_add_ps(_mm512_set1_ps(0.5f), _mm512_mul_ps(r, p));
    p = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(r, p));
    p = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(r, p));
    return _mm512_scalef_ps(p, n);
}

/* e^x for a softmax's x = score - max <= 0: cpu_exp_nonpos's clamp to
 * [-87, 0]; a NaN lane gives e^0, as the scalar one does (min returns its
 * second operand) */
__attribute__((target("avx512f"))) static inline __m512 cp_exp16_nonpos(__m512 x)
{
    x = _mm512_min_ps(x, _mm512_setzero_ps());
    return cp_exp16_clamped(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)));
}

/* e^x for any x, clamped to [-87, 88] (no overflow to inf, no subnormal
 * 2^n); a NaN lane gives e^-87 (max returns its second operand) */
__attribute__((target("avx512f"))) static inline __m512 cp_exp16(__m512 x)
{
    return cp_exp16_clamped(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f)));
}

/* silu(g) x u on 16 lanes, cpu_swiglu's expression g / (1 + e^-g) x u
 * with the vector e^x: the one copy the SwiGLU of the int8 path
 * (q8p_swiglu) and the AMX MLP's gate / up epilogue share, so the two
 * give the same bits */
__attribute__((target("avx512f"))) static inline __m512 cp_silu_mul16(__m512 g, __m512 u)
{
    const __m512 e = cp_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}
#endif

#endif
