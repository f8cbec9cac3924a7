/* AMX bf16 GEMM (gemm_amx.h): the weight's tile layout, its packing
 * and unpacking, and y = x . W^T on _tile_dpbf16ps.  Target attributes
 * only (gemm_amx.c). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_amx_internal.h"

/* ---- bf16: layout ------------------------------------------------------ */

cp_status cp_amx_bf16_layout_of(int out, int in, cp_amx_bf16_layout *layout, cp_error *err)
{
    if (out < 1 || in < 1 || out > INT32_MAX - 15 || in > INT32_MAX - 31)
        return cp_fail(err, CP_EINVAL, "amx bf16 layout: matrix [%d x %d] out of range", out, in);
    cp_amx_bf16_layout L = { .out = out, .in = in, .out_pad = (out + 15) & ~15, .in_pad = (in + 31) & ~31 };
    size_t e;
    if (!cp_mul_size((size_t)L.out_pad, (size_t)L.in_pad, &e) || !cp_mul_size(e, 2, &L.bytes))
        return cp_fail(err, CP_EINVAL, "amx bf16 layout: matrix [%d x %d] too large", out, in);
    *layout = L;
    return CP_OK;
}

/* element (j, k) of W in the packed buffer, in bf16 elements */
static size_t packed_at(const cp_amx_bf16_layout *L, int j, int k)
{
    return ((size_t)(j / 16) * (size_t)(L->in_pad / 32) + (size_t)(k / 32)) * 512 + (size_t)((k % 32) / 2) * 32 + (size_t)(j % 16) * 2 +
           (size_t)(k % 2);
}

void cp_amx_bf16_pack_into(void *dst, const uint16_t *w, const cp_amx_bf16_layout *L)
{
    uint16_t *d = dst;
    memset(d, 0, L->bytes); /* the padding: columns past out, inputs past in */
    for (int j = 0; j < L->out; j++)
        for (int k = 0; k < L->in; k++) d[packed_at(L, j, k)] = w[(size_t)j * L->in + k];
}

cp_status cp_amx_bf16_pack(const uint16_t *w, int out, int in, void **packed, cp_amx_bf16_layout *layout, cp_error *err)
{
    cp_amx_bf16_layout L;
    cp_status s = cp_amx_bf16_layout_of(out, in, &L, err);
    if (s) return s;
    void *p = aligned_alloc(64, L.bytes); /* a multiple of 1 KB: aligned_alloc's size rule holds */
    if (!p) return cp_fail(err, CP_ENOMEM, "amx bf16 pack: %zu bytes for a [%d x %d] matrix", L.bytes, out, in);
    cp_amx_bf16_pack_into(p, w, &L);
    *packed = p, *layout = L;
    return CP_OK;
}

void cp_amx_bf16_unpack(uint16_t *dst, const void *packed, const cp_amx_bf16_layout *L)
{
    const uint16_t *s = packed;
    for (int j = 0; j < L->out; j++)
        for (int k = 0; k < L->in; k++) dst[(size_t)j * L->in + k] = s[packed_at(L, j, k)];
}

void cp_amx_bf16_rows(float *dst, const void *packed, const cp_amx_bf16_layout *L, const int32_t *ids, int n)
{
    const uint16_t *s = packed;
    for (int i = 0; i < n; i++) {
        float *o = dst + (size_t)i * L->in;
        for (int k = 0; k < L->in; k++) {
            const uint32_t u = (uint32_t)s[packed_at(L, ids[i], k)] << 16; /* bf16 -> f32: exact */
            memcpy(&o[k], &u, 4);
        }
    }
}

/* ---- bf16 -------------------------------------------------------------- */

/* staged A: [rows_pad / 16][in_pad / 32][16 rows][32 bf16], each (row
 * tile, K tile) one contiguous 1 KB A tile; then the threads' C buffers */
static size_t bf16_a_bytes(int n, const cp_amx_bf16_layout *L) { return (size_t)rows_pad(n) * (size_t)L->in_pad * 2; }
static int bf16_bp(int n, const cp_amx_bf16_layout *L) { return block_pairs((size_t)L->in_pad * 2, row_units(n)); }

size_t cp_amx_bf16_scratch(int n, const cp_amx_bf16_layout *L, int threads)
{
    return bf16_a_bytes(n, L) + (size_t)threads * (carry_bytes(L->in_pad / 32, bf16_bp(n, L)) + (size_t)L->in_pad * sizeof(float));
}

/* row i of x into the staged A: f32 rounded to bf16 (nearest even, as
 * bf16p's round_row) or bf16 copied, zeros past in and for rows past n */
AMX_FN static void stage_row(uint16_t *a, int i, int n, const float *xf, const uint16_t *xb, int ldx, int in, int kt)
{
    uint16_t *base = a + ((size_t)(i / 16) * (size_t)kt * 16 + (size_t)(i % 16)) * 32;
    for (int t = 0; t < kt; t++) {
        uint16_t *d = base + (size_t)t * 512;
        const int k = 32 * t, left = i < n ? in - k : 0;
        const __mmask32 m = left >= 32 ? ~(__mmask32)0 : left > 0 ? (__mmask32)((1u << left) - 1) : 0;
        if (xf) {
            const float *s = left > 0 ? xf + (size_t)i * ldx + k : xf;
            const __m256bh lo = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps((__mmask16)m, s));
            const __m256bh hi = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps((__mmask16)(m >> 16), s + 16));
            _mm256_store_si256((__m256i *)(void *)d, (__m256i)lo);
            _mm256_store_si256((__m256i *)(void *)(d + 16), (__m256i)hi);
        } else _mm512_store_si512(d, _mm512_maskz_loadu_epi16(m, left > 0 ? xb + (size_t)i * ldx + k : xb));
    }
}

/* staged row i: from bf16 x (xb, row stride ldx), or from the f32 source */
AMX_FN static void stage_source_row(uint16_t *a, int i, int n, const q8p_src *src, const uint16_t *xb, int ldx, int in, int kt,
                                    float *buf)
{
    if (xb) stage_row(a, i, n, NULL, xb, ldx, in, kt);
    else /* row stride 0: the made row is row i's (rows past n: zeros, nothing read) */
        stage_row(a, i, n, i < n ? q8p_source_row(src, i, in, buf) : src->x, NULL, 0, in, kt);
}

AMX_FN static void bf16_run(const q8p_src *src, const uint16_t *xb, int ldx, const cp_amx_bf16_out *outs, int count, int n, int in,
                            void *scratch, int threads)
{
    uint16_t *a = scratch;
    const cp_amx_bf16_layout *L0 = outs[0].layout;
    const int kt = L0->in_pad / 32, npad = rows_pad(n), bp = bf16_bp(n, L0);
    char *carry = (char *)scratch + bf16_a_bytes(n, L0);
    float *rowbuf = (float *)(void *)(carry + (size_t)threads * carry_bytes(kt, bp)); /* a thread's source row */
    /* One row tile (a decode step): staged on this thread and the column
     * pairs claimed one at a time -- a thread woken late into the region
     * (tens of microseconds on a virtual machine) then costs only what it
     * did not take, not a wait at the staging barrier and the region's end
     * (gemm_i8_prefill.c's decode panels, the same reason) */
    const int claim = one_tile(n);
    long macs = 0;
    amx_job J[Q8P_MAX_OUTS];
    for (int o = 0; o < count; o++) {
        const cp_amx_bf16_layout *L = outs[o].layout;
        J[o] = (amx_job){ .i8 = 0, .a = scratch, .a_rt = (size_t)kt * 1024, .a_kt = 1024, .lda = 64, .b = outs[o].wp, .b_kt = 1024, .ldb = 64,
                          .kt = kt, .nblk = L->out_pad / 16, .n = n, .out = L->out, .ldy = outs[o].ldy, .accumulate = outs[o].accumulate,
                          .bp = bp, .claim = claim, .y = outs[o].y, .bias = outs[o].bias };
        macs += (long)npad * L->out_pad * L->in_pad;
    }
    if (claim)
        for (int i = 0; i < npad; i++) stage_source_row(a, i, n, src, xb, ldx, in, kt, rowbuf);
    /* threads from 2^23 multiply-adds (~8 us on the tiles): a parallel region
     * wakes a sleeping thread for tens of microseconds, which a small
     * model's decode row (cp-books-6m: 16 x 768 x 256) paid four times a
     * layer -- generate 921 -> 1312 tok/s on one thread there, the 0.5B
     * shape's decode and prefill unchanged (its matrices stay parallel) */
#pragma omp parallel num_threads(threads) if (macs >= (1L << 23))
    {
        const int t = omp_get_thread_num();
        if (!claim) {
            float *buf = rowbuf + (size_t)t * (size_t)L0->in_pad;
#pragma omp for schedule(static)
            for (int i = 0; i < npad; i++) stage_source_row(a, i, n, src, xb, ldx, in, kt, buf);
        }
        cpu_amx_run_jobs(J, count, t, omp_get_num_threads(), carry + (size_t)t * carry_bytes(kt, bp));
    }
}

static cp_status bf16_check(const cp_amx_bf16_layout *L, int n, int threads, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s) return s;
    if (!L || L->out < 1 || L->in < 1 || L->out_pad != ((L->out + 15) & ~15) || L->in_pad != ((L->in + 31) & ~31))
        return cp_fail(err, CP_EINVAL, "amx bf16 gemm: the layout is not one cp_amx_bf16_layout_of made");
    if (n < 1 || n > INT32_MAX - ROW_PAIR || threads < 1) return cp_fail(err, CP_EINVAL, "amx bf16 gemm: %d rows, %d threads", n, threads);
    return CP_OK;
}

cp_status cp_amx_bf16_gemm(float *y, int ldy, const float *x, const void *wp, const cp_amx_bf16_layout *L, int n, int accumulate,
                           void *scratch, int threads, cp_error *err)
{
    cp_status s = bf16_check(L, n, threads, err);
    if (s) return s;
    const q8p_src src = { .kind = Q8P_SRC_PLAIN, .x = x };
    const cp_amx_bf16_out o = { .y = y, .ldy = ldy, .wp = wp, .layout = L, .accumulate = accumulate };
    bf16_run(&src, NULL, 0, &o, 1, n, L->in, scratch, threads);
    return CP_OK;
}

cp_status cp_amx_bf16_gemm_bx(float *y, int ldy, const uint16_t *x, int ldx, const void *wp, const cp_amx_bf16_layout *L, int n,
                              int accumulate, void *scratch, int threads, cp_error *err)
{
    cp_status s = bf16_check(L, n, threads, err);
    if (s) return s;
    const q8p_src src = { .kind = Q8P_SRC_PLAIN };
    const cp_amx_bf16_out o = { .y = y, .ldy = ldy, .wp = wp, .layout = L, .accumulate = accumulate };
    bf16_run(&src, x, ldx, &o, 1, n, L->in, scratch, threads);
    return CP_OK;
}

size_t cp_amx_bf16_fused_scratch(int n, int in, int threads)
{
    cp_amx_bf16_layout L;
    cp_error e;
    return cp_amx_bf16_layout_of(16, in, &L, &e) ? 0 : cp_amx_bf16_scratch(n, &L, threads);
}

cp_status cp_amx_bf16_fused(const q8p_src *src, const cp_amx_bf16_out *outs, int count, int n, int in, void *scratch, int threads,
                            cp_error *err)
{
    cp_status s0 = cpu_amx_check_source(src, count, "amx bf16 fused gemm", err);
    if (s0) return s0;
    for (int o = 0; o < count; o++) {
        cp_status s = bf16_check(outs[o].layout, n, threads, err);
        if (s) return s;
        if (outs[o].layout->in != in)
            return cp_fail(err, CP_EINVAL, "amx bf16 fused gemm: output %d's weight takes %d inputs, the rows have %d", o, outs[o].layout->in, in);
    }
    bf16_run(src, NULL, 0, outs, count, n, in, scratch, threads);
    return CP_OK;
}

/* ---- the MLP: rmsnorm, gate / up with SwiGLU in their epilogue, down ---- */

/* down in K segments: past one row tile (a decode step reads its weight
 * once whatever the blocking) and past KSEG_TILES K tiles */
static int down_kseg(int n, const cp_amx_bf16_layout *Ld) { return one_tile(n) ? 0 : kseg_of(Ld->in_pad / 32); }

/* a thread's C buffer: gate / up's, or down's (in K segments or not) */
static size_t mlp_carry_bytes(int n, const cp_amx_bf16_layout *Lg, const cp_amx_bf16_layout *Ld)
{
    const int ks = down_kseg(n, Ld);
    const size_t cg = carry_bytes(Lg->in_pad / 32, bf16_bp(n, Lg));
    const size_t cd = ks ? kseg_carry_bytes(Ld->out_pad / 16, kseg_bp(ks, row_units(n))) : carry_bytes(Ld->in_pad / 32, bf16_bp(n, Ld));
    return cg > cd ? cg : cd;
}

size_t cp_amx_bf16_mlp_scratch(int n, int in, int inter, int threads)
{
    cp_amx_bf16_layout L1, L2, Ld;
    cp_error e;
    if (cp_amx_bf16_layout_of(16, in, &L1, &e) || cp_amx_bf16_layout_of(16, inter, &L2, &e) || cp_amx_bf16_layout_of(in, inter, &Ld, &e)) return 0;
    return bf16_a_bytes(n, &L1) + bf16_a_bytes(n, &L2) + (size_t)threads * (mlp_carry_bytes(n, &L1, &Ld) + (size_t)L1.in_pad * sizeof(float));
}

AMX_FN static void mlp_run(const q8p_src *src, const cp_amx_bf16_mlp_w *w, float *y, int ldy, int accumulate, int n, void *scratch,
                           int threads)
{
    const cp_amx_bf16_layout *Lg = w->gate_l, *Ld = w->down_l;
    const int kt = Lg->in_pad / 32, ktd = Ld->in_pad / 32, npad = rows_pad(n), claim = one_tile(n);
    uint16_t *a = scratch;
    char *h = (char *)scratch + bf16_a_bytes(n, Lg); /* silu(gate) x up: down's staged A */
    char *carry = h + bf16_a_bytes(n, Ld);
    const size_t cbytes = mlp_carry_bytes(n, Lg, Ld);
    const int ks = down_kseg(n, Ld);
    float *rowbuf = (float *)(void *)(carry + (size_t)threads * cbytes);
    const amx_job G = { .a = scratch, .a_rt = (size_t)kt * 1024, .a_kt = 1024, .lda = 64, .b = w->gate, .b_up = w->up, .b_kt = 1024,
                        .ldb = 64, .kt = kt, .nblk = Lg->out_pad / 16, .n = n, .out = Lg->out, .bp = bf16_bp(n, Lg), .claim = claim,
                        .h = h, .h_rt = (size_t)ktd * 1024 };
    const amx_job D = { .a = h, .a_rt = (size_t)ktd * 1024, .a_kt = 1024, .lda = 64, .b = w->down, .b_kt = 1024, .ldb = 64, .kt = ktd,
                        .nblk = Ld->out_pad / 16, .n = n, .out = Ld->out, .ldy = ldy, .accumulate = accumulate,
                        .bp = ks ? kseg_bp(ks, row_units(n)) : bf16_bp(n, Ld), .claim = claim, .y = y, .kseg = ks };
    /* an odd number of 16-column blocks leaves the last K tile's upper
     * lanes to no item: zeros, as staging pads a row past its length */
    if (Lg->out_pad < Ld->in_pad)
        for (int r = 0; r < npad / 16; r++)
            for (int i = 0; i < 16; i++) memset(h + (size_t)r * G.h_rt + (size_t)(ktd - 1) * 1024 + (size_t)i * 64 + 32, 0, 32);
    /* threads where either product alone would take them (bf16_run's
     * 2^23): a small model's decode step stays on this thread -- summed,
     * cp-books-6m's (6.3 M + 3.1 M) forked a region a layer, decode 1610
     * -> 1400 tok/s */
    const long macs_gu = (long)npad * Lg->out_pad * Lg->in_pad * 2, macs_d = (long)npad * Ld->out_pad * Ld->in_pad;
    if (claim)
        for (int i = 0; i < npad; i++) stage_source_row(a, i, n, src, NULL, 0, Lg->in, kt, rowbuf);
#pragma omp parallel num_threads(threads) if (macs_gu >= (1L << 23) || macs_d >= (1L << 23))
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (!claim) {
            float *buf = rowbuf + (size_t)t * (size_t)Lg->in_pad;
#pragma omp for schedule(static)
            for (int i = 0; i < npad; i++) stage_source_row(a, i, n, src, NULL, 0, Lg->in, kt, buf);
        }
        cpu_amx_run_jobs(&G, 1, t, nt, carry + (size_t)t * cbytes);
#pragma omp barrier
        cpu_amx_run_jobs(&D, 1, t, nt, carry + (size_t)t * cbytes);
    }
}

cp_status cp_amx_bf16_mlp(const q8p_src *src, const cp_amx_bf16_mlp_w *w, float *y, int ldy, int accumulate, int n, void *scratch,
                          int threads, cp_error *err)
{
    cp_status s = cpu_amx_check_source(src, 1, "amx bf16 mlp", err);
    for (int k = 0; k < 3 && s == CP_OK; k++) s = bf16_check(k == 0 ? w->gate_l : k == 1 ? w->up_l : w->down_l, n, threads, err);
    if (s) return s;
    if (!w->gate || !w->up || !w->down || w->up_l->out != w->gate_l->out || w->up_l->in != w->gate_l->in || w->down_l->in != w->gate_l->out)
        return cp_fail(err, CP_EINVAL, "amx bf16 mlp: gate [%d x %d], up [%d x %d] and down [%d x %d] do not chain", w->gate_l->out,
                       w->gate_l->in, w->up_l->out, w->up_l->in, w->down_l->out, w->down_l->in);
    mlp_run(src, w, y, ldy, accumulate, n, scratch, threads);
    return CP_OK;
}
