/* AMX int8 GEMM (gemm_amx.h): u8 x s8 on _tile_dpbusd over a q8 blob in
 * the vnni panel order, the vnni kernels' integers and epilogue.  Target
 * attributes only (gemm_amx.c). */
#include <omp.h>
#include <string.h>

#include "../q8.h"
#include "gemm_amx_internal.h"
#include "gemm_i8.h"

/* ---- int8 ---------------------------------------------------------------
 * scratch: the row scales (rows_pad(n) floats, 64-aligned), then the
 * quantized rows, row-major, rows_pad(n) x ld bytes (rows past n zero):
 * the A tile of row tile r, K tile t is 16 rows of 64 bytes at
 * xq + 16 r ld + 64 t, stride ld; then the threads' C buffers.  B tiles
 * of the panel order: vector v (16 columns), K tile t at
 * data + v/3 48 ld + t 16 192 + (v % 3) 64, stride 192. */
#define I8_BSTRIDE (CP_Q8_PANEL_COLS * 4)

static size_t i8_head_bytes(int n, int in) { return cp_q8_round64((size_t)rows_pad(n) * 4) + (size_t)rows_pad(n) * (size_t)cp_q8_ld(in); }
static int i8_bp(int n, int in) { return block_pairs((size_t)cp_q8_ld(in), row_units(n)); }

size_t cp_amx_i8_scratch(int n, int in, int threads)
{
    return i8_head_bytes(n, in) + (size_t)threads * (carry_bytes(cp_q8_ld(in) / 64, i8_bp(n, in)) + (size_t)cp_q8_ld(in) * sizeof(float));
}

AMX_FN static void i8_run(const q8p_src *src, const q8p_out *outs, int count, int n, int in, void *scratch, int threads)
{
    const int ld = cp_q8_ld(in), kt = ld / 64, npad = rows_pad(n), bp = i8_bp(n, in);
    float *sx = scratch;
    uint8_t *xq = (uint8_t *)scratch + cp_q8_round64((size_t)npad * 4);
    char *carry = (char *)scratch + i8_head_bytes(n, in);
    float *rowbuf = (float *)(void *)(carry + (size_t)threads * carry_bytes(kt, bp)); /* a thread's source row */
    amx_job J[Q8P_MAX_OUTS];
    long work = 0;
    for (int o = 0; o < count; o++) {
        const void *w = outs[o].w;
        J[o] = (amx_job){ .i8 = 1, .a = (const char *)xq, .a_rt = (size_t)16 * ld, .a_kt = 64, .lda = ld, .b = (const char *)cp_q8_data(w),
                          .b_kt = (size_t)16 * I8_BSTRIDE, .ldb = I8_BSTRIDE, .ld = ld, .kt = kt, .nblk = (outs[o].out + 15) / 16, .n = n,
                          .out = outs[o].out, .ldy = outs[o].ldy, .accumulate = outs[o].accumulate, .bp = bp, .y = outs[o].y,
                          .bias = outs[o].bias, .sx = sx, .sw = cp_q8_scales(w), .sum = cp_q8_sums(w) };
        work += (long)npad * outs[o].out * ld;
    }
#pragma omp parallel num_threads(threads) if (work >= (1L << 22))
    {
        const int t = omp_get_thread_num();
        float *buf = rowbuf + (size_t)t * ld;
#pragma omp for schedule(static)
        for (int i = 0; i < npad; i++) {
            if (i < n) sx[i] = q8_quantize_row_u8(q8p_source_row(src, i, in, buf), in, ld, xq + (size_t)i * ld);
            else memset(xq + (size_t)i * ld, 0, (size_t)ld), sx[i] = 0;
        }
        cpu_amx_run_jobs(J, count, t, omp_get_num_threads(), carry + (size_t)t * carry_bytes(kt, bp));
    }
}

static cp_status i8_check(const void *w, int n, int in, int out, int threads, cp_error *err)
{
    if (n < 1 || n > INT32_MAX - ROW_PAIR || threads < 1) return cp_fail(err, CP_EINVAL, "amx int8 gemm: %d rows, %d threads", n, threads);
    if (!cp_q8_matches(w, out, in))
        return cp_fail(err, CP_EINVAL, "amx int8 gemm: the weight is not a q8 blob of [%d x %d]", out, in);
    if (cp_q8_layout(w) != CP_Q8_PANELS)
        return cp_fail(err, CP_EINVAL, "amx int8 gemm: the [%d x %d] weight is row-major; the tiles read the panel layout (cp_q8_pack_blob)",
                       out, in);
    return CP_OK;
}

cp_status cp_amx_i8_fused(const q8p_src *src, const q8p_out *outs, int count, int n, int in, void *scratch, int threads, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s || (s = cpu_amx_check_source(src, count, "amx int8 fused gemm", err))) return s;
    for (int o = 0; o < count; o++)
        if ((s = i8_check(outs[o].w, n, in, outs[o].out, threads, err))) return s;
    i8_run(src, outs, count, n, in, scratch, threads);
    return CP_OK;
}

cp_status cp_amx_i8_gemm(float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate, void *scratch,
                         int threads, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s || (s = i8_check(w, n, in, out, threads, err))) return s;
    const q8p_src src = { .kind = Q8P_SRC_PLAIN, .x = x };
    const q8p_out o = { .y = y, .ldy = ldy, .w = w, .out = out, .accumulate = accumulate };
    i8_run(&src, &o, 1, n, in, scratch, threads);
    return CP_OK;
}
