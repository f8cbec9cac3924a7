/* A call's attention on AMX bf16 tiles (gemm_amx.h, cp_amx_attention):
 * Q K^T and P V as tile products, the f32 mask and softmax between, the
 * export and the sensitive mass from the same probabilities.  Target
 * attributes only (gemm_amx.c).
 *
 * Layout.  K and V of the slots some row sees, [kbase, kbase + nkp) with
 * kbase and nkp multiples of 32, are rounded to bf16 once per call into
 * the B operands of the two products, per KV head:
 *   K: [key block of 16][hd / 32][16 dim pairs][16 keys][2]  (Q K^T)
 *   V: [dim block of 16][key tile of 32][16 key pairs][16 dims][2]  (P V)
 * A work unit is a tile of 16 consecutive rows of the call and one head
 * (or, when the call asks for an export or a mass, all heads in order: a
 * row's export adds its heads in one order).  It stages its Q as A tiles,
 * computes the scores of its key range into f32, makes each row's
 * probabilities over that row's own range, rounds them to bf16 as A tiles
 * and runs P V over the tile's key tiles.
 *
 * Batch invariance: a row's scores are its own dot products; its softmax
 * runs over [its first visible slot taken down to 32, its last visible
 * slot], sums in 16 lanes by slot modulo 16 -- ranges the row alone
 * decides -- and its probabilities are exactly 0 outside them, so the P V
 * chain over key tiles aligned to absolute multiples of 32 adds only exact
 * zeros for tiles the other rows bring in.  A query's output, export and
 * mass are bit for bit the same alone, in any tile and in any chunk. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "../dtype.h"
#include "exp_avx512.h"
#include "gemm_amx_internal.h"
#include "gemm_amx_micro.h"
#include "ops_cpu.h"

/* the bf16 tile products (gemm_amx_micro.h) for Q K^T and P V: two
 * column blocks at a time where there are two (two independent chains in
 * flight), one for the last of an odd count -- each C tile's chain of
 * tile products is the same in either */
MICRO_1X2(bf16_1x2, DP_BF16)
MICRO_1X1(bf16_1x1, DP_BF16)

/* below this many multiply-adds (rows x heads x keys x head_dim) a call
 * runs on its caller's thread: a decode step's attention on a small model
 * is a few microseconds, less than waking a sleeping thread */
#define TILE_ATTN_PARALLEL_FMAS (1L << 18)

static size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }
static int round32(int n) { return (n + 31) & ~31; }

/* the scratch of a call (sizes from its shape alone, the largest nkp) */
typedef struct attn_plan {
    int nkp_max, dt;
    size_t range_bytes, sbits_bytes, kv_bytes, q_bytes, s_bytes, p_bytes, thread_bytes;
} attn_plan;

static void attn_plan_of(const cp_attn_args *a, attn_plan *P)
{
    const int hd = a->head_dim;
    P->dt = hd / 32;
    P->nkp_max = round32(a->n_keys);
    P->range_bytes = round64((size_t)a->n * 2 * sizeof(int));
    P->sbits_bytes = round64((size_t)(P->nkp_max / 16) * sizeof(uint16_t));
    P->kv_bytes = (size_t)P->nkp_max * hd * 2; /* one KV head's K (or V), bf16 */
    P->q_bytes = (size_t)P->dt * 1024;
    P->s_bytes = round64((size_t)16 * P->nkp_max * 4);
    P->p_bytes = (size_t)(P->nkp_max / 32) * 1024;
    P->thread_bytes = 2048 + P->q_bytes + P->s_bytes + P->p_bytes; /* two C tiles first */
}

size_t cp_amx_attn_scratch(const cp_attn_args *a, int threads)
{
    attn_plan P;
    attn_plan_of(a, &P);
    return 64 + P.range_bytes + P.sbits_bytes + 2 * (size_t)a->n_kv_heads * P.kv_bytes + (size_t)(threads > 1 ? threads : 1) * P.thread_bytes;
}

/* 32 consecutive elements of a row (f32 or bf16 source) as bf16, rounded
 * to nearest even; zeros where !have */
AMX_FN static inline __m512i bf16_32(const float *f, const uint16_t *h, size_t at, int have)
{
    if (!have) return _mm512_setzero_si512();
    if (f) return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + at + 16), _mm512_loadu_ps(f + at));
    return _mm512_loadu_si512(h + at);
}

/* 16 consecutive elements as bf16 (zeros where !have) */
AMX_FN static inline __m256i bf16_16(const float *f, const uint16_t *h, size_t at, int have)
{
    if (!have) return _mm256_setzero_si256();
    if (f) return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(f + at));
    return _mm256_loadu_si256((const __m256i *)(const void *)(h + at));
}

/* r[c] becomes column c of the 16 x 16 matrix of 32-bit words whose rows
 * were r[0..15]: 4 x 4 blocks within 128-bit lanes, then the lanes */
AMX_FN static void transpose16_epi32(__m512i r[16])
{
    __m512i a[16], b[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]), a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* lane L of b[4i + k]: rows 4i..4i+3 of column 4L + k */
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m512i c0 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x88), c1 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xdd);
        const __m512i d0 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x88), d1 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xdd);
        r[k] = _mm512_shuffle_i32x4(c0, d0, 0x88), r[8 + k] = _mm512_shuffle_i32x4(c0, d0, 0xdd);
        r[4 + k] = _mm512_shuffle_i32x4(c1, d1, 0x88), r[12 + k] = _mm512_shuffle_i32x4(c1, d1, 0xdd);
    }
}

/* KV head g's keys [kbase + 16 b, + 16) as the Q K^T operand (slots at
 * or past khi zero): per 32 dims, key n's 16 dim pairs are column n */
AMX_FN static void pack_k_block(const cp_attn_args *a, int g, int slot0, int khi, int dt, uint16_t *dst)
{
    const size_t kld = (size_t)a->n_kv_heads * a->head_dim;
    const float *kf = a->k16 ? NULL : a->k;
    for (int t = 0; t < dt; t++) {
        __m512i r[16];
#pragma GCC unroll 16
        for (int n = 0; n < 16; n++) r[n] = bf16_32(kf, a->k16, (size_t)(slot0 + n) * kld + (size_t)g * a->head_dim + 32 * (size_t)t, slot0 + n < khi);
        transpose16_epi32(r);
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) _mm512_storeu_si512(dst + (size_t)t * 512 + (size_t)p * 32, r[p]);
    }
}

/* KV head g's values of the 32 slots from slot0 as the P V operand, one
 * block of 16 dims at dst + db * vstride: row r holds slots 2r and 2r + 1
 * interleaved dim by dim (32 dims a pass: the 16-bit interleave works
 * within 128-bit lanes, whose halves the two lane shuffles put in order) */
AMX_FN static void pack_v_tile(const cp_attn_args *a, int g, int slot0, int khi, uint16_t *dst, size_t vstride)
{
    const size_t kld = (size_t)a->n_kv_heads * a->head_dim;
    const float *vf = a->k16 ? NULL : a->v;
    for (int d0 = 0; d0 < a->head_dim; d0 += 32)
        for (int r = 0; r < 16; r++) {
            const int s0 = slot0 + 2 * r, s1 = s0 + 1;
            const size_t col = (size_t)g * a->head_dim + (size_t)d0;
            const __m512i x = bf16_32(vf, a->v16, (size_t)s0 * kld + col, s0 < khi), y = bf16_32(vf, a->v16, (size_t)s1 * kld + col, s1 < khi);
            const __m512i lo = _mm512_unpacklo_epi16(x, y), hi = _mm512_unpackhi_epi16(x, y); /* lane L: dims 8L..8L+3, 8L+4..8L+7 */
            const __m512i t0 = _mm512_shuffle_i32x4(lo, hi, 0x44), t1 = _mm512_shuffle_i32x4(lo, hi, 0xee);
            uint16_t *d = dst + (size_t)(d0 / 16) * vstride + (size_t)r * 32;
            _mm512_storeu_si512(d, _mm512_shuffle_i32x4(t0, t0, 0xd8));
            _mm512_storeu_si512(d + vstride, _mm512_shuffle_i32x4(t1, t1, 0xd8));
        }
}

/* the lanes of a 16-slot chunk at j that lie in [lo, hi) */
static inline __mmask16 lanes_in(int j, int lo, int hi)
{
    const int a = lo > j ? lo - j : 0, b = hi - j < 16 ? hi - j : 16;
    return b <= a ? 0 : (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
}

/* One row's softmax over slots [r0, rhi) (row: the scaled scores of slot
 * r0 on; r0 a multiple of 32, so a slot's lane is the same in any range):
 * the AVX-512 pair kernel's mask, vector exponential and lane sums leave
 * e^(s - max) in row; returns 1 / the sum, the factor P is made with */
AMX_FN static float row_probs(const cp_attn_args *a, int i, float *row, int r0, int rhi)
{
    const int32_t qp = a->q_pos[i];
    return cpu_attn_softmax_row16(row, a->k_pos + r0, rhi - r0, qp, a->window ? qp - a->window : INT32_MIN);
}

/* row_probs when every slot of [r0 + vis, r0 + nk) is visible and none
 * before it is (the call's slots hold nondecreasing positions: a row's
 * visible slots are one run, its range): the same operations on the same
 * lanes, in the same order, as cpu_attn_softmax_row16 -- only the masks,
 * which it makes per 16 slots from the slots' positions, come from the run's
 * ends, and the chunks wholly inside the run take no mask at all. */
AMX_FN static float row_probs_run(float *row, int vis, int nk)
{
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    const int full0 = (vis + 15) & ~15, full1 = nk & ~15; /* chunks [full0, full1) wholly visible */
    for (int j = vis & ~15; j < nk; j += 16) {
        if (j >= full0 && j < full1) {
            vmx = _mm512_max_ps(vmx, _mm512_loadu_ps(row + j));
            continue;
        }
        const __mmask16 m = lanes_in(j, vis, nk);
        vmx = _mm512_mask_max_ps(vmx, m, vmx, _mm512_maskz_loadu_ps(m, row + j));
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 16) {
        if (j >= full0 && j < full1) {
            const __m512 e = cp_exp16_nonpos(_mm512_sub_ps(_mm512_loadu_ps(row + j), mx));
            _mm512_storeu_ps(row + j, e);
            sum = _mm512_add_ps(sum, e);
            continue;
        }
        const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1), m = lanes_in(j, vis, nk);
        const __m512 e = _mm512_maskz_mov_ps(m, cp_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), mx)));
        _mm512_mask_storeu_ps(row + j, in, e);
        sum = _mm512_add_ps(sum, e);
    }
    return 1.0f / _mm512_reduce_add_ps(sum);
}

/* the tiles released, from the OpenMP region's body (an outlined function
 * without the AMX target: the intrinsic inlines only into one with it) */
AMX_FN static void tiles_off(void) { _tile_release(); }

/* per-call state every unit reads */
typedef struct attn_call {
    const cp_attn_args *a;
    const attn_plan *P;
    const int *range; /* row i's visible slots [range[2i], range[2i + 1]) */
    const uint16_t *sbits; /* bit l of sbits[b]: slot kbase + 16 b + l is sensitive (with sens_mass) */
    int kbase, nkp;
    uint16_t *kp, *vp; /* packed K, V: KV head g at + g * nkp * hd */
    float scale;
    int runs; /* the slots' positions never decrease: a row's range is all visible (row_probs_run) */
} attn_call;

/* rows [i0, i0 + nr) of heads [h0, h0 + gh) (nr x gh <= 16, the heads
 * one KV head's): A row a is row i0 + a / gh of head h0 + a % gh.  Q
 * staged, S = scale Q K^T over the unit's key range, each A row's
 * probabilities, P V into out.  A C row depends on its A row alone, so
 * an A row's results are the same bits whichever rows and heads share
 * its tile; a row's heads come in order (its export adds them so). */
AMX_FN static void attn_unit(const attn_call *C, int i0, int nr, int h0, int gh, char *tb)
{
    const cp_attn_args *a = C->a;
    const attn_plan *P = C->P;
    const int hd = a->head_dim, dt = P->dt, g = h0 / (a->n_heads / a->n_kv_heads), na = nr * gh;
    const size_t qld = (size_t)a->n_heads * hd;
    char *c = tb; /* two C tiles */
    uint16_t *qa = (uint16_t *)(void *)(tb + 2048);
    float *S = (float *)(void *)(tb + 2048 + P->q_bytes);
    uint16_t *pa = (uint16_t *)(void *)(tb + 2048 + P->q_bytes + P->s_bytes);
    int lo = INT32_MAX, hi = 0;
    for (int r = 0; r < nr; r++)
        if (C->range[2 * (i0 + r)] < C->range[2 * (i0 + r) + 1]) {
            if (C->range[2 * (i0 + r)] < lo) lo = C->range[2 * (i0 + r)];
            if (C->range[2 * (i0 + r) + 1] > hi) hi = C->range[2 * (i0 + r) + 1];
        }
    if (hi == 0) { /* no row sees a key: zeros, as the f32 path */
        for (int r = 0; r < nr; r++) memset(a->out + (size_t)(i0 + r) * qld + (size_t)h0 * hd, 0, (size_t)gh * hd * sizeof(float));
        return;
    }
    lo &= ~31;
    const int nk = hi - lo, nkb = (nk + 15) / 16, nkt = (nk + 31) / 32, ldS = P->nkp_max;
    /* A tiles (Q, then P) hold only rows [0, na): the rows past it give
     * outputs never read, whatever the buffer held; one row (a decode
     * step of one head) is read with stride 0 */
    const int lda = na == 1 ? 0 : 64;
    for (int t = 0; t < dt; t++)
        for (int r = 0; r < na; r++)
            _mm512_storeu_si512(qa + ((size_t)t * 16 + r) * 32,
                                bf16_32(a->q, NULL, (size_t)(i0 + r / gh) * qld + (size_t)(h0 + r % gh) * hd + 32 * (size_t)t, 1));
    AMX_MEMORY_BARRIER();
    const char *kb = (const char *)(C->kp + (size_t)g * C->nkp * hd) + (size_t)((lo - C->kbase) / 16) * dt * 1024;
    for (int b = 0; b < nkb; b += 2) {
        const int two = b + 1 < nkb;
        if (two) bf16_1x2((const char *)qa, lda, 1024, kb + (size_t)b * dt * 1024, kb + (size_t)(b + 1) * dt * 1024, 64, 1024, dt, NULL, c, NULL, 0, 0);
        else bf16_1x1((const char *)qa, lda, 1024, kb + (size_t)b * dt * 1024, 64, 1024, dt, NULL, c, NULL, 0, 0);
        for (int k = 0; k <= two; k++)
            for (int r = 0; r < na; r++)
                _mm512_storeu_ps(S + (size_t)r * ldS + 16 * (b + k),
                                 _mm512_mul_ps(_mm512_load_ps((const float *)(const void *)(c + 1024 * k) + 16 * r), _mm512_set1_ps(C->scale)));
    }
    /* each A row's probabilities over its query's own range, then P as A
     * tiles ([key tile][16 rows][32 slots] bf16): zeros outside that range */
    for (int r = 0; r < na; r++) {
        const int i = i0 + r / gh;
        int s = 0, e = 0; /* the row's probabilities: S columns [s, e), e^(s - max) x inv */
        float inv = 0;
        if (C->range[2 * i] < C->range[2 * i + 1]) {
            const int r0 = C->range[2 * i] & ~31;
            s = r0 - lo, e = C->range[2 * i + 1] - lo;
            inv = C->runs ? row_probs_run(S + (size_t)r * ldS + s, C->range[2 * i] - r0, C->range[2 * i + 1] - r0)
                          : row_probs(a, i, S + (size_t)r * ldS + s, r0, C->range[2 * i + 1]);
        }
        const __m512 vinv = _mm512_set1_ps(inv), vw = _mm512_set1_ps(a->export_weight);
        const float *row = S + (size_t)r * ldS;
        /* the query's export and sensitive mass, made here from the p that
         * P is rounded from (the pair kernel's arithmetic, slot by slot in
         * the same order: the same bits): ex at the unit's first slot, sb
         * its sensitive lanes; both NULL for a row no export wants */
        const int dst = e > s && (a->export_a || a->sens_mass) ? cpu_attn_export_dst(a, i) : -1;
        float *ex = dst >= 0 && a->export_a ? a->export_a + (size_t)dst * a->export_ld + lo : NULL;
        const uint16_t *sb = dst >= 0 && a->sens_mass ? C->sbits + (lo - C->kbase) / 16 : NULL;
        __m512 mass = _mm512_setzero_ps();
        for (int t = 0; t < nkt; t++) {
            uint16_t *d = pa + ((size_t)t * 16 + r) * 32;
            for (int half = 0; half < 2; half++) {
                const int j = 32 * t + 16 * half;
                const __mmask16 m = lanes_in(j, s, e);
                /* no masked load where no lane is wanted: a load masked
                 * to nothing from an untouched page costs a microcode
                 * assist */
                __m256i v = _mm256_setzero_si256();
                if (m) {
                    const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), vinv);
                    v = (__m256i)_mm512_cvtneps_pbh(p);
                    if (ex) _mm512_mask_storeu_ps(ex + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, ex + j), _mm512_mul_ps(vw, p)));
                    if (sb) mass = _mm512_mask_add_ps(mass, m & sb[j / 16], mass, p);
                }
                _mm256_storeu_si256((__m256i *)(void *)(d + 16 * half), v);
            }
        }
        if (sb) {
            const float mv = _mm512_reduce_add_ps(mass);
            if (mv > a->sens_mass[dst]) a->sens_mass[dst] = mv;
        }
    }
    AMX_MEMORY_BARRIER();
    /* O = P V: the tile's key tiles in slot order, from zero */
    const size_t vstride = (size_t)(C->nkp / 32) * 512; /* one dim block's key tiles, in uint16 */
    const uint16_t *vb = C->vp + (size_t)g * C->nkp * hd + (size_t)((lo - C->kbase) / 32) * 512;
    for (int db = 0; db < hd / 16; db += 2) { /* head_dim % 32 == 0: dim blocks in pairs */
        bf16_1x2((const char *)pa, lda, 1024, (const char *)(vb + (size_t)db * vstride), (const char *)(vb + (size_t)(db + 1) * vstride), 64,
                 1024, nkt, NULL, c, NULL, 0, 0);
        for (int k = 0; k < 2; k++) {
            const float *ck = (const float *)(const void *)(c + 1024 * k);
            float *o = a->out + (size_t)i0 * qld + (size_t)h0 * hd + 16 * (size_t)(db + k);
            if (gh == 1) put_f32(o, (int)qld, ck, nr, 16, 0); /* one head: its rows qld apart */
            else
                for (int r = 0; r < nr; r++) /* row r's heads: consecutive in out, gh C rows from r x gh */
                    put_f32(o + (size_t)r * qld, hd, ck + (size_t)16 * r * gh, gh, 16, 0);
        }
    }
}

/* KV head g's K and V of the 32 slots from kbase + 32 b (slots at or
 * past khi zero) into the products' operands: two K blocks, one V tile */
AMX_FN static void pack_kv_block(const attn_call *C, int g, int b, int khi)
{
    const int kblocks = C->nkp / 32, dt = C->P->dt, hd = C->a->head_dim, slot0 = C->kbase + 32 * b;
    uint16_t *kd = C->kp + (size_t)g * C->nkp * hd + (size_t)(2 * b) * dt * 512;
    pack_k_block(C->a, g, slot0, khi, dt, kd);
    pack_k_block(C->a, g, slot0 + 16, khi, dt, kd + (size_t)dt * 512);
    pack_v_tile(C->a, g, slot0, khi, C->vp + (size_t)g * C->nkp * hd + (size_t)b * 512, (size_t)kblocks * 512);
}

cp_status cp_amx_attention(const cp_attn_args *a, void *scratch, int threads, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s) return s;
    if (a->n < 1 || a->n_keys < 1 || a->head_dim < 32 || a->head_dim % 32 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads ||
        threads < 1)
        return cp_fail(err, CP_EUNSUPPORTED, "amx attention: %d queries, %d keys, head_dim %d (a multiple of 32 wanted), %d / %d heads",
                       a->n, a->n_keys, a->head_dim, a->n_heads, a->n_kv_heads);
    if (!a->out) return cp_fail(err, CP_EINVAL, "amx attention: no output rows (an export alone is the general kernels')");
    if ((a->export_a && a->export_ld < a->n_keys) || (a->sens_mass && !a->sens_cols))
        return cp_fail(err, CP_EINVAL, "amx attention: an export narrower than its %d keys, or a mass without its sensitive slots", a->n_keys);
    if (!(a->k && a->v) && !(a->k16 && a->v16)) return cp_fail(err, CP_EINVAL, "amx attention: no keys or values");
    attn_plan P;
    attn_plan_of(a, &P);
    char *base = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int *range = (int *)(void *)base;
    int kbase = INT32_MAX, khi = 0;
    for (int i = 0; i < a->n; i++) {
        cpu_attn_key_range(a, i, 1, &range[2 * i], &range[2 * i + 1]);
        if (range[2 * i] < range[2 * i + 1]) {
            if (range[2 * i] < kbase) kbase = range[2 * i];
            if (range[2 * i + 1] > khi) khi = range[2 * i + 1];
        }
    }
    if (khi == 0) kbase = 0;
    kbase &= ~31;
    const int nkp = round32(khi - kbase), hd = a->head_dim;
    uint16_t *sbits = (uint16_t *)(void *)(base + P.range_bytes);
    uint16_t *kp = (uint16_t *)(void *)(base + P.range_bytes + P.sbits_bytes), *vp = kp + (size_t)a->n_kv_heads * P.nkp_max * hd;
    char *per_thread = base + P.range_bytes + P.sbits_bytes + 2 * (size_t)a->n_kv_heads * P.kv_bytes;
    if (a->sens_mass) /* the sensitive slots as lane masks, once a call (sens_cols ends at n_keys) */
        for (int b = 0; b < nkp / 16; b++) {
            uint16_t bits = 0;
            for (int l = 0; l < 16 && kbase + 16 * b + l < a->n_keys; l++) bits |= (uint16_t)((a->sens_cols[kbase + 16 * b + l] != 0) << l);
            sbits[b] = bits;
        }
    int runs = 1;
    for (int k = kbase + 1; k < khi && runs; k++) runs = a->k_pos[k] >= a->k_pos[k - 1];
    const attn_call C = { a, &P, range, sbits, kbase, nkp, kp, vp, 1.0f / sqrtf((float)hd), runs };
    const long fmas = (long)a->n * a->n_heads * (khi - kbase) * hd;
    const int nth = fmas > TILE_ATTN_PARALLEL_FMAS ? threads : 1, group = a->n_heads / a->n_kv_heads;
    if (a->n * group <= 16) {
        /* Few rows (a decode step): one A tile holds every row of a KV
         * head's group of heads, and a unit is a KV head -- its own K and V
         * packed by itself, no barrier between packing and products, and
         * its K and V tiles read once for the group, not once a head.  An
         * exporting call is one unit over the KV heads in order (a row's
         * export adds its heads in order). */
        const int exporting = a->export_a || a->sens_mass, units = exporting ? 1 : a->n_kv_heads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(units > 1 ? nth : 1)
        for (int u = 0; u < units; u++) {
            char *tb = per_thread + (size_t)omp_get_thread_num() * P.thread_bytes;
            const int g0 = exporting ? 0 : u, g1 = exporting ? a->n_kv_heads : u + 1;
            tiles_on();
            for (int g = g0; g < g1; g++) {
                for (int b = 0; b < nkp / 32; b++) pack_kv_block(&C, g, b, khi);
                attn_unit(&C, 0, a->n, g * group, group, tb);
            }
            tiles_off();
        }
        return CP_OK;
    }
    /* whole: a unit takes every head of its rows -- always when exporting
     * (a row's export adds its heads in one order), and when there are
     * rows enough to keep the threads busy (a unit per head pays its
     * scheduling and its Q staging eight to fourteen times a tile) */
    const int tiles = (a->n + 15) / 16, whole = a->export_a || a->sens_mass || tiles >= 4 * threads;
    const int units = whole ? tiles : tiles * a->n_heads;
#pragma omp parallel num_threads(nth)
    {
#pragma omp for schedule(static) collapse(2)
        for (int g = 0; g < a->n_kv_heads; g++)
            for (int b = 0; b < nkp / 32; b++) pack_kv_block(&C, g, b, khi);
        char *tb = per_thread + (size_t)omp_get_thread_num() * P.thread_bytes;
        tiles_on();
#pragma omp for schedule(dynamic, 1)
        for (int w = 0; w < units; w++) { /* the last rows first: they see the most keys, and the threads finish together */
            const int u = units - 1 - w, t = whole ? u : u / a->n_heads, i0 = 16 * t, nr = a->n - i0 < 16 ? a->n - i0 : 16;
            if (whole)
                for (int h = 0; h < a->n_heads; h++) attn_unit(&C, i0, nr, h, 1, tb);
            else
                attn_unit(&C, i0, nr, u % a->n_heads, 1, tb);
        }
        tiles_off();
    }
    return CP_OK;
}
