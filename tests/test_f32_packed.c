/* f32 weights packed at load (kernels/cpu/gemm_f32.h's f32p, the CPU
 * backend's AVX-512 f32 path): the layout's round trip, the kernel against
 * a double reference within the bound of a sequential fma chain, a row's
 * bits the same alone (n = 1, decode) and at every place of a batch of
 * n = 1 .. 513 (prefill), accumulating too, and the backend running its
 * packed f32 matrices this way.  Every test skips, saying so, where the
 * CPU has no AVX-512. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/gemm_f32.h"
#include "helpers.h"

static void need_avx512(void)
{
    cpu_features f;
    cpu_features_detect(&f);
    if (!f.avx512) cr_skip_test("no AVX-512 here: the packed f32 kernel is not tested");
}

static uint32_t rnd_state;
static float rnd(void) { return test_lcg_uniform(&rnd_state); }
static void *xalloc(size_t bytes) { return test_xalloc64(bytes); }

/* the layout is a permutation plus zero padding: unpack gives every
 * element back, for out off the 16-column blocks */
Test(f32p, pack_and_unpack_are_inverse)
{
    static const int ins[] = { 1, 7, 33, 130 }, outs[] = { 1, 15, 16, 17, 50 };
    rnd_state = 5;
    for (size_t a = 0; a < sizeof ins / sizeof *ins; a++)
        for (size_t b = 0; b < sizeof outs / sizeof *outs; b++) {
            const int in = ins[a], out = outs[b];
            float *w = xalloc((size_t)out * in * 4), *back = xalloc((size_t)out * in * 4), *p = xalloc(f32p_bytes(out, in));
            for (int k = 0; k < out * in; k++) w[k] = rnd();
            cr_assert_eq(f32p_bytes(out, in), (size_t)((out + 15) / 16) * 16 * (size_t)in * 4);
            f32p_pack(p, w, out, in);
            memset(back, 0xff, (size_t)out * in * 4);
            f32p_unpack(back, p, out, in);
            cr_assert(memcmp(w, back, (size_t)out * in * 4) == 0, "out %d in %d: unpack(pack(W)) != W", out, in);
            int j = out - 1, k = in - 1; /* element (j, k) at [j/16][k][j%16], padding zero */
            cr_assert_eq(p[((size_t)(j / 16) * in + k) * 16 + j % 16], w[(size_t)j * in + k]);
            if (out % 16) cr_assert_eq(p[((size_t)(out / 16) * in + k) * 16 + 15], 0.0f, "out %d: padded column not zero", out);
            free(w), free(back), free(p);
        }
}

/* against double: |y - ref| <= in u / (1 - in u) sum |w x| (u = 2^-24),
 * the bound of a sequential chain of rounded steps, plus u |y0| for the
 * accumulate's one add; in and out off the 16s, ldy wider than out */ 
Test(f32p, within_the_sequential_chain_bound_of_a_double_reference)
{
    need_avx512();
    static const int shapes[][3] = { { 1, 1, 1 }, { 3, 17, 45 }, { 9, 130, 50 }, { 65, 896, 97 }, { 20, 4864, 48 } };
    rnd_state = 7;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int acc = 0; acc < 2; acc++) {
            const int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2], ldy = out + 3;
            float *x = xalloc((size_t)n * in * 4), *w = xalloc((size_t)out * in * 4), *p = xalloc(f32p_bytes(out, in));
            float *y = xalloc((size_t)n * ldy * 4), *y0 = xalloc((size_t)n * ldy * 4);
            for (int k = 0; k < n * in; k++) x[k] = rnd();
            for (int k = 0; k < out * in; k++) w[k] = rnd();
            for (int k = 0; k < n * ldy; k++) y[k] = y0[k] = rnd();
            f32p_pack(p, w, out, in);
            f32p_gemm(y, ldy, x, p, n, in, out, acc);
            const double u = ldexp(1.0, -24), g = in * u / (1 - in * u);
            for (int i = 0; i < n; i++) {
                for (int j = 0; j < out; j++) {
                    double r = 0, mag = 0;
                    for (int k = 0; k < in; k++) {
                        double q = (double)x[(size_t)i * in + k] * w[(size_t)j * in + k];
                        r += q, mag += fabs(q);
                    }
                    const double base = acc ? y0[(size_t)i * ldy + j] : 0;
                    const double bound = g * mag + u * (fabs(base) + fabs(r) + g * mag) + 1e-30;
                    cr_assert(fabs(y[(size_t)i * ldy + j] - (base + r)) <= bound, "n %d in %d out %d acc %d (%d, %d): %.9g vs %.9g (bound %.3g)",
                              n, in, out, acc, i, j, y[(size_t)i * ldy + j], base + r, bound);
                }
                for (int j = out; j < ldy; j++)
                    cr_assert_eq(y[(size_t)i * ldy + j], y0[(size_t)i * ldy + j], "a column past out written (%d, %d)", i, j);
            }
            free(x), free(w), free(p), free(y), free(y0);
        }
}

/* batch invariance: every row of an n-row call is bit for bit the same
 * row run alone (n = 1, the decode step), at every n a decode batch or a
 * prefill chunk has, from a fresh output and accumulating */
Test(f32p, a_row_is_bitwise_its_lone_run_at_every_n)
{
    need_avx512();
    static const int ns[] = { 1, 3, 16, 17, 64, 65, 200, 513 };
    const int in = 131, out = 83, nmax = 513; /* out: two full column groups, a short one; in off the vector */
    rnd_state = 9;
    float *x = xalloc((size_t)nmax * in * 4), *w = xalloc((size_t)out * in * 4), *p = xalloc(f32p_bytes(out, in));
    float *lone = xalloc((size_t)nmax * out * 4), *y = xalloc((size_t)nmax * out * 4), *y0 = xalloc((size_t)nmax * out * 4);
    for (int k = 0; k < nmax * in; k++) x[k] = rnd();
    for (int k = 0; k < out * in; k++) w[k] = rnd();
    for (int k = 0; k < nmax * out; k++) y0[k] = rnd();
    f32p_pack(p, w, out, in);
    for (int acc = 0; acc < 2; acc++) {
        memcpy(lone, y0, (size_t)nmax * out * 4);
        for (int i = 0; i < nmax; i++) f32p_gemm(lone + (size_t)i * out, out, x + (size_t)i * in, p, 1, in, out, acc);
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (int off = 0; off + ns[a] <= nmax; off += ns[a] > 64 ? nmax : 37) { /* the same rows at other places too */
                const int n = ns[a];
                memcpy(y, y0, (size_t)nmax * out * 4);
                f32p_gemm(y + (size_t)off * out, out, x + (size_t)off * in, p, n, in, out, acc);
                for (int i = off; i < off + n; i++)
                    for (int j = 0; j < out; j++) {
                        float ya = y[(size_t)i * out + j], yl = lone[(size_t)i * out + j];
                        cr_assert(memcmp(&ya, &yl, 4) == 0, "acc %d n %d from row %d: row %d col %d %.9g, alone %.9g", acc, n, off, i,
                                  j, ya, yl);
                    }
            }
    }
    free(x), free(w), free(p), free(lone), free(y), free(y0);
}

/* through the backend (CP_CPU_ISA=avx512, f32 matrices): pack_matrix packs
 * an f32 matrix in f32p's layout, matmul on it is f32p_gemm's bits at n
 * = 1 and 65 (accumulating too, a bias added after), and download gives
 * the row-major matrix back */
Test(f32p, the_backend_packs_f32_matrices_and_runs_them_through_f32p)
{
    need_avx512();
    cp_backend *be = test_cpu_backend_on("avx512");
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_F32, &err), CP_OK, "%s", err.msg);
    const int in = 133, out = 70, n = 65;
    rnd_state = 21;
    float *w = xalloc((size_t)out * in * 4), *x = xalloc((size_t)n * in * 4), *back = xalloc((size_t)out * in * 4);
    float *p = xalloc(f32p_bytes(out, in)), *yb = xalloc((size_t)n * out * 4), *yk = xalloc((size_t)n * out * 4);
    for (int k = 0; k < out * in; k++) w[k] = rnd();
    for (int k = 0; k < n * in; k++) x[k] = rnd();
    cp_matrix wm = { 0 };
    size_t bytes = 0;
    cr_assert_eq(be->pack_matrix(be, w, out, in, &wm, &bytes, &err), CP_OK, "%s", err.msg);
    cr_assert(wm.data && bytes == f32p_bytes(out, in), "avx512 did not pack a [%d x %d] f32 matrix", out, in);
    f32p_pack(p, w, out, in);
    cr_assert(memcmp(wm.data, p, bytes) == 0, "the backend's packed bytes are not f32p_pack's");
    for (int acc = 0; acc < 2; acc++)
        for (int m = 1; m <= n; m += n - 1) {
            for (int k = 0; k < n * out; k++) yb[k] = yk[k] = (float)k;
            be->matmul(be, yb, out, x, &wm, NULL, m, in, out, acc);
            f32p_gemm(yk, out, x, p, m, in, out, acc);
            cr_assert(be->sync(be, &err) == CP_OK, "%s", err.msg);
            cr_assert(memcmp(yb, yk, (size_t)n * out * 4) == 0, "n %d acc %d: the backend's matmul is not f32p_gemm's bits", m, acc);
        }
    cr_assert_eq(cp_matrix_download(be, back, &wm, &err), CP_OK, "%s", err.msg);
    cr_assert(memcmp(back, w, (size_t)out * in * 4) == 0, "download of a packed f32 matrix is not the row-major matrix");
    cp_matrix_free(be, &wm);
    be->destroy(be);
    free(w), free(x), free(back), free(p), free(yb), free(yk);
}
