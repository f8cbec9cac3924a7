/* GEMMs on AMX tiles (kernels/cpu/gemm_amx.h): the availability checks,
 * the bf16 layout's round trip, the bf16 kernel against exact products at
 * odd shapes and tails, the int8 kernel against an exact integer reference
 * and the VNNI kernels bit for bit, and batch invariance of both (a row
 * alone, in a batch of 37 at every place, in a batch of 256: the same
 * bits).  Every kernel test skips, saying why, where this process cannot
 * run AMX tiles. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/gemm_amx.h"
#include "../kernels/cpu/gemm_bf16_packed.h"
#include "../kernels/cpu/gemm_i8.h"
#include "../kernels/cpu/gemm_i8_prefill.h"
#include "../kernels/cpu/ops_cpu.h"
#include "../kernels/dtype.h"
#include "../kernels/q8.h"
#include "helpers.h"

static void need_amx(void)
{
    cp_error err = { 0 };
    if (cp_amx_ready(&err) != CP_OK) cr_skip_test("%s: the AMX kernels are not tested", err.msg);
}

static uint32_t rnd_state;
static float rnd(void) { return test_lcg_uniform(&rnd_state); }
static void *xalloc(size_t bytes) { return test_xalloc64(bytes); }

/* ---- availability ------------------------------------------------------ */

/* words of a CPU with everything: AMX-TILE/BF16/INT8, OSXSAVE, XCR0's
 * tile bits, palette 1 of 8 tiles x 16 rows x 64 bytes; each piece taken
 * away alone is refused with its own reason */
Test(amx, cpuid_checks_refuse_each_missing_piece)
{
    const uint32_t e1 = 1u << 27, e7 = 1u << 24 | 1u << 22 | 1u << 25;
    const uint64_t x0 = 3ull << 17 | 0xe7;
    const uint32_t pal[3] = { 1024u << 16 | 8192u, 8u << 16 | 64u, 16u };
    const char *why = NULL;
    cr_assert_eq(cp_amx_cpuid_allows(e1, e7, x0, pal, &why), 1, "a full AMX CPU refused: %s", why);
    const struct {
        uint32_t e1, e7;
        uint64_t x0;
        uint32_t pal[3];
        const char *needle;
    } bad[] = {
        { e1, e7 & ~(1u << 24), x0, { pal[0], pal[1], pal[2] }, "AMX-TILE" },
        { e1, e7 & ~(1u << 22), x0, { pal[0], pal[1], pal[2] }, "AMX-BF16" },
        { e1, e7 & ~(1u << 25), x0, { pal[0], pal[1], pal[2] }, "AMX-INT8" },
        { 0, e7, x0, { pal[0], pal[1], pal[2] }, "OSXSAVE" },
        { e1, e7, x0 & ~(1ull << 18), { pal[0], pal[1], pal[2] }, "XCR0" },
        { e1, e7, x0 & ~(1ull << 17), { pal[0], pal[1], pal[2] }, "XCR0" },
        { e1, e7, x0, { 0, 0, 0 }, "palette" },
        { e1, e7, x0, { pal[0], 8u << 16 | 32u, pal[2] }, "palette" },
        { e1, e7, x0, { pal[0], pal[1], 8u }, "palette" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why = NULL;
        cr_assert_eq(cp_amx_cpuid_allows(bad[i].e1, bad[i].e7, bad[i].x0, bad[i].pal, &why), 0, "case %zu allowed", i);
        cr_assert(why && strstr(why, bad[i].needle), "case %zu: reason '%s' does not name %s", i, why ? why : "(null)", bad[i].needle);
    }
}

/* Where the CPU and the OS have AMX (Linux lists amx_tile, amx_bf16 and
 * amx_int8 in /proc/cpuinfo only then), cp_amx_ready must say yes: the
 * permission request and its check work, and the kernel tests below run
 * rather than skip */
Test(amx, ready_where_the_cpu_and_os_have_it)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) cr_skip_test("no /proc/cpuinfo: not Linux");
    static char line[1 << 16]; /* one CPU's flags line */
    int has = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "flags", 5) == 0) {
            has = strstr(line, " amx_tile") && strstr(line, " amx_bf16") && strstr(line, " amx_int8");
            break;
        }
    fclose(f);
    if (!has) cr_skip_test("no amx_tile, amx_bf16 and amx_int8 in /proc/cpuinfo: nothing to check");
    cp_error err = { 0 };
    cr_assert_eq(cp_amx_ready(&err), CP_OK, "AMX listed by the kernel, yet: %s", err.msg);
}

/* the kernels refuse what they cannot read, saying what: a row-major int8
 * blob, a layout not made by cp_amx_bf16_layout_of, zero rows */
Test(amx, kernels_refuse_bad_operands_with_a_message)
{
    need_amx();
    cp_error err = { 0 };
    cp_amx_bf16_layout L;
    cr_assert_eq(cp_amx_bf16_layout_of(0, 5, &L, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "[0 x 5]"), "%s", err.msg);
    cr_assert_eq(cp_amx_bf16_layout_of(20, 40, &L, &err), CP_OK);
    float x[40] = { 0 }, y[20];
    char scr[4096] __attribute__((aligned(64)));
    void *wp = xalloc(L.bytes);
    memset(wp, 0, L.bytes);
    cp_amx_bf16_layout bad = L;
    bad.in_pad = 40;
    cr_assert_eq(cp_amx_bf16_gemm(y, 20, x, wp, &bad, 1, 0, scr, 2, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "layout"), "%s", err.msg);
    cr_assert_eq(cp_amx_bf16_gemm(y, 20, x, wp, &L, 0, 0, scr, 2, &err), CP_EINVAL);
    free(wp);
    float w[20 * 40] = { 0 };
    char *blob = xalloc(cp_q8_bytes(20, 40));
    cp_q8_quantize_rows((int8_t *)(blob + cp_q8_off_data(20)), (float *)(void *)(blob + cp_q8_off_scales()),
                        (int32_t *)(void *)(blob + cp_q8_off_sums(20)), w, 20, 40);
    *(cp_q8_head *)(void *)blob = (cp_q8_head){ CP_Q8_MAGIC, 20, 40, cp_q8_ld(40), CP_Q8_ROWS };
    cr_assert(cp_amx_i8_scratch(1, 40, 2) <= sizeof scr);
    cr_assert_eq(cp_amx_i8_gemm(y, 20, x, blob, 1, 40, 20, 0, scr, 2, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "row-major"), "%s", err.msg);
    cr_assert_eq(cp_amx_i8_gemm(y, 20, x, blob, 1, 41, 20, 0, scr, 2, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "[20 x 41]"), "%s", err.msg);
    free(blob);
}

/* ---- bf16 -------------------------------------------------------------- */

/* pack is a permutation plus zero padding: unpack gives W back, the pad
 * is zero, element (j, k) sits where the header says, and for in a
 * multiple of 32 the bytes are bf16p_pack's */
Test(amx, bf16_pack_and_unpack_are_inverse)
{
    static const int ins[] = { 1, 7, 31, 32, 33, 96, 131 }, outs[] = { 1, 15, 16, 17, 50 };
    rnd_state = 5;
    cp_error err = { 0 };
    for (size_t a = 0; a < sizeof ins / sizeof *ins; a++)
        for (size_t b = 0; b < sizeof outs / sizeof *outs; b++) {
            const int in = ins[a], out = outs[b];
            uint16_t *w = xalloc((size_t)out * in * 2), *back = xalloc((size_t)out * in * 2);
            for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(rnd());
            void *p = NULL;
            cp_amx_bf16_layout L;
            cr_assert_eq(cp_amx_bf16_pack(w, out, in, &p, &L, &err), CP_OK, "%s", err.msg);
            cr_assert_eq(L.out_pad, (out + 15) / 16 * 16);
            cr_assert_eq(L.in_pad, (in + 31) / 32 * 32);
            cr_assert_eq(L.bytes, (size_t)L.out_pad * L.in_pad * 2);
            memset(back, 0xff, (size_t)out * in * 2);
            cp_amx_bf16_unpack(back, p, &L);
            cr_assert(memcmp(w, back, (size_t)out * in * 2) == 0, "out %d in %d: unpack(pack(W)) != W", out, in);
            const uint16_t *q = p;
            const int j = out - 1, k = in - 1;
            cr_assert_eq(q[((size_t)(j / 16) * (L.in_pad / 32) + k / 32) * 512 + ((k % 32) / 2) * 32 + (j % 16) * 2 + k % 2],
                         w[(size_t)j * in + k]);
            size_t nonzero = 0;
            for (size_t e = 0; e < L.bytes / 2; e++) nonzero += q[e] != 0;
            size_t wnz = 0;
            for (int e = 0; e < out * in; e++) wnz += w[e] != 0;
            cr_assert_eq(nonzero, wnz, "out %d in %d: the padding is not zero", out, in);
            if (in % 32 == 0) {
                void *bp = xalloc(bf16p_bytes(out, in));
                bf16p_pack(bp, w, out, in);
                cr_assert_eq(bf16p_bytes(out, in), L.bytes);
                cr_assert(memcmp(bp, p, L.bytes) == 0, "out %d in %d: not bf16p's bytes", out, in);
                free(bp);
            }
            free(w), free(back), free(p);
        }
}

/* y = (acc ? y0 : 0) + bf16(x) . W^T with every product exact (two bf16
 * multiply exactly in double), and sum |x||w| per output */
static void ref_bf16(double *y, double *mag, const float *x, const uint16_t *w, const float *y0, int ldy, int n, int in, int out, int acc)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) {
            double s = acc ? y0[(size_t)i * ldy + j] : 0, a = fabs(s);
            for (int k = 0; k < in; k++) {
                const double p = (double)cp_bf16_to_f32(cp_f32_to_bf16(x[(size_t)i * in + k])) * cp_bf16_to_f32(w[(size_t)j * in + k]);
                s += p, a += fabs(p);
            }
            y[(size_t)i * out + j] = s, mag[(size_t)i * out + j] = a;
        }
}

/* Against exact products of bf16(x): |err| <= (in + 2) 2^-24 sum|x||w|,
 * the f32 accumulation's bound in any order -- a dropped, doubled or
 * misplaced product, a K tail read from the wrong place, a partial sum
 * lost between K chunks, x rounded other than to nearest even, would
 * break it.  n off the 16- and 32-row tiles, in off the 32-element K
 * tiles (1, 7, 31, 33, 131) and past one 16-tile K chunk (545), out off
 * the 16- and 32-column blocks, with and without accumulation, y's row stride past
 * out (the columns past out never written). */
Test(amx, bf16_matches_exact_products_at_odd_shapes)
{
    need_amx();
    static const int ns[] = { 1, 3, 16, 17, 33, 40 }, ins[] = { 1, 7, 31, 32, 33, 131, 545 }, outs[] = { 1, 5, 16, 17, 33, 100 };
    rnd_state = 2024;
    cp_error err = { 0 };
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
            for (size_t c = 0; c < sizeof outs / sizeof *outs; c++) {
                const int n = ns[a], in = ins[b], out = outs[c], ldy = out + 3, acc = (int)((a + b + c) % 2);
                float *x = xalloc((size_t)n * in * 4), *y = xalloc((size_t)n * ldy * 4), *y0 = xalloc((size_t)n * ldy * 4);
                uint16_t *w = xalloc((size_t)out * in * 2);
                double *r = xalloc((size_t)n * out * 8), *mag = xalloc((size_t)n * out * 8);
                for (int k = 0; k < n * in; k++) x[k] = rnd();
                for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(rnd());
                for (int k = 0; k < n * ldy; k++) y0[k] = y[k] = rnd();
                void *p = NULL;
                cp_amx_bf16_layout L;
                cr_assert_eq(cp_amx_bf16_pack(w, out, in, &p, &L, &err), CP_OK, "%s", err.msg);
                void *scr = xalloc(cp_amx_bf16_scratch(n, &L, 2));
                cr_assert_eq(cp_amx_bf16_gemm(y, ldy, x, p, &L, n, acc, scr, 2, &err), CP_OK, "%s", err.msg);
                ref_bf16(r, mag, x, w, y0, ldy, n, in, out, acc);
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < out; j++) {
                        const double got = y[(size_t)i * ldy + j], want = r[(size_t)i * out + j];
                        cr_assert(fabs(got - want) <= ldexp((in + 2) * mag[(size_t)i * out + j], -24) + 1e-30,
                                  "n %d in %d out %d acc %d: y[%d][%d] = %.9g, exact products %.9g", n, in, out, acc, i, j, got, want);
                    }
                    for (int j = out; j < ldy; j++)
                        cr_assert_eq(y[(size_t)i * ldy + j], y0[(size_t)i * ldy + j], "n %d in %d out %d: column %d past out written", n,
                                     in, out, j);
                }
                free(x), free(y), free(y0), free(w), free(r), free(mag), free(p), free(scr);
            }
}

/* The bf16 kernel on x already in bf16 (row stride past in) gives the
 * f32 entry's bits on x = those bf16 values */
Test(amx, bf16_input_gives_the_f32_entrys_bits)
{
    need_amx();
    static const int ns[] = { 1, 17, 70 }, ins[] = { 7, 64, 131 };
    const int out = 37;
    rnd_state = 31;
    cp_error err = { 0 };
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++) {
            const int n = ns[a], in = ins[b], ldx = in + 5;
            float *x = xalloc((size_t)n * in * 4), *y1 = xalloc((size_t)n * out * 4), *y2 = xalloc((size_t)n * out * 4);
            uint16_t *xb = xalloc((size_t)n * ldx * 2), *w = xalloc((size_t)out * in * 2);
            for (int i = 0; i < n; i++)
                for (int k = 0; k < ldx; k++) {
                    const uint16_t h = cp_f32_to_bf16(rnd());
                    xb[(size_t)i * ldx + k] = h;
                    if (k < in) x[(size_t)i * in + k] = cp_bf16_to_f32(h);
                }
            for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(rnd());
            void *p = NULL;
            cp_amx_bf16_layout L;
            cr_assert_eq(cp_amx_bf16_pack(w, out, in, &p, &L, &err), CP_OK, "%s", err.msg);
            void *scr = xalloc(cp_amx_bf16_scratch(n, &L, 2));
            cr_assert_eq(cp_amx_bf16_gemm(y1, out, x, p, &L, n, 0, scr, 2, &err), CP_OK, "%s", err.msg);
            cr_assert_eq(cp_amx_bf16_gemm_bx(y2, out, xb, ldx, p, &L, n, 0, scr, 2, &err), CP_OK, "%s", err.msg);
            cr_assert(memcmp(y1, y2, (size_t)n * out * 4) == 0, "n %d in %d: bf16 input differs from its f32 twin", n, in);
            free(x), free(y1), free(y2), free(xb), free(w), free(p), free(scr);
        }
}

/* Batch invariance: every row's outputs are bit for bit its lone run
 * (n = 1: one row tile) in a batch of 16 (one full tile), 37 (tile pairs,
 * the last part-filled, the row at every place) and 256 (several row
 * blocks, both threads), with and without accumulation, in off the K
 * tiles, the model's 896 (two K chunks), out off the column pairs. */
Test(amx, bf16_rows_are_bitwise_their_lone_run, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    static const int ins[] = { 7, 131, 896 }, outs[] = { 37, 100 }, ns[] = { 16, 37, 256 };
    enum { NMAX = 256 };
    rnd_state = 4711;
    cp_error err = { 0 };
    for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
        for (size_t c = 0; c < sizeof outs / sizeof *outs; c++) {
            const int in = ins[b], out = outs[c];
            float *x = xalloc((size_t)NMAX * in * 4), *y0 = xalloc((size_t)NMAX * out * 4);
            float *ya = xalloc((size_t)NMAX * out * 4), *yb = xalloc((size_t)NMAX * out * 4);
            uint16_t *w = xalloc((size_t)out * in * 2);
            for (int k = 0; k < NMAX * in; k++) x[k] = rnd();
            for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(rnd());
            for (int k = 0; k < NMAX * out; k++) y0[k] = rnd();
            void *p = NULL;
            cp_amx_bf16_layout L;
            cr_assert_eq(cp_amx_bf16_pack(w, out, in, &p, &L, &err), CP_OK, "%s", err.msg);
            void *scr = xalloc(cp_amx_bf16_scratch(NMAX, &L, 2));
            for (int acc = 0; acc < 2; acc++) {
                memcpy(ya, y0, (size_t)NMAX * out * 4);
                for (int i = 0; i < NMAX; i++)
                    cr_assert_eq(cp_amx_bf16_gemm(ya + (size_t)i * out, out, x + (size_t)i * in, p, &L, 1, acc, scr, 2, &err), CP_OK, "%s",
                                 err.msg);
                for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
                    const int n = ns[s];
                    for (int start = 0; start + n <= NMAX; start += n) {
                        memcpy(yb, y0, (size_t)NMAX * out * 4);
                        cr_assert_eq(cp_amx_bf16_gemm(yb + (size_t)start * out, out, x + (size_t)start * in, p, &L, n, acc, scr, 2, &err),
                                     CP_OK, "%s", err.msg);
                        for (int i = start; i < start + n; i++)
                            for (int j = 0; j < out; j++)
                                cr_assert(memcmp(&ya[(size_t)i * out + j], &yb[(size_t)i * out + j], 4) == 0,
                                          "in %d out %d acc %d: row %d (place %d of %d) column %d: %.9g in the batch, %.9g alone", in,
                                          out, acc, i, i - start, n, j, yb[(size_t)i * out + j], ya[(size_t)i * out + j]);
                    }
                }
            }
            free(x), free(y0), free(ya), free(yb), free(w), free(p), free(scr);
        }
}

/* ---- int8 -------------------------------------------------------------- */

/* a q8 blob of out x in in the panel layout (what the loader makes on a
 * vnni CPU), *rows the row-major one it was packed from (freed by the
 * caller) */
static void *panel_blob(const float *w, int out, int in, void **rows)
{
    char *r = xalloc(cp_q8_bytes(out, in));
    memset(r, 0xa5, cp_q8_bytes(out, in));
    cp_q8_quantize_rows((int8_t *)(r + cp_q8_off_data(out)), (float *)(void *)(r + cp_q8_off_scales()),
                        (int32_t *)(void *)(r + cp_q8_off_sums(out)), w, out, in);
    *(cp_q8_head *)(void *)r = (cp_q8_head){ CP_Q8_MAGIC, out, in, cp_q8_ld(in), CP_Q8_ROWS };
    void *p = xalloc(cp_q8_bytes_in(out, in, CP_Q8_PANELS));
    cr_assert_eq(cp_q8_pack_blob(p, r), 1);
    *rows = r;
    return p;
}

/* The exact integer reference: x quantized by the vnni kernels' routine,
 * the products summed in int64 (an overflow of int32 would show), then
 * gemm_i8_prefill.c's expression in scalar f32 -- the same bits */
static void ref_i8(float *y, int ldy, const float *x, const void *rows_blob, int n, int in, int out, int acc)
{
    const int ld = cp_q8_ld(in);
    uint8_t *xq = xalloc((size_t)ld);
    const int8_t *q = cp_q8_data(rows_blob);
    const float *sw = cp_q8_scales(rows_blob);
    const int32_t *sum = cp_q8_sums(rows_blob);
    for (int i = 0; i < n; i++) {
        const float sx = q8_quantize_row_u8(x + (size_t)i * in, in, ld, xq);
        for (int j = 0; j < out; j++) {
            int64_t s = 0;
            for (int k = 0; k < ld; k++) s += (int64_t)xq[k] * q[(size_t)j * ld + k];
            cr_assert(s >= INT32_MIN && s <= INT32_MAX, "the reference's sum left int32");
            const int32_t d = (int32_t)s - sum[j] * 128;
            float v = (float)d * (sx * sw[j]);
            if (acc) v = y[(size_t)i * ldy + j] + v;
            y[(size_t)i * ldy + j] = v;
        }
    }
    free(xq);
}

/* Bit for bit the exact integer reference, q8p_gemm (the VNNI prefill
 * kernel, on the same panel blob) and q8_gemm's vnni dot kernels (on the
 * row-major one), at n off the 16- and 32-row tiles, in off the 64-byte
 * K tiles (1, 7, 63, 64, 65, 131) and past one 16-tile K chunk (1090:
 * the sums carried between chunks), out off the 16-column vectors and the
 * 48-column panels (an odd vector count: the 2 x 1 kernel), with and
 * without accumulation, y's row stride past out. */
Test(amx, int8_is_bitwise_the_integer_reference_and_the_vnni_kernels, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    static const int ns[] = { 1, 3, 17, 33, 37 }, ins[] = { 1, 7, 63, 64, 65, 131, 1090 }, outs[] = { 1, 5, 16, 17, 47, 48, 49, 100 };
    rnd_state = 99;
    cp_error err = { 0 };
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
            for (size_t c = 0; c < sizeof outs / sizeof *outs; c++) {
                const int n = ns[a], in = ins[b], out = outs[c], ldy = out + 3, acc = (int)((a + b + c) % 2);
                float *x = xalloc((size_t)n * in * 4), *w = xalloc((size_t)out * in * 4);
                float *y = xalloc((size_t)n * ldy * 4), *yr = xalloc((size_t)n * ldy * 4), *yp = xalloc((size_t)n * ldy * 4),
                      *yd = xalloc((size_t)n * ldy * 4);
                for (int k = 0; k < n * in; k++) x[k] = 3 * rnd();
                for (int k = 0; k < out * in; k++) w[k] = rnd();
                for (int k = 0; k < n * ldy; k++) y[k] = yr[k] = yp[k] = yd[k] = rnd();
                void *rows = NULL, *blob = panel_blob(w, out, in, &rows);
                size_t sb = cp_amx_i8_scratch(n, in, 2), s2 = q8p_scratch(n, in, 4), s3 = q8_scratch(n, in);
                if (s2 > sb) sb = s2;
                if (s3 > sb) sb = s3;
                void *scr = xalloc(sb);
                cr_assert_eq(cp_amx_i8_gemm(y, ldy, x, blob, n, in, out, acc, scr, 2, &err), CP_OK, "%s", err.msg);
                ref_i8(yr, ldy, x, rows, n, in, out, acc);
                q8p_gemm(yp, ldy, x, blob, n, in, out, acc, scr, 2);
                q8_gemm(Q8_VNNI, yd, ldy, x, rows, n, in, out, acc, scr);
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < ldy; j++) {
                        const size_t o = (size_t)i * ldy + j;
                        cr_assert(memcmp(&y[o], &yr[o], 4) == 0, "n %d in %d out %d acc %d: y[%d][%d] = %.9g, integer reference %.9g", n,
                                  in, out, acc, i, j, y[o], yr[o]);
                        cr_assert(memcmp(&y[o], &yp[o], 4) == 0, "n %d in %d out %d acc %d: y[%d][%d] = %.9g, q8p_gemm %.9g", n, in, out,
                                  acc, i, j, y[o], yp[o]);
                        cr_assert(memcmp(&y[o], &yd[o], 4) == 0, "n %d in %d out %d acc %d: y[%d][%d] = %.9g, q8_gemm vnni %.9g", n, in,
                                  out, acc, i, j, y[o], yd[o]);
                    }
                free(x), free(w), free(y), free(yr), free(yp), free(yd), free(rows), free(blob), free(scr);
            }
}

/* The int8 tiles' fused form is the vnni kernels' fused form (q8p_run) bit
 * for bit: RMSNorm rows into three outputs, two with a bias, and SwiGLU
 * rows accumulating into one, at a tile's and at prefill row counts, the
 * scratch poisoned between the calls (no row may come from a stale one). */
Test(amx, int8_fused_is_the_vnni_fused_form_bitwise, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    static const int ns[] = { 3, 17, 37, 100 }, outw[3] = { 48, 100, 17 };
    enum { NMAX = 100, IN = 131 };
    rnd_state = 4242;
    cp_error err = { 0 };
    float *x = xalloc((size_t)NMAX * IN * 4), *up = xalloc((size_t)NMAX * IN * 4), *nw = xalloc((size_t)IN * 4), *bias[3], *ya[3], *yb[3];
    void *rows[3], *blob[3];
    for (int k = 0; k < NMAX * IN; k++) x[k] = 4 * rnd(), up[k] = rnd();
    for (int k = 0; k < IN; k++) nw[k] = 1 + rnd();
    for (int o = 0; o < 3; o++) {
        float *w = xalloc((size_t)outw[o] * IN * 4);
        for (int k = 0; k < outw[o] * IN; k++) w[k] = rnd();
        blob[o] = panel_blob(w, outw[o], IN, &rows[o]);
        free(w);
        bias[o] = o == 1 ? NULL : xalloc((size_t)outw[o] * 4);
        for (int k = 0; bias[o] && k < outw[o]; k++) bias[o][k] = rnd();
        ya[o] = xalloc((size_t)NMAX * outw[o] * 4), yb[o] = xalloc((size_t)NMAX * outw[o] * 4);
    }
    size_t sb = cp_amx_i8_scratch(NMAX, IN, 2), s2 = q8p_scratch(NMAX, IN, 2);
    if (s2 > sb) sb = s2;
    void *scr = xalloc(sb);
    for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
        const int n = ns[s];
        q8p_out qo[3];
        q8p_out ao[3];
        for (int o = 0; o < 3; o++) {
            qo[o] = (q8p_out){ .y = ya[o], .ldy = outw[o], .w = blob[o], .bias = bias[o], .out = outw[o] };
            ao[o] = (q8p_out){ .y = yb[o], .ldy = outw[o], .w = blob[o], .bias = bias[o], .out = outw[o] };
        }
        const q8p_src qn = { .kind = Q8P_SRC_NORM, .x = x, .norm_w = nw, .eps = 1e-5f };
        q8p_run(&qn, qo, 3, n, IN, scr, 2);
        memset(scr, 0xff, sb);
        cr_assert_eq(cp_amx_i8_fused(&qn, ao, 3, n, IN, scr, 2, &err), CP_OK, "%s", err.msg);
        for (int o = 0; o < 3; o++)
            for (int k = 0; k < n * outw[o]; k++)
                cr_assert(memcmp(&ya[o][k], &yb[o][k], 4) == 0, "norm: n %d, output %d: y[%d][%d] = %.9g, vnni %.9g", n, o, k / outw[o],
                          k % outw[o], yb[o][k], ya[o][k]);
        for (int k = 0; k < n * outw[1]; k++) ya[1][k] = yb[1][k] = rnd();
        const q8p_src qs = { .kind = Q8P_SRC_SWIGLU, .x = x, .up = up };
        qo[1].accumulate = ao[1].accumulate = 1;
        q8p_run(&qs, &qo[1], 1, n, IN, scr, 2);
        memset(scr, 0xff, sb);
        cr_assert_eq(cp_amx_i8_fused(&qs, &ao[1], 1, n, IN, scr, 2, &err), CP_OK, "%s", err.msg);
        for (int k = 0; k < n * outw[1]; k++)
            cr_assert(memcmp(&ya[1][k], &yb[1][k], 4) == 0, "swiglu: n %d: y[%d][%d] = %.9g, vnni %.9g", n, k / outw[1], k % outw[1], yb[1][k],
                      ya[1][k]);
    }
    for (int o = 0; o < 3; o++) free(rows[o]), free(blob[o]), free(bias[o]), free(ya[o]), free(yb[o]);
    free(x), free(up), free(nw), free(scr);
}

/* A row holding a NaN gives NaN outputs (as the vnni kernels do), and
 * the other rows of its tile are untouched by it */
Test(amx, int8_nan_row_is_nan_and_alone)
{
    need_amx();
    enum { N = 20, IN = 100, OUT = 40 };
    rnd_state = 7;
    cp_error err = { 0 };
    float *x = xalloc((size_t)N * IN * 4), *w = xalloc((size_t)OUT * IN * 4), *y = xalloc((size_t)N * OUT * 4),
          *yp = xalloc((size_t)N * OUT * 4);
    for (int k = 0; k < N * IN; k++) x[k] = rnd();
    for (int k = 0; k < OUT * IN; k++) w[k] = rnd();
    x[5 * IN + 17] = NAN;
    void *rows = NULL, *blob = panel_blob(w, OUT, IN, &rows);
    size_t sb = cp_amx_i8_scratch(N, IN, 2), s2 = q8p_scratch(N, IN, 4);
    void *scr = xalloc(sb > s2 ? sb : s2);
    cr_assert_eq(cp_amx_i8_gemm(y, OUT, x, blob, N, IN, OUT, 0, scr, 2, &err), CP_OK, "%s", err.msg);
    q8p_gemm(yp, OUT, x, blob, N, IN, OUT, 0, scr, 2);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OUT; j++) {
            const float v = y[i * OUT + j];
            if (i == 5) cr_assert(isnan(v), "row 5 column %d: %g, not NaN", j, v);
            else cr_assert(memcmp(&v, &yp[i * OUT + j], 4) == 0, "row %d column %d: %g, q8p %g", i, j, v, yp[i * OUT + j]);
        }
    free(x), free(w), free(y), free(yp), free(rows), free(blob), free(scr);
}

/* int8 batch invariance, as for bf16: a row alone, in 16, in 37, in 256
 * (the model's 896 and 4864-long rows among them), the same bits */
Test(amx, int8_rows_are_bitwise_their_lone_run, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    static const int ins[] = { 65, 896, 4864 }, ns[] = { 16, 37, 256 };
    const int out = 100;
    enum { NMAX = 256 };
    rnd_state = 1234;
    cp_error err = { 0 };
    for (size_t b = 0; b < sizeof ins / sizeof *ins; b++) {
        const int in = ins[b];
        float *x = xalloc((size_t)NMAX * in * 4), *w = xalloc((size_t)out * in * 4);
        float *y0 = xalloc((size_t)NMAX * out * 4), *ya = xalloc((size_t)NMAX * out * 4), *yb = xalloc((size_t)NMAX * out * 4);
        for (int k = 0; k < NMAX * in; k++) x[k] = rnd();
        for (int k = 0; k < out * in; k++) w[k] = rnd();
        for (int k = 0; k < NMAX * out; k++) y0[k] = rnd();
        void *rows = NULL, *blob = panel_blob(w, out, in, &rows);
        void *scr = xalloc(cp_amx_i8_scratch(NMAX, in, 2));
        for (int acc = 0; acc < 2; acc++) {
            memcpy(ya, y0, (size_t)NMAX * out * 4);
            for (int i = 0; i < NMAX; i++)
                cr_assert_eq(cp_amx_i8_gemm(ya + (size_t)i * out, out, x + (size_t)i * in, blob, 1, in, out, acc, scr, 2, &err), CP_OK, "%s",
                             err.msg);
            for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
                const int n = ns[s];
                for (int start = 0; start + n <= NMAX; start += n) {
                    memcpy(yb, y0, (size_t)NMAX * out * 4);
                    cr_assert_eq(cp_amx_i8_gemm(yb + (size_t)start * out, out, x + (size_t)start * in, blob, n, in, out, acc, scr, 2, &err),
                                 CP_OK, "%s", err.msg);
                    for (int i = start; i < start + n; i++)
                        cr_assert(memcmp(ya + (size_t)i * out, yb + (size_t)i * out, (size_t)out * 4) == 0,
                                  "in %d acc %d: row %d (place %d of %d) differs from its lone run", in, acc, i, i - start, n);
                }
            }
        }
        free(x), free(w), free(y0), free(ya), free(yb), free(rows), free(blob), free(scr);
    }
}

/* The fused form is the plain ops in turn, bit for bit: rmsnorm rows
 * (q8p_rmsnorm_row) into a buffer, a cp_amx_bf16_gemm per output, then
 * cpu_add_bias's y + b -- three outputs of different widths, two with a
 * bias; and silu(gate) x up (q8p_swiglu_span) into y accumulating.  At a
 * decode step's row and at prefill counts, in widths off the tiles. */
Test(amx, fused_norm_and_swiglu_gemms_are_the_plain_ops_bitwise, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    static const int ns[] = { 1, 5, 37, 100 }, ins[] = { 64, 131 }, outw[3] = { 48, 100, 17 };
    enum { NMAX = 100 };
    rnd_state = 9001;
    cp_error err = { 0 };
    for (size_t b = 0; b < sizeof ins / sizeof *ins; b++) {
        const int in = ins[b];
        float *x = xalloc((size_t)NMAX * in * 4), *up = xalloc((size_t)NMAX * in * 4), *nw = xalloc((size_t)in * 4);
        float *rows = xalloc((size_t)NMAX * in * 4), *bias[3], *ya[3], *yb[3];
        void *p[3];
        cp_amx_bf16_layout L[3];
        for (int k = 0; k < NMAX * in; k++) x[k] = 4 * rnd(), up[k] = rnd();
        for (int k = 0; k < in; k++) nw[k] = 1 + rnd();
        for (int o = 0; o < 3; o++) {
            uint16_t *w = xalloc((size_t)outw[o] * in * 2);
            for (int k = 0; k < outw[o] * in; k++) w[k] = cp_f32_to_bf16(rnd());
            cr_assert_eq(cp_amx_bf16_pack(w, outw[o], in, &p[o], &L[o], &err), CP_OK, "%s", err.msg);
            free(w);
            bias[o] = o == 1 ? NULL : xalloc((size_t)outw[o] * 4);
            for (int k = 0; bias[o] && k < outw[o]; k++) bias[o][k] = rnd();
            ya[o] = xalloc((size_t)NMAX * outw[o] * 4), yb[o] = xalloc((size_t)NMAX * outw[o] * 4);
        }
        const size_t scratch_bytes = cp_amx_bf16_fused_scratch(NMAX, in, 2);
        void *scr = xalloc(scratch_bytes);
        for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
            const int n = ns[s];
            /* rmsnorm into three outputs */
            for (int i = 0; i < n; i++) q8p_rmsnorm_row(rows + (size_t)i * in, x + (size_t)i * in, nw, in, 1e-5f);
            cp_amx_bf16_out outs[3];
            for (int o = 0; o < 3; o++) {
                cr_assert_eq(cp_amx_bf16_gemm(ya[o], outw[o], rows, p[o], &L[o], n, 0, scr, 2, &err), CP_OK, "%s", err.msg);
                for (int i = 0; bias[o] && i < n; i++)
                    for (int j = 0; j < outw[o]; j++) ya[o][(size_t)i * outw[o] + j] += bias[o][j];
                outs[o] = (cp_amx_bf16_out){ .y = yb[o], .ldy = outw[o], .wp = p[o], .layout = &L[o], .bias = bias[o] };
            }
            const q8p_src norm = { .kind = Q8P_SRC_NORM, .x = x, .norm_w = nw, .eps = 1e-5f };
            memset(scr, 0xff, scratch_bytes); /* NaN where a row is not staged: the plain calls staged the same rows there */
            cr_assert_eq(cp_amx_bf16_fused(&norm, outs, 3, n, in, scr, 2, &err), CP_OK, "%s", err.msg);
            for (int o = 0; o < 3; o++)
                for (int k = 0; k < n * outw[o]; k++)
                    cr_assert(memcmp(&ya[o][k], &yb[o][k], 4) == 0, "norm: in %d, n %d, output %d: y[%d][%d] = %.9g, the plain ops %.9g", in,
                              n, o, k / outw[o], k % outw[o], yb[o][k], ya[o][k]);
            /* SwiGLU into one output, accumulating onto what y held */
            q8p_swiglu_span(rows, x, up, (size_t)n * in);
            for (int k = 0; k < n * outw[1]; k++) ya[1][k] = yb[1][k] = rnd();
            cr_assert_eq(cp_amx_bf16_gemm(ya[1], outw[1], rows, p[1], &L[1], n, 1, scr, 2, &err), CP_OK, "%s", err.msg);
            const q8p_src sw = { .kind = Q8P_SRC_SWIGLU, .x = x, .up = up };
            outs[1].accumulate = 1;
            memset(scr, 0xff, scratch_bytes);
            cr_assert_eq(cp_amx_bf16_fused(&sw, &outs[1], 1, n, in, scr, 2, &err), CP_OK, "%s", err.msg);
            for (int k = 0; k < n * outw[1]; k++)
                cr_assert(memcmp(&ya[1][k], &yb[1][k], 4) == 0, "swiglu: in %d, n %d: y[%d][%d] = %.9g, the plain ops %.9g", in, n, k / outw[1],
                          k % outw[1], yb[1][k], ya[1][k]);
        }
        /* an output whose weight takes other inputs is refused, saying so */
        cp_amx_bf16_out bad = { .y = yb[0], .ldy = outw[0], .wp = p[0], .layout = &L[0] };
        const q8p_src plain = { .kind = Q8P_SRC_PLAIN, .x = x };
        cr_assert_eq(cp_amx_bf16_fused(&plain, &bad, 1, 1, in + 1, scr, 2, &err), CP_EINVAL);
        cr_assert(strstr(err.msg, "inputs"), "%s", err.msg);
        for (int o = 0; o < 3; o++) free(p[o]), free(bias[o]), free(ya[o]), free(yb[o]);
        free(x), free(up), free(nw), free(rows), free(scr);
    }
}

/* The MLP in one region is the fused forms in turn, bit for bit: gate and
 * up from the normed rows, silu(gate) x up as the source of down,
 * accumulating onto y.  Shapes: an odd count of 16-column blocks in gate
 * (the last K tile of down half written), K past one chunk of 16 tiles in
 * both products (the carried C tiles), down's K in segments over several
 * row blocks, and a decode step's one row. */
Test(amx, the_mlp_in_one_region_is_the_fused_forms_bitwise, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    static const int ns[] = { 1, 16, 17, 70, 600 };
    /* the last: down's K in segments (past KSEG_TILES K tiles), at 600 rows in several row blocks */
    static const struct { int in, inter; } shapes[] = { { 64, 48 }, { 528, 592 }, { 96, 1040 }, { 80, 2600 } };
    enum { NMAX = 600 };
    rnd_state = 4242;
    cp_error err = { 0 };
    for (size_t b = 0; b < sizeof shapes / sizeof *shapes; b++) {
        const int in = shapes[b].in, inter = shapes[b].inter;
        float *x = xalloc((size_t)NMAX * in * 4), *nw = xalloc((size_t)in * 4), *g = xalloc((size_t)NMAX * inter * 4);
        float *u = xalloc((size_t)NMAX * inter * 4), *ya = xalloc((size_t)NMAX * in * 4), *yb = xalloc((size_t)NMAX * in * 4);
        void *p[3];
        cp_amx_bf16_layout L[3];
        for (int k = 0; k < NMAX * in; k++) x[k] = 4 * rnd();
        for (int k = 0; k < in; k++) nw[k] = 1 + rnd();
        for (int o = 0; o < 3; o++) {
            const int rows = o < 2 ? inter : in, cols = o < 2 ? in : inter;
            uint16_t *w = xalloc((size_t)rows * cols * 2);
            for (int k = 0; k < rows * cols; k++) w[k] = cp_f32_to_bf16(rnd());
            cr_assert_eq(cp_amx_bf16_pack(w, rows, cols, &p[o], &L[o], &err), CP_OK, "%s", err.msg);
            free(w);
        }
        size_t sa = cp_amx_bf16_fused_scratch(NMAX, in, 2), sd = cp_amx_bf16_fused_scratch(NMAX, inter, 2);
        const size_t sm = cp_amx_bf16_mlp_scratch(NMAX, in, inter, 2);
        void *scr = xalloc(sa > sd ? sa : sd), *scm = xalloc(sm);
        const cp_amx_bf16_mlp_w w = { p[0], p[1], p[2], &L[0], &L[1], &L[2] };
        for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
            const int n = ns[s];
            const q8p_src norm = { .kind = Q8P_SRC_NORM, .x = x, .norm_w = nw, .eps = 1e-5f };
            const cp_amx_bf16_out gu[2] = { { .y = g, .ldy = inter, .wp = p[0], .layout = &L[0] },
                                            { .y = u, .ldy = inter, .wp = p[1], .layout = &L[1] } };
            cr_assert_eq(cp_amx_bf16_fused(&norm, gu, 2, n, in, scr, 2, &err), CP_OK, "%s", err.msg);
            for (int k = 0; k < n * in; k++) ya[k] = yb[k] = rnd();
            const q8p_src sw = { .kind = Q8P_SRC_SWIGLU, .x = g, .up = u };
            const cp_amx_bf16_out dn = { .y = ya, .ldy = in, .wp = p[2], .layout = &L[2], .accumulate = 1 };
            cr_assert_eq(cp_amx_bf16_fused(&sw, &dn, 1, n, inter, scr, 2, &err), CP_OK, "%s", err.msg);
            memset(scm, 0xff, sm); /* NaN wherever the region would read what it did not write */
            cr_assert_eq(cp_amx_bf16_mlp(&norm, &w, yb, in, 1, n, scm, 2, &err), CP_OK, "%s", err.msg);
            for (int k = 0; k < n * in; k++)
                cr_assert(memcmp(&ya[k], &yb[k], 4) == 0, "in %d, inter %d, n %d: y[%d][%d] = %.9g, the fused forms %.9g", in, inter, n,
                          k / in, k % in, yb[k], ya[k]);
        }
        /* products that do not chain are refused, saying so */
        const cp_amx_bf16_mlp_w bad = { p[0], p[1], p[0], &L[0], &L[1], &L[0] };
        const q8p_src norm = { .kind = Q8P_SRC_NORM, .x = x, .norm_w = nw, .eps = 1e-5f };
        cr_assert_eq(cp_amx_bf16_mlp(&norm, &bad, yb, in, 1, 1, scm, 2, &err), CP_EINVAL);
        cr_assert(strstr(err.msg, "chain"), "%s", err.msg);
        for (int o = 0; o < 3; o++) free(p[o]);
        free(x), free(nw), free(g), free(u), free(ya), free(yb), free(scr), free(scm);
    }
}

/* ---- attention --------------------------------------------------------- */

/* one attention problem: q [n, heads * hd], k / v [keys, kv * hd] (f32,
 * and as bf16 for the cache form), positions past + i for the queries
 * and j for the keys */
typedef struct attn_case {
    int n, keys, heads, kv, hd, window, past;
    float *q, *k, *v;
    uint16_t *k16, *v16;
    int32_t *qp, *kp;
} attn_case;

static void attn_make(attn_case *c, float qscale)
{
    c->q = xalloc((size_t)c->n * c->heads * c->hd * 4);
    c->k = xalloc((size_t)c->keys * c->kv * c->hd * 4), c->v = xalloc((size_t)c->keys * c->kv * c->hd * 4);
    c->k16 = xalloc((size_t)c->keys * c->kv * c->hd * 2), c->v16 = xalloc((size_t)c->keys * c->kv * c->hd * 2);
    c->qp = xalloc((size_t)c->n * 4), c->kp = xalloc((size_t)c->keys * 4);
    for (int e = 0; e < c->n * c->heads * c->hd; e++) c->q[e] = qscale * rnd();
    for (int e = 0; e < c->keys * c->kv * c->hd; e++) {
        c->k[e] = rnd(), c->v[e] = rnd();
        c->k16[e] = cp_f32_to_bf16(c->k[e]), c->v16[e] = cp_f32_to_bf16(c->v[e]);
    }
    for (int i = 0; i < c->n; i++) c->qp[i] = c->past + i;
    for (int j = 0; j < c->keys; j++) c->kp[j] = j;
}

static void attn_free(attn_case *c) { free(c->q), free(c->k), free(c->v), free(c->k16), free(c->v16), free(c->qp), free(c->kp); }

/* rows [r0, r0 + n) of c as their own call (q and positions offset), keys
 * [0, keys); out [n, heads * hd] */
static cp_status attn_run_ex(const attn_case *c, int r0, int n, int keys, int cache16, float *out, float *ex, int ex_ld, const uint8_t *sens,
                             float *mass, const int32_t *ex_rows, cp_error *err)
{
    const int qld = c->heads * c->hd;
    cp_attn_args a = { .q = c->q + (size_t)r0 * qld, .k = cache16 ? NULL : c->k, .v = cache16 ? NULL : c->v, .q_pos = c->qp + r0,
                       .k_pos = c->kp, .out = out, .n = n, .n_keys = keys, .n_heads = c->heads, .n_kv_heads = c->kv, .head_dim = c->hd,
                       .window = c->window, .export_a = ex, .export_ld = ex_ld, .export_weight = 0.5f, .sens_cols = sens, .sens_mass = mass,
                       .k16 = cache16 ? c->k16 : NULL, .v16 = cache16 ? c->v16 : NULL, .export_rows = ex_rows };
    void *scr = xalloc(cp_amx_attn_scratch(&a, 2));
    cp_status s = cp_amx_attention(&a, scr, 2, err);
    free(scr);
    return s;
}

static cp_status attn_run(const attn_case *c, int r0, int n, int keys, int cache16, float *out, cp_error *err)
{
    return attn_run_ex(c, r0, n, keys, cache16, out, NULL, 0, NULL, NULL, NULL, err);
}

/* Against double attention on the bf16-rounded q, k, v (exact scores,
 * softmax in double): |err| <= 2^-7 sum_j p_j |v_j| + 1e-6 -- the
 * probabilities rounded to bf16 (2^-9 relative) and f32 sums; a key
 * dropped, taken from the wrong slot or head, or the causal / window mask
 * off by one moves an output by about p_j |v_j|, far past it.  Query
 * counts off the 16-row tiles, a past before them (keys off the 32-slot
 * tiles), GQA and plain heads, head_dim 32 and 64, a sliding window, the
 * f32 and the bf16 cache. */
Test(amx, attention_matches_a_double_reference, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    static const struct { int n, past, heads, kv, hd, window, swapped; } cs[] = {
        { 1, 0, 4, 2, 64, 0, 0 }, { 5, 20, 4, 2, 64, 0, 0 }, { 37, 0, 2, 2, 32, 0, 0 }, { 37, 11, 4, 1, 64, 0, 0 }, { 23, 30, 4, 2, 32, 9, 0 },
        { 70, 0, 2, 1, 64, 40, 0 },
        { 1, 40, 14, 2, 64, 0, 0 }, { 2, 33, 14, 2, 64, 0, 0 }, /* a decode step's rows x seven heads of a KV head in one A tile */
        /* slots whose positions are not in slot order (neighbours swapped): a
         * row's visible slots are not one run, so its masks come from the
         * positions, not from its range's ends */
        { 37, 11, 4, 1, 64, 0, 1 }, { 23, 30, 4, 2, 32, 9, 1 },
    };
    rnd_state = 555;
    cp_error err = { 0 };
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++)
        for (int cache16 = 0; cache16 < 2; cache16++) {
            attn_case c = { .n = cs[t].n, .keys = cs[t].past + cs[t].n, .heads = cs[t].heads, .kv = cs[t].kv, .hd = cs[t].hd,
                            .window = cs[t].window, .past = cs[t].past };
            attn_make(&c, 3.0f);
            if (cs[t].swapped)
                for (int j = 0; j + 1 < c.keys; j += 2) {
                    const int32_t x = c.kp[j];
                    c.kp[j] = c.kp[j + 1], c.kp[j + 1] = x;
                }
            const int qld = c.heads * c.hd, kld = c.kv * c.hd, group = c.heads / c.kv;
            float *out = xalloc((size_t)c.n * qld * 4), *out2 = xalloc((size_t)c.n * qld * 4);
            cr_assert_eq(attn_run(&c, 0, c.n, c.keys, cache16, out, &err), CP_OK, "%s", err.msg);
            /* again with an export (on top of 1s) and a mass over every third slot */
            float *ex = xalloc((size_t)c.n * c.keys * 4), *mass = xalloc((size_t)c.n * 4);
            double *ex_ref = xalloc((size_t)c.n * c.keys * 8), *mass_ref = xalloc((size_t)c.n * 8);
            uint8_t *sens = xalloc((size_t)c.keys);
            for (int j = 0; j < c.keys; j++) sens[j] = j % 3 == 1;
            for (int e = 0; e < c.n * c.keys; e++) ex[e] = 1.0f, ex_ref[e] = 1.0;
            for (int i = 0; i < c.n; i++) mass[i] = 0, mass_ref[i] = 0;
            cr_assert_eq(attn_run_ex(&c, 0, c.n, c.keys, cache16, out2, ex, c.keys, sens, mass, NULL, &err), CP_OK, "%s", err.msg);
            cr_assert(memcmp(out, out2, (size_t)c.n * qld * 4) == 0, "case %zu: an export changed the output rows", t);
            double *p = xalloc((size_t)c.keys * 8);
            const double scale = 1.0f / sqrtf((float)c.hd);
            for (int i = 0; i < c.n; i++)
                for (int h = 0; h < c.heads; h++) {
                    const int g = h / group, qpos = c.qp[i];
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j < c.keys; j++) {
                        const int vis = c.kp[j] <= qpos && (c.window == 0 || c.kp[j] > qpos - c.window);
                        double s = 0;
                        for (int d = 0; d < c.hd; d++)
                            s += (double)cp_bf16_to_f32(cp_f32_to_bf16(c.q[(size_t)i * qld + h * c.hd + d])) *
                                 cp_bf16_to_f32(c.k16[(size_t)j * kld + g * c.hd + d]);
                        p[j] = vis ? s * scale : -INFINITY;
                        if (p[j] > mx) mx = p[j];
                    }
                    for (int j = 0; j < c.keys; j++) p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx), sum += p[j];
                    double m = 0;
                    for (int j = 0; j < c.keys; j++) {
                        ex_ref[(size_t)i * c.keys + j] += 0.5 * p[j] / sum;
                        if (sens[j]) m += p[j] / sum;
                    }
                    if (m > mass_ref[i]) mass_ref[i] = m;
                    for (int d = 0; d < c.hd; d++) {
                        double o = 0, mag = 0;
                        for (int j = 0; j < c.keys; j++) {
                            const double vv = cp_bf16_to_f32(c.v16[(size_t)j * kld + g * c.hd + d]);
                            o += p[j] / sum * vv, mag += p[j] / sum * fabs(vv);
                        }
                        const double got = out[(size_t)i * qld + h * c.hd + d];
                        cr_assert(fabs(got - o) <= ldexp(mag, -7) + 1e-6,
                                  "case %zu cache16 %d: row %d head %d dim %d: %.9g, reference %.9g (sum p|v| %.3g)", t, cache16, i, h, d, got,
                                  o, mag);
                    }
                }
            /* f32 probabilities from exact bf16 products: a relative error of a few ulps */
            for (int e = 0; e < c.n * c.keys; e++)
                cr_assert(fabs(ex[e] - ex_ref[e]) <= 1e-5, "case %zu cache16 %d: export (%d, %d) %.9g, reference %.9g", t, cache16, e / c.keys,
                          e % c.keys, ex[e], ex_ref[e]);
            for (int i = 0; i < c.n; i++)
                cr_assert(fabs(mass[i] - mass_ref[i]) <= 1e-5, "case %zu cache16 %d: row %d's sensitive mass %.9g, reference %.9g", t, cache16, i,
                          mass[i], mass_ref[i]);
            free(p), free(out), free(out2), free(ex), free(mass), free(ex_ref), free(mass_ref), free(sens);
            attn_free(&c);
        }
}

/* Batch invariance: a query's output is bit for bit the same computed
 * alone (one row against the cache), in the whole prefill, and in a
 * prefill cut into chunks of other sizes (each chunk against the keys so
 * far) -- with and without a sliding window, whose lone rows start their
 * key tiles elsewhere than the prefill's. */
Test(amx, attention_rows_are_bitwise_their_lone_run, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    static const int windows[] = { 0, 9 };
    rnd_state = 808;
    cp_error err = { 0 };
    for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
        attn_case c = { .n = 70, .keys = 70, .heads = 4, .kv = 2, .hd = 64, .window = windows[w], .past = 0 };
        attn_make(&c, 3.0f);
        const int qld = c.heads * c.hd;
        float *all = xalloc((size_t)c.n * qld * 4), *one = xalloc((size_t)qld * 4), *chunk = xalloc((size_t)c.n * qld * 4);
        cr_assert_eq(attn_run(&c, 0, c.n, c.keys, 0, all, &err), CP_OK, "%s", err.msg);
        for (int i = 0; i < c.n; i++) {
            cr_assert_eq(attn_run(&c, i, 1, i + 1, 0, one, &err), CP_OK, "%s", err.msg);
            cr_assert(memcmp(one, all + (size_t)i * qld, (size_t)qld * 4) == 0, "window %d: row %d alone differs from the prefill's",
                      c.window, i);
        }
        /* the export and the mass: each row's alone into row 0 of its own
         * buffers, against the whole call naming every row's target --
         * rows sent to -1 add nothing, the others land in reversed rows */
        float *exa = xalloc((size_t)c.n * c.keys * 4), *exo = xalloc((size_t)c.keys * 4), *mg = xalloc((size_t)(c.n + 1) * 4), *ma = mg + 1, mo;
        mg[0] = 0; /* a guard before the masses: a row sent to -1 writes none */
        int32_t *rows = xalloc((size_t)c.n * 4);
        uint8_t *sens = xalloc((size_t)c.keys);
        for (int j = 0; j < c.keys; j++) sens[j] = j % 5 == 2;
        for (int i = 0; i < c.n; i++) rows[i] = i % 7 == 3 ? -1 : c.n - 1 - i, ma[i] = 0;
        memset(exa, 0, (size_t)c.n * c.keys * 4);
        cr_assert_eq(attn_run_ex(&c, 0, c.n, c.keys, 0, chunk, exa, c.keys, sens, ma, rows, &err), CP_OK, "%s", err.msg);
        cr_assert(memcmp(chunk, all, (size_t)c.n * qld * 4) == 0, "window %d: exporting changed the output rows", c.window);
        for (int i = 0; i < c.n; i++) {
            memset(exo, 0, (size_t)c.keys * 4), mo = 0;
            cr_assert_eq(attn_run_ex(&c, i, 1, i + 1, 0, one, exo, c.keys, sens, &mo, NULL, &err), CP_OK, "%s", err.msg);
            if (rows[i] < 0) continue;
            cr_assert(memcmp(exo, exa + (size_t)rows[i] * c.keys, (size_t)c.keys * 4) == 0, "window %d: row %d's export differs from its lone run's",
                      c.window, i);
            cr_assert(memcmp(&mo, ma + rows[i], 4) == 0, "window %d: row %d's mass differs from its lone run's", c.window, i);
        }
        for (int i = 0; i < c.n; i++)
            if (i % 7 == 3) /* its target row, c.n - 1 - i, is no other row's */
                for (int j = 0; j < c.keys; j++)
                    cr_assert(exa[(size_t)(c.n - 1 - i) * c.keys + j] == 0, "window %d: row %d, sent to -1, exported", c.window, i);
        cr_assert(mg[0] == 0, "window %d: a mass was written before the first row", c.window);
        free(exa), free(exo), free(mg), free(rows), free(sens);
        static const int cuts[] = { 0, 13, 21, 29, 30, 70 }; /* chunks of 13, 8, 8, 1, 40 rows (8 x 2 heads: one A tile) */
        for (size_t k = 0; k + 1 < sizeof cuts / sizeof *cuts; k++)
            cr_assert_eq(attn_run(&c, cuts[k], cuts[k + 1] - cuts[k], cuts[k + 1], 0, chunk + (size_t)cuts[k] * qld, &err), CP_OK, "%s",
                         err.msg);
        for (int i = 0; i < c.n; i++)
            cr_assert(memcmp(chunk + (size_t)i * qld, all + (size_t)i * qld, (size_t)qld * 4) == 0,
                      "window %d: row %d in a chunked prefill differs from the whole prefill's", c.window, i);
        free(all), free(one), free(chunk);
        attn_free(&c);
    }
}

/* what the tile attention does not do, it refuses, saying what */
Test(amx, attention_refuses_what_it_does_not_do)
{
    need_amx();
    float q[48] = { 0 }, k[48] = { 0 }, out[48], ex[4] = { 0 };
    int32_t pos[1] = { 0 };
    cp_attn_args a = { .q = q, .k = k, .v = k, .q_pos = pos, .k_pos = pos, .out = out, .n = 1, .n_keys = 1, .n_heads = 1, .n_kv_heads = 1,
                       .head_dim = 48 };
    char scr[1 << 16] __attribute__((aligned(64)));
    cp_error err = { 0 };
    cr_assert_eq(cp_amx_attention(&a, scr, 1, &err), CP_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "head_dim 48"), "%s", err.msg);
    a.head_dim = 32, a.export_a = ex, a.export_ld = 1, a.out = NULL;
    cr_assert(cp_amx_attn_scratch(&a, 1) <= sizeof scr);
    cr_assert_eq(cp_amx_attention(&a, scr, 1, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "no output rows"), "%s", err.msg);
    a.out = out, a.export_ld = 0;
    cr_assert_eq(cp_amx_attention(&a, scr, 1, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "narrower"), "%s", err.msg);
    a.export_ld = 1;
    cr_assert_eq(cp_amx_attention(&a, scr, 1, &err), CP_OK, "%s", err.msg);
}

/* ---- the amx path of the CPU backend ----------------------------------- */

/* CP_CPU_ISA=amx with the tiles ready: the describe line names the tile
 * kernels; a bf16 matrix packed at load runs cp_amx_bf16_gemm's bits at
 * every n (a decode row included), reads back row-major through download
 * and by rows through embed (a tied table as the LM head); a plain one
 * gives a row its lone bits; an int8 matrix, in panel order or row-major,
 * gives cp_amx_i8_gemm's bits on both sides of the tile/vnni switch */
Test(amx, the_amx_path_runs_the_tile_kernels, .timeout = TEST_TIMEOUT(60))
{
    need_amx();
    cp_error err = { 0 };
    const int in = 96, out = 40, nmax = 37;
    rnd_state = 41;
    uint16_t *w = xalloc((size_t)out * in * 2), *back = xalloc((size_t)out * in * 2);
    float *wf = xalloc((size_t)out * in * 4), *x = xalloc((size_t)nmax * in * 4);
    float *ya = xalloc((size_t)nmax * out * 4), *yb = xalloc((size_t)nmax * out * 4), *rows = xalloc((size_t)3 * in * 4);
    for (int k = 0; k < out * in; k++) wf[k] = rnd(), w[k] = cp_f32_to_bf16(wf[k]);
    for (int k = 0; k < nmax * in; k++) x[k] = rnd();
    cp_backend *be = test_cpu_backend_on("amx");
    cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
    cr_assert(strstr(be->describe(be), "AMX tile kernels"), "the amx path names its kernels: %s", be->describe(be));
    cr_assert((be->flags & CP_BE_EMBED_READS_PACKED), "the amx path's embed reads its packed rows: the loader must be told");
    cp_matrix bpm = { 0 };
    size_t bytes = 0;
    cr_assert_eq(be->pack_matrix(be, w, out, in, &bpm, &bytes, &err), CP_OK, "%s", err.msg);
    void *bp = bpm.data;
    cr_assert(bp, "the amx path packs bf16 matrices at load");
    cp_amx_bf16_layout L;
    cr_assert_eq(cp_amx_bf16_layout_of(out, in, &L, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(bytes, L.bytes, "packed in the tile layout: %zu bytes, not %zu", bytes, L.bytes);
    void *scratch = xalloc(cp_amx_bf16_scratch(nmax, &L, 1));
    const int ns[] = { 1, 6, 16, 17, nmax };
    for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
        const int n = ns[c];
        cr_assert_eq(cp_amx_bf16_gemm(ya, out, x, bp, &L, n, 0, scratch, 1, &err), CP_OK, "%s", err.msg);
        be->matmul(be, yb, out, x, &bpm, NULL, n, in, out, 0);
        cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
        cr_assert(!memcmp(ya, yb, (size_t)n * out * 4), "n %d: the backend's bf16 matmul is not the tile kernel's bits", n);
    }
    cr_assert_eq(cp_matrix_download(be, back, &bpm, &err), CP_OK, "%s", err.msg);
    cr_assert(!memcmp(back, w, (size_t)out * in * 2), "a packed amx matrix downloads as it was given");
    const int32_t ids[3] = { 0, 17, out - 1 };
    be->embed(be, rows, &bpm, ids, 3, in);
    cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < in; k++)
            cr_assert_eq(cp_f32_to_bf16(rows[(size_t)i * in + k]), w[(size_t)ids[i] * in + k], "embed row %d [%d] of a packed table", ids[i], k);
    cp_matrix_free(be, &bpm);
    /* a plain (unpacked) matrix: oneDNN's fixed row blocks, a row's bits alone as in a batch */
    uint16_t *plain = NULL;
    cr_assert_eq(be->alloc(be, (size_t)out * in * 2, (void **)&plain, &err), CP_OK, "%s", err.msg);
    memcpy(plain, w, (size_t)out * in * 2);
    be->matmul(be, ya, out, x + (size_t)(nmax - 1) * in, TEST_MAT(be, plain, out, in), NULL, 1, in, out, 0);
    be->matmul(be, yb, out, x, TEST_MAT(be, plain, out, in), NULL, nmax, in, out, 0);
    cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
    cr_assert(!memcmp(ya, yb + (size_t)(nmax - 1) * out, (size_t)out * 4), "a plain matrix: row %d alone is not its bits in a batch of %d",
              nmax - 1, nmax);
    be->free(be, plain);
    cp_backend_destroy(be);
    free(scratch);

    be = test_cpu_backend_on("amx");
    cr_assert_eq(be->set_matrix_dtype(be, CP_I8, &err), CP_OK, "%s", err.msg);
    cr_assert(strstr(be->describe(be), "AMX tile kernel"), "the amx path's int8 names the tile kernel: %s", be->describe(be));
    void *rows_blob = NULL, *pw = panel_blob(wf, out, in, &rows_blob);
    scratch = xalloc(cp_amx_i8_scratch(nmax, in, 1));
    for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
        const int n = ns[c];
        cr_assert_eq(cp_amx_i8_gemm(ya, out, x, pw, n, in, out, 0, scratch, 1, &err), CP_OK, "%s", err.msg);
        be->matmul(be, yb, out, x, TEST_MAT(be, pw, out, in), NULL, n, in, out, 0);
        cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
        cr_assert(!memcmp(ya, yb, (size_t)n * out * 4), "n %d: the backend's int8 matmul is not the tile kernel's bits", n);
        be->matmul(be, yb, out, x, TEST_MAT(be, rows_blob, out, in), NULL, n, in, out, 0); /* row-major: the vnni kernels, the same integers */
        cr_assert_eq(be->sync(be, &err), CP_OK, "n %d: a row-major int8 matrix on the amx path: %s", n, err.msg);
        cr_assert(!memcmp(ya, yb, (size_t)n * out * 4), "n %d: a row-major int8 matrix is not the panel matrix's bits", n);
    }
    cp_backend_destroy(be);
    free(scratch), free(pw), free(rows_blob);
    free(w), free(back), free(wf), free(x), free(ya), free(yb), free(rows);
}

/* The elementwise ops on a bf16 tile path take the vector forms the int8
 * path has (q8p_swiglu's exp, q8p_rmsnorm's 8 double lanes): the products
 * round every activation to bf16, so their 2e-7 is lost below it, and the
 * scalar forms were most of the norms' and SwiGLU's time.  The f32-compute
 * avx512 path keeps the exact ones (libm's expf, a scalar double sum). */
Test(amx, the_bf16_tile_path_runs_the_vector_swiglu_and_norm)
{
    need_amx();
    enum { N = 3, DIM = 333 };
    static float g[N * DIM], u[N * DIM], w[DIM], o[N * DIM], want[N * DIM];
    rnd_state = 9;
    for (int i = 0; i < N * DIM; i++) g[i] = 8 * rnd(), u[i] = rnd();
    for (int j = 0; j < DIM; j++) w[j] = 0.5f + rnd();
    const char *paths[] = { "amx", "avx512" };
    for (int p = 0; p < 2; p++) {
        cp_error err = { 0 };
        cp_backend *be = test_cpu_backend_on(paths[p]);
        cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
        be->swiglu(be, o, g, u, (size_t)N * DIM);
        if (p == 0) q8p_swiglu(want, g, u, (size_t)N * DIM);
        else cpu_swiglu(want, g, u, (size_t)N * DIM);
        cr_assert(memcmp(o, want, sizeof o) == 0, "%s: SwiGLU is not the %s form", paths[p], p ? "scalar" : "vector");
        be->rmsnorm(be, o, g, w, N, DIM, 1e-6f);
        if (p == 0) q8p_rmsnorm(want, g, w, N, DIM, 1e-6f);
        else cpu_rmsnorm(want, g, w, N, DIM, 1e-6f);
        cr_assert(memcmp(o, want, sizeof o) == 0, "%s: RMSNorm is not the %s form", paths[p], p ? "scalar" : "vector");
        cp_backend_destroy(be);
    }
}
