/* The CPU backend with bf16 matrices (kernels/cpu/gemm_bf16.h): the GEMM
 * kernels of every path against a double reference, the models against
 * the f32 reference (the fixtures and cp-books-6m), the dispatch forced per
 * ISA (CP_CPU_ISA), --dtype on the command line, and the loader dropping
 * the checkpoint's pages as it goes.
 *
 * Two kinds of bf16 path, two kinds of bound:
 *   - f32 compute from bf16 weights (avx2, avx512, generic: "AMX off"):
 *     bf16 -> f32 is exact, so on a BF16 checkpoint the results are the f32
 *     reference's up to summation order;
 *   - bf16 compute (amx: oneDNN; on a CPU without AMX oneDNN runs it on
 *     AVX-512-BF16): activations rounded to bf16 as well, so the logits
 *     move by about the bf16 rounding (2^-9 relative per product). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/sampler.h"
#include "../kernels/cpu/gemm_amx.h"
#include "../kernels/cpu/gemm_bf16.h"
#include "helpers.h"

static cpu_features features(void)
{
    cpu_features f;
    cpu_features_detect(&f);
    return f;
}

/* the f32-compute paths this CPU runs */
static int f32_paths(const char **out)
{
    cpu_features f = features();
    int n = 0;
    out[n++] = "generic";
    if (f.avx2_fma) out[n++] = "avx2";
    if (f.avx512) out[n++] = "avx512";
    return n;
}

/* ---- the GEMM kernels ------------------------------------------------- */

/* y = (acc ? y : 0) + x . W^T + bias in double from the same bf16 W, and
 * sum |x||w| per output (the scale rounding errors are relative to) */
static void ref_matmul(double *y, double *mag, const float *x, const uint16_t *w, const float *bias, const float *y0, int n,
                       int in, int out, int ldy, int acc)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) {
            double s = acc ? y0[(size_t)i * ldy + j] : 0, a = fabs(s);
            for (int k = 0; k < in; k++) {
                double p = (double)x[(size_t)i * in + k] * cp_bf16_to_f32(w[(size_t)j * in + k]);
                s += p, a += fabs(p);
            }
            if (bias) s += bias[j], a += fabs(bias[j]);
            y[(size_t)i * out + j] = s, mag[(size_t)i * out + j] = a;
        }
}

/* Every shape class each path has: n at, below and above the dot kernels'
 * limit, and every remainder of their 4-row groups (n = 5, 2 + 4 x 0, 3,
 * 7: groups of 1, 2, 3 rows after full ones); in and out off the vector
 * widths (in = 56: the one-row kernel's 32-wide loop, one 16-wide step and
 * a masked tail of 8), a row stride past out (the padding must stay
 * untouched), accumulation, bias.  rel bounds |y - ref| / sum|x||w|. */
static void check_matmul_path(const char *isa, double rel)
{
    cp_backend *be = test_cpu_backend_on(isa);
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
    static const int ns[] = { 1, 2, 3, 4, 5, 7, 16, 17, 70 }, ins[] = { 7, 40, 56, 130 }, outs[] = { 5, 33, 96 };
    uint32_t r = 12345;
#define RND() (r = r * 1664525u + 1013904223u, ((float)(r >> 8) / 16777216.0f) * 2.0f - 1.0f)
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
            for (size_t c = 0; c < sizeof outs / sizeof *outs; c++)
                for (int acc = 0; acc < 2; acc++) {
                    int n = ns[a], in = ins[b], out = outs[c], ldy = out + 3;
                    float *x = malloc((size_t)n * in * 4), *y = malloc((size_t)n * ldy * 4), *y0 = malloc((size_t)n * ldy * 4);
                    float *bias = malloc((size_t)out * 4);
                    uint16_t *w = NULL;
                    cr_assert_eq(be->alloc(be, (size_t)out * in * 2, (void **)&w, &err), CP_OK);
                    double *ref = malloc((size_t)n * out * 8), *mag = malloc((size_t)n * out * 8);
                    cr_assert(x && y && y0 && bias && ref && mag);
                    for (int k = 0; k < n * in; k++) x[k] = RND();
                    for (int k = 0; k < out * in; k++) w[k] = cp_f32_to_bf16(RND());
                    for (int k = 0; k < out; k++) bias[k] = RND();
                    for (int k = 0; k < n * ldy; k++) y0[k] = y[k] = RND();
                    const float *bp = acc ? NULL : bias; /* bias once with, once without accumulation */
                    ref_matmul(ref, mag, x, w, bp, y0, n, in, out, ldy, acc);
                    be->matmul(be, y, ldy, x, TEST_MAT(be, w, out, in), bp, n, in, out, acc);
                    cr_assert_eq(be->sync(be, &err), CP_OK, "CP_CPU_ISA=%s: %s", isa, err.msg);
                    for (int i = 0; i < n; i++) {
                        for (int j = 0; j < out; j++) {
                            double d = fabs(y[(size_t)i * ldy + j] - ref[(size_t)i * out + j]);
                            cr_assert(d <= rel * mag[(size_t)i * out + j] + 1e-30,
                                      "CP_CPU_ISA=%s n %d in %d out %d acc %d: y[%d][%d] = %.9g, reference %.9g", isa, n, in, out,
                                      acc, i, j, y[(size_t)i * ldy + j], ref[(size_t)i * out + j]);
                        }
                        for (int j = out; j < ldy; j++)
                            cr_assert_eq(y[(size_t)i * ldy + j], y0[(size_t)i * ldy + j], "CP_CPU_ISA=%s wrote past out", isa);
                    }
                    be->free(be, w);
                    free(x), free(y), free(y0), free(bias), free(ref), free(mag);
                }
#undef RND
    cp_backend_destroy(be);
}

/* f32 compute: f32 rounding of sums of at most 130 terms, far below 1e-5 */
Test(bf16, f32_compute_kernels_match_a_double_reference_on_every_path)
{
    const char *paths[3];
    int n = f32_paths(paths);
    for (int i = 0; i < n; i++) check_matmul_path(paths[i], 1e-5);
}

/* Batch invariance of f32 compute at every row count, over bf16 weights
 * (the f32-compute paths) and f32 weights (gemm_f32.h): a row's outputs
 * are bit for bit the same computed alone as at any place in a batch of
 * 2..200 rows (every remainder of the kernels' 4-row groups; 17-64: a
 * serving step's prefill chunk beside the decoders; 65, 130, 200: prefill
 * chunks, which ran sgemm on widened blocks, or sgemm itself for f32
 * weights, and n = 1 sgemv), on every path, for in off and on the vector
 * widths (7: tail only; 40: one 16/8-wide step past the 32/16-wide
 * two-chain loop and a tail; 56, 130, 896: the model's; 2100: past
 * BF16_TILE_MIN_IN, the tiled kernel's reach, with a 16-wide step and a
 * tail), with and without accumulation.  Why bitwise: a request batched
 * with others, or prefilled in other chunks, computes exactly as alone. */
static void rows_bitwise(cp_dtype dt)
{
    const char *paths[3];
    int np = f32_paths(paths);
    static const int ins[] = { 7, 40, 56, 130, 896, 2100 }, ns[] = { 2, 3, 5, 6, 7, 16, 17, 33, 48, 64, 65, 130, 200 };
    enum { OUT = 31, NMAX = 200 }; /* 31 x 2100 < 65536: no parallel region (a loaded machine waits for its threads) */
    const size_t wb = dt == CP_BF16 ? 2 : 4;
    uint32_t r = 777;
#define RND() (r = r * 1664525u + 1013904223u, ((float)(r >> 8) / 16777216.0f) * 2.0f - 1.0f)
    for (int p = 0; p < np; p++) {
        cp_backend *be = test_cpu_backend_on(paths[p]);
        cp_error err = { 0 };
        cr_assert_eq(be->set_matrix_dtype(be, dt, &err), CP_OK, "%s", err.msg);
        for (size_t b = 0; b < sizeof ins / sizeof *ins; b++) {
            const int in = ins[b];
            float *x = malloc((size_t)NMAX * in * 4), *y0 = malloc((size_t)NMAX * OUT * 4);
            float *yb = malloc((size_t)NMAX * OUT * 4), *ya = malloc((size_t)OUT * 4);
            void *w = NULL;
            cr_assert(x && y0 && yb && ya);
            cr_assert_eq(be->alloc(be, (size_t)OUT * in * wb, &w, &err), CP_OK);
            for (int k = 0; k < NMAX * in; k++) x[k] = RND();
            for (int k = 0; k < OUT * in; k++) {
                float v = RND();
                if (dt == CP_BF16) ((uint16_t *)w)[k] = cp_f32_to_bf16(v);
                else ((float *)w)[k] = v;
            }
            for (int k = 0; k < NMAX * OUT; k++) y0[k] = RND();
            for (size_t c = 0; c < sizeof ns / sizeof *ns; c++)
                for (int acc = 0; acc < 2; acc++) {
                    const int n = ns[c];
                    memcpy(yb, y0, (size_t)n * OUT * 4);
                    be->matmul(be, yb, OUT, x, TEST_MAT(be, w, OUT, in), NULL, n, in, OUT, acc);
                    for (int i = 0; i < n; i++) {
                        memcpy(ya, y0 + (size_t)i * OUT, (size_t)OUT * 4);
                        be->matmul(be, ya, OUT, x + (size_t)i * in, TEST_MAT(be, w, OUT, in), NULL, 1, in, OUT, acc);
                        cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
                        for (int j = 0; j < OUT; j++)
                            cr_assert(memcmp(&ya[j], &yb[(size_t)i * OUT + j], 4) == 0,
                                      "CP_CPU_ISA=%s, %s weights, in %d: row %d of %d, column %d: %.9g batched, %.9g alone (acc %d)",
                                      paths[p], cp_dtype_name(dt), in, i, n, j, yb[(size_t)i * OUT + j], ya[j], acc);
                    }
                }
            be->free(be, w);
            free(x), free(y0), free(yb), free(ya);
        }
        cp_backend_destroy(be);
    }
#undef RND
}

Test(bf16, f32_compute_rows_are_bitwise_the_same_alone_and_batched, .timeout = TEST_TIMEOUT(60)) { rows_bitwise(CP_BF16); }
Test(bf16, f32_weights_rows_are_bitwise_the_same_alone_and_batched, .timeout = TEST_TIMEOUT(60)) { rows_bitwise(CP_F32); }

/* The two f32-compute kernels bf16_gemm_small chooses between by row
 * length -- one W row against 4 x rows (dot) and a register tile of 2 W
 * rows x 4 x rows (tiled) -- give the same bits for every output at every
 * n (each tile remainder: 1..4 x rows, an odd last W row), on every path:
 * which one a shape takes is a speed choice, never a numerical one. */
Test(bf16, dot_and_tiled_kernels_give_the_same_bits)
{
    static const int ins[] = { 7, 40, 56, 133 }, outs[] = { 5, 34, 37 };
    enum { NMAX = 9, INMAX = 133, OUTMAX = 37 };
    static float x[NMAX * INMAX], yd[NMAX * OUTMAX], yt[NMAX * OUTMAX];
    static uint16_t w[OUTMAX * INMAX];
    uint32_t r = 4242;
#define RND() (r = r * 1664525u + 1013904223u, ((float)(r >> 8) / 16777216.0f) * 2.0f - 1.0f)
    for (int k = 0; k < NMAX * INMAX; k++) x[k] = RND();
    for (int k = 0; k < OUTMAX * INMAX; k++) w[k] = cp_f32_to_bf16(RND());
    cpu_features f = features();
    const cpu_isa isas[] = { CPU_ISA_GENERIC, CPU_ISA_AVX2, CPU_ISA_AVX512 };
    const int have[] = { 1, f.avx2_fma, f.avx512 };
    for (int p = 0; p < 3; p++) {
        if (!have[p]) continue;
        for (size_t a = 0; a < sizeof ins / sizeof *ins; a++)
            for (size_t b = 0; b < sizeof outs / sizeof *outs; b++)
                for (int n = 1; n <= NMAX; n++)
                    for (int acc = 0; acc < 2; acc++) {
                        const int in = ins[a], out = outs[b];
                        for (int k = 0; k < n * out; k++) yd[k] = yt[k] = 0.5f * (float)(k % 5);
                        bf16_gemm_dot(isas[p], yd, out, x, w, n, in, out, acc);
                        bf16_gemm_tiled(isas[p], yt, out, x, w, n, in, out, acc);
                        for (int k = 0; k < n * out; k++)
                            cr_assert(memcmp(&yd[k], &yt[k], 4) == 0, "%s in %d out %d n %d acc %d: row %d column %d: dot %.9g, tiled %.9g",
                                      cpu_isa_name(isas[p]), in, out, n, acc, k / out, k % out, yd[k], yt[k]);
                    }
    }
#undef RND
}

/* bf16 compute: x rounded to bf16 (relative 2^-9 each), so |error| <=
 * 2^-9 sum|x||w| plus f32 accumulation; 2.5e-3 leaves room for neither
 * being exact.  Skips where oneDNN has no bf16 matmul on this CPU. */
Test(bf16, bf16_compute_kernel_matches_a_double_reference)
{
    cpu_features f = features();
    if (!f.amx_bf16 && !f.avx512_bf16) cr_skip_test("no AMX-BF16 or AVX-512-BF16 here: oneDNN has no bf16 matmul to test");
    check_matmul_path("amx", 2.5e-3);
    /* a plain (unpacked) matrix past the small-n kernels goes to oneDNN
     * too: its primitive is then named where "none yet" was (f32 compute
     * would pass the bound above as well) */
    cp_backend *be = test_cpu_backend_on("amx");
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
    cr_assert(strstr(be->describe(be), "impl none yet"), "%s", be->describe(be));
    enum { N = 70, IN = 64, OUT = 32 };
    static float x[N * IN], y[N * OUT];
    uint16_t *w = NULL;
    cr_assert_eq(be->alloc(be, (size_t)OUT * IN * 2, (void **)&w, &err), CP_OK);
    for (int k = 0; k < OUT * IN; k++) w[k] = cp_f32_to_bf16(0.01f * (float)(k % 7));
    be->matmul(be, y, OUT, x, TEST_MAT(be, w, OUT, IN), NULL, N, IN, OUT, 0);
    cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
    cr_assert(!strstr(be->describe(be), "impl none yet"), "a plain %d-row matmul did not reach oneDNN: %s", N, be->describe(be));
    be->free(be, w);
    cp_backend_destroy(be);
}

/* the vdpbf16ps kernels (bf16 compute at up to 16 rows, forced with
 * CP_CPU_ISA=avx512bf16): x rounded to bf16, so the bf16-compute bound;
 * skips, saying so, where the CPU has no AVX512_BF16 */
Test(bf16, avx512bf16_kernels_match_a_double_reference)
{
    cpu_features f = features();
    if (!f.avx512_bf16) cr_skip_test("no AVX512_BF16 here: the vdpbf16ps kernels are not tested");
    cp_backend *be = test_cpu_backend_on("avx512bf16");
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
    cr_assert(strstr(be->describe(be), "vdpbf16ps"), "%s", be->describe(be));
    cp_backend_destroy(be);
    check_matmul_path("avx512bf16", 2.5e-3);
}

Test(bf16, embedding_rows_come_from_the_bf16_table_exactly)
{
    cp_backend *be = test_cpu_backend_on(NULL);
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
    uint16_t table[4 * 3];
    for (int i = 0; i < 12; i++) table[i] = cp_f32_to_bf16(0.5f * (float)i - 2.25f); /* exact in bf16 */
    int32_t ids[3] = { 2, 0, 3 };
    float out[9];
    be->embed(be, out, TEST_MAT(be, table, 0, 3), ids, 3, 3);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) cr_assert_eq(out[i * 3 + j], 0.5f * (float)(ids[i] * 3 + j) - 2.25f);
    cp_backend_destroy(be);
}

/* ---- models against the f32 reference ---------------------------------- */

typedef struct model_case {
    const char *rel;
    /* f32 compute from --dtype bf16 weights vs the f32 reference: the
     * rounding of F32 / F16 weights to bf16 (0 for BF16: none) */
    double nmse_weights;
} model_case;

/* Measured here (AMD EPYC Zen 5, no AMX: oneDNN ran brg:avx512_core_bf16;
 * 2026-12-01), NMSE of all logits against the f32 reference, prefill in
 * chunks of 16, and the bounds (about 4x the measurement, for other CPUs'
 * kernels; the random fixtures' peaked attention amplifies rounding, the
 * trained cp-books-6m does not):
 *   model               f32 compute from bf16 weights   bf16 compute (oneDNN)
 *   qwen2-tiny (BF16)   6.6e-14  bound 1e-11            6.4e-4  bound 3e-3
 *   mistral-tiny (F32)  2.4e-3   bound 1e-2             3.1e-3  bound 1.2e-2
 *   llama-tiny (F16)    6.6e-4   bound 3e-3             7.7e-4  bound 3e-3
 *   cp-books-6m (BF16)  5.8e-14  bound 1e-11            1.1e-6  bound 5e-6
 * (the same on the generic, avx2 and avx512 paths; printed by the tests
 * with --verbose: re-measure when a kernel changes).  A broken kernel
 * (a lost block, a wrong stride, a skipped accumulation) is >= 1e-2. */
static const model_case cases[] = {
    { "fixtures/qwen2-tiny", 1e-11 },
    { "fixtures/mistral-tiny-swa", 1e-2 },
    { "fixtures/llama-tiny", 3e-3 },
    { "models/cp-books-6m", 1e-11 },
};
static const double nmse_bf16_compute[] = { 3e-3, 1.2e-2, 3e-3, 5e-6 };

/* AMX forced off: every f32-compute path, from bf16 weights, gives the f32
 * reference's logits within the weights' own rounding (none for BF16
 * checkpoints, so there it is summation order only) */
Test(bf16, amx_off_bf16_weights_give_the_f32_results_on_every_path, .timeout = TEST_TIMEOUT(60))
{
    const char *paths[3];
    int np = f32_paths(paths);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char dir[512];
        shared_path(dir, sizeof dir, cases[c].rel);
        int T;
        int32_t *ids = test_golden_ids(dir, &T);
        cp_backend *be32, *be16;
        cp_model *m32 = test_load_as(dir, NULL, CP_WEIGHTS_F32, &be32);
        float *ref = test_all_logits(m32, ids, T, 16);
        size_t n = (size_t)T * m32->cfg.vocab;
        for (int p = 0; p < np; p++) {
            cp_model *m16 = test_load_as(dir, paths[p], CP_WEIGHTS_BF16, &be16);
            cr_assert_eq(m16->matrix_dtype, CP_BF16);
            cr_assert(strstr(be16->describe(be16), "f32 compute") && strstr(be16->describe(be16), paths[p]), "%s",
                      be16->describe(be16));
            float *lg = test_all_logits(m16, ids, T, 16);
            double e = test_nmse(lg, ref, n);
            cr_log_info("%s CP_CPU_ISA=%s: NMSE %.3g", cases[c].rel, paths[p], e);
            cr_assert(e <= cases[c].nmse_weights, "%s CP_CPU_ISA=%s: logits NMSE %.3g > %.3g", cases[c].rel, paths[p], e,
                      cases[c].nmse_weights);
            free(lg);
            cp_model_free(m16);
            cp_backend_destroy(be16);
        }
        free(ref), free(ids);
        cp_model_free(m32);
        cp_backend_destroy(be32);
    }
}

Test(bf16, bf16_compute_logits_stay_near_the_f32_reference, .timeout = TEST_TIMEOUT(60))
{
    cpu_features f = features();
    if (!f.amx_bf16 && !f.avx512_bf16) cr_skip_test("no AMX-BF16 or AVX-512-BF16 here: oneDNN has no bf16 matmul to test");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char dir[512];
        shared_path(dir, sizeof dir, cases[c].rel);
        int T;
        int32_t *ids = test_golden_ids(dir, &T);
        cp_backend *be32, *be16;
        cp_model *m32 = test_load_as(dir, NULL, CP_WEIGHTS_F32, &be32);
        cp_model *m16 = test_load_as(dir, "amx", CP_WEIGHTS_BF16, &be16);
        cr_assert(strstr(be16->describe(be16), "bf16 compute"), "%s", be16->describe(be16));
        float *ref = test_all_logits(m32, ids, T, 16), *lg = test_all_logits(m16, ids, T, 16);
        double e = test_nmse(lg, ref, (size_t)T * m32->cfg.vocab);
        cr_log_info("%s bf16 compute: NMSE %.3g (%s)", cases[c].rel, e, be16->describe(be16));
        cr_assert(e <= nmse_bf16_compute[c], "%s: bf16-compute logits NMSE %.3g > %.3g", cases[c].rel, e, nmse_bf16_compute[c]);
        /* the activations' rounding must show: f32 compute on these weights
         * is >= 1e4 times closer (the table above) */
        cr_assert(e > 1e3 * cases[c].nmse_weights || e > 1e-7, "%s: NMSE %.3g: is bf16 compute running at all?", cases[c].rel, e);
        free(ref), free(lg), free(ids);
        cp_model_free(m16), cp_model_free(m32);
        cp_backend_destroy(be16), cp_backend_destroy(be32);
    }
}

/* 32 greedy tokens, free-running, from the same 64-token prompt */
static void greedy(cp_model *m, const int32_t *ids, int32_t *out)
{
    cp_error err = { 0 };
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, 64 + 32, 64, &s, &err), CP_OK, "%s", err.msg);
    float *lg = malloc((size_t)m->cfg.vocab * 4);
    cr_assert_eq(cp_forward(m, s, ids, NULL, 64, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < 32; i++) {
        out[i] = cp_argmax(lg, m->cfg.vocab);
        cr_assert_eq(cp_forward(m, s, &out[i], NULL, 1, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    }
    free(lg);
    cp_state_free(m, s);
}

/* cp-books-6m: measured 32/32 in bf16 compute (amx and avx512bf16) and
 * 32/32 on every f32 path */
Test(bf16, greedy_agrees_with_f32_on_cp_books, .timeout = TEST_TIMEOUT(60))
{
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    int T;
    int32_t *ids = test_golden_ids(dir, &T), want[32], got[32];
    cr_assert(T >= 64);
    cp_backend *be32, *be16;
    cp_model *m32 = test_load_as(dir, NULL, CP_WEIGHTS_F32, &be32);
    greedy(m32, ids, want);
    cpu_features f = features();
    const char *paths[5];
    int np = f32_paths(paths);
    if (f.amx_bf16 || f.avx512_bf16) paths[np++] = "amx";
    if (f.avx512_bf16) paths[np++] = "avx512bf16"; /* bf16 compute on packed weights (gemm_bf16_packed.h) */
    for (int p = 0; p < np; p++) {
        cp_model *m16 = test_load_as(dir, paths[p], CP_WEIGHTS_BF16, &be16);
        greedy(m16, ids, got);
        int agree = 0;
        for (int i = 0; i < 32; i++) agree += got[i] == want[i];
        cr_log_info("CP_CPU_ISA=%s: %d/32 greedy tokens agree", paths[p], agree);
        /* f32 compute: the same arithmetic on the same (BF16-stored) weights */
        int need = strcmp(paths[p], "amx") == 0 || strcmp(paths[p], "avx512bf16") == 0 ? 30 : 32;
        cr_assert(agree >= need, "CP_CPU_ISA=%s: %d/32 greedy tokens agree with f32, need %d", paths[p], agree, need);
        cp_model_free(m16);
        cp_backend_destroy(be16);
    }
    free(ids);
    cp_model_free(m32);
    cp_backend_destroy(be32);
}

/* ---- dtype selection --------------------------------------------------- */

Test(bf16, auto_keeps_the_stored_dtype_and_never_rounds_f32)
{
    static const struct { const char *rel; cp_dtype want; } c[] = {
        { "fixtures/qwen2-tiny", CP_BF16 },        /* BF16 stays */
        { "fixtures/llama-tiny", CP_BF16 },        /* F16 -> BF16 */
        { "fixtures/mistral-tiny-swa", CP_F32 },   /* F32 kept */
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        char dir[512];
        shared_path(dir, sizeof dir, c[i].rel);
        cp_backend *be;
        cp_model *m = test_load_as(dir, NULL, CP_WEIGHTS_AUTO, &be);
        cr_assert_eq(m->matrix_dtype, c[i].want, "%s: auto chose %s", c[i].rel, cp_dtype_name(m->matrix_dtype));
        cr_assert_eq(be->matrix_dtype, c[i].want);
        /* two bytes an element for bf16 matrices: what --dtype is for */
        size_t elems = m->weight_bytes / (c[i].want == CP_BF16 ? 2 : 4);
        cr_assert(elems > 0);
        cp_model_free(m);
        cp_backend_destroy(be);
    }
    /* the library's default stays the backend's (f32): the golden tests' reference */
    char dir[512];
    cp_backend *be;
    cp_model *m = load_model_or_die(shared_path(dir, sizeof dir, "fixtures/qwen2-tiny"), &be);
    cr_assert_eq(m->matrix_dtype, CP_F32);
    cp_model_free(m);
    cp_backend_destroy(be);
}

Test(bf16, bf16_halves_the_weight_bytes)
{
    char dir[512];
    shared_path(dir, sizeof dir, "fixtures/mistral-tiny-swa");
    cp_backend *b1, *b2;
    /* the plain row-major layout (generic kernels): packed layouts for
     * oneDNN pad this fixture's small dimensions to their blocks */
    cp_model *m32 = test_load_as(dir, "generic", CP_WEIGHTS_F32, &b1), *m16 = test_load_as(dir, "generic", CP_WEIGHTS_BF16, &b2);
    /* vectors (norms) stay f32: a little over half */
    cr_assert(m16->weight_bytes * 2 > m32->weight_bytes && m16->weight_bytes * 2 < m32->weight_bytes * 1.02,
              "bf16 %zu bytes vs f32 %zu", m16->weight_bytes, m32->weight_bytes);
    cp_model_free(m32), cp_model_free(m16);
    cp_backend_destroy(b1), cp_backend_destroy(b2);
}

Test(bf16, a_backend_switched_after_load_is_refused)
{
    char dir[512];
    shared_path(dir, sizeof dir, "fixtures/qwen2-tiny");
    cp_backend *be;
    cp_model *m = test_load_as(dir, NULL, CP_WEIGHTS_BF16, &be);
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_F32, &err), CP_OK);
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, 8, 8, &s, &err), CP_OK);
    int32_t ids[2] = { 1, 2 };
    float *lg = malloc((size_t)m->cfg.vocab * 4);
    cr_assert_eq(cp_forward(m, s, ids, NULL, 2, CP_LOGITS_LAST, lg, NULL, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "BF16") && strstr(err.msg, "F32"), "%s", err.msg);
    free(lg);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
}

/* a flag of /proc/cpuinfo: the kernel's reading of cpuid, independent of ours */
static int cpuinfo_flag(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int found = 0;
    size_t k = strlen(flag);
    while (f && !found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        for (char *p = strstr(line, flag); p && !found; p = strstr(p + 1, flag))
            found = p[-1] == ' ' && (p[k] == ' ' || p[k] == '\n');
        break;
    }
    if (f) fclose(f);
    return found;
}

/* automatic: bf16 compute where the CPU multiplies bf16 natively (AMX-BF16
 * tiles, else AVX512_BF16's packed vdpbf16ps kernels), f32 compute from the
 * bf16 weights below that, and the path names what runs */
Test(bf16, automatic_dispatch_follows_cpuid)
{
    cpu_features f = features();
    cr_assert_eq(f.amx_bf16, cpuinfo_flag("amx_bf16") && cpuinfo_flag("amx_tile"), "AMX-BF16: cpuid says %d, /proc/cpuinfo disagrees",
                 f.amx_bf16);
    cr_assert_eq(f.avx512, cpuinfo_flag("avx512f") && cpuinfo_flag("avx512bw") && cpuinfo_flag("avx512vl"));
    cr_assert_eq(f.avx512_bf16, f.avx512 && cpuinfo_flag("avx512_bf16"));
    cp_backend *be = test_cpu_backend_on(NULL);
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_BF16, &err), CP_OK, "%s", err.msg);
    const char *d = be->describe(be);
    if (f.amx_bf16 && cp_amx_ready(NULL) == CP_OK) cr_assert(strstr(d, "bf16 compute") && strstr(d, "AMX tile kernels"), "%s", d);
    else if (f.amx_bf16) cr_assert(strstr(d, "bf16 compute") && strstr(d, "oneDNN"), "%s", d);
    else if (f.avx512_bf16) cr_assert(strstr(d, "bf16 compute") && strstr(d, "avx512bf16 vdpbf16ps"), "%s", d);
    else cr_assert(strstr(d, "f32 compute") && strstr(d, f.avx512 ? "avx512" : f.avx2_fma ? "avx2" : "generic"), "%s", d);
    cp_backend_destroy(be);
}

Test(bf16, cp_cpu_isa_is_checked)
{
    setenv("CP_CPU_ISA", "sse9", 1);
    cp_backend *be = NULL;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_EINVAL);
    cr_assert(be == NULL && strstr(err.msg, "sse9"), "%s", err.msg);
    cpu_features f = features();
    if (!f.avx512) { /* a path the CPU cannot run is refused, not run */
        setenv("CP_CPU_ISA", "avx512", 1);
        cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_EUNSUPPORTED);
    }
    unsetenv("CP_CPU_ISA");
    cp_weight_dtype d;
    cr_assert_eq(cp_weight_dtype_from_name("fp8", &d, &err), CP_EINVAL);
    cr_assert_eq(cp_weight_dtype_from_name("bf16", &d, &err), CP_OK);
    cr_assert_eq(d, CP_WEIGHTS_BF16);
}

/* ---- the loader drops the checkpoint's pages --------------------------- */

/* resident file-backed pages of this process (statm's third field) */
static long resident_shared_pages(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size, res, shared = -1;
    if (f && fscanf(f, "%ld %ld %ld", &size, &res, &shared) != 3) shared = -1;
    if (f) fclose(f);
    return shared;
}

Test(bf16, released_tensors_leave_the_resident_set)
{
    char dir[512], path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", shared_path(dir, sizeof dir, "models/cp-books-6m"));
    st_set *s = NULL;
    cp_error err = { 0 };
    cr_assert_eq(st_open_file(path, &s, &err), CP_OK, "%s", err.msg);
    size_t bytes = 0;
    long before = resident_shared_pages(), page = sysconf(_SC_PAGESIZE);
    volatile unsigned sum = 0;
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_at(s, i);
        for (size_t b = 0; b < t->nbytes; b += 256) sum += ((const unsigned char *)t->data)[b];
        bytes += t->nbytes;
    }
    long touched = resident_shared_pages() - before, pages = (long)(bytes / (size_t)page);
    cr_assert(touched >= pages * 9 / 10, "reading %ld pages made only %ld resident", pages, touched);
    for (size_t i = 0; i < st_count(s); i++) st_release(st_at(s, i));
    long left = resident_shared_pages() - before;
    cr_assert(left <= pages / 20, "%ld of %ld pages still resident after st_release", left, pages);
    /* the mapping stays readable */
    const st_tensor *t = st_at(s, 0);
    sum += ((const unsigned char *)t->data)[t->nbytes - 1];
    st_close(s);
}

typedef struct rss_watch {
    long base, max_extra;
} rss_watch;

static void watch_progress(void *ctx, size_t done, size_t total)
{
    (void)done, (void)total;
    rss_watch *w = ctx;
    long extra = resident_shared_pages() - w->base;
    if (extra > w->max_extra) w->max_extra = extra;
}

/* The loader releases each tensor's pages once it is converted: at no
 * point during a load are more than the largest tensor's pages (and the
 * fingerprint's few sampled pages per tensor) resident — without it, the
 * whole checkpoint is by the end. */
Test(bf16, loading_keeps_the_checkpoint_out_of_the_resident_set)
{
    char dir[512], path[600];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_set *st = NULL;
    cp_error err = { 0 };
    cr_assert_eq(st_open_file(path, &st, &err), CP_OK, "%s", err.msg);
    size_t largest = 0, all = 0, n = st_count(st);
    for (size_t i = 0; i < n; i++) {
        size_t b = st_at(st, i)->nbytes;
        all += b;
        if (b > largest) largest = b;
    }
    st_close(st);
    long page = sysconf(_SC_PAGESIZE);
    long bound = (long)(largest / (size_t)page) + 2 + 3 * (long)n + 64, pages = (long)(all / (size_t)page);
    cr_assert(bound < pages / 2, "the test needs a checkpoint of many tensors");
    cp_backend *be = test_cpu_backend_on(NULL);
    cp_load_opts lo = { NULL, NULL, CP_WEIGHTS_BF16 };
    cp_model *m = NULL;
    /* one load first: where the weights are packed for oneDNN, its first
     * reorders fault in the library's own code pages, which count as
     * shared too and are no checkpoint page; the checkpoint's pages of
     * this load are dropped as it goes, like the next one's */
    cr_assert_eq(cp_model_load(dir, be, &lo, &m, &err), CP_OK, "%s", err.msg);
    cp_model_free(m);
    m = NULL;
    rss_watch w = { resident_shared_pages(), 0 };
    lo = (cp_load_opts){ watch_progress, &w, CP_WEIGHTS_BF16 };
    cr_assert_eq(cp_model_load(dir, be, &lo, &m, &err), CP_OK, "%s", err.msg);
    cr_log_info("peak checkpoint pages resident while loading: %ld (bound %ld, checkpoint %ld)", w.max_extra, bound, pages);
    cr_assert(w.max_extra <= bound, "%ld checkpoint pages resident during the load, bound %ld (of %ld)", w.max_extra, bound, pages);
    cp_model_free(m);
    cp_backend_destroy(be);
}

/* ---- the command line -------------------------------------------------- */

static int ids_of(const char *json, int32_t *ids, int cap)
{
    const char *p = strstr(json, "\"ids\":[");
    if (!p) return -1;
    p += 7;
    int n = 0;
    while (n < cap && *p && *p != ']') {
        char *end;
        ids[n++] = (int32_t)strtol(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

Test(bf16, generate_gives_the_same_tokens_in_bf16_and_f32, .timeout = TEST_TIMEOUT(60))
{
    char dir[512], cmd[1024], o32[8192], o16[8192], oauto[8192];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    const char *prompt = "The old lighthouse keeper climbed the stairs every evening to light the lamp";
    snprintf(cmd, sizeof cmd, "generate --model %s --prompt '%s' -n 32 --ignore-eos --json --quiet-progress --dtype f32", dir, prompt);
    cr_assert_eq(test_cli_output(cmd, o32, sizeof o32), 0, "%s", o32);
    snprintf(cmd, sizeof cmd, "generate --model %s --prompt '%s' -n 32 --ignore-eos --json --quiet-progress --dtype bf16", dir, prompt);
    cr_assert_eq(test_cli_output(cmd, o16, sizeof o16), 0, "%s", o16);
    snprintf(cmd, sizeof cmd, "generate --model %s --prompt '%s' -n 32 --ignore-eos --json --quiet-progress", dir, prompt);
    cr_assert_eq(test_cli_output(cmd, oauto, sizeof oauto), 0, "%s", oauto);
    cr_assert(strstr(o32, "f32 weights"), "%s", o32);
    cr_assert(strstr(o16, "bf16 weights"), "%s", o16);
    cr_assert(strstr(oauto, "bf16 weights"), "auto on a BF16 checkpoint: %s", oauto);
    int32_t a[40], b[40];
    cr_assert_eq(ids_of(o32, a, 40), 32);
    cr_assert_eq(ids_of(o16, b, 40), 32);
    int agree = 0;
    for (int i = 0; i < 32; i++) agree += a[i] == b[i];
    /* the f32-compute path is exact on BF16 weights (32/32 measured); bf16
     * compute (auto on AMX) keeps the bound above */
    cpu_features f = features();
    cr_assert(agree >= (f.amx_bf16 ? 30 : 32), "generate --dtype bf16 agrees with f32 on %d/32 tokens", agree);
}

Test(bf16, dtype_option_is_checked_on_every_loader)
{
    static const char *const cmds[] = { "generate --model x --prompt y", "run --model x --requests y", "serve --model x --keys y",
                                        "annotate --model x --prompt y", "attack --model x" };
    char cmd[256], out[4096];
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        snprintf(cmd, sizeof cmd, "%s --dtype fp8", cmds[i]);
        cr_assert_eq(test_cli_output(cmd, out, sizeof out), 2, "%s: %s", cmd, out);
        cr_assert(strstr(out, "--dtype") && strstr(out, "fp8"), "%s: %s", cmd, out);
    }
}

/* Automatic choice on made-up CPUs: the AMX tiles (or oneDNN) with
 * AMX-BF16; AVX512_BF16 without it: the own packed vdpbf16ps kernels (bf16
 * compute, batch-invariant, no oneDNN needed); plain AVX-512 and below:
 * exact f32 compute from the bf16 weights. */
Test(bf16, automatic_choice_by_isa)
{
    cp_error err = { 0 };
    cpu_isa isa;
    cpu_features f = { .avx2_fma = 1, .avx512 = 1, .avx512_bf16 = 1 };
    cr_assert_eq(cpu_isa_choose(NULL, &f, 1, &isa, &err), CP_OK);
    cr_assert_eq(isa, CPU_ISA_AVX512_BF16, "AVX512_BF16 without AMX: the vdpbf16ps kernels");
    cr_assert_eq(cpu_isa_choose("", &f, 1, &isa, &err), CP_OK);
    cr_assert_eq(isa, CPU_ISA_AVX512_BF16, "an empty CP_CPU_ISA is automatic");
    cr_assert_eq(cpu_isa_choose(NULL, &f, 0, &isa, &err), CP_OK);
    cr_assert_eq(isa, CPU_ISA_AVX512_BF16, "no oneDNN: the own vdpbf16ps kernels still");
    f = (cpu_features){ .avx2_fma = 1, .avx512 = 1, .avx512_vnni = 1 };
    cr_assert_eq(cpu_isa_choose(NULL, &f, 1, &isa, &err), CP_OK);
    cr_assert_eq(isa, CPU_ISA_AVX512, "AVX-512 without bf16: exact f32 compute");
    f = (cpu_features){ .avx2_fma = 1 };
    cr_assert_eq(cpu_isa_choose(NULL, &f, 1, &isa, &err), CP_OK);
    cr_assert_eq(isa, CPU_ISA_AVX2, "AVX2: f32 compute");
    f = (cpu_features){ .avx2_fma = 1, .avx512 = 1, .avx512_bf16 = 1, .amx_bf16 = 1 };
    cr_assert_eq(cpu_isa_choose(NULL, &f, 1, &isa, &err), CP_OK);
    cr_assert_eq(isa, CPU_ISA_AMX, "AMX-BF16: the tiles");
    cr_assert_eq(cpu_isa_choose(NULL, &f, 0, &isa, &err), CP_OK);
    cr_assert_eq(isa, CPU_ISA_AVX512_BF16, "AMX-BF16 in a build without oneDNN: the vdpbf16ps kernels");
}
