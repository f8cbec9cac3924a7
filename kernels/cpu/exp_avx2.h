/* e^x on 8 AVX2 lanes for a softmax's x = score - max <= 0: cpu_exp_nonpos
 * (ops_cpu.h) and cp_exp16_nonpos (exp_avx512.h) on 8 lanes -- the same
 * operations in the same order, mul then add and never a fused
 * multiply-add (the C11 build does not contract), floor by roundps and
 * 2^n built in the exponent field as the scalar function builds it, so a
 * lane is bit for bit the scalar value.  What the AVX2 pair kernel
 * (attn_decode_avx2.c) runs; callers compile it inside their own
 * target("avx2,fma") functions. */
#ifndef CP_EXP_AVX2_H
#define CP_EXP_AVX2_H

#if defined(__x86_64__)
#include <immintrin.h>

/* clamped to [-87, 0]; a NaN lane gives e^0, as the scalar one does (min
 * returns its second operand) */
__attribute__((target("avx2,fma"))) static inline __m256 cp_exp8_nonpos(__m256 x)
{
    x = _mm256_min_ps(x, _mm256_setzero_ps());
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 y = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _mm256_set1_ps(0.5f));
    const __m256 n = _mm256_floor_ps(y);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145752f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(1.42860677e-6f)));
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_add_ps(_mm256_set1_ps(1.0f / 120), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f / 24), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f / 6), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(r, p));
    /* n in [-126, 1]: an exact int, a normal float's exponent */
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

#endif
