/* The small elementwise ops (kernels/cpu/ops_cpu.h, CPU_SERIAL_ELEMS): a
 * few rows run on the calling thread, many rows threaded, and either way
 * every row is bit for bit that row alone — through the backend's table
 * (f32 and int8 matrices: the int8 path has its own vector norm and
 * SwiGLU) at sizes on both sides of the thresholds. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops_cpu.h"
#include "helpers.h"

static uint32_t rng = 31337;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return ((float)(rng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

static float *rand_buf(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    cr_assert(p);
    for (size_t i = 0; i < n; i++) p[i] = scale * rnd();
    return p;
}

enum { DIM = 896, HEADS = 14, HD = 64, INTER = 4864 };
/* row counts: one, a decode batch, and past CPU_SERIAL_ELEMS at DIM (73) */
static const int rows[] = { 1, 3, 16, 80 };
#define N_ROWS ((int)(sizeof rows / sizeof rows[0]))

/* rmsnorm over n rows: each row as the op gives it for that row alone */
static void check_rmsnorm(cp_backend *be, const char *what)
{
    const int n_max = 80;
    float *x = rand_buf((size_t)n_max * DIM, 3), *w = rand_buf(DIM, 1), *all = malloc((size_t)n_max * DIM * 4), *one = malloc(DIM * 4);
    cr_assert(all && one);
    for (int k = 0; k < N_ROWS; k++) {
        const int n = rows[k];
        memset(all, 0xff, (size_t)n * DIM * 4);
        be->rmsnorm(be, all, x, w, n, DIM, 1e-6f);
        for (int i = 0; i < n; i++) {
            be->rmsnorm(be, one, x + (size_t)i * DIM, w, 1, DIM, 1e-6f);
            cr_assert(memcmp(one, all + (size_t)i * DIM, DIM * 4) == 0, "%s rmsnorm: row %d of %d differs from its lone run", what, i, n);
        }
    }
    /* and it is a norm: row 0 of the last call has mean square ~1 before w */
    double ss = 0;
    for (int j = 0; j < DIM; j++) ss += (double)(all[j] / w[j]) * (all[j] / w[j]);
    cr_assert(fabs(ss / DIM - 1) < 1e-3, "%s rmsnorm: mean square %g", what, ss / DIM);
    free(x), free(w), free(all), free(one);
}

/* SwiGLU over n rows of INTER: each 16-aligned block as alone */
static void check_swiglu(cp_backend *be, const char *what)
{
    const size_t max = 80 * (size_t)INTER;
    float *g = rand_buf(max, 4), *u = rand_buf(max, 1), *all = malloc(max * 4), *one = malloc(16 * 4);
    cr_assert(all && one);
    for (int k = 0; k < N_ROWS; k++) {
        const size_t count = (size_t)rows[k] * INTER;
        memset(all, 0xff, count * 4);
        be->swiglu(be, all, g, u, count);
        for (size_t i = 0; i < count; i += 16) {
            be->swiglu(be, one, g + i, u + i, 16);
            cr_assert(memcmp(one, all + i, 16 * 4) == 0, "%s swiglu: elements %zu.. of %zu differ from their lone run", what, i, count);
        }
    }
    const float want = g[0] / (1.0f + expf(-g[0])) * u[0];
    cr_assert(fabsf(all[0] - want) <= 1e-5f * fabsf(want) + 1e-7f, "%s swiglu: %g, not %g", what, all[0], want);
    free(g), free(u), free(all), free(one);
}

Test(small_ops, norm_and_swiglu_rows_are_their_lone_runs_f32_and_int8)
{
    cp_backend *be = test_cpu_backend_on(NULL);
    check_rmsnorm(be, "f32");
    check_swiglu(be, "f32");
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_I8, &err), CP_OK, "%s", err.msg);
    check_rmsnorm(be, "int8");
    check_swiglu(be, "int8");
    cp_backend_destroy(be);
}

/* RoPE in place over n rows (row stride past the heads): each row rotated
 * as alone, the stride's gap untouched */
Test(small_ops, rope_rows_are_their_lone_runs)
{
    cp_backend *be = test_cpu_backend_on(NULL);
    const int ld = HEADS * HD + 8, half = HD / 2, n_max = 80;
    float *x0 = rand_buf((size_t)n_max * ld, 2), *cs = rand_buf((size_t)n_max * half, 1), *sn = rand_buf((size_t)n_max * half, 1);
    float *all = malloc((size_t)n_max * ld * 4), *one = malloc((size_t)ld * 4);
    cr_assert(all && one);
    for (int k = 0; k < N_ROWS; k++) {
        const int n = rows[k];
        memcpy(all, x0, (size_t)n * ld * 4);
        be->rope(be, all, ld, cs, sn, n, HEADS, HD);
        for (int i = 0; i < n; i++) {
            memcpy(one, x0 + (size_t)i * ld, (size_t)ld * 4);
            be->rope(be, one, ld, cs + (size_t)i * half, sn + (size_t)i * half, 1, HEADS, HD);
            cr_assert(memcmp(one, all + (size_t)i * ld, (size_t)ld * 4) == 0, "rope: row %d of %d differs from its lone run", i, n);
            cr_assert(memcmp(all + (size_t)i * ld + HEADS * HD, x0 + (size_t)i * ld + HEADS * HD, 8 * 4) == 0, "rope wrote past the heads");
        }
    }
    /* the rotation itself, element 0 of the last call's row 1 */
    const float a = x0[ld], b = x0[ld + half], want = a * cs[half] - b * sn[half];
    cr_assert_eq(all[ld], want);
    free(x0), free(cs), free(sn), free(all), free(one);
    cp_backend_destroy(be);
}

/* bias adds over n rows of 896 and of 128 (Qwen's q and k/v biases) */
Test(small_ops, bias_rows_are_their_lone_runs)
{
    const int outs[] = { DIM, 128 }, ld = DIM + 4, n_max = 80;
    float *y0 = rand_buf((size_t)n_max * ld, 1), *bias = rand_buf(DIM, 1), *all = malloc((size_t)n_max * ld * 4), *one = malloc((size_t)ld * 4);
    cr_assert(all && one);
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < N_ROWS; k++) {
            const int n = rows[k];
            memcpy(all, y0, (size_t)n * ld * 4);
            cpu_add_bias(all, ld, bias, n, outs[o]);
            for (int i = 0; i < n; i++) {
                memcpy(one, y0 + (size_t)i * ld, (size_t)ld * 4);
                cpu_add_bias(one, ld, bias, 1, outs[o]);
                cr_assert(memcmp(one, all + (size_t)i * ld, (size_t)ld * 4) == 0, "bias: row %d of %d (out %d) differs", i, n, outs[o]);
                cr_assert_eq(all[(size_t)i * ld], y0[(size_t)i * ld] + bias[0]);
            }
        }
    free(y0), free(bias), free(all), free(one);
}

/* The AVX-512 RoPE and placement rotation give the scalar loops' bits (the
 * scalar one is what the generic and avx2 paths run, and a row's K must
 * not depend on the path that placed it), at head sizes with whole and
 * partial 16-lane blocks; the gap past the heads untouched. */
Test(small_ops, vector_rope_and_placement_are_the_scalar_ones)
{
#if defined(__x86_64__) && !defined(CP_NO_BLAS)
    if (!__builtin_cpu_supports("avx512f")) cr_skip_test("no AVX-512 F: the vector rotation is not run here");
    static const int hds[] = { 16, 32, 64, 80, 128 };
    for (size_t t = 0; t < sizeof hds / sizeof hds[0]; t++) {
        const int hd = hds[t], heads = 3, half = hd / 2, n = 37, ld = heads * hd + 5;
        float *x0 = rand_buf((size_t)n * ld, 3), *cs = rand_buf((size_t)n * half, 1), *sn = rand_buf((size_t)n * half, 1);
        float *a = malloc((size_t)n * ld * 4), *b = malloc((size_t)n * ld * 4);
        cr_assert(a && b);
        memcpy(a, x0, (size_t)n * ld * 4), memcpy(b, x0, (size_t)n * ld * 4);
        cpu_rope(a, ld, cs, sn, n, heads, hd);
        cpu_rope_avx512(b, ld, cs, sn, n, heads, hd);
        cr_assert(memcmp(a, b, (size_t)n * ld * 4) == 0, "head_dim %d: the vector RoPE differs from the scalar one", hd);
        cr_assert(memcmp(a, x0, (size_t)n * ld * 4) != 0, "head_dim %d: RoPE changed nothing", hd);
        for (int i = 0; i < n; i++) cr_assert(memcmp(b + (size_t)i * ld + heads * hd, x0 + (size_t)i * ld + heads * hd, 5 * 4) == 0);
        /* placement: rows of ld floats in, K_pre and V copied, K rotated */
        const size_t row = (size_t)heads * hd;
        float *k[2], *kp[2], *v[2];
        for (int r = 0; r < 2; r++) {
            k[r] = calloc((size_t)n * row, 4), kp[r] = calloc((size_t)n * row, 4), v[r] = calloc((size_t)n * row, 4);
            cr_assert(k[r] && kp[r] && v[r]);
        }
        cpu_place_kv(k[0], kp[0], v[0], x0, a, (size_t)ld, n, cs, sn, heads, hd);
        cpu_place_kv_avx512(k[1], kp[1], v[1], x0, a, (size_t)ld, n, cs, sn, heads, hd);
        cr_assert(memcmp(k[0], k[1], (size_t)n * row * 4) == 0, "head_dim %d: placed K differs", hd);
        cr_assert(memcmp(kp[0], kp[1], (size_t)n * row * 4) == 0 && memcmp(v[0], v[1], (size_t)n * row * 4) == 0);
        cr_assert(memcmp(k[1], a, row * 4) == 0, "head_dim %d: placed K is not the in-place rotation", hd);
        for (int r = 0; r < 2; r++) free(k[r]), free(kp[r]), free(v[r]);
        free(x0), free(cs), free(sn), free(a), free(b);
    }
#else
    cr_skip_test("not an x86-64 BLAS build");
#endif
}
