/* Decode attention (kernels/cpu/ops_cpu.h, cpu_attention_decode): the
 * AVX-512 kernel and the portable loops, over f32 and bf16 caches, against
 * a double-precision reference written here from the definition in
 * backend.h (causal by position, sliding window, GQA), against the
 * general BLAS path, and the bitwise promises: a row in a batch is its
 * lone run, a bf16 cache is an f32 cache holding the same values. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops_cpu.h"
#include "helpers.h"

static uint32_t rng = 4242;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return ((float)(rng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* one problem: n query rows at positions first_q.., nk keys at a
 * permutation of 0..nk-1 (a reuse placement's slot order), q in [-2, 2),
 * K and V in [-1, 1) rounded to bf16 (so the f32 and bf16 caches hold the
 * same values) */
typedef struct prob {
    cp_attn_args a;
    float *q, *k, *v, *out;
    uint16_t *k16, *v16;
    int32_t *qp, *kp;
    float *S;
} prob;

static void prob_make(prob *p, int n, int nk, int heads, int kv, int hd, int window, int32_t first_q)
{
    const size_t qn = (size_t)n * heads * hd, kn = (size_t)nk * kv * hd;
    p->q = malloc(qn * 4), p->k = malloc(kn * 4), p->v = malloc(kn * 4), p->out = malloc(qn * 4);
    p->k16 = malloc(kn * 2), p->v16 = malloc(kn * 2);
    p->qp = malloc((size_t)n * 4), p->kp = malloc((size_t)nk * 4);
    cr_assert(p->q && p->k && p->v && p->out && p->k16 && p->v16 && p->qp && p->kp);
    for (int j = 0; j < nk; j++) p->kp[j] = (int32_t)(((long)j * 7) % nk); /* a permutation when gcd(7, nk) = 1 */
    for (int i = 0; i < n; i++) p->qp[i] = first_q + i;
    for (size_t i = 0; i < qn; i++) p->q[i] = 2 * rnd();
    for (size_t i = 0; i < kn; i++) {
        p->k16[i] = cp_f32_to_bf16(rnd()), p->v16[i] = cp_f32_to_bf16(rnd());
        p->k[i] = cp_bf16_to_f32(p->k16[i]), p->v[i] = cp_bf16_to_f32(p->v16[i]);
    }
    p->a = (cp_attn_args){ .q = p->q, .k = p->k, .v = p->v, .q_pos = p->qp, .k_pos = p->kp, .out = p->out, .n = n, .n_keys = nk,
                           .n_heads = heads, .n_kv_heads = kv, .head_dim = hd, .window = window };
    size_t sf = cpu_attention_decode_scratch_floats(&p->a), sg = cpu_attention_general_scratch_floats(&p->a);
    p->S = malloc((sf > sg ? sf : sg) * 4);
    cr_assert(p->S);
}

static void prob_free(prob *p)
{
    free(p->q), free(p->k), free(p->v), free(p->out), free(p->k16), free(p->v16), free(p->qp), free(p->kp), free(p->S);
}

/* the args reading the bf16 copy of the cache instead */
static cp_attn_args as_bf16(const prob *p)
{
    cp_attn_args b = p->a;
    b.k = b.v = NULL, b.k16 = p->k16, b.v16 = p->v16;
    return b;
}

static int have_avx512(void) { return __builtin_cpu_supports("avx512f"); }
static int have_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/* the pair kernels, and whether kernel k runs at head_dim hd on this CPU
 * (a forced vector kernel falls back to the portable loops otherwise) */
static const cpu_attn_kernel PAIR_KERNELS[] = { CPU_ATTN_PORTABLE, CPU_ATTN_AVX512, CPU_ATTN_AVX2 };
enum { N_PAIR_KERNELS = 3 };
static int pair_kernel_runs(cpu_attn_kernel k, int hd)
{
    if (k == CPU_ATTN_PORTABLE) return 1;
    if (hd % 16) return 0;
    return k == CPU_ATTN_AVX512 ? have_avx512() : have_avx2();
}
static const char *kernel_name(cpu_attn_kernel k)
{
    return k == CPU_ATTN_PORTABLE ? "portable" : k == CPU_ATTN_AVX512 ? "avx512" : "avx2";
}

/* runs kernel k on a (output into out, every element first NaN: all are
 * written) */
static void run(const cp_attn_args *a, float *S, cpu_attn_kernel k, float *out)
{
    cp_attn_args b = *a;
    b.out = out;
    const size_t qn = (size_t)a->n * a->n_heads * a->head_dim;
    for (size_t i = 0; i < qn; i++) out[i] = NAN;
    cpu_attention_decode(&b, S, k);
}

/* The bound, from a measurement: over the cases below the largest
 * |out - reference| was 1.5e-7 (AVX-512) / 1.3e-7 (portable), |v| < 1 and
 * outputs a convex mix of them: f32 accumulation over hd = 64 products
 * and up to 1000 keys, e^x to 2e-7.  1e-6 leaves room for other shapes;
 * a dropped key, a wrong scale or a softmax off by one key moves outputs
 * by 1e-3 or more. */
#define REF_BOUND 1e-6f

static void check_ref(int n, int nk, int heads, int kv, int hd, int window, int32_t first_q)
{
    prob p;
    prob_make(&p, n, nk, heads, kv, hd, window, first_q);
    const size_t qn = (size_t)n * heads * hd;
    float *r = malloc(qn * 4), *o = malloc(qn * 4);
    cr_assert(r && o);
    test_attention_ref(&p.a, p.k, p.v, r);
    const cp_attn_args b = as_bf16(&p);
    for (int ki = 0; ki < N_PAIR_KERNELS; ki++) {
        const cpu_attn_kernel k = PAIR_KERNELS[ki];
        if (!pair_kernel_runs(k, hd)) continue;
        for (int bf = 0; bf < 2; bf++) {
            run(bf ? &b : &p.a, p.S, k, o);
            float d = max_abs_diff(o, r, qn);
            cr_log_info("n %d keys %d heads %d/%d hd %d window %d %s %s: max |out - reference| %.3g", n, nk, heads, kv, hd, window,
                        kernel_name(k), bf ? "bf16" : "f32", d);
            cr_assert(d < REF_BOUND, "n %d keys %d heads %d/%d hd %d window %d %s %s: max |out - reference| %.3g", n, nk, heads, kv, hd,
                      window, kernel_name(k), bf ? "bf16" : "f32", d);
        }
    }
    free(r), free(o);
    prob_free(&p);
}

Test(attn_decode, matches_the_double_reference_on_odd_sizes)
{
    static const int ctx[] = { 1, 17, 255, 1000 };
    for (int c = 0; c < 4; c++) {
        check_ref(1, ctx[c], 14, 2, 64, 0, ctx[c] - 1);  /* the 0.5B shape: GQA groups of 7 */
        check_ref(1, ctx[c], 4, 4, 64, 0, ctx[c] - 1);   /* no sharing */
        check_ref(1, ctx[c], 14, 2, 64, 100, ctx[c] - 1); /* a sliding window */
    }
    check_ref(3, 255, 14, 2, 48, 31, 252); /* three rows, head_dim 48 (16-dim value blocks), a window */
    check_ref(2, 101, 6, 2, 40, 0, 99);    /* head_dim 40: the portable loops only */
    check_ref(16, 64, 4, 1, 64, 0, 40);    /* rows past the cache's positions see some keys only */
    check_ref(5, 203, 10, 2, 32, 17, 199); /* head_dim 32 (the kit model's), groups of 5 (4 + 1 heads a value pass), a window */
    check_ref(4, 9, 8, 4, 32, 0, 5);       /* keys fewer than one 8-key block */
    check_ref(2, 50, 4, 2, 32, 5, -3);     /* positions before every key: zeros */
}

/* Against the path decode ran before (cpu_attention_general: BLAS per
 * head): both f32, within the two paths' rounding of each other (measured
 * 7.8e-8 here; the same bound as the reference). */
Test(attn_decode, matches_the_general_path)
{
    prob p;
    prob_make(&p, 1, 1000, 14, 2, 64, 0, 999);
    const size_t qn = 14 * 64;
    float *g = malloc(qn * 4), *o = malloc(qn * 4);
    cr_assert(g && o);
    cp_attn_args a = p.a;
    a.out = g;
    cpu_attention_general(&a, p.S);
    run(&p.a, p.S, CPU_ATTN_AUTO, o);
    float d = max_abs_diff(o, g, qn);
    cr_log_info("decode vs the general path: max |diff| %.3g", d);
    cr_assert(d < REF_BOUND, "decode vs the general path: max |diff| %.3g", d);
    /* and cpu_attention takes the decode kernel for a decode row */
    a.out = g;
    cpu_attention(&a, p.S);
    cr_assert(memcmp(g, o, qn * 4) == 0, "cpu_attention's decode row is not the decode kernel's");
    free(g), free(o);
    prob_free(&p);
}

/* A few rows that ask for the attention export or the sensitive mass (the
 * annotator's inputs) stay on the general path, which fills them: the
 * decode kernel computes neither. */
/* The export and the sensitive mass a prefill's output pass adds from
 * its own scores (both kernels, both cache dtypes, GQA, a window, keys in
 * a placement's order) are the general kernels' f32 ones to rounding:
 * each is a probability times a weight, summed over 4-8 heads (1e-6
 * leaves room over f32's 6e-8 a term; a dropped head or key moves a row
 * by 1e-2 or more).  Rows with no export keep theirs untouched. */
Test(attn_decode, the_pair_kernels_export_is_the_general_kernels)
{
    static const int shapes[][7] = { /* n, keys, heads, kv heads, hd, window, first query position */
        { 5, 41, 4, 2, 32, 0, 36 }, { 7, 60, 8, 4, 32, 9, 53 }, { 3, 37, 6, 2, 64, 0, 30 },
    };
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int *sh = shapes[c], n = sh[0], nk = sh[1];
        prob p;
        prob_make(&p, n, nk, sh[2], sh[3], sh[4], sh[5], sh[6]);
        float *ex = calloc((size_t)n * nk, 4), *exr = calloc((size_t)n * nk, 4), *m = calloc((size_t)n, 4), *mr = calloc((size_t)n, 4);
        float *o = malloc((size_t)n * sh[2] * sh[4] * 4);
        uint8_t *sens = calloc((size_t)nk, 1);
        cr_assert(ex && exr && m && mr && o && sens);
        for (int j = 0; j < nk; j += 5) sens[j] = 1;
        cp_attn_args r = p.a;
        r.export_a = exr, r.export_ld = nk, r.export_weight = 1.0f / (float)sh[2], r.sens_cols = sens, r.sens_mass = mr;
        cpu_attention_general(&r, p.S);
        for (int ki = 0; ki < N_PAIR_KERNELS; ki++) {
            const cpu_attn_kernel k = PAIR_KERNELS[ki];
            if (!pair_kernel_runs(k, sh[4])) continue;
            for (int bf = 0; bf < 4; bf++) { /* f32, bf16 cache; then each without a mass (the export alone) */
                cp_attn_args a = bf % 2 ? as_bf16(&p) : p.a;
                memset(ex, 0, (size_t)n * nk * 4), memset(m, 0, (size_t)n * 4);
                a.out = o, a.export_a = ex, a.export_ld = nk, a.export_weight = r.export_weight, a.sens_cols = sens, a.sens_mass = m;
                if (bf >= 2) a.sens_cols = NULL, a.sens_mass = NULL;
                cpu_attention_decode(&a, p.S, k);
                float d = max_abs_diff(ex, exr, (size_t)n * nk), dm = bf >= 2 ? 0 : max_abs_diff(m, mr, (size_t)n);
                cr_log_info("shape %zu %s %s%s: export %.3g, mass %.3g from the general kernels'", c, kernel_name(k),
                            bf % 2 ? "bf16" : "f32", bf >= 2 ? " (no mass)" : "", d, dm);
                cr_assert(d < 1e-6 && dm < 1e-6, "shape %zu %s %s%s: the export differs by %.3g, the mass by %.3g", c, kernel_name(k),
                          bf % 2 ? "bf16" : "f32", bf >= 2 ? " (no mass)" : "", d, dm);
                cr_assert(mr[n - 1] > 0.05f, "shape %zu: the sensitive columns hold no mass (%g): the comparison is empty", c, mr[n - 1]);
            }
        }
        free(ex), free(exr), free(m), free(mr), free(o), free(sens);
        prob_free(&p);
    }
}

/* A decode-sized call's export and sensitive mass: with output rows
 * from the decode kernel's scores, without them (out NULL) from the
 * general kernels' -- the same to rounding, each row the 4 heads' mean
 * of probabilities (sums to 1), the mass filled. */
Test(attn_decode, a_few_rows_export_with_or_without_output_rows)
{
    prob p;
    prob_make(&p, 2, 40, 4, 2, 32, 0, 38);
    float ex[2][2 * 40] = { { 0 } }, mass[2][2] = { { 0 } };
    uint8_t sens[40] = { 0 };
    sens[3] = sens[39] = 1;
    for (int only = 0; only < 2; only++) {
        cp_attn_args a = p.a;
        a.export_a = ex[only], a.export_ld = 40, a.export_weight = 0.25f, a.sens_cols = sens, a.sens_mass = mass[only];
        if (only) a.out = NULL;
        cpu_attention(&a, p.S);
        for (int i = 0; i < 2; i++) {
            double sum = 0;
            for (int j = 0; j < 40; j++) sum += ex[only][i * 40 + j];
            cr_assert(fabs(sum - 1.0) < 1e-5, "%s: row %d's export sums to %.6g, not the 4 heads' mean (1)", only ? "export only" : "with rows",
                      i, sum);
            cr_assert(mass[only][i] > 0, "%s: row %d's sensitive mass was not filled", only ? "export only" : "with rows", i);
        }
    }
    cr_assert(max_abs_diff(ex[0], ex[1], 2 * 40) < 1e-6 && max_abs_diff(mass[0], mass[1], 2) < 1e-6,
              "the export differs with and without output rows");
    prob_free(&p);
}

/* A sequence's attention output is bit for bit the same alone and in a
 * batch (the batching issue's promise): each row of a 6-row call against
 * the same row computed alone (its q, its position), on 2 threads and on
 * 1, for both kernels and both cache dtypes. */
Test(attn_decode, a_row_is_bitwise_its_lone_run_in_a_batch)
{
    enum { N = 6, NK = 300, H = 14, KV = 2, HD = 64 };
    prob p;
    prob_make(&p, N, NK, H, KV, HD, 0, NK - N);
    const size_t qld = H * HD;
    float *batch = malloc(N * qld * 4), *alone = malloc(qld * 4);
    cr_assert(batch && alone);
    const cp_attn_args b16 = as_bf16(&p);
    for (int ki = 0; ki < N_PAIR_KERNELS; ki++) {
        const cpu_attn_kernel k = PAIR_KERNELS[ki];
        if (!pair_kernel_runs(k, HD)) continue;
        for (int bf = 0; bf < 2; bf++) {
            const cp_attn_args *base = bf ? &b16 : &p.a;
            omp_set_num_threads(2);
            run(base, p.S, k, batch);
            for (int threads = 1; threads <= 2; threads++) {
                omp_set_num_threads(threads);
                for (int i = 0; i < N; i++) {
                    cp_attn_args one = *base;
                    one.n = 1, one.q = p.q + (size_t)i * qld, one.q_pos = p.qp + i;
                    run(&one, p.S, k, alone);
                    cr_assert(memcmp(alone, batch + (size_t)i * qld, qld * 4) == 0,
                              "%s %s, %d thread(s): row %d of the batch is not its lone run", kernel_name(k), bf ? "bf16" : "f32",
                              threads, i);
                }
            }
        }
    }
    free(batch), free(alone);
    prob_free(&p);
}

/* A bf16 cache reads as an f32 cache holding its (widened, exact) values:
 * the same products in the same order, bit for bit -- so --kv-dtype bf16
 * changes what the cache holds, never how decode sums it. */
Test(attn_decode, a_bf16_cache_is_bitwise_an_f32_cache_of_its_values)
{
    static const int ctx[] = { 1, 17, 255, 1000 };
    for (int c = 0; c < 4; c++) {
        prob p;
        prob_make(&p, 2, ctx[c], 14, 2, 64, c == 2 ? 50 : 0, ctx[c] - 2);
        const size_t qn = 2 * 14 * 64;
        float *o32 = malloc(qn * 4), *o16 = malloc(qn * 4);
        cr_assert(o32 && o16);
        const cp_attn_args b = as_bf16(&p);
        for (int ki = 0; ki < N_PAIR_KERNELS; ki++) {
            const cpu_attn_kernel k = PAIR_KERNELS[ki];
            if (!pair_kernel_runs(k, 64)) continue;
            run(&p.a, p.S, k, o32);
            run(&b, p.S, k, o16);
            cr_assert(memcmp(o32, o16, qn * 4) == 0, "%s, %d keys: the bf16 cache's output is not the f32 cache's", kernel_name(k),
                      ctx[c]);
        }
        free(o32), free(o16);
        prob_free(&p);
    }
}

/* The BLAS-free bf16 decode kernel -- the portable loops the device
 * check's libc-only build runs, which no test ran while the BLAS build
 * chose its own path -- against the BLAS build's production path
 * (cpu_attention_kv16) and the general BLAS path over the widened cache:
 * the 0.5B shape at 1k context and an odd one with a window. */
Test(attn_decode, the_blas_free_bf16_kernel_agrees_with_the_blas_build)
{
    const int shapes[][7] = { { 1, 1000, 14, 2, 64, 0, 999 }, { 4, 333, 6, 3, 40, 17, 329 } };
    for (int s = 0; s < 2; s++) {
        const int *c = shapes[s];
        prob p;
        prob_make(&p, c[0], c[1], c[2], c[3], c[4], c[5], c[6]);
        const size_t qn = (size_t)c[0] * c[2] * c[4];
        float *port = malloc(qn * 4), *prod = malloc(qn * 4), *gen = malloc(qn * 4);
        cr_assert(port && prod && gen);
        cp_attn_args b = as_bf16(&p);
        run(&b, p.S, CPU_ATTN_PORTABLE, port);
        b.out = prod;
        cpu_attention_kv16(&b, p.S);
        cp_attn_args w = p.a; /* the widened cache: the same values in f32 */
        w.out = gen;
        cpu_attention_general(&w, p.S);
        float d1 = max_abs_diff(port, prod, qn), d2 = max_abs_diff(port, gen, qn);
        cr_log_info("shape %d: portable bf16 vs production %.3g, vs general BLAS %.3g", s, d1, d2);
        cr_assert(d1 < REF_BOUND && d2 < REF_BOUND, "shape %d: portable bf16 vs production %.3g, vs general BLAS %.3g", s, d1, d2);
        for (size_t i = 0; i < qn; i++) cr_assert(isfinite(port[i]), "shape %d: out[%zu] not written", s, i);
        free(port), free(prod), free(gen);
        prob_free(&p);
    }
}

#if defined(__x86_64__)
#include "../kernels/cpu/exp_avx512.h"

__attribute__((target("avx512f"))) static void exp16_nonpos_of(const float *x, float *y)
{
    _mm512_storeu_ps(y, cp_exp16_nonpos(_mm512_loadu_ps(x)));
}

__attribute__((target("avx512f"))) static void exp16_of(const float *x, float *y)
{
    _mm512_storeu_ps(y, cp_exp16(_mm512_loadu_ps(x)));
}

#include "../kernels/cpu/exp_avx2.h"

__attribute__((target("avx2,fma"))) static void exp8_nonpos_of(const float *x, float *y)
{
    _mm256_storeu_ps(y, cp_exp8_nonpos(_mm256_loadu_ps(x)));
}

/* f (a vector exp of `lanes` lanes, x to y) against cpu_exp_nonpos, bit
 * for bit, lane for lane: every 256th float from -0 down to -100, then a
 * NaN, +5, -inf, a tiny positive and -0 (f's x and y hold 16 floats) */
static void exp_nonpos_is_the_scalar_one(void (*f)(const float *, float *), int lanes)
{
    float x[16], y[16];
    int n = 0;
    const uint32_t stop = 0xC2C80000u; /* -100.0f */
    for (uint64_t u = 0x80000000u; u <= stop; u += 256) {
        uint32_t b = (uint32_t)u;
        memcpy(&x[n], &b, 4);
        if (++n < lanes && u + 256 <= stop) continue;
        f(x, y);
        for (int i = 0; i < n; i++) {
            float want = cpu_exp_nonpos(x[i]);
            cr_assert(memcmp(&y[i], &want, 4) == 0, "%d lanes, e^%.9g: vector %.9g, scalar %.9g", lanes, x[i], y[i], want);
        }
        n = 0;
    }
    x[0] = NAN, x[1] = 5.0f, x[2] = -INFINITY, x[3] = 1e-30f;
    for (int i = 4; i < lanes; i++) x[i] = -0.0f;
    f(x, y);
    for (int i = 0; i < lanes; i++) {
        float want = cpu_exp_nonpos(x[i]);
        cr_assert(memcmp(&y[i], &want, 4) == 0, "%d lanes, lane %d, e^%g: vector %.9g, scalar %.9g", lanes, i, x[i], y[i], want);
    }
    cr_assert(y[0] == 1.0f && y[1] == 1.0f, "NaN, +5: %g %g, not e^0", y[0], y[1]);
}

/* The AVX2 pair kernel's exp (kernels/cpu/exp_avx2.h): for x <= 0 every
 * lane is cpu_exp_nonpos's value, bit for bit; +x, a NaN lane and -inf as
 * the scalar one. */
Test(attn_decode, the_avx2_vector_exp_is_the_scalar_one_lane_for_lane)
{
    if (!have_avx2()) cr_skip_test("no AVX2 + FMA here: the avx2 exp is not run");
    exp_nonpos_is_the_scalar_one(exp8_nonpos_of, 8);
}

/* The one vector exp (kernels/cpu/exp_avx512.h) the softmaxes and the int8
 * SwiGLU share: for x <= 0 every lane is cpu_exp_nonpos's value, bit for
 * bit (the vectorized softmaxes keep their C fallbacks' results), +x
 * clamped to 0 and a NaN lane e^0 as the scalar one;
 * cp_exp16 over [-87, 88] within 3e-7 of exp() relative (measured
 * 2.25e-7 at 1/64 steps), clamped outside, a NaN lane e^-87. */
Test(attn_decode, the_shared_vector_exp_is_the_scalar_one_lane_for_lane)
{
    if (!have_avx512()) cr_skip_test("no AVX-512 here: the shared 16-lane exp is not run");
    exp_nonpos_is_the_scalar_one(exp16_nonpos_of, 16);
    float x[16], y[16];
    double worst = 0;
    for (int k = 0; k < 175 * 64; k += 16) {
        for (int i = 0; i < 16; i++) x[i] = -87.0f + (float)(k + i) / 64.0f;
        exp16_of(x, y);
        for (int i = 0; i < 16; i++) {
            double e = exp((double)x[i]), r = fabs(y[i] - e) / e;
            if (r > worst) worst = r;
            cr_assert(r < 3e-7, "cp_exp16(%.9g) = %.9g, exp %.9g: relative %.3g", x[i], y[i], e, r);
        }
    }
    cr_log_info("cp_exp16 over [-87, 88]: max relative error %.3g", worst);
    x[0] = NAN, x[1] = 100.0f, x[2] = -100.0f;
    exp16_of(x, y);
    cr_assert(y[0] == y[2] && fabsf(y[2] - expf(-87.0f)) < 1e-6f * expf(-87.0f) && fabs(y[1] - exp(88.0)) < 1e-6 * exp(88.0),
              "NaN, 100, -100: %g %g %g", y[0], y[1], y[2]);
}
#endif

/* The general path's softmax rows (what a prefill with the annotator's
 * export runs): both kernels against probabilities, export and sensitive
 * mass computed here in double precision from the definition, over keys at
 * a permutation of positions, causal and windowed, at key counts that end
 * inside a 16-lane block.  Bound: measured largest |p - reference| 9e-8
 * (both kernels; e^x to 2e-7, an f32 sum over <= 300 keys); 1e-6 leaves
 * room, and a key dropped or let in moves a probability by 1e-3 or more. */
Test(attn_decode, the_softmax_rows_match_the_double_reference)
{
    const int nq = 7, window_of[2] = { 0, 23 }, nks[3] = { 1, 45, 300 };
    for (int wi = 0; wi < 2; wi++)
        for (int ni = 0; ni < 3; ni++) {
            const int nk = nks[ni], window = window_of[wi];
            int32_t *kp = malloc((size_t)nk * 4), qp[7];
            float *S0 = malloc((size_t)nq * nk * 4), *S = malloc((size_t)nq * nk * 4), *ex = malloc((size_t)nq * nk * 4);
            uint8_t *sens = malloc((size_t)nk);
            double *ref = malloc((size_t)nq * nk * sizeof *ref);
            cr_assert(kp && S0 && S && ex && sens && ref);
            for (int j = 0; j < nk; j++) kp[j] = (int32_t)(((long)j * 7) % nk), sens[j] = (uint8_t)(j % 5 == 1);
            for (int i = 0; i < nq; i++) qp[i] = (int32_t)(nk - 1 - 3 * i);
            for (size_t i = 0; i < (size_t)nq * nk; i++) S0[i] = 8 * rnd();
            double rmass[7];
            for (int i = 0; i < nq; i++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < nk; j++) {
                    int vis = kp[j] <= qp[i] && (window == 0 || kp[j] > qp[i] - window);
                    if (vis && S0[i * nk + j] > mx) mx = S0[i * nk + j];
                }
                for (int j = 0; j < nk; j++) {
                    int vis = kp[j] <= qp[i] && (window == 0 || kp[j] > qp[i] - window);
                    ref[i * nk + j] = vis ? exp((double)S0[i * nk + j] - mx) : 0;
                    sum += ref[i * nk + j];
                }
                rmass[i] = 0;
                for (int j = 0; j < nk; j++) {
                    ref[i * nk + j] = sum > 0 ? ref[i * nk + j] / sum : 0;
                    rmass[i] += sens[j] ? ref[i * nk + j] : 0;
                }
            }
            const cpu_attn_kernel ks[] = { CPU_ATTN_PORTABLE, CPU_ATTN_AVX512 };
            for (int ki = 0; ki < 2; ki++) {
                if (ks[ki] == CPU_ATTN_AVX512 && !have_avx512()) continue;
                float mass[7] = { 0 };
                memcpy(S, S0, (size_t)nq * nk * 4);
                for (size_t i = 0; i < (size_t)nq * nk; i++) ex[i] = 0.5f;
                cp_attn_args a = { .q_pos = qp, .k_pos = kp, .n = nq, .n_keys = nk, .window = window, .export_a = ex,
                                   .export_ld = nk, .export_weight = 0.25f, .sens_cols = sens, .sens_mass = mass };
                cpu_attn_softmax_rows_kernel(&a, S, 0, nq, 0, nk, ks[ki]);
                double worst = 0;
                for (int i = 0; i < nq; i++) {
                    for (int j = 0; j < nk; j++) {
                        double d = fabs(S[i * nk + j] - ref[i * nk + j]), de = fabs(ex[i * nk + j] - (0.5 + 0.25 * ref[i * nk + j]));
                        worst = d > worst ? d : worst;
                        worst = de > worst ? de : worst;
                    }
                    double dm = fabs(mass[i] - rmass[i]);
                    worst = dm > worst ? dm : worst;
                }
                cr_log_info("softmax rows keys %d window %d %s: max |p - reference| %.3g", nk, window, ki ? "avx512" : "portable", worst);
                cr_assert(worst < 1e-6, "softmax rows keys %d window %d %s: max |p - reference| %.3g", nk, window,
                          ki ? "avx512" : "portable", worst);
            }
            free(kp), free(S0), free(S), free(ex), free(sens), free(ref);
        }
}

/* The export pass over several heads (cpu_attn_export_rows_kernel, what a
 * call without output rows runs) adds to the export and the mass exactly
 * what the softmax rows add called head after head, on both kernels:
 * three heads' scores of 9 rows against keys in slot order (where the
 * AVX-512 row skips the 16-key blocks a row does not see) and at a
 * permutation of positions, causal and windowed, the block's key range
 * starting past slot 0, an export already holding a layer. */
Test(attn_decode, the_export_pass_over_heads_is_the_softmax_rows_head_after_head)
{
    const int nq = 9, nh = 3, klo = 5, nks[3] = { 1, 45, 301 }, window_of[2] = { 0, 23 };
    for (int ordered = 0; ordered < 2; ordered++)
    for (int wi = 0; wi < 2; wi++)
        for (int ni = 0; ni < 3; ni++) {
            const int nk = nks[ni], nkeys = nk + klo, window = window_of[wi];
            const size_t ns = (size_t)nh * nq * nk, ne = (size_t)nq * nkeys;
            int32_t *kp = malloc((size_t)nkeys * 4), qp[9];
            float *S0 = malloc(ns * 4), *S = malloc(ns * 4), *e1 = malloc(ne * 4), *e2 = malloc(ne * 4);
            uint8_t *sens = malloc((size_t)nkeys);
            cr_assert(kp && S0 && S && e1 && e2 && sens);
            for (int j = 0; j < nkeys; j++) kp[j] = ordered ? j : (int32_t)(((long)j * 7) % nkeys), sens[j] = (uint8_t)(j % 5 == 1);
            for (int i = 0; i < nq; i++) qp[i] = (int32_t)(ordered ? klo + (nk - 1) * i / (nq - 1) : nkeys - 1 - 2 * i);
            for (size_t i = 0; i < ns; i++) S0[i] = 8 * rnd();
            for (size_t i = 0; i < ne; i++) e1[i] = e2[i] = 0.3f * (rnd() + 1);
            const cpu_attn_kernel ks[] = { CPU_ATTN_PORTABLE, CPU_ATTN_AVX512 };
            for (int ki = 0; ki < 2; ki++) {
                if (ks[ki] == CPU_ATTN_AVX512 && !have_avx512()) continue;
                float m1[9] = { 0 }, m2[9] = { 0 };
                cp_attn_args a = { .q_pos = qp, .k_pos = kp, .n = nq, .n_keys = nkeys, .n_heads = nh, .window = window, .export_a = e1,
                                   .export_ld = nkeys, .export_weight = 1.0f / 3, .sens_cols = sens, .sens_mass = m1 };
                memcpy(S, S0, ns * 4);
                for (int h = 0; h < nh; h++) cpu_attn_softmax_rows_kernel(&a, S + (size_t)h * nq * nk, 0, nq, klo, nk, ks[ki]);
                a.export_a = e2, a.sens_mass = m2;
                memcpy(S, S0, ns * 4);
                cpu_attn_export_rows_kernel(&a, S, nh, 0, nq, klo, nk, ks[ki]);
                cr_assert(memcmp(e1, e2, ne * 4) == 0, "keys %d window %d ordered %d %s: the export pass differs from the rows head after head",
                          nk, window, ordered, ki ? "avx512" : "portable");
                cr_assert(memcmp(m1, m2, sizeof m1) == 0, "keys %d window %d %s: the sensitive mass differs", nk, window,
                          ki ? "avx512" : "portable");
            }
            free(kp), free(S0), free(S), free(e1), free(e2), free(sens);
        }
}

/* The general path without output rows (out NULL: the BLAS products of
 * an exporting prefill whose rows come from the pair kernel) adds the
 * export and the mass bit for bit as with them: two blocks of rows, GQA,
 * a window, keys at a permutation of positions, two calls on one export. */
Test(attn_decode, the_general_export_without_output_rows_is_the_export_with_them)
{
    const int shapes[3][6] = { { 300, 420, 8, 4, 32, 0 }, { 40, 77, 6, 2, 16, 19 }, { 17, 17, 2, 2, 64, 0 } };
    for (int si = 0; si < 3; si++) {
        const int *c = shapes[si];
        prob p;
        prob_make(&p, c[0], c[1], c[2], c[3], c[4], c[5], c[1] - c[0]);
        const size_t ne = (size_t)c[0] * c[1];
        float *e1 = calloc(ne, 4), *e2 = calloc(ne, 4), *m1 = calloc((size_t)c[0], 4), *m2 = calloc((size_t)c[0], 4);
        uint8_t *sens = malloc((size_t)c[1]);
        cr_assert(e1 && e2 && m1 && m2 && sens);
        for (int j = 0; j < c[1]; j++) sens[j] = (uint8_t)(j % 7 == 2);
        for (int layer = 0; layer < 2; layer++) {
            cp_attn_args a = p.a;
            a.export_a = e1, a.export_ld = c[1], a.export_weight = 1.0f / (2 * c[2]), a.sens_cols = sens, a.sens_mass = m1;
            cpu_attention_general(&a, p.S);
            a.out = NULL, a.export_a = e2, a.sens_mass = m2;
            float *S = malloc(cpu_attention_general_scratch_floats(&a) * 4);
            cr_assert(S);
            cpu_attention_general(&a, S);
            free(S);
            p.q[layer] += 0.5f;
        }
        size_t bad = 0;
        for (size_t i = 0; i < ne; i++) bad += memcmp(&e1[i], &e2[i], 4) != 0;
        cr_assert_eq(bad, 0, "shape %d: %zu export values differ without output rows", si, bad);
        cr_assert(memcmp(m1, m2, (size_t)c[0] * 4) == 0, "shape %d: the sensitive mass differs without output rows", si);
        free(e1), free(e2), free(m1), free(m2), free(sens);
        prob_free(&p);
    }
}

/* The pair kernels as the backend runs them for every row count
 * (cpu_attention_rows): a row's export and sensitive mass are bit for bit
 * its lone call's (its 4 KV heads add in one order whatever the call), and
 * with export_rows each lands in the row it names -- reversed here, one
 * row sent to -1 adding nothing -- f32 and bf16 caches. */
Test(attn_decode, a_rows_export_is_its_lone_calls_and_lands_where_export_rows_say)
{
    enum { N = 5, NK = 41, H = 8, KV = 4, HD = 32 };
    prob p;
    prob_make(&p, N, NK, H, KV, HD, 0, NK - N);
    const size_t qld = H * HD;
    uint8_t sens[NK];
    for (int j = 0; j < NK; j++) sens[j] = j % 4 == 1;
    int32_t rows[N];
    for (int i = 0; i < N; i++) rows[i] = i == 2 ? -1 : N - 1 - i;
    float *scr = malloc(cpu_attention_rows_scratch_floats(&p.a, 2, CPU_ATTN_AUTO) * sizeof(float));
    float ex[N * NK], mass[N + 1], e1[NK], m1, out1[H * HD];
    cr_assert(scr);
    for (int bf = 0; bf < 2; bf++) {
        cp_attn_args a = bf ? as_bf16(&p) : p.a;
        a.out = p.out, a.export_ld = NK, a.export_weight = 1.0f / H, a.sens_cols = sens;
        memset(ex, 0, sizeof ex), memset(mass, 0, sizeof mass);
        a.export_a = ex, a.sens_mass = mass + 1, a.export_rows = rows; /* mass[0]: a guard before the rows */
        cpu_attention_rows(&a, scr, 2, CPU_ATTN_AUTO);
        for (int i = 0; i < N; i++) {
            cp_attn_args one = a;
            memset(e1, 0, sizeof e1), m1 = 0;
            one.n = 1, one.q = p.q + (size_t)i * qld, one.q_pos = p.qp + i, one.out = out1;
            one.export_a = e1, one.sens_mass = &m1, one.export_rows = NULL;
            cpu_attention_rows(&one, scr, 1, CPU_ATTN_AUTO);
            cr_assert(memcmp(out1, p.out + (size_t)i * qld, sizeof out1) == 0, "%s: row %d's output is not its lone call's", bf ? "bf16" : "f32", i);
            if (rows[i] < 0) continue;
            cr_assert(memcmp(e1, ex + (size_t)rows[i] * NK, sizeof e1) == 0, "%s: row %d's export is not its lone call's at row %d",
                      bf ? "bf16" : "f32", i, rows[i]);
            cr_assert(memcmp(&m1, mass + 1 + rows[i], sizeof m1) == 0, "%s: row %d's mass is not its lone call's", bf ? "bf16" : "f32", i);
            cr_assert(m1 > 0, "%s: row %d has no sensitive mass: the comparison is empty", bf ? "bf16" : "f32", i);
        }
        for (int j = 0; j < NK; j++) cr_assert(ex[(size_t)(N - 1 - 2) * NK + j] == 0, "%s: the row sent to -1 exported", bf ? "bf16" : "f32");
        cr_assert(mass[0] == 0 && mass[1 + N - 1 - 2] == 0, "%s: the row sent to -1 wrote a mass", bf ? "bf16" : "f32");
    }
    free(scr);
    prob_free(&p);
}

/* The block kernels (cpu_attn_rows_block_avx2 / _avx512: up to 8 rows
 * reading each block of keys and values once) against their pair kernel,
 * row by row: output, export and sensitive mass bit for bit -- contiguous
 * causal rows, a window (rows starting at different slots: each its own
 * pair), rows scattered over the prompt (ranges far apart: alone, or
 * together with the keys past a shorter row's range thrown away), one
 * query head a KV head, seven and seventeen, keys at a permutation of
 * positions. */
typedef void (*attn_block_fn)(const cp_attn_args *, int, int, int, float *, float *);
typedef void (*attn_pair_fn)(const cp_attn_args *, int, int, float *, float *);

static void block_kernel_is_its_pairs(attn_block_fn block, attn_pair_fn pair)
{
    const int shapes[7][8] = {
        /* n, keys, heads, kv, hd, window, spread (0: contiguous rows at the end; else row i at i * spread % keys),
         * keys in position order (else a permutation) */
        { 13, 97, 8, 4, 32, 0, 0, 0 },  { 9, 150, 14, 2, 64, 40, 0, 0 }, { 11, 211, 8, 4, 32, 0, 37, 0 },
        { 6, 70, 4, 4, 16, 0, 3, 0 },   { 7, 64, 14, 2, 64, 0, 0, 0 },   { 10, 120, 8, 4, 32, 21, 0, 1 },
        { 5, 40, 34, 2, 16, 0, 0, 0 }, /* 17 query heads a KV head: more than a run holds, pairs */
    };
    for (int si = 0; si < 7; si++) {
        const int *c = shapes[si], n = c[0], nk = c[1], H = c[2], KV = c[3], HD = c[4], group = H / KV;
        prob p;
        prob_make(&p, n, nk, H, KV, HD, c[5], nk - n);
        if (c[6])
            for (int i = 0; i < n; i++) p.qp[i] = (int32_t)(((long)i * c[6] + 5) % nk);
        if (c[7]) /* a window then moves each row's first slot */
            for (int j = 0; j < nk; j++) p.kp[j] = j;
        const size_t qld = (size_t)H * HD, per = CPU_ATTN_DECODE_PER((size_t)group, nk, HD), ne = (size_t)n * nk;
        float *S = malloc(CPU_ATTN_ROW_BLOCK * per * 4), *ob = malloc((size_t)n * qld * 4), *op = malloc((size_t)n * qld * 4);
        float *eb = calloc(ne, 4), *ep = calloc(ne, 4), *mb = calloc((size_t)n, 4), *mp = calloc((size_t)n, 4);
        uint8_t *sens = malloc((size_t)nk);
        cr_assert(S && ob && op && eb && ep && mb && mp && sens);
        for (int j = 0; j < nk; j++) sens[j] = (uint8_t)(j % 5 == 1);
        for (int ex = 0; ex < 2; ex++) {
            cp_attn_args a = p.a;
            if (ex) a.export_ld = nk, a.export_weight = 1.0f / H, a.sens_cols = sens;
            for (size_t i = 0; i < (size_t)n * qld; i++) ob[i] = op[i] = NAN;
            memset(eb, 0, ne * 4), memset(ep, 0, ne * 4), memset(mb, 0, (size_t)n * 4), memset(mp, 0, (size_t)n * 4);
            a.out = ob, a.export_a = ex ? eb : NULL, a.sens_mass = ex ? mb : NULL;
            for (int i0 = 0; i0 < n; i0 += CPU_ATTN_ROW_BLOCK)
                for (int g = 0; g < KV; g++)
                    block(&a, i0, n - i0 < CPU_ATTN_ROW_BLOCK ? n - i0 : CPU_ATTN_ROW_BLOCK, g, S,
                                             S + CPU_ATTN_ROW_BLOCK * per - CPU_ATTN_DECODE_TILE * (size_t)HD);
            a.out = op, a.export_a = ex ? ep : NULL, a.sens_mass = ex ? mp : NULL;
            for (int i = 0; i < n; i++)
                for (int g = 0; g < KV; g++) pair(&a, i, g, S, S + per - CPU_ATTN_DECODE_TILE * (size_t)HD);
            for (int i = 0; i < n; i++) {
                cr_assert(memcmp(ob + (size_t)i * qld, op + (size_t)i * qld, qld * 4) == 0, "shape %d%s: row %d's output is not its pairs'", si,
                          ex ? " (export)" : "", i);
                if (!ex) continue;
                cr_assert(memcmp(eb + (size_t)i * nk, ep + (size_t)i * nk, (size_t)nk * 4) == 0, "shape %d: row %d's export is not its pairs'", si, i);
                cr_assert(memcmp(&mb[i], &mp[i], 4) == 0, "shape %d: row %d's mass is not its pairs'", si, i);
            }
            double sum = 0;
            for (size_t i = 0; i < (size_t)n * qld; i++) sum += fabsf(op[i]);
            cr_assert(sum > 0, "shape %d: every output is zero: the comparison is empty", si);
        }
        free(S), free(ob), free(op), free(eb), free(ep), free(mb), free(mp), free(sens);
        prob_free(&p);
    }
}

Test(attn_decode, the_avx2_block_kernel_is_its_rows_pairs_bitwise)
{
    if (!have_avx2()) cr_skip_test("no AVX2 + FMA here: the block kernel is not tested");
    block_kernel_is_its_pairs(cpu_attn_rows_block_avx2, cpu_attn_decode_pair_avx2);
}

Test(attn_decode, the_avx512_block_kernel_is_its_rows_pairs_bitwise)
{
    if (!have_avx512()) cr_skip_test("no AVX-512 here: the block kernel is not tested");
    block_kernel_is_its_pairs(cpu_attn_rows_block_avx512, cpu_attn_decode_pair_avx512);
}
