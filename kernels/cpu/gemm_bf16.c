/* f32 compute from bf16 weights (gemm_bf16.h).
 *
 * Why two kernels: a decode step (n = 1) is a matrix-vector product bound by
 * the bytes of W streamed, so a dot kernel that widens each bf16 row in
 * registers reads half of what f32 sgemv reads.  A prefill chunk (n in the
 * hundreds) is bound by arithmetic: there OpenBLAS's sgemm is far ahead of
 * anything hand-written here, and widening a block of W rows into an
 * L2-sized buffer costs O(out x in) against the GEMM's O(n x out x in).
 * Measured on this machine's CPU: profiling/bench_forward's GEMM ceilings.
 *
 * The ISA-specific kernels carry target attributes and are only called when
 * cpuid said the CPU runs them (cpu_isa_choose): one binary everywhere. */
#include "gemm_bf16.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <immintrin.h>

#include "../dtype.h"

void cpu_features_detect(cpu_features *f)
{
    memset(f, 0, sizeof *f);
    __builtin_cpu_init();
    f->avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f->avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    f->avx512_vnni = f->avx512 && __builtin_cpu_supports("avx512vnni");
    unsigned a, b, c, d;
    /* leaf 7: sub-leaf 0 EDX bit 22 AMX-BF16, bit 24 AMX-TILE; sub-leaf 1
     * EAX bit 5 AVX512_BF16.  (gcc 12 has no __builtin_cpu_supports names
     * for these.)  The OS side of AMX (XFD permission) is oneDNN's. */
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a >= 7) {
        unsigned max7;
        __asm__ volatile("cpuid" : "=a"(max7), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        f->amx_bf16 = f->avx512 && (d >> 22 & 1) && (d >> 24 & 1);
        if (max7 >= 1) {
            __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
            f->avx512_bf16 = f->avx512 && (a >> 5 & 1);
        }
    }
}

const char *cpu_isa_name(cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_AVX512: return "avx512";
    case CPU_ISA_AMX: return "amx";
    case CPU_ISA_AVX512_VNNI: return "avx512vnni";
    case CPU_ISA_AVX512_BF16: return "avx512bf16";
    default: return "generic";
    }
}

cp_status cpu_isa_choose(const char *forced, const cpu_features *f, int have_dnnl, cpu_isa *out, cp_error *err)
{
    if (!forced || !*forced) {
        /* bf16 compute where the CPU multiplies bf16 natively (AMX tiles,
         * else vdpbf16ps: Zen 4/5 prefill 2.8-3.5x and decode 2x the f32
         * compute of the 0.5B shape); f32 compute from bf16 weights below */
        *out = f->amx_bf16 && have_dnnl ? CPU_ISA_AMX
               : f->avx512_bf16         ? CPU_ISA_AVX512_BF16
               : f->avx512              ? CPU_ISA_AVX512
               : f->avx2_fma            ? CPU_ISA_AVX2
                                        : CPU_ISA_GENERIC;
        return CP_OK;
    }
    static const struct { const char *name; cpu_isa isa; } names[] = {
        { "generic", CPU_ISA_GENERIC }, { "avx2", CPU_ISA_AVX2 }, { "avx512", CPU_ISA_AVX512 }, { "amx", CPU_ISA_AMX },
        { "avx512vnni", CPU_ISA_AVX512_VNNI }, { "avx512bf16", CPU_ISA_AVX512_BF16 },
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(forced, names[i].name) != 0) continue;
        cpu_isa isa = names[i].isa;
        if ((isa == CPU_ISA_AVX2 && !f->avx2_fma) || (isa == CPU_ISA_AVX512 && !f->avx512) ||
            (isa == CPU_ISA_AVX512_VNNI && !f->avx512_vnni) || (isa == CPU_ISA_AVX512_BF16 && !f->avx512_bf16))
            return cp_fail(err, CP_EUNSUPPORTED, "CP_CPU_ISA=%s: this CPU does not have %s", forced, forced);
        if (isa == CPU_ISA_AMX && !have_dnnl)
            return cp_fail(err, CP_EUNSUPPORTED, "CP_CPU_ISA=amx: this build has no oneDNN");
        *out = isa;
        return CP_OK;
    }
    return cp_fail(err, CP_EINVAL, "CP_CPU_ISA='%.32s': expected generic, avx2, avx512, avx512vnni, avx512bf16 or amx", forced);
}

void bf16_widen(float *dst, const uint16_t *src, size_t n)
{
    /* a shift per element: gcc vectorizes it */
    uint32_t *d = (uint32_t *)(void *)dst;
    for (size_t i = 0; i < n; i++) d[i] = (uint32_t)src[i] << 16;
}

/* ---- dot kernels: r <= 4 rows of x against one row of W ---------------- */

__attribute__((target("avx2,fma"))) static inline __m256 widen8(const uint16_t *p)
{
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512 widen16(const uint16_t *p)
{
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512 widen16_tail(const uint16_t *p, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define DOT_W uint16_t
#define DOT_SCALAR(e) cp_bf16_to_f32(e)
#define DOT_LOAD8(p) widen8(p)
#define DOT_LOAD16(p) widen16(p)
#define DOT_LOAD16_TAIL(p, m) widen16_tail(p, m)
#include "gemm_dot_impl.h"

void bf16_gemm_dot(cpu_isa isa, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate)
{
    dot_gemm(isa, y, ldy, x, w, n, in, out, accumulate);
}

/* ---- AVX-512, mid-size batches: a register tile of 2 W rows x XT x rows -
 * A step that carries a prefill chunk beside the decoders has 17-64 rows:
 * the one-W-row kernel above loads each x vector for one FMA there (x rows
 * past L1 stream from L2 at a load per FMA), and sgemm on widened blocks
 * (the other way to run more than 16 rows) widens and packs all of W for each call.
 * Here each widened W vector feeds XT FMAs and each x vector two: W is
 * still read from memory once for all n rows (column blocks over the
 * threads, every row group over a block before the next).  The arithmetic
 * of every output is rows512's, operation for operation -- two chains over
 * alternate 16-lane steps, joined, one more 16-lane step, the masked tail,
 * hsum4's reduction -- so a row's result is bit for bit its lone run at
 * any n the backend sends through either kernel (tests/test_bf16.c). */

#define XT512 4 /* x rows of a tile: 2 x XT x 2 chains accumulators + 4 W vectors + 2 x in 32 zmm */

/* s0[i] = x row i . W row w0, s1[i] = x row i . W row w1, i < R <= XT512 */
__attribute__((target(A512), always_inline)) static inline void tile512(const uint16_t *w0, const uint16_t *w1, int in, const float *x,
                                                                          int ldx, int R, float *s0, float *s1)
{
    __m512 a0[XT512], b0[XT512], a1[XT512], b1[XT512];
#pragma GCC unroll 8
    for (int i = 0; i < XT512; i++) a0[i] = b0[i] = a1[i] = b1[i] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 32 <= in; k += 32) {
        __m512 u0 = widen16(w0 + k), v0 = widen16(w0 + k + 16), u1 = widen16(w1 + k), v1 = widen16(w1 + k + 16);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 xa = _mm512_loadu_ps(x + (size_t)i * ldx + k), xb = _mm512_loadu_ps(x + (size_t)i * ldx + k + 16);
            a0[i] = _mm512_fmadd_ps(u0, xa, a0[i]);
            a1[i] = _mm512_fmadd_ps(u1, xa, a1[i]);
            b0[i] = _mm512_fmadd_ps(v0, xb, b0[i]);
            b1[i] = _mm512_fmadd_ps(v1, xb, b1[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) a0[i] = _mm512_add_ps(a0[i], b0[i]), a1[i] = _mm512_add_ps(a1[i], b1[i]);
    if (k + 16 <= in) {
        __m512 u0 = widen16(w0 + k), u1 = widen16(w1 + k);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 xa = _mm512_loadu_ps(x + (size_t)i * ldx + k);
            a0[i] = _mm512_fmadd_ps(u0, xa, a0[i]);
            a1[i] = _mm512_fmadd_ps(u1, xa, a1[i]);
        }
        k += 16;
    }
    if (k < in) {
        __mmask16 m = (__mmask16)((1u << (in - k)) - 1);
        __m512 u0 = widen16_tail(w0 + k, m), u1 = widen16_tail(w1 + k, m);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 xa = _mm512_maskz_loadu_ps(m, x + (size_t)i * ldx + k);
            a0[i] = _mm512_fmadd_ps(u0, xa, a0[i]);
            a1[i] = _mm512_fmadd_ps(u1, xa, a1[i]);
        }
    }
    float t[8];
    _mm_storeu_ps(t, hsum4(a0[0], a0[1], a0[2], a0[3]));
    _mm_storeu_ps(t + 4, hsum4(a1[0], a1[1], a1[2], a1[3]));
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) s0[i] = t[i], s1[i] = t[4 + i];
}

/* output columns j0..j1 of all n rows: x row groups of XT512, W rows in
 * pairs (an odd last one through rows512: the same arithmetic) */
__attribute__((target(A512))) static void tiles512(float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int j0, int j1,
                                                   int accumulate)
{
    for (int i0 = 0; i0 < n; i0 += XT512) {
        const int r = n - i0 < XT512 ? n - i0 : XT512;
        const float *xb = x + (size_t)i0 * in;
        int j = j0;
        for (; j + 2 <= j1; j += 2) {
            float s0[XT512], s1[XT512];
            const uint16_t *w0 = w + (size_t)j * in, *w1 = w0 + in;
            switch (r) { /* r as a constant in each case */
            case 1: tile512(w0, w1, in, xb, in, 1, s0, s1); break;
            case 2: tile512(w0, w1, in, xb, in, 2, s0, s1); break;
            case 3: tile512(w0, w1, in, xb, in, 3, s0, s1); break;
            default: tile512(w0, w1, in, xb, in, 4, s0, s1); break;
            }
            for (int i = 0; i < r; i++) {
                float *yo = y + (size_t)(i0 + i) * ldy + j;
                yo[0] = accumulate ? yo[0] + s0[i] : s0[i];
                yo[1] = accumulate ? yo[1] + s1[i] : s1[i];
            }
        }
        if (j < j1) block512(y + (size_t)i0 * ldy, ldy, xb, w, r, in, j, j1, accumulate);
    }
}

void bf16_gemm_tiled(cpu_isa isa, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate)
{
    if (!avx512_kernels(isa)) {
        bf16_gemm_dot(isa, y, ldy, x, w, n, in, out, accumulate); /* no tile below AVX-512: the dot kernels */
        return;
    }
    const int nblocks = (out + 15) / 16;
    const long chunk = cpu_claim_chunk(nblocks, n, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, chunk) if ((long)out * in > 65536)
    for (int cb = 0; cb < nblocks; cb++)
        tiles512(y, ldy, x, w, n, in, cb * 16, cb * 16 + 16 < out ? cb * 16 + 16 : out, accumulate);
}

void bf16_gemm_small(cpu_isa isa, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate)
{
    /* the tile where a group of x rows is past L1 (in >= BF16_TILE_MIN_IN:
     * the MLP's down projection), where halving the x loads pays for a
     * second W stream; one W row at a time elsewhere, and always for one
     * row (the GEMV, bound by W's bytes).  The same arithmetic either way. */
    if (n >= 2 && in >= BF16_TILE_MIN_IN) bf16_gemm_tiled(isa, y, ldy, x, w, n, in, out, accumulate);
    else bf16_gemm_dot(isa, y, ldy, x, w, n, in, out, accumulate);
}

/* ---- bf16 compute: vdpbf16ps ------------------------------------------ */

#define DP_TARGET "avx512f,avx512bw,avx512vl,avx512bf16"

static int dp_ld(int in) { return (in + 31) & ~31; }

size_t bf16_dp_scratch(int n, int in) { return (size_t)n * (size_t)dp_ld(in) * 2; }

/* x rows rounded to bf16, zero-padded to a multiple of 32 */
__attribute__((target(DP_TARGET))) static void dp_round_rows(uint16_t *dst, const float *x, int n, int in)
{
    const int ld = dp_ld(in);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < ld; k += 16) {
            int left = in - k;
            __mmask16 m = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + (size_t)i * in + k));
            _mm256_store_si256((__m256i *)(void *)(dst + (size_t)i * ld + k), (__m256i)h);
        }
}

__attribute__((target(DP_TARGET), always_inline)) static inline void dot_dp_r(const uint16_t *w, const uint16_t *xb, int xs, int r,
                                                                                 int in, float *acc)
{
    /* two chains over alternate 32-wide steps for every r (not for one row
     * only, as before: a row then had other bits batched than alone), so
     * a row's result is the same whatever r or its place in the batch */
    __m512 a[4], b[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 64 <= in; k += 64) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k), w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) {
            a[i] = _mm512_dpbf16_ps(a[i], w0, (__m512bh)_mm512_load_si512(xb + (size_t)i * xs + k));
            b[i] = _mm512_dpbf16_ps(b[i], w1, (__m512bh)_mm512_load_si512(xb + (size_t)i * xs + k + 32));
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++) a[i] = _mm512_add_ps(a[i], b[i]);
    for (; k + 32 <= in; k += 32) {
        __m512bh wv = (__m512bh)_mm512_loadu_si512(w + k);
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) a[i] = _mm512_dpbf16_ps(a[i], wv, (__m512bh)_mm512_load_si512(xb + (size_t)i * xs + k));
    }
    if (k < in) { /* masked tail of W; x is zero-padded */
        __mmask32 m = (__mmask32)((1ull << (in - k)) - 1);
        __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + k);
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) a[i] = _mm512_dpbf16_ps(a[i], wv, (__m512bh)_mm512_load_si512(xb + (size_t)i * xs + k));
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++) acc[i] = _mm512_reduce_add_ps(a[i]);
}

__attribute__((target(DP_TARGET))) static void dot_dp(const uint16_t *w, const uint16_t *xb, int xs, int r, int in, float *acc)
{
    switch (r) {
    case 1: dot_dp_r(w, xb, xs, 1, in, acc); break;
    case 2: dot_dp_r(w, xb, xs, 2, in, acc); break;
    case 3: dot_dp_r(w, xb, xs, 3, in, acc); break;
    default: dot_dp_r(w, xb, xs, 4, in, acc); break;
    }
}

void bf16_gemm_small_dp(float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate,
                        void *scratch)
{
    uint16_t *xb = scratch;
    const int xs = dp_ld(in), nblocks = (out + 15) / 16;
    dp_round_rows(xb, x, n, in);
    const long chunk = cpu_claim_chunk(nblocks, n, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, chunk) if ((long)out * in > 65536)
    for (int cb = 0; cb < nblocks; cb++) {
        int j0 = cb * 16, j1 = j0 + 16 < out ? j0 + 16 : out;
        for (int g0 = 0; g0 < n; g0 += 4) { /* W's block stays in cache across the row groups */
            int r = n - g0 < 4 ? n - g0 : 4;
            for (int j = j0; j < j1; j++) {
                float acc[4];
                dot_dp(w + (size_t)j * in, xb + (size_t)g0 * xs, xs, r, in, acc);
                for (int i = 0; i < r; i++) {
                    float *yo = y + (size_t)(g0 + i) * ldy + j;
                    yo[0] = accumulate ? yo[0] + acc[i] : acc[i];
                }
            }
        }
    }
}

/* ---- blocked sgemm on widened rows ------------------------------------ */

/* rows of W widened at a time per thread: the block (<= 256 Ki floats,
 * 1 MiB) stays in a core's L2 while sgemm packs it */
#define BLOCK_FLOATS ((size_t)256 << 10)

static int block_rows(int in, int out)
{
    int nt = omp_get_max_threads();
    long r = (long)(BLOCK_FLOATS / (size_t)in);
    long share = ((long)out + nt - 1) / nt; /* every thread gets a block */
    if (r > share) r = share;
    r = r / 16 * 16;
    return r < 16 ? 16 : (int)r;
}

size_t bf16_gemm_blocked_scratch(int in, int out)
{
    return (size_t)omp_get_max_threads() * (size_t)block_rows(in, out) * (size_t)in;
}

void bf16_gemm_blocked(float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate,
                       float *scratch)
{
    const int bn = block_rows(in, out), nblocks = (out + bn - 1) / bn;
    const float beta = accumulate ? 1.0f : 0.0f;
    /* one sgemm per block, each on one thread: OpenBLAS (OpenMP build)
     * runs single-threaded inside a parallel region, so the two pools are
     * one and never oversubscribe the cores */
#pragma omp parallel
    {
        float *buf = scratch + (size_t)omp_get_thread_num() * (size_t)bn * in;
#pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < nblocks; b++) {
            int j0 = b * bn, cnt = out - j0 < bn ? out - j0 : bn;
            bf16_widen(buf, w + (size_t)j0 * in, (size_t)cnt * in);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, cnt, in, 1.0f, x, in, buf, in, beta, y + j0, ldy);
        }
    }
}
