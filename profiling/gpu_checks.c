/* The device checks (profiling/gpu_checks.h): each compares one piece of
 * the CUDA backend with the CPU reference ops (built without BLAS where
 * there is none) on fresh random inputs of odd sizes, or runs a carried
 * weight pack end to end.  Shared by the device machine's runner
 * (gpu_check_main.c, libc only) and the Criterion suite (tests/test_cuda.c). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_checks.h"

#include "../kernels/backend.h"
#include "../kernels/cpu/ops_cpu.h"
#include "../kernels/dtype.h"
#include "../engine/annotate/annotate.h"
#include "../engine/annotate/sat.h"
#include "../model/pack.h"
#ifdef CP_CUDA
#include "../kernels/cuda/annot_cuda.h"
#endif

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static void fill(float *p, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) p[i] = scale * frand();
}
static void round_bf16(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = cp_bf16_to_f32(cp_f32_to_bf16(p[i]));
}


/* The error of got against ref: NMSE and the largest element error relative
 * to the largest |ref|.  NaN anywhere fails. */
typedef struct cmp {
    double nmse, rel_max;
    int nan;
} cmp;

static cmp compare(const float *got, const float *ref, size_t n)
{
    double num = 0, den = 0, mx = 0, ref_max = 0;
    cmp c = { 0 };
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i])) c.nan = 1;
        double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
        mx = fmax(mx, fabs(d)), ref_max = fmax(ref_max, fabs(ref[i]));
    }
    c.nmse = den > 0 ? num / den : num;
    c.rel_max = ref_max > 0 ? mx / ref_max : mx;
    return c;
}

static int within(check *k, const char *what, cmp c, double nmse_tol, double rel_tol)
{
    if (c.nan || !(c.nmse <= nmse_tol) || !(c.rel_max <= rel_tol)) {
        snprintf(k->why, sizeof k->why, "%s: nmse %.3g (tol %.1g), max rel err %.3g (tol %.1g)%s", what, c.nmse, nmse_tol,
                 c.rel_max, rel_tol, c.nan ? ", NaN" : "");
        return 0;
    }
    return 1;
}

/* device buffers: upload a host array / poison then download */
static void *dev_put(check *k, const void *host, size_t bytes)
{
    void *d = NULL;
    cp_error err;
    if (k->gpu->alloc(k->gpu, bytes, &d, &err) || (host && k->gpu->upload(k->gpu, d, host, bytes, &err))) {
        fprintf(stderr, "gpu_check: %s\n", err.msg);
        exit(1);
    }
    return d;
}
static void *dev_poison(check *k, size_t bytes)
{
    void *d = dev_put(k, NULL, bytes);
    unsigned char *nan = malloc(bytes); /* 0xff bytes: NaN in f32; an unwritten output fails */
    memset(nan, 0xff, bytes);
    cp_error err;
    if (k->gpu->upload(k->gpu, d, nan, bytes, &err)) exit(1);
    free(nan);
    return d;
}
static int dev_get(check *k, void *host, const void *d, size_t bytes)
{
    cp_error err;
    if (k->gpu->sync(k->gpu, &err) || k->gpu->download(k->gpu, host, d, bytes, &err)) {
        snprintf(k->why, sizeof k->why, "device error: %s", err.msg);
        return 0;
    }
    return 1;
}

/* ---- per-op parity ---- */

int t_embed(check *k)
{
    static const int shapes[][3] = { { 1, 1, 5 }, { 3, 17, 40 }, { 17, 129, 1000 }, { 129, 1000, 333 } }; /* n, dim, vocab */
    for (int s = 0; s < 4; s++) {
        int n = shapes[s][0], dim = shapes[s][1], V = shapes[s][2];
        float *table = malloc((size_t)V * dim * 4), *ref = malloc((size_t)n * dim * 4), *got = malloc((size_t)n * dim * 4);
        cp_dtype md = k->gpu->matrix_dtype;
        uint16_t *tb = malloc((size_t)V * dim * cp_dtype_size(md));
        int32_t *ids = malloc((size_t)n * 4);
        fill(table, (size_t)V * dim, 2);
        round_bf16(table, (size_t)V * dim);
        cp_convert_float(tb, md, table, CP_F32, (size_t)V * dim);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)((frand() * 0.5f + 0.5f) * (V - 1));
        cpu_embed(ref, table, ids, n, dim);
        void *dt = dev_put(k, tb, (size_t)V * dim * cp_dtype_size(md)), *di = dev_put(k, ids, (size_t)n * 4), *dout = dev_poison(k, (size_t)n * dim * 4);
        const cp_matrix tm = cp_matrix_rows(dt, md, V, dim);
        k->gpu->embed(k->gpu, dout, &tm, di, n, dim);
        int ok = dev_get(k, got, dout, (size_t)n * dim * 4) && within(k, "embed", compare(got, ref, (size_t)n * dim), 0, 0);
        k->gpu->free(k->gpu, dt), k->gpu->free(k->gpu, di), k->gpu->free(k->gpu, dout);
        free(table), free(ref), free(got), free(tb), free(ids);
        if (!ok) return 0;
    }
    return 1;
}

int t_rmsnorm(check *k)
{
    static const int shapes[][2] = { { 1, 1 }, { 3, 17 }, { 17, 129 }, { 129, 1000 }, { 7, 3584 } };
    for (int s = 0; s < 5; s++) {
        int n = shapes[s][0], dim = shapes[s][1];
        size_t N = (size_t)n * dim;
        float *x = malloc(N * 4), *w = malloc((size_t)dim * 4), *ref = malloc(N * 4), *got = malloc(N * 4);
        fill(x, N, 3), fill(w, (size_t)dim, 1);
        cpu_rmsnorm(ref, x, w, n, dim, 1e-6f);
        void *dx = dev_put(k, x, N * 4), *dw = dev_put(k, w, (size_t)dim * 4), *dout = dev_poison(k, N * 4);
        k->gpu->rmsnorm(k->gpu, dout, dx, dw, n, dim, 1e-6f);
        int ok = dev_get(k, got, dout, N * 4) && within(k, "rmsnorm", compare(got, ref, N), 1e-11, 1e-5);
        k->gpu->free(k->gpu, dx), k->gpu->free(k->gpu, dw), k->gpu->free(k->gpu, dout);
        free(x), free(w), free(ref), free(got);
        if (!ok) return 0;
    }
    return 1;
}

int t_rope(check *k)
{
    static const int shapes[][3] = { { 1, 1, 24 }, { 3, 2, 32 }, { 17, 6, 64 }, { 129, 4, 128 }, { 5, 2, 256 } }; /* n, heads, hd */
    for (int s = 0; s < 5; s++) {
        int n = shapes[s][0], H = shapes[s][1], hd = shapes[s][2], ld = H * hd + 8, half = hd / 2;
        size_t N = (size_t)n * ld;
        float *x = malloc(N * 4), *ref = malloc(N * 4), *got = malloc(N * 4), *c = malloc((size_t)n * half * 4),
              *sn = malloc((size_t)n * half * 4);
        fill(x, N, 2);
        for (int i = 0; i < n * half; i++) {
            double a = (i / half + 1) * pow(10000.0, -2.0 * (i % half) / hd);
            c[i] = (float)cos(a), sn[i] = (float)sin(a);
        }
        memcpy(ref, x, N * 4);
        cpu_rope(ref, ld, c, sn, n, H, hd);
        void *dx = dev_put(k, x, N * 4), *dc = dev_put(k, c, (size_t)n * half * 4), *ds = dev_put(k, sn, (size_t)n * half * 4);
        k->gpu->rope(k->gpu, dx, ld, dc, ds, n, H, hd);
        int ok = dev_get(k, got, dx, N * 4) && within(k, "rope", compare(got, ref, N), 1e-12, 1e-6);
        k->gpu->free(k->gpu, dx), k->gpu->free(k->gpu, dc), k->gpu->free(k->gpu, ds);
        free(x), free(ref), free(got), free(c), free(sn);
        if (!ok) return 0;
    }
    return 1;
}

int t_swiglu(check *k)
{
    static const size_t counts[] = { 1, 17, 1000, 100003 };
    for (int s = 0; s < 4; s++) {
        size_t N = counts[s];
        float *g = malloc(N * 4), *u = malloc(N * 4), *ref = malloc(N * 4), *got = malloc(N * 4);
        fill(g, N, 6), fill(u, N, 2);
        cpu_swiglu(ref, g, u, N);
        void *dg = dev_put(k, g, N * 4), *du = dev_put(k, u, N * 4), *dout = dev_poison(k, N * 4);
        k->gpu->swiglu(k->gpu, dout, dg, du, N);
        int ok = dev_get(k, got, dout, N * 4) && within(k, "swiglu", compare(got, ref, N), 1e-11, 1e-5);
        k->gpu->free(k->gpu, dg), k->gpu->free(k->gpu, du), k->gpu->free(k->gpu, dout);
        free(g), free(u), free(ref), free(got);
        if (!ok) return 0;
    }
    return 1;
}

/* bf16 weights and the activations rounded to bf16 as the device rounds
 * them: what remains is f32 vs double accumulation */
int t_matmul(check *k)
{
    static const int shapes[][5] = { /* n, in, out, accumulate, bias */
        { 1, 17, 3, 0, 0 }, { 3, 129, 1000, 1, 0 }, { 17, 1000, 129, 0, 1 }, { 129, 256, 768, 1, 1 }, { 1, 3584, 512, 0, 1 }
    };
    for (int s = 0; s < 5; s++) {
        int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2], acc = shapes[s][3], has_b = shapes[s][4], ldy = out + 3;
        size_t NX = (size_t)n * in, NW = (size_t)out * in, NY = (size_t)n * ldy;
        float *x = malloc(NX * 4), *w = malloc(NW * 4), *b = malloc((size_t)out * 4), *y0 = malloc(NY * 4), *ref = malloc(NY * 4),
              *got = malloc(NY * 4), *xr = malloc(NX * 4);
        cp_dtype md = k->gpu->matrix_dtype;
        uint16_t *wb = malloc(NW * cp_dtype_size(md));
        fill(x, NX, 1), fill(w, NW, 1.0f / sqrtf((float)in)), fill(b, (size_t)out, 0.5f), fill(y0, NY, 1);
        round_bf16(w, NW);
        cp_convert_float(wb, md, w, CP_F32, NW);
        memcpy(xr, x, NX * 4);
        if (k->act_bf16) round_bf16(xr, NX); /* as the device rounds them for its bf16 GEMMs */
        memcpy(ref, y0, NY * 4);
        cpu_matmul(ref, ldy, xr, w, has_b ? b : NULL, n, in, out, acc);
        void *dx = dev_put(k, x, NX * 4), *dw = dev_put(k, wb, NW * cp_dtype_size(md)), *db = dev_put(k, b, (size_t)out * 4), *dy0 = dev_put(k, NULL, NY * 4 + 4);
        float *dy = (float *)dy0 + (s == 2); /* one output only 4-byte aligned, as a y inside a larger buffer can be */
        cp_error err;
        if (k->gpu->upload(k->gpu, dy, y0, NY * 4, &err)) return snprintf(k->why, sizeof k->why, "%s", err.msg), 0;
        const cp_matrix wm = cp_matrix_rows(dw, md, out, in);
        k->gpu->matmul(k->gpu, dy, ldy, dx, &wm, has_b ? db : NULL, n, in, out, acc);
        int ok = dev_get(k, got, dy, NY * 4) && within(k, "matmul", compare(got, ref, NY), 1e-10, 1e-4);
        k->gpu->free(k->gpu, dx), k->gpu->free(k->gpu, dw), k->gpu->free(k->gpu, db), k->gpu->free(k->gpu, dy0);
        free(x), free(w), free(b), free(y0), free(ref), free(got), free(xr), free(wb);
        if (!ok) return 0;
    }
    return 1;
}

int t_place(check *k)
{
    static const int shapes[][4] = { { 1, 1, 24, 24 }, { 16, 2, 32, 80 }, { 37, 4, 128, 600 } }; /* n, kv heads, hd, src_ld */
    for (int s = 0; s < 3; s++) {
        int n = shapes[s][0], KV = shapes[s][1], hd = shapes[s][2], half = hd / 2;
        size_t row = (size_t)KV * hd, ld = (size_t)shapes[s][3], NS = (size_t)n * ld, N = (size_t)n * row;
        float *sk = malloc(NS * 4), *sv = malloc(NS * 4), *c = malloc((size_t)n * half * 4), *sn = malloc((size_t)n * half * 4);
        float *rk = malloc(N * 4), *rp = malloc(N * 4), *rv = malloc(N * 4), *got = malloc(N * 4);
        fill(sk, NS, 2), fill(sv, NS, 2), fill(c, (size_t)n * half, 1), fill(sn, (size_t)n * half, 1);
        cpu_place_kv(rk, rp, rv, sk, sv, ld, n, c, sn, KV, hd);
        float *dsk = dev_put(k, sk, NS * 4), *dsv = dev_put(k, sv, NS * 4), *dc = dev_put(k, c, (size_t)n * half * 4),
              *ds = dev_put(k, sn, (size_t)n * half * 4);
        float *dk = dev_poison(k, N * 4), *dp = dev_poison(k, N * 4), *dv = dev_poison(k, N * 4);
        k->gpu->place_kv(k->gpu, dk, dp, dv, dsk, dsv, ld, n, dc, ds, KV, hd);
        int ok = dev_get(k, got, dk, N * 4) && within(k, "place_kv k", compare(got, rk, N), 1e-12, 1e-6) &&
                 dev_get(k, got, dp, N * 4) && within(k, "place_kv k_pre", compare(got, rp, N), 0, 0) &&
                 dev_get(k, got, dv, N * 4) && within(k, "place_kv v", compare(got, rv, N), 0, 0);
        void *ptrs[] = { dsk, dsv, dc, ds, dk, dp, dv };
        for (int i = 0; i < 7; i++) k->gpu->free(k->gpu, ptrs[i]);
        free(sk), free(sv), free(c), free(sn), free(rk), free(rp), free(rv), free(got);
        if (!ok) return 0;
    }
    return 1;
}

typedef struct attn_case {
    int n, n_keys, H, KV, D, window, export, scatter;
} attn_case;

/* bf16_inputs: q, k, v drawn as bf16 values (the tensor-core variant rounds
 * its inputs; so drawn, only its P rounding and sums differ) */
static int attn_one(check *k, const attn_case *c, int bf16_inputs, double nmse_tol, double rel_tol)
{
    const int qld = c->H * c->D, kld = c->KV * c->D;
    size_t NQ = (size_t)c->n * qld, NK = (size_t)c->n_keys * kld, NA = (size_t)c->n * c->n_keys;
    float *q = malloc(NQ * 4), *kk = malloc(NK * 4), *v = malloc(NK * 4), *ref = malloc(NQ * 4), *got = malloc(NQ * 4);
    float *ea = malloc(NA * 4), *ea_ref = malloc(NA * 4), *ea_got = malloc(NA * 4), *sm = malloc((size_t)c->n * 4),
          *sm_ref = malloc((size_t)c->n * 4), *sm_got = malloc((size_t)c->n * 4);
    int32_t *qp = malloc((size_t)c->n * 4), *kp = malloc((size_t)c->n_keys * 4);
    uint8_t *sens = malloc((size_t)c->n_keys);
    fill(q, NQ, 2), fill(kk, NK, 2), fill(v, NK, 1), fill(ea, NA, 0.1f);
    if (bf16_inputs) round_bf16(q, NQ), round_bf16(kk, NK), round_bf16(v, NK);
    for (int i = 0; i < c->n; i++) sm[i] = 0.15f + 0.15f * frand();
    for (int j = 0; j < c->n_keys; j++) sens[j] = frand() > 0.6f;
    /* keys at positions 0..n_keys-1, in slot order or (scatter) in a
     * shuffled placement as reused KV lands; queries take the last n */
    for (int j = 0; j < c->n_keys; j++) kp[j] = j;
    if (c->scatter)
        for (int j = c->n_keys - 1; j > 0; j--) {
            int r = (int)((frand() * 0.5f + 0.5f) * j);
            int32_t t = kp[j];
            kp[j] = kp[r], kp[r] = t;
        }
    for (int i = 0; i < c->n; i++) qp[i] = c->n_keys - c->n + i;
    cp_attn_args a = { q, kk, v, qp, kp, ref, c->n, c->n_keys, c->H, c->KV, c->D, c->window, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL };
    if (c->export) {
        memcpy(ea_ref, ea, NA * 4), memcpy(sm_ref, sm, (size_t)c->n * 4);
        a.export_a = ea_ref, a.export_ld = c->n_keys, a.export_weight = 0.25f, a.sens_cols = sens, a.sens_mass = sm_ref;
    }
    float *scratch = malloc(cpu_attention_scratch_floats(&a) * 4);
    cpu_attention(&a, scratch);
    cp_attn_args g = a;
    g.q = dev_put(k, q, NQ * 4), g.k = dev_put(k, kk, NK * 4), g.v = dev_put(k, v, NK * 4);
    g.q_pos = dev_put(k, qp, (size_t)c->n * 4), g.k_pos = dev_put(k, kp, (size_t)c->n_keys * 4), g.out = dev_poison(k, NQ * 4);
    if (c->export) {
        g.export_a = dev_put(k, ea, NA * 4), g.sens_cols = dev_put(k, sens, (size_t)c->n_keys), g.sens_mass = dev_put(k, sm, (size_t)c->n * 4);
    }
    k->gpu->attention(k->gpu, &g);
    int ok = dev_get(k, got, g.out, NQ * 4) && within(k, "attention out", compare(got, ref, NQ), nmse_tol, rel_tol);
    if (ok && c->export)
        ok = dev_get(k, ea_got, g.export_a, NA * 4) && within(k, "attention export", compare(ea_got, ea_ref, NA), 1e-10, 1e-5) &&
             dev_get(k, sm_got, g.sens_mass, (size_t)c->n * 4) && within(k, "sensitive mass", compare(sm_got, sm_ref, (size_t)c->n), 1e-10, 1e-5);
    void *ptrs[] = { (void *)g.q, (void *)g.k, (void *)g.v, (void *)g.q_pos, (void *)g.k_pos, g.out };
    for (int i = 0; i < 6; i++) k->gpu->free(k->gpu, ptrs[i]);
    if (c->export) k->gpu->free(k->gpu, g.export_a), k->gpu->free(k->gpu, (void *)g.sens_cols), k->gpu->free(k->gpu, g.sens_mass);
    free(q), free(kk), free(v), free(ref), free(got), free(ea), free(ea_ref), free(ea_got), free(sm), free(sm_ref), free(sm_got);
    free(qp), free(kp), free(sens), free(scratch);
    if (!ok) {
        char tmp[2300];
        snprintf(tmp, sizeof tmp, "%s (n %d keys %d heads %d/%d D %d window %d)", k->why, c->n, c->n_keys, c->H, c->KV, c->D, c->window);
        memcpy(k->why, tmp, sizeof k->why - 1);
        k->why[sizeof k->why - 1] = 0;
    }
    return ok;
}

int t_attention(check *k)
{
    static const attn_case cases[] = {
        { 1, 1, 1, 1, 24, 0, 0, 0 },     { 17, 17, 4, 2, 32, 0, 1, 0 },      { 129, 129, 6, 2, 24, 16, 1, 0 },
        { 3, 1000, 8, 8, 64, 0, 0, 0 },  { 1, 4099, 28, 4, 128, 0, 1, 0 },   { 200, 300, 4, 1, 128, 0, 1, 1 },
        { 33, 33, 2, 1, 256, 0, 0, 0 },  { 20, 45, 3, 3, 100, 7, 1, 1 },     { 1000, 1000, 2, 2, 128, 0, 0, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!attn_one(k, &cases[i], 0, 1e-10, 1e-4)) return 0;
    return 1;
}

/* Variant 2 (tensor cores, CP_CUDA_ATTN=mma): head_dim 64 and 128 from 64
 * queries; the other shapes fall back to variant 1 (covered here too) */
int t_attention_mma(check *k)
{
    static const attn_case cases[] = {
        { 64, 64, 4, 2, 64, 0, 1, 0 },   { 200, 300, 4, 1, 128, 0, 1, 1 }, { 130, 130, 8, 8, 64, 16, 0, 0 },
        { 1000, 1000, 2, 2, 128, 0, 0, 0 }, { 77, 500, 28, 4, 128, 0, 1, 0 }, { 33, 33, 2, 1, 128, 0, 0, 0 },
        { 100, 100, 2, 2, 96, 0, 0, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!attn_one(k, &cases[i], 1, 1e-5, 2e-2)) return 0;
    return 1;
}

int t_sample(check *k)
{
    static const int vocab[] = { 1, 7, 1000, 151936 };
    int agree = 0, total = 0;
    for (int s = 0; s < 4; s++) {
        int V = vocab[s];
        float *l = malloc((size_t)V * 4);
        fill(l, (size_t)V, 8);
        void *dl = dev_put(k, l, (size_t)V * 4);
        int32_t want = cpu_sample(l, V, 0, 1, 0), got = k->gpu->sample(k->gpu, dl, V, 0, 1, 0);
        if (got != want) {
            snprintf(k->why, sizeof k->why, "argmax over %d: device %d, cpu %d", V, got, want);
            return 0;
        }
        static const float tops[] = { 1.0f, 0.9f, 0.5f };
        for (int t = 0; t < 3; t++)
            for (int r = 0, reps = V > 10000 ? 8 : 40; r < reps; r++) { /* the reference is slow on 152k ids */
                float u = (r + 0.5f) / reps;
                agree += k->gpu->sample(k->gpu, dl, V, 0.8f, tops[t], u) == cpu_sample(l, V, 0.8f, tops[t], u);
                total++;
            }
        if (k->gpu->sample(k->gpu, dl, V, 0.8f, 0.5f, 1.0f) != -1) {
            snprintf(k->why, sizeof k->why, "u = 1 must be refused");
            return 0;
        }
        k->gpu->free(k->gpu, dl);
        free(l);
    }
    if (agree < total * 98 / 100) { /* float vs double sums can move a boundary: rarely */
        snprintf(k->why, sizeof k->why, "top-p samples agree with the cpu in %d of %d", agree, total);
        return 0;
    }
    return 1;
}

/* ---- the annotator on the device (kernels/cuda/annot_cuda.h) ---- */

/* block-local attention rows like a prefill's: strong within a block of 50,
 * weak elsewhere, a sink at 0 */
static float *local_attention(int T, size_t lda)
{
    float *A = calloc((size_t)T * lda, sizeof *A);
    for (int i = 0; i < T; i++) {
        double sum = 0;
        int b0 = i / 50 * 50;
        for (int j = 0; j <= i; j++) {
            double w = (0.5f + 0.5f * frand()) * (j == 0 ? 3.0 : j >= b0 ? 4.0 : 0.5);
            A[(size_t)i * lda + j] = (float)w;
            sum += w;
        }
        for (int j = 0; j <= i; j++) A[(size_t)i * lda + j] = (float)(A[(size_t)i * lda + j] / sum);
    }
    return A;
}

/* The annotator with its O(T^2) part on the device (cp_cuda_annot_dev; the
 * host reference cp_annot_dev_host when self-testing) chooses the same
 * segments, flags and rejections as the host path; and the device SAT of
 * the last run equals the host's entry by entry. */
int t_annot(check *k, int self_test)
{
    const int T = 600;
    const size_t lda = T + 3;
    float *A = local_attention(T, lda);
    uint8_t sens[600] = { 0 };
    sens[211] = sens[407] = 1;
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.min_len = 16, o.max_len = 128, o.beta = 0.004;
    cp_annot_input in = { A, lda, T, NULL, sens, NULL, NULL, NULL };
    float *dA = dev_put(k, A, (size_t)T * lda * 4);
    uint8_t *dsens = dev_put(k, sens, T);
    cp_annot_result want = { 0 }, got = { 0 };
    cp_error err = { 0 };
    cp_annot_dev dev = { 0 };
    int ok = cp_annotate(&in, &o, &want, &err) == CP_OK;
#ifdef CP_CUDA
    if (ok) ok = (self_test ? cp_annot_dev_host(A, lda, T, sens, &dev, &err) : cp_cuda_annot_dev_open(k->gpu, dA, lda, T, dsens, &dev, &err)) == CP_OK;
#else
    if (ok) ok = self_test && cp_annot_dev_host(A, lda, T, sens, &dev, &err) == CP_OK;
#endif
    cp_annot_input elsewhere = in;
    elsewhere.A = NULL, elsewhere.dev = &dev;
    ok = ok && cp_annotate(&elsewhere, &o, &got, &err) == CP_OK;
    if (!ok) snprintf(k->why, sizeof k->why, "annotate: %s", err.msg);
    if (ok && (got.n != want.n || want.n == 0 || !want.rejected_tau || !want.rejected_beta || got.rejected_tau != want.rejected_tau ||
               got.rejected_beta != want.rejected_beta)) {
        snprintf(k->why, sizeof k->why, "segments: device %zu, host %zu (host rejected tau %ld, beta %ld; device %ld, %ld)", got.n,
                 want.n, want.rejected_tau, want.rejected_beta, got.rejected_tau, got.rejected_beta);
        ok = 0;
    }
    for (size_t g = 0; ok && g < got.n; g++)
        if (got.v[g].start != want.v[g].start || got.v[g].len != want.v[g].len ||
            memcmp(got.v[g].recompute, want.v[g].recompute, (size_t)got.v[g].len) ||
            fabs(got.v[g].internal - want.v[g].internal) > 1e-9 * (1 + want.v[g].internal)) {
            snprintf(k->why, sizeof k->why, "segment %zu: device [%d, +%d) internal %.12g, host [%d, +%d) %.12g", g, got.v[g].start,
                     got.v[g].len, got.v[g].internal, want.v[g].start, want.v[g].len, want.v[g].internal);
            ok = 0;
        }
#ifdef CP_CUDA
    /* the last run's table against the host's, entry by entry in the band */
    if (ok && !self_test) {
        const int s = 408, e = T, n = e - s, band = o.max_len < n ? o.max_len : n; /* the run after the second secret */
        double *v = dev_put(k, NULL, (size_t)n * (band + 1) * 8), *scratch = dev_put(k, NULL, (size_t)2 * n * 8);
        double *host = malloc((size_t)n * (band + 1) * 8);
        cp_cuda_sat_build(k->gpu, dA, lda, s, e, band, v, scratch);
        cp_sat sat = { 0 };
        ok = dev_get(k, host, v, (size_t)n * (band + 1) * 8) && cp_sat_build(&sat, A, lda, s, e, band, &err) == CP_OK;
        double worst = 0;
        for (int i = s; ok && i < e; i++)
            for (int j = i - band > s ? i - band : s; j <= i; j++) {
                double h = cp_sat_at(&sat, i, j), d = host[(size_t)(i - s) * (band + 1) + (i - j)];
                worst = fmax(worst, fabs(d - h) / fmax(1e-300, fabs(h)));
            }
        if (ok && !(worst <= 1e-12)) snprintf(k->why, sizeof k->why, "SAT differs from the host's by %.3g relative", worst), ok = 0;
        cp_sat_free(&sat);
        free(host);
        k->gpu->free(k->gpu, v), k->gpu->free(k->gpu, scratch);
    }
    if (dev.ctx) self_test ? cp_annot_dev_host_free(&dev) : cp_cuda_annot_dev_close(&dev);
#else
    if (dev.ctx) cp_annot_dev_host_free(&dev);
#endif
    cp_annot_result_free(&got);
    cp_annot_result_free(&want);
    k->gpu->free(k->gpu, dA), k->gpu->free(k->gpu, dsens);
    free(A);
    return ok;
}

/* ---- end to end on the carried packs ---- */

int e2e(check *k, const char *path, double nmse_tol, double *nmse_out, int *greedy_ok, int *greedy_n)
{
    cp_error err = { 0 };
    cp_model *m;
    cp_pack_extra x;
    if (cp_pack_read(path, k->gpu, &m, &x, &err)) {
        snprintf(k->why, sizeof k->why, "%s", err.msg);
        return 0;
    }
    const int V = m->cfg.vocab;
    cp_state *st;
    float *lg = malloc((size_t)x.n_ids * V * 4), *last = malloc((size_t)V * 4);
    int ok = cp_state_create(m, x.n_ids + x.n_greedy + 1, 256, &st, &err) == CP_OK &&
             cp_forward(m, st, x.ids, NULL, x.n_ids, CP_LOGITS_ALL, lg, NULL, &err) == CP_OK;
    cmp c = { 0 };
    if (ok && x.logits) c = compare(lg, x.logits, (size_t)x.n_ids * V);
    *nmse_out = c.nmse;
    *greedy_ok = 0, *greedy_n = x.n_greedy;
    memcpy(last, lg + (size_t)(x.n_ids - 1) * V, (size_t)V * 4);
    int diverged = 0;
    for (int i = 0; ok && i < x.n_greedy; i++) { /* teacher-forced: a flip is counted, not carried */
        int32_t best = cpu_sample(last, V, 0, 1, 0);
        if (best == x.greedy[i] && !diverged) (*greedy_ok)++;
        else diverged = 1;
        ok = cp_forward(m, st, &x.greedy[i], NULL, 1, CP_LOGITS_LAST, last, NULL, &err) == CP_OK;
    }
    if (!ok) snprintf(k->why, sizeof k->why, "%s", err.msg);
    cp_state_free(m, st);
    cp_model_free(m);
    cp_pack_extra_free(&x);
    free(lg), free(last);
    if (ok && (c.nan || c.nmse > nmse_tol)) {
        snprintf(k->why, sizeof k->why, "%s: logits nmse %.3g vs the reference (tol %.0e)%s", path, c.nmse, nmse_tol, c.nan ? ", NaN" : "");
        ok = 0;
    }
    return ok;
}

/* The reuse prefill on the device: the first half of a pack's prompt
 * computed in one state, its pre-RoPE K and V downloaded and placed into a
 * fresh state (place_kv), the second half computed there: the last logits
 * must equal a plain prefill's (the exact variant: to f32 rounding). */
int t_reuse_prefill(check *k, const char *path, double *nmse_out)
{
    cp_error err = { 0 };
    cp_model *m;
    cp_pack_extra x;
    if (cp_pack_read(path, k->gpu, &m, &x, &err)) return snprintf(k->why, sizeof k->why, "%s", err.msg), 0;
    const cp_config *c = &m->cfg;
    const int n = x.n_ids, h = n / 2, V = c->vocab, L = c->n_layers;
    const size_t kvd = (size_t)c->n_kv_heads * c->head_dim;
    cp_state *a = NULL, *b = NULL;
    float *plain = malloc((size_t)V * 4), *reuse = malloc((size_t)V * 4), *kp = malloc((size_t)L * h * kvd * 4),
          *vv = malloc((size_t)L * h * kvd * 4);
    int32_t *pos = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) pos[i] = i;
    int ok = cp_state_create(m, n, 64, &a, &err) == CP_OK && cp_state_create(m, n, 64, &b, &err) == CP_OK &&
             cp_forward(m, a, x.ids, NULL, n, CP_LOGITS_LAST, plain, NULL, &err) == CP_OK;
    /* the first h rows of every layer, as the pool would hold them */
    for (int l = 0; ok && l < L; l++) {
        size_t at = (size_t)l * a->capacity * kvd;
        ok = k->gpu->download(k->gpu, kp + (size_t)l * h * kvd, a->k_pre + at, (size_t)h * kvd * 4, &err) == CP_OK &&
             k->gpu->download(k->gpu, vv + (size_t)l * h * kvd, a->v + at, (size_t)h * kvd * 4, &err) == CP_OK;
    }
    float *dk = NULL, *dv = NULL;
    if (ok) dk = dev_put(k, kp, (size_t)L * h * kvd * 4), dv = dev_put(k, vv, (size_t)L * h * kvd * 4);
    const float **kl = malloc((size_t)L * sizeof *kl), **vl = malloc((size_t)L * sizeof *vl);
    for (int l = 0; ok && l < L; l++) kl[l] = dk + (size_t)l * h * kvd, vl[l] = dv + (size_t)l * h * kvd;
    ok = ok && cp_state_place(m, b, 0, h, pos, kl, vl, kvd, &err) == CP_OK &&
         cp_forward_at(m, b, x.ids + h, pos + h, pos + h, n - h, n, CP_LOGITS_LAST, reuse, NULL, &err) == CP_OK;
    if (!ok) snprintf(k->why, sizeof k->why, "%s", err.msg);
    cmp cm = compare(reuse, plain, (size_t)V);
    *nmse_out = cm.nmse;
    ok = ok && within(k, "reuse prefill vs plain", cm, 1e-10, 1e-4);
    if (dk) k->gpu->free(k->gpu, dk), k->gpu->free(k->gpu, dv);
    cp_state_free(m, a), cp_state_free(m, b);
    cp_model_free(m);
    cp_pack_extra_free(&x);
    free(plain), free(reuse), free(kp), free(vv), free(pos), free(kl), free(vl);
    return ok;
}

/* Continuous batching on the device: three sequences of one pack's prompt
 * (the whole of it; its first half at positions from 7; its last two
 * thirds) prefilled in one cp_forward_batch step, then decoded together for
 * four steps (greedy, each feeding its own tokens): every step's last
 * logits must equal the sequence's lone cp_forward run on the same backend. */
int t_batch_parity(check *k, const char *path, double nmse_tol, double *nmse_out)
{
    cp_error err = { 0 };
    cp_model *m;
    cp_pack_extra x;
    if (cp_pack_read(path, k->gpu, &m, &x, &err)) return snprintf(k->why, sizeof k->why, "%s", err.msg), 0;
    enum { NS = 3, STEPS = 4 };
    const int n = x.n_ids, V = m->cfg.vocab;
    const int32_t *ids[NS] = { x.ids, x.ids, x.ids + n / 3 };
    int len[NS] = { n, n / 2 > 0 ? n / 2 : 1, n - n / 3 }, p0[NS] = { 0, 7, 0 };
    float *lone = malloc((size_t)NS * (STEPS + 1) * V * 4), *bat = malloc((size_t)NS * (STEPS + 1) * V * 4);
    int32_t *pos = malloc((size_t)(n + 8) * 4), tok[NS][STEPS + 1];
    cp_state *s[NS] = { 0 };
    cp_batch_ws *ws = NULL;
    int ok = lone && bat && pos && cp_batch_ws_create(m, 2 * n + 8, &ws, &err) == CP_OK;
    for (int r = 0; ok && r < NS; r++) { /* alone */
        float *lg = lone + (size_t)r * (STEPS + 1) * V;
        for (int i = 0; i < len[r]; i++) pos[i] = p0[r] + i;
        ok = cp_state_create(m, len[r] + STEPS + 1, 64, &s[r], &err) == CP_OK &&
             cp_forward(m, s[r], ids[r], pos, len[r], CP_LOGITS_LAST, lg, NULL, &err) == CP_OK;
        for (int t = 0; ok && t < STEPS; t++) {
            tok[r][t] = cpu_sample(lg + (size_t)t * V, V, 0, 1, 0);
            ok = cp_forward(m, s[r], &tok[r][t], NULL, 1, CP_LOGITS_LAST, lg + (size_t)(t + 1) * V, NULL, &err) == CP_OK;
        }
        ok = ok && cp_state_reset(m, s[r], &err) == CP_OK;
    }
    int32_t *bpos = malloc((size_t)NS * (n + 8) * 4);
    ok = ok && bpos;
    for (int t = 0; ok && t <= STEPS; t++) { /* together */
        cp_batch_seq q[NS];
        for (int r = 0; r < NS; r++) {
            int32_t *pr = bpos + (size_t)r * (n + 8);
            for (int i = 0; i < len[r]; i++) pr[i] = p0[r] + i;
            float *lg = bat + ((size_t)r * (STEPS + 1) + t) * V;
            q[r] = t == 0 ? (cp_batch_seq){ .s = s[r], .tokens = ids[r], .pos = pr, .n = len[r], .mode = CP_LOGITS_LAST, .logits = lg }
                          : (cp_batch_seq){ .s = s[r], .tokens = &tok[r][t - 1], .n = 1, .mode = CP_LOGITS_LAST, .logits = lg };
        }
        ok = cp_forward_batch(m, ws, q, NS, &err) == CP_OK;
    }
    if (!ok) snprintf(k->why, sizeof k->why, "%s", err.msg);
    cmp cm = { 0 };
    if (ok) cm = compare(bat, lone, (size_t)NS * (STEPS + 1) * V);
    *nmse_out = cm.nmse;
    ok = ok && within(k, "batched vs alone", cm, nmse_tol, 1e-2);
    for (int r = 0; r < NS; r++) cp_state_free(m, s[r]);
    cp_batch_ws_free(m, ws);
    cp_model_free(m);
    cp_pack_extra_free(&x);
    free(lone), free(bat), free(pos), free(bpos);
    return ok;
}


cp_status gpu_checks_open(check *k, int self_test, cp_error *err)
{
    memset(k, 0, sizeof *k);
    k->self_test = self_test;
    /* the variants are chosen by the environment at creation */
    static const char *const vars[3][2] = { { NULL, NULL }, { "CP_CUDA_GEMM", "f32" }, { "CP_CUDA_ATTN", "mma" } };
    cp_backend **slots[3] = { &k->fast, &k->exact, &k->mma };
    cp_status rc = cp_backend_cpu_create(&k->cpu, err);
    for (int i = 0; i < 3 && rc == CP_OK; i++) {
        if (vars[i][0]) setenv(vars[i][0], vars[i][1], 1);
        rc = self_test ? cp_backend_cpu_create(slots[i], err) : cp_backend_cuda_create(slots[i], err);
        if (vars[i][0]) unsetenv(vars[i][0]);
    }
    if (rc != CP_OK) {
        gpu_checks_close(k);
        return rc;
    }
    k->gpu = k->fast;
    k->act_bf16 = k->fast->matrix_dtype == CP_BF16;
    return CP_OK;
}

void gpu_checks_close(check *k)
{
    cp_backend_destroy(k->fast);
    cp_backend_destroy(k->exact);
    cp_backend_destroy(k->mma);
    cp_backend_destroy(k->cpu);
    k->fast = k->exact = k->mma = k->cpu = k->gpu = NULL;
}
