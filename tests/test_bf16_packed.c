/* bf16 compute on packed weights (kernels/cpu/gemm_bf16_packed.h, the
 * CP_CPU_ISA=avx512bf16 path): the layout's round trip, the kernel against
 * a double reference with a bound from bf16 rounding, batch invariance
 * through the backend at every n a serving step or a prefill has (packed
 * matrices and the plain tied LM head alike), download of a packed matrix,
 * and cp-books-6m against the f32 reference.  Every test skips, saying so,
 * where the CPU has no AVX512_BF16. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/sampler.h"
#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/cpu/gemm_bf16_packed.h"
#include "helpers.h"

static void need_bf16(void)
{
    cpu_features f;
    cpu_features_detect(&f);
    if (!f.avx512_bf16) cr_skip_test("no AVX512_BF16 here: the packed vdpbf16ps kernel is not tested");
}

static uint32_t rnd_state;
static float rnd(void) { return test_lcg_uniform(&rnd_state); }
static void *xalloc(size_t bytes) { return test_xalloc64(bytes); }

/* the layout is a permutation plus zero padding: unpack gives every
 * element back, for in odd / even and out off the 16-column blocks */
Test(bf16p, pack_and_unpack_are_inverse)
{
    static const int ins[] = { 1, 7, 8, 33, 130 }, outs[] = { 1, 15, 16, 17, 50 };
    rnd_state = 11;
    for (size_t a = 0; a < sizeof ins / sizeof *ins; a++)
        for (size_t b = 0; b < sizeof outs / sizeof *outs; b++) {
            const int in = ins[a], out = outs[b];
            uint16_t *w = xalloc((size_t)out * in * 2), *back = xalloc((size_t)out * in * 2);
            void *p = xalloc(bf16p_bytes(out, in));
            for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(rnd());
            cr_assert_eq(bf16p_bytes(out, in), (size_t)((out + 15) / 16) * 16 * (size_t)((in + 1) / 2) * 2 * 2);
            bf16p_pack(p, w, out, in);
            memset(back, 0xff, (size_t)out * in * 2);
            bf16p_unpack(back, p, out, in);
            cr_assert(memcmp(w, back, (size_t)out * in * 2) == 0, "out %d in %d: unpack(pack(W)) != W", out, in);
            /* the vdpbf16ps operand: element (j, k) at [j/16][k/2][j%16][k%2] */
            const uint16_t *q = p;
            int j = out - 1, k = in - 1;
            cr_assert_eq(q[((size_t)(j / 16) * ((in + 1) / 2) + k / 2) * 32 + (j % 16) * 2 + k % 2], w[(size_t)j * in + k]);
            free(w), free(back), free(p);
        }
}

/* y = (acc ? y0 : 0) + xr . W^T in double, with xr = x (or x rounded to
 * bf16 when round), and sum |x||w| per output */
static void ref(double *y, double *mag, const float *x, const uint16_t *w, const float *y0, int n, int in, int out, int acc, int round)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) {
            double s = acc ? y0[(size_t)i * out + j] : 0, a = fabs(s);
            for (int k = 0; k < in; k++) {
                float xv = x[(size_t)i * in + k];
                if (round) xv = cp_bf16_to_f32(cp_f32_to_bf16(xv));
                double p = (double)xv * cp_bf16_to_f32(w[(size_t)j * in + k]);
                s += p, a += fabs(p);
            }
            y[(size_t)i * out + j] = s, mag[(size_t)i * out + j] = a;
        }
}

/* Accuracy, two bounds per output: against exact products of x itself,
 * |err| <= 2^-8 sum|x||w| (x rounded to bf16 is within 2^-9 relative of
 * x; the rest is f32 accumulation, in 2^-24 per step at most); against
 * exact products of bf16(x), |err| <= (in + 2) 2^-24 sum|x||w| (f32
 * accumulation only: the products of two bf16 are exact in f32) -- which
 * a kernel that dropped, doubled or misplaced a product, or rounded x
 * some other way than to nearest even, would break. */
Test(bf16p, kernel_matches_a_double_reference_within_bf16_rounding)
{
    need_bf16();
    static const int ns[] = { 1, 3, 8, 9, 17 }, ins[] = { 1, 7, 40, 131 }, outs[] = { 5, 16, 49, 100 };
    rnd_state = 12345;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
            for (size_t c = 0; c < sizeof outs / sizeof *outs; c++)
                for (int acc = 0; acc < 2; acc++) {
                    const int n = ns[a], in = ins[b], out = outs[c];
                    float *x = xalloc((size_t)n * in * 4), *y = xalloc((size_t)n * out * 4), *y0 = xalloc((size_t)n * out * 4);
                    uint16_t *w = xalloc((size_t)out * in * 2);
                    void *p = xalloc(bf16p_bytes(out, in)), *scr = xalloc(bf16p_scratch(n, in));
                    double *r0 = xalloc((size_t)n * out * 8), *r1 = xalloc((size_t)n * out * 8), *mag = xalloc((size_t)n * out * 8);
                    for (int k = 0; k < n * in; k++) x[k] = rnd();
                    for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(rnd());
                    for (int k = 0; k < n * out; k++) y0[k] = y[k] = rnd();
                    bf16p_pack(p, w, out, in);
                    bf16p_gemm(y, out, x, p, n, in, out, acc, scr);
                    ref(r0, mag, x, w, y0, n, in, out, acc, 0);
                    ref(r1, mag, x, w, y0, n, in, out, acc, 1);
                    for (int k = 0; k < n * out; k++) {
                        double e0 = fabs(y[k] - r0[k]), e1 = fabs(y[k] - r1[k]);
                        cr_assert(e0 <= ldexp(mag[k], -8), "n %d in %d out %d acc %d: y[%d] = %.9g, exact %.9g", n, in, out, acc, k, y[k],
                                  r0[k]);
                        cr_assert(e1 <= ldexp((in + 2) * mag[k], -24) + 1e-30, "n %d in %d out %d acc %d: y[%d] = %.9g, bf16(x) exact %.9g",
                                  n, in, out, acc, k, y[k], r1[k]);
                    }
                    free(x), free(y), free(y0), free(w), free(p), free(scr), free(r0), free(r1), free(mag);
                }
}

/* bf16p_gemm_plain (a plain W, rows in the lanes: the tied LM head)
 * gives bf16p_gemm's bits on the packed W, for in odd and even, out off
 * the 16/48-column tiles, n off the 16-row lane groups and past a 64-row
 * work item (1, 2, 9, 17, 70), with and without accumulation: where a
 * matrix lives is never a numerical choice */
Test(bf16p, plain_and_packed_weights_give_the_same_bits)
{
    need_bf16();
    static const int ins[] = { 1, 7, 33, 64, 131 }, outs[] = { 3, 16, 37, 100 }, ns[] = { 1, 2, 9, 17, 70 };
    rnd_state = 99;
    for (size_t a = 0; a < sizeof ins / sizeof *ins; a++)
        for (size_t b = 0; b < sizeof outs / sizeof *outs; b++)
            for (size_t c = 0; c < sizeof ns / sizeof *ns; c++)
                for (int acc = 0; acc < 2; acc++) {
                    const int in = ins[a], out = outs[b], n = ns[c];
                    float *x = xalloc((size_t)n * in * 4), *yp = xalloc((size_t)n * out * 4), *yq = xalloc((size_t)n * out * 4);
                    uint16_t *w = xalloc((size_t)out * in * 2);
                    void *p = xalloc(bf16p_bytes(out, in)), *scr = xalloc(bf16p_plain_scratch(n, in));
                    for (int k = 0; k < n * in; k++) x[k] = rnd();
                    for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(rnd());
                    for (int k = 0; k < n * out; k++) yp[k] = yq[k] = rnd();
                    bf16p_pack(p, w, out, in);
                    bf16p_gemm(yp, out, x, p, n, in, out, acc, scr);
                    bf16p_gemm_plain(yq, out, x, w, n, in, out, acc, scr);
                    for (int k = 0; k < n * out; k++)
                        cr_assert(memcmp(&yp[k], &yq[k], 4) == 0, "in %d out %d n %d acc %d: y[%d][%d]: packed %.9g, plain %.9g", in, out, n,
                                  acc, k / out, k % out, yp[k], yq[k]);
                    free(x), free(yp), free(yq), free(w), free(p), free(scr);
                }
}

/* a matrix of out x in on be: packed when pack (NULL back: the test fails,
 * the path must pack), else plain backend memory */
static cp_matrix matrix_on(cp_backend *be, const uint16_t *w, int out, int in, int pack)
{
    cp_error err = { 0 };
    cp_matrix m = { 0 };
    size_t bytes = 0;
    if (pack) {
        cr_assert_eq(be->pack_matrix(be, w, out, in, &m, &bytes, &err), CP_OK, "%s", err.msg);
        cr_assert(m.data && bytes == bf16p_bytes(out, in), "avx512bf16 did not pack a [%d x %d] matrix", out, in);
        return m;
    }
    void *p = NULL;
    cr_assert_eq(be->alloc(be, (size_t)out * in * 2, &p, &err), CP_OK, "%s", err.msg);
    memcpy(p, w, (size_t)out * in * 2);
    return cp_matrix_rows(p, CP_BF16, out, in);
}

/* Batch invariance at every n: through the backend (CP_CPU_ISA=avx512bf16)
 * a row's outputs are bit for bit its lone run at n = 1, 2, 5, 16, 17, 48,
 * 64 (decode and serving steps), 200 (prefill: past the 64-row work items
 * and the 8-row tiles), at every place in the batch, with and without
 * accumulation, for in odd (7, 131) and the model's 896, out off the 16-
 * and 48-column tiles (37, 100), on packed matrices (bf16p_gemm) and plain
 * ones (the tied embedding as the LM head: bf16p_gemm_plain; before, the
 * dot kernels there ran one chain at 2-4 rows and two alone). */
Test(bf16p, rows_are_bitwise_their_lone_run_at_every_n, .timeout = TEST_TIMEOUT(30))
{
    need_bf16();
    cp_backend *be = test_cpu_backend_on("avx512bf16");
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
    static const int ns[] = { 2, 5, 16, 17, 48, 64, 200 }, ins[] = { 7, 131, 896 }, outs[] = { 37, 100 };
    enum { NMAX = 200 };
    rnd_state = 777;
    for (int pack = 1; pack >= 0; pack--)
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
            for (size_t c = 0; c < sizeof outs / sizeof *outs; c++) {
                const int in = ins[b], out = outs[c];
                float *x = xalloc((size_t)NMAX * in * 4), *y0 = xalloc((size_t)NMAX * out * 4);
                float *yb = xalloc((size_t)NMAX * out * 4), *ya = xalloc((size_t)NMAX * out * 4);
                uint16_t *w = xalloc((size_t)out * in * 2);
                for (int k = 0; k < NMAX * in; k++) x[k] = rnd();
                for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(rnd());
                for (int k = 0; k < NMAX * out; k++) y0[k] = rnd();
                cp_matrix wm = matrix_on(be, w, out, in, pack);
                for (int acc = 0; acc < 2; acc++) {
                    /* every row alone, once */
                    memcpy(ya, y0, (size_t)NMAX * out * 4);
                    for (int i = 0; i < NMAX; i++) be->matmul(be, ya + (size_t)i * out, out, x + (size_t)i * in, &wm, NULL, 1, in, out, acc);
                    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
                        const int n = ns[a], i0 = NMAX - n; /* the batch's rows are the last n: each at another place than alone */
                        memcpy(yb, y0 + (size_t)i0 * out, (size_t)n * out * 4);
                        be->matmul(be, yb, out, x + (size_t)i0 * in, &wm, NULL, n, in, out, acc);
                        cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
                        for (int i = 0; i < n; i++)
                            for (int j = 0; j < out; j++) {
                                const float bv = yb[(size_t)i * out + j], av = ya[(size_t)(i0 + i) * out + j];
                                cr_assert(memcmp(&bv, &av, 4) == 0, "%s in %d out %d acc %d: row %d of %d, column %d: %.9g batched, %.9g alone",
                                          pack ? "packed" : "plain", in, out, acc, i, n, j, bv, av);
                            }
                    }
                }
                cp_matrix_free(be, &wm);
                free(x), free(y0), free(yb), free(ya), free(w);
            }
    cp_backend_destroy(be);
}

/* download gives a packed matrix back row-major, bit for bit; embed reads its rows exactly (a tied table packed as the
 * LM head); the path's description counts the packed matrices */
Test(bf16p, a_packed_matrix_downloads_as_it_was_given)
{
    need_bf16();
    cp_backend *be = test_cpu_backend_on("avx512bf16");
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
    enum { OUT = 21, IN = 9 };
    uint16_t w[OUT * IN], back[OUT * IN];
    rnd_state = 5;
    for (int k = 0; k < OUT * IN; k++) w[k] = cp_f32_to_bf16(rnd());
    cp_matrix p = matrix_on(be, w, OUT, IN, 1);
    cr_assert(strstr(be->describe(be), "on 1 matrices packed"), "%s", be->describe(be));
    cr_assert_eq(cp_matrix_download(be, back, &p, &err), CP_OK, "%s", err.msg);
    cr_assert(memcmp(w, back, sizeof w) == 0, "a packed matrix downloaded other bytes than were packed");
    const int32_t ids[] = { 20, 0, 17, 5, 20 };
    float rows[5 * IN];
    be->embed(be, rows, &p, ids, 5, IN);
    cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < IN; k++)
            cr_assert_eq(rows[i * IN + k], cp_bf16_to_f32(w[ids[i] * IN + k]), "embed row %d (id %d) element %d from the packed table", i,
                         ids[i], k);
    cr_assert((be->flags & CP_BE_EMBED_READS_PACKED), "the avx512bf16 path's embed reads packed rows: the loader must be told");
    cp_matrix_free(be, &p);
    cr_assert(strstr(be->describe(be), "on 0 matrices packed"), "%s", be->describe(be));
    cp_backend_destroy(be);
}

/* cp-books-6m (BF16, tied embeddings) on the avx512bf16 path against the
 * f32 reference: its matrices packed at load (6 layers x 7, and the tied
 * embedding, which embed reads by rows and the LM head runs), the bytes
 * those of the plain bf16 load (no second copy; its shapes need no
 * padding), logits NMSE and KL within the bf16-compute bounds of
 * tests/test_bf16.c (oneDNN: 1.1e-6 measured, bound 5e-6) and 30 of 32
 * greedy tokens (measured: printed with --verbose). */
Test(bf16p, cp_books_stays_near_the_f32_reference, .timeout = TEST_TIMEOUT(60))
{
    need_bf16();
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    int T;
    int32_t *ids = test_golden_ids(dir, &T);
    cp_backend *be32, *be16, *bep;
    cp_model *m32 = test_load_as(dir, NULL, CP_WEIGHTS_F32, &be32);
    cp_model *mp = test_load_as(dir, "avx512bf16", CP_WEIGHTS_BF16, &bep);
    cp_model *m16 = test_load_as(dir, "avx512", CP_WEIGHTS_BF16, &be16);
    cr_assert(strstr(bep->describe(bep), "on 43 matrices packed"), "%s", bep->describe(bep));
    cr_assert_eq(mp->lm_head.data, mp->embed.data, "the tie is one matrix");
    cr_assert_eq(mp->weight_bytes, m16->weight_bytes, "packed load holds %zu weight bytes, plain bf16 %zu", mp->weight_bytes, m16->weight_bytes);
    float *ref32 = test_all_logits(m32, ids, T, 16), *lg = test_all_logits(mp, ids, T, 16);
    const int V = m32->cfg.vocab;
    double e = test_nmse(lg, ref32, (size_t)T * V), kl = test_mean_kl(lg, ref32, T, V);
    int flips = 0;
    for (int t = 0; t < T; t++) flips += cp_argmax(lg + (size_t)t * V, V) != cp_argmax(ref32 + (size_t)t * V, V);
    cr_log_info("cp-books-6m avx512bf16 (bf16p): NMSE %.3g, KL %.3g nats, %d/%d top-1 flips", e, kl, flips, T);
    cr_assert(e <= 5e-6, "NMSE %.3g > 5e-6", e);
    cr_assert(e > 1e-9, "NMSE %.3g: are the activations rounded to bf16 at all?", e);
    cr_assert(kl <= 5e-5, "KL %.3g > 5e-5", kl);
    free(lg), free(ref32), free(ids);
    cp_model_free(m16), cp_model_free(mp), cp_model_free(m32);
    cp_backend_destroy(be16), cp_backend_destroy(bep), cp_backend_destroy(be32);
}

/* The vdpbf16ps dot kernel on plain W (the profiling benches' reference
 * for bf16 compute at a few rows): a row's bits alone
 * are its bits at every place in a batch of 2, 3, 4, 5, 16 (every
 * remainder of its 4-row groups), for in past and off its 64-wide
 * two-chain loop; before, one row ran two chains and a group of 2-4 one. */
Test(bf16p, dp_kernel_rows_are_bitwise_their_lone_run)
{
    need_bf16();
    static const int ins[] = { 40, 130, 200 }, ns[] = { 2, 3, 4, 5, 16 };
    enum { OUT = 19, NMAX = 16, INMAX = 200 };
    static float x[NMAX * INMAX], ya[NMAX * OUT], yb[NMAX * OUT];
    static uint16_t w[OUT * INMAX];
    void *scr = xalloc(bf16_dp_scratch(NMAX, INMAX));
    rnd_state = 31;
    for (int k = 0; k < NMAX * INMAX; k++) x[k] = rnd();
    for (int k = 0; k < OUT * INMAX; k++) w[k] = cp_f32_to_bf16(rnd());
    for (size_t a = 0; a < sizeof ins / sizeof *ins; a++) {
        const int in = ins[a];
        for (int i = 0; i < NMAX; i++) bf16_gemm_small_dp(ya + i * OUT, OUT, x + (size_t)i * in, w, 1, in, OUT, 0, scr);
        /* and right: within f32 accumulation of the exact bf16(x) products
         * (every in here has a tail past its last multiple of 32) */
        static double r[NMAX * OUT], mag[NMAX * OUT];
        ref(r, mag, x, w, ya, NMAX, in, OUT, 0, 1);
        for (int k = 0; k < NMAX * OUT; k++)
            cr_assert(fabs(ya[k] - r[k]) <= ldexp((in + 2) * mag[k], -24) + 1e-30, "in %d: row %d column %d: %.9g, bf16(x) exact %.9g", in,
                      k / OUT, k % OUT, ya[k], r[k]);
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) {
            const int n = ns[b];
            bf16_gemm_small_dp(yb, OUT, x, w, n, in, OUT, 0, scr);
            for (int k = 0; k < n * OUT; k++)
                cr_assert(memcmp(&ya[k], &yb[k], 4) == 0, "in %d: row %d of %d, column %d: %.9g batched, %.9g alone", in, k / OUT, n, k % OUT,
                          yb[k], ya[k]);
        }
    }
    free(scr);
}
