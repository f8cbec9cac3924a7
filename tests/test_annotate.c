/* The annotator: the banded summed-area table against direct sums, the DP
 * against brute force, sensitive tokens and sensitive attention, row-subset
 * input, and real attention from a trained model. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/annotate/annotate.h"
#include "../engine/annotate/sat.h"
#include "../kernels/cpu/ops_cpu.h"
#include "../tokenizer/tokenizer.h"
#include "helpers.h"

static uint64_t rng;
static double urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Attention-like rows (sum 1 over j <= i): a sink, blocks that attend
 * mostly inside themselves, noise elsewhere. */
static float *make_attention(int T, int block, uint64_t seed)
{
    rng = seed;
    float *A = calloc((size_t)T * T, sizeof *A);
    for (int i = 0; i < T; i++) {
        double sum = 0;
        int b0 = i / block * block;
        for (int j = 0; j <= i; j++) {
            double w = urand() * (j == 0 ? 3.0 : j >= b0 ? 2.0 + 4 * urand() : 0.6);
            A[(size_t)i * T + j] = (float)w;
            sum += w;
        }
        for (int j = 0; j <= i; j++) A[(size_t)i * T + j] = (float)(A[(size_t)i * T + j] / sum);
    }
    return A;
}

static double direct_square(const float *A, int T, int a, int b)
{
    double s = 0;
    for (int i = a; i <= b; i++)
        for (int j = a; j <= i; j++) s += A[(size_t)i * T + j];
    return s;
}

Test(annotate, banded_sat_equals_direct_sums)
{
    int T = 60;
    float *A = make_attention(T, 12, 1);
    cp_error err = { 0 };
    int bands[] = { 59, 60, 8 }; /* full, full, banded */
    for (int k = 0; k < 3; k++) {
        cp_sat t;
        int s = 5, e = 60;
        cr_assert_eq(cp_sat_build(&t, A, (size_t)T, s, e, bands[k], &err), CP_OK);
        for (int a = s; a < e; a++)
            for (int b = a; b < e && b - a < bands[k]; b++) {
                double d = direct_square(A, T, a, b), g = cp_sat_square(&t, a, b);
                cr_assert(fabs(d - g) < 1e-9, "band %d [%d, %d]: %g vs %g", bands[k], a, b, g, d);
            }
        for (int i = s; i < e; i++)
            for (int a = i - bands[k] + 1 > s ? i - bands[k] + 1 : s; a <= i; a++) {
                double d = 0;
                for (int j = a; j <= i; j++) d += A[(size_t)i * T + j];
                cr_assert(fabs(cp_sat_row_from(&t, i, a) - d) < 1e-9, "row %d from %d", i, a);
            }
        cp_sat_free(&t);
    }
    free(A);
}

/* validity computed the slow way, independent of the table */
static int slow_valid(const float *A, int T, const uint8_t *sens, const cp_annot_opts *o, int a, int b)
{
    double in = direct_square(A, T, a, b), ex = 0, se = 0;
    for (int i = a; i <= b; i++)
        for (int j = 0; j < a; j++) {
            if (j >= o->sink) ex += A[(size_t)i * T + j];
            if (sens && sens[j]) se += A[(size_t)i * T + j];
        }
    if (se > o->beta * (b - a + 1)) return 0;
    return in >= o->tau * ex;
}

/* every set of disjoint valid segments inside runs: the most tokens covered */
static int brute(const float *A, int T, const uint8_t *sens, const cp_annot_opts *o, int p, const uint8_t *ok)
{
    if (p >= T) return 0;
    int best = brute(A, T, sens, o, p + 1, ok);
    for (int q = p; q < T && ok[q]; q++) {
        int len = q - p + 1;
        if (len < o->min_len || len > o->max_len || !slow_valid(A, T, sens, o, p, q)) continue;
        int v = len + brute(A, T, sens, o, q + 1, ok);
        if (v > best) best = v;
    }
    return best;
}

Test(annotate, dp_equals_brute_force)
{
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.min_len = 3;
    o.max_len = 12;
    int nontrivial = 0;
    for (uint64_t seed = 1; seed <= 60; seed++) {
        int T = 14 + (int)(seed % 7);
        float *A = make_attention(T, 3 + (int)(seed % 4), seed * 7919);
        uint8_t sens[32] = { 0 }, ok[32];
        int with_sens = seed % 2;
        if (with_sens) sens[2 + seed % 9] = 1;
        o.tau = 0.5 + (double)(seed % 5) * 0.3;
        o.beta = seed % 3 ? 0.02 : 0.3;
        for (int i = 0; i < T; i++) ok[i] = !sens[i];
        cp_annot_input in = { A, (size_t)T, T, NULL, with_sens ? sens : NULL, NULL, NULL, NULL };
        cp_annot_result r;
        cp_error err = { 0 };
        cr_assert_eq(cp_annotate(&in, &o, &r, &err), CP_OK, "%s", err.msg);
        int want = brute(A, T, with_sens ? sens : NULL, &o, 0, ok);
        cr_assert_eq(r.tokens_covered, want, "seed %llu: DP covers %d, brute force %d", (unsigned long long)seed,
                     r.tokens_covered, want);
        for (size_t k = 0; k < r.n; k++) {
            const cp_annot_segment *g = &r.v[k];
            cr_assert(slow_valid(A, T, with_sens ? sens : NULL, &o, g->start, g->start + g->len - 1));
            for (int i = g->start; i < g->start + g->len; i++) cr_assert(!sens[i], "segment holds a sensitive token");
            if (k) cr_assert_geq(g->start, r.v[k - 1].start + r.v[k - 1].len);
            int flags = 0;
            for (int i = 0; i < g->len; i++) flags += g->recompute[i];
            int want_flags = o.k0 + (int)ceil(o.r * g->len);
            cr_assert_eq(flags, want_flags < g->len ? want_flags : g->len, "recompute count depends on length only");
            cr_assert(g->recompute[0] && g->recompute[1], "the first k0 tokens are recomputed");
        }
        nontrivial += want > 0 && want < T;
        cp_annot_result_free(&r);
        free(A);
    }
    cr_assert_gt(nontrivial, 10, "the random cases should exercise real choices");
}

Test(annotate, sensitive_attention_cuts_rows_and_row_subsets_agree)
{
    int T = 120;
    float *A = make_attention(T, 40, 5);
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.min_len = 8;
    cp_annot_input in = { A, (size_t)T, T, NULL, NULL, NULL, NULL, NULL };
    cp_annot_result full;
    cp_error err = { 0 };
    cr_assert_eq(cp_annotate(&in, &o, &full, &err), CP_OK);
    cr_assert_gt(full.n, 0);
    /* one row whose max-over-heads sensitive mass is high is never shared */
    float sm[120] = { 0 };
    int cutrow = full.v[0].start + full.v[0].len / 2;
    sm[cutrow] = 0.3f;
    in.sens_mass = sm;
    cp_annot_result cut;
    cr_assert_eq(cp_annotate(&in, &o, &cut, &err), CP_OK);
    cr_assert_eq(cut.rows_sens_attention, 1);
    cr_assert_eq(cut.cut[cutrow], CP_CUT_SENS_ATTENTION);
    for (size_t k = 0; k < cut.n; k++)
        cr_assert(cutrow < cut.v[k].start || cutrow >= cut.v[k].start + cut.v[k].len, "row %d was shared", cutrow);
    /* a reuse prefill: rows outside the fresh run were never computed */
    int fs = 40, fe = 80;
    uint8_t fresh[120] = { 0 };
    float *B = malloc((size_t)T * T * sizeof *B);
    for (size_t i = 0; i < (size_t)T * T; i++) B[i] = NAN;
    for (int i = fs; i < fe; i++) {
        fresh[i] = 1;
        memcpy(B + (size_t)i * T, A + (size_t)i * T, (size_t)T * sizeof *B);
    }
    cp_annot_input sub = { B, (size_t)T, T, fresh, NULL, NULL, NULL, NULL };
    uint8_t only[120] = { 0 };
    for (int i = fs; i < fe; i++) only[i] = 1;
    cp_annot_input ref = { A, (size_t)T, T, only, NULL, NULL, NULL, NULL };
    cp_annot_result rs, rr;
    cr_assert_eq(cp_annotate(&sub, &o, &rs, &err), CP_OK);
    cr_assert_eq(cp_annotate(&ref, &o, &rr, &err), CP_OK);
    cr_assert_eq(rs.n, rr.n);
    cr_assert_gt(rs.n, 0);
    for (size_t k = 0; k < rs.n; k++) {
        cr_assert(rs.v[k].start == rr.v[k].start && rs.v[k].len == rr.v[k].len);
        cr_assert(memcmp(rs.v[k].recompute, rr.v[k].recompute, (size_t)rs.v[k].len) == 0);
    }
    cp_annot_result_free(&full), cp_annot_result_free(&cut), cp_annot_result_free(&rs), cp_annot_result_free(&rr);
    free(A), free(B);
}

/* The attention op's sensitive mass is a max over heads: one head that
 * copies a sensitive column shows, even when the head average is small. */
Test(annotate, one_head_copying_a_secret_shows_in_the_max)
{
    enum { H = 8, D = 4, N = 6 };
    float q[N * H * D], k[N * D], v[N * D], out[N * H * D], ex[N * N] = { 0 }, sm[N] = { 0 };
    int32_t pos[N] = { 0, 1, 2, 3, 4, 5 };
    uint8_t sens[N] = { 0, 0, 1, 0, 0, 0 };
    memset(q, 0, sizeof q);
    for (int t = 0; t < N; t++)
        for (int d = 0; d < D; d++) k[t * D + d] = t == 2 ? 1.0f : 0.0f, v[t * D + d] = (float)t;
    /* in row 5, head 3 looks hard at token 2; all other heads are flat */
    for (int d = 0; d < D; d++) q[(5 * H + 3) * D + d] = 20.0f;
    cp_attn_args a = { .q = q, .k = k, .v = v, .q_pos = pos, .k_pos = pos, .out = out, .n = N, .n_keys = N, .n_heads = H,
                       .n_kv_heads = 1, .head_dim = D, .export_a = ex, .export_ld = N, .export_weight = 1.0f / H,
                       .sens_cols = sens, .sens_mass = sm };
    float *scratch = malloc(cpu_attention_scratch_floats(&a) * sizeof(float));
    cpu_attention(&a, scratch);
    free(scratch);
    cr_assert_gt(sm[5], 0.99f, "max over heads: %g", sm[5]);
    cr_assert_lt(ex[5 * N + 2], 0.3f, "the head average is diluted: %g", ex[5 * N + 2]);
    cr_assert_gt(ex[5 * N + 2], 0.1f);
    cr_assert(fabsf(sm[3] - 1.0f / 4) < 1e-5f, "a flat row of 4 keys puts 1/4 on the secret: %g", sm[3]);
}

/* Real trained attention: cp-books-6m on a held-out passage with a name in
 * it.  Some runs are shared, some are cut. */
Test(annotate, real_model_text)
{
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    cp_backend *be;
    cp_model *m = load_model_or_die(dir, &be);
    cp_tokenizer *tok = open_tokenizer_or_die("models/cp-books-6m");
    char path[512];
    size_t len;
    char *book = read_text(shared_path(path, sizeof path, "data/gutenberg/pg174_picture_of_dorian_gray.txt"), &len);
    cr_assert(book);
    /* a passage from the middle, on a line boundary */
    char *p = strchr(book + len / 2, '\n');
    cr_assert(p);
    while (*p == '\n' || *p == '\r') p++;
    size_t n = 2000;
    while (((unsigned char)p[n] & 0xc0) == 0x80) n--;
    cp_error err = { 0 };
    cp_encoding e = { 0 };
    cr_assert_eq(cp_tokenize(tok, p, n, CP_TOK_ADD_SPECIAL, &e, &err), CP_OK, "%s", err.msg);
    int T = (int)(e.n > 500 ? 500 : e.n);
    uint8_t *sens = calloc((size_t)T, 1);
    for (int i = T / 2; i < T / 2 + 3; i++) sens[i] = 1; /* a planted secret */
    float *A = calloc((size_t)T * T, sizeof *A), *sm = calloc((size_t)T, sizeof *sm);
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, T, 256, &s, &err), CP_OK);
    cp_export ex = { .a = A, .ld = T, .sensitive = sens, .sens_mass = sm };
    cr_assert_eq(cp_forward(m, s, e.ids, NULL, T, CP_LOGITS_NONE, NULL, &ex, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < T; i++) {
        double tot = 0;
        for (int j = 0; j <= i; j++) tot += A[(size_t)i * T + j];
        cr_assert(fabs(tot - 1) < 1e-3, "row %d sums to %g", i, tot);
    }
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    cp_annot_input in = { A, (size_t)T, T, NULL, sens, sm, NULL, NULL };
    cp_annot_result r;
    cr_assert_eq(cp_annotate(&in, &o, &r, &err), CP_OK, "%s", err.msg);
    cr_log_info("cp-books-6m, %d tokens: %zu segments cover %d tokens (%d to recompute); %d runs; %d rows cut by "
                "sensitive attention; candidates rejected: %ld by tau, %ld by beta",
                T, r.n, r.tokens_covered, r.tokens_recompute, r.runs, r.rows_sens_attention, r.rejected_tau, r.rejected_beta);
    cr_assert_gt(r.n, 0, "nothing shared on real text");
    cr_assert_lt(r.tokens_covered, T - 3, "everything shared: the tests are not discriminating");
    for (size_t k = 0; k < r.n; k++)
        for (int i = r.v[k].start; i < r.v[k].start + r.v[k].len; i++) cr_assert(!sens[i]);
    cp_annot_result_free(&r);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
    cp_tokenizer_free(tok);
    cp_encoding_free(&e);
    free(book), free(sens), free(A), free(sm);
}

/* The export of only the rows asked for (cp_export.want, what a reuse
 * prefill passes: its fresh tokens): those rows and their sensitive mass
 * what the full export gives them (to rounding), every other row zero, and
 * the annotator, which cuts runs at every token not fresh, finds exactly
 * the same segments over either. */
Test(annotate, an_export_of_the_wanted_rows_is_the_full_export_there, .timeout = TEST_TIMEOUT(60))
{
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    cp_backend *be;
    cp_model *m = load_model_or_die(dir, &be);
    enum { T = 300 };
    int32_t ids[T];
    uint8_t sens[T] = { 0 }, want[T];
    for (int i = 0; i < T; i++) ids[i] = 5 + (i * 37 + i / 7) % 3000, want[i] = (i / 40) % 2 == 0 || i == 61 || i == 299;
    for (int i = 150; i < 153; i++) sens[i] = 1;
    float *A0 = calloc((size_t)T * T, sizeof *A0), *A1 = calloc((size_t)T * T, sizeof *A1);
    float *sm0 = calloc(T, sizeof *sm0), *sm1 = calloc(T, sizeof *sm1);
    cr_assert(A0 && A1 && sm0 && sm1);
    cp_error err = { 0 };
    for (int pass = 0; pass < 2; pass++) {
        cp_state *s = NULL;
        cr_assert_eq(cp_state_create(m, T, 256, &s, &err), CP_OK, "%s", err.msg);
        cp_export ex = { .a = pass ? A1 : A0, .ld = T, .sensitive = sens, .sens_mass = pass ? sm1 : sm0, .want = pass ? want : NULL };
        cr_assert_eq(cp_forward(m, s, ids, NULL, T, CP_LOGITS_NONE, NULL, &ex, &err), CP_OK, "%s", err.msg);
        cp_state_free(m, s);
    }
    int wanted = 0;
    double worst = 0;
    for (int i = 0; i < T; i++) {
        if (want[i]) {
            wanted++;
            for (int j = 0; j < T; j++) worst = fmax(worst, fabs((double)A1[(size_t)i * T + j] - A0[(size_t)i * T + j]));
            worst = fmax(worst, fabs((double)sm1[i] - sm0[i]));
        } else if (be->flags & CP_BE_ATTN_EXPORT_ONLY) {
            for (int j = 0; j < T; j++) cr_assert_eq(A1[(size_t)i * T + j], 0.0f, "row %d is not wanted but was exported", i);
            cr_assert_eq(sm1[i], 0.0f, "row %d is not wanted but has a mass", i);
        }
    }
    cr_assert(wanted > 100 && wanted < T - 100, "the mask leaves rows on both sides: %d", wanted);
    /* the scores' products run over the wanted rows' own blocks, which a
     * library may block differently (oneDNN: by the call's row count):
     * equal to rounding, far below what moves a cut (tau, beta: 1e-2) */
    cr_log_info("wanted rows: largest difference from the full export %.3g", worst);
    cr_assert_lt(worst, 1e-5, "wanted rows differ from the full export by %g", worst);
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    cp_annot_input in0 = { A0, (size_t)T, T, want, sens, sm0, NULL, NULL }, in1 = { A1, (size_t)T, T, want, sens, sm1, NULL, NULL };
    cp_annot_result r0, r1;
    cr_assert_eq(cp_annotate(&in0, &o, &r0, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_annotate(&in1, &o, &r1, &err), CP_OK, "%s", err.msg);
    cr_assert_gt(r0.n, 0, "no segment: the comparison below is empty");
    cr_assert_eq(r1.n, r0.n);
    for (size_t k = 0; k < r0.n; k++) {
        const cp_annot_segment *a = &r0.v[k], *b = &r1.v[k];
        cr_assert(a->start == b->start && a->len == b->len && memcmp(a->recompute, b->recompute, (size_t)a->len) == 0,
                  "segment %zu differs: [%d, +%d) against [%d, +%d)", k, b->start, b->len, a->start, a->len);
        cr_assert(fabs(a->internal - b->internal) < 1e-4 && fabs(a->external - b->external) < 1e-4 &&
                      fabs(a->sensitive - b->sensitive) < 1e-4,
                  "segment %zu's masses differ: %g %g %g against %g %g %g", k, b->internal, b->external, b->sensitive, a->internal,
                  a->external, a->sensitive);
    }
    cp_annot_result_free(&r0), cp_annot_result_free(&r1);
    free(A0), free(A1), free(sm0), free(sm1);
    cp_model_free(m);
    cp_backend_destroy(be);
}

/* The annotator with its O(T^2) part elsewhere (kernels/annot_dev.h, what
 * the device implements): the host reference gives exactly the segments,
 * flags, masses and rejection counts of the built-in path, and a device
 * that fails fails the annotation with its message. */
static cp_status failing_run(void *ctx, int s, int e, const cp_annot_params *p, double *tot, double *sink_mass, double *sens_mass,
                             uint8_t *codes, cp_error *err)
{
    (void)ctx, (void)p, (void)tot, (void)sink_mass, (void)sens_mass, (void)codes;
    return cp_fail(err, CP_EDEVICE, "test device: run [%d, %d) failed", s, e);
}

Test(annotate, the_device_interface_chooses_the_same_segments)
{
    int T = 200;
    float *A = make_attention(T, 40, 9);
    uint8_t sens[200] = { 0 };
    sens[97] = sens[151] = 1; /* three runs; rows after a secret attend to it a little */
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.min_len = 8, o.max_len = 48, o.beta = 0.004;
    cp_annot_input in = { A, (size_t)T, T, NULL, sens, NULL, NULL, NULL };
    cp_annot_result want, got;
    cp_error err = { 0 };
    cr_assert_eq(cp_annotate(&in, &o, &want, &err), CP_OK);
    cp_annot_dev dev;
    cr_assert_eq(cp_annot_dev_host(A, (size_t)T, T, sens, &dev, &err), CP_OK, "%s", err.msg);
    cp_annot_input elsewhere = in;
    elsewhere.A = NULL; /* never read when the device holds the matrix */
    elsewhere.dev = &dev;
    cr_assert_eq(cp_annotate(&elsewhere, &o, &got, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(got.n, want.n);
    cr_assert_gt(want.n, 0, "no segment (tau rejected %ld, beta %ld)", want.rejected_tau, want.rejected_beta);
    for (size_t k = 0; k < got.n; k++) {
        cr_assert(got.v[k].start == want.v[k].start && got.v[k].len == want.v[k].len, "segment %zu differs", k);
        cr_assert(memcmp(got.v[k].recompute, want.v[k].recompute, (size_t)got.v[k].len) == 0);
        cr_assert(fabs(got.v[k].internal - want.v[k].internal) <= 1e-12 * (1 + want.v[k].internal));
        cr_assert(fabs(got.v[k].external - want.v[k].external) <= 1e-12 * (1 + want.v[k].external));
        cr_assert(fabs(got.v[k].sensitive - want.v[k].sensitive) <= 1e-12);
    }
    cr_assert_eq(got.rejected_tau, want.rejected_tau);
    cr_assert_eq(got.rejected_beta, want.rejected_beta);
    cr_assert(want.rejected_tau > 0 && want.rejected_beta > 0, "tau %ld beta %ld", want.rejected_tau, want.rejected_beta);
    cp_annot_dev broken = dev;
    broken.run = failing_run;
    elsewhere.dev = &broken;
    cp_annot_result none;
    cr_assert_eq(cp_annotate(&elsewhere, &o, &none, &err), CP_EDEVICE);
    cr_assert(strstr(err.msg, "test device"), "%s", err.msg);
    cp_annot_dev_host_free(&dev);
    cp_annot_result_free(&want), cp_annot_result_free(&got);
    free(A);
}

/* Recompute flags: the first k0 tokens of a segment, then the tokens whose
 * rows put the largest share of their attention before the segment (they
 * lose the most context when the segment is reused elsewhere).  Tokens 0-9
 * are reused (not part of any run), so the run and the one segment (tau 0)
 * is [10, 40); rows 20, 25 and 33 put 0.6, 0.5 and 0.4 of their mass on
 * token 5, every other row 0.05: with k0 2 and r 0.1 (ceil(0.1 * 30) = 3)
 * the flags are exactly 10, 11, 20, 25 and 33. */
Test(annotate, recompute_flags_take_the_largest_external_shares)
{
    enum { T = 40 };
    float A[T * T] = { 0 };
    for (int i = 10; i < T; i++) {
        double ext = i == 20 ? 0.6 : i == 25 ? 0.5 : i == 33 ? 0.4 : 0.05, sink = 0.1, inside = 1 - ext - sink;
        A[i * T + 0] = (float)sink;
        A[i * T + 5] = (float)ext;
        for (int j = 10; j <= i; j++) A[i * T + j] = (float)(inside / (i - 9));
    }
    uint8_t fresh[T];
    for (int i = 0; i < T; i++) fresh[i] = i >= 10;
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.min_len = 30, o.tau = 0, o.k0 = 2, o.r = 0.1; /* one segment: the whole run */
    cp_annot_input in = { A, T, T, fresh, NULL, NULL, NULL, NULL };
    cp_annot_result r;
    cp_error err = { 0 };
    cr_assert_eq(cp_annotate(&in, &o, &r, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(r.n, 1);
    cr_assert(r.v[0].start == 10 && r.v[0].len == 30, "segment [%d, +%d)", r.v[0].start, r.v[0].len);
    for (int k = 0; k < 30; k++) {
        int t = 10 + k, want = t == 10 || t == 11 || t == 20 || t == 25 || t == 33;
        cr_assert_eq(r.v[0].recompute[k], want, "token %d: flag %d, want %d", t, r.v[0].recompute[k], want);
    }
    cr_assert_eq(r.tokens_recompute, 5);
    cp_annot_result_free(&r);
}

/* Runs end where a group (a message) ends: with every segment valid (tau
 * 0), no segment holds tokens of two groups. */
Test(annotate, segments_never_span_two_groups)
{
    int T = 64;
    float *A = make_attention(T, 16, 3);
    int32_t group[64];
    for (int i = 0; i < T; i++) group[i] = i < 27 ? 0 : 1;
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.min_len = 8, o.tau = 0;
    cp_annot_input in = { A, (size_t)T, T, NULL, NULL, NULL, group, NULL };
    cp_annot_result r;
    cp_error err = { 0 };
    cr_assert_eq(cp_annotate(&in, &o, &r, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(r.runs, 2, "one run per group");
    cr_assert_eq(r.tokens_covered, T, "tau 0: every token of both runs is covered");
    for (size_t k = 0; k < r.n; k++)
        cr_assert_eq(group[r.v[k].start], group[r.v[k].start + r.v[k].len - 1], "segment [%d, +%d) spans two groups", r.v[k].start,
                     r.v[k].len);
    cp_annot_result_free(&r);
    free(A);
}

/* ---- the band of the export (what the request path keeps) ---------------- */

/* What the forward pass hands a caller of cp_export.rows: rows a test
 * "reuses" (keep = 0) never reach the band, as rows the prefill does not
 * compute never do; the dense copy gets the rows that do. */
typedef struct band_feed {
    cp_annot_band *band;  /* fed a row a call */
    cp_annot_band *whole; /* fed each call's kept rows in one call (the rows summed in groups) */
    const cp_annot_input *in;
    const uint8_t *keep;
    float *dense; /* T x T, the rows given */
    int T;
} band_feed;

static cp_status feed_rows(void *ctx, const float *rows, size_t ld, const int32_t *slots, int n, cp_error *err)
{
    band_feed *f = ctx;
    float *kept = malloc((size_t)n * ld * sizeof *kept);
    int32_t *at = malloc((size_t)n * sizeof *at);
    cr_assert(kept && at);
    int nk = 0;
    cp_status rc = CP_OK;
    for (int k = 0; k < n && rc == CP_OK; k++) {
        if (!f->keep[slots[k]]) continue;
        memcpy(f->dense + (size_t)slots[k] * f->T, rows + (size_t)k * ld, (size_t)(slots[k] + 1) * sizeof(float));
        memcpy(kept + (size_t)nk * ld, rows + (size_t)k * ld, ld * sizeof *kept);
        at[nk++] = slots[k];
        rc = cp_annot_band_add(f->band, f->in, rows + (size_t)k * ld, ld, &slots[k], 1, err);
    }
    if (rc == CP_OK) rc = cp_annot_band_add(f->whole, f->in, kept, ld, at, nk, err);
    free(kept), free(at);
    return rc;
}

static void assert_same_result(const cp_annot_result *got, const cp_annot_result *want, int T, const char *what)
{
    cr_assert_eq(got->n, want->n, "%s: %zu segments from the band, %zu from the dense matrix", what, got->n, want->n);
    for (size_t k = 0; k < got->n; k++) {
        const cp_annot_segment *g = &got->v[k], *w = &want->v[k];
        cr_assert(g->start == w->start && g->len == w->len, "%s: segment %zu is [%d, +%d), dense [%d, +%d)", what, k, g->start,
                  g->len, w->start, w->len);
        cr_assert(memcmp(g->recompute, w->recompute, (size_t)g->len) == 0, "%s: segment %zu's flags differ", what, k);
        /* bit for bit: the band keeps the dense path's order of summation */
        cr_assert(memcmp(&g->internal, &w->internal, sizeof g->internal) == 0, "%s: internal %.17g vs %.17g", what, g->internal,
                  w->internal);
        cr_assert(memcmp(&g->external, &w->external, sizeof g->external) == 0, "%s: external %.17g vs %.17g", what, g->external,
                  w->external);
        cr_assert(memcmp(&g->sensitive, &w->sensitive, sizeof g->sensitive) == 0, "%s: sensitive mass differs", what);
    }
    cr_assert(got->runs == want->runs && got->rejected_tau == want->rejected_tau && got->rejected_beta == want->rejected_beta,
              "%s: runs %d/%d, rejected by tau %ld/%ld, by beta %ld/%ld", what, got->runs, want->runs, got->rejected_tau,
              want->rejected_tau, got->rejected_beta, want->rejected_beta);
    cr_assert(got->tokens_covered == want->tokens_covered && got->tokens_recompute == want->tokens_recompute);
    cr_assert(memcmp(got->cut, want->cut, (size_t)T) == 0, "%s: cut reasons differ", what);
}

/* cp-books-6m's real attention on a passage, two messages, a planted
 * secret and a reused stretch: the annotator over the band the forward
 * pass's rows() left gives the very segments, flags, masses and counts it
 * gives over the dense export — for a band wider than every run (the
 * default max_len) and for narrow ones where a run's rows reach left of
 * their band (the left sums matter), and with min_len = max_len so every
 * chosen segment reaches the band's edge. */
Test(annotate, the_band_gives_what_the_dense_export_gives, .timeout = TEST_TIMEOUT(60))
{
    char dir[512], path[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    cp_backend *be;
    cp_model *m = load_model_or_die(dir, &be);
    cp_tokenizer *tok = open_tokenizer_or_die("models/cp-books-6m");
    size_t len;
    char *book = read_text(shared_path(path, sizeof path, "data/gutenberg/pg174_picture_of_dorian_gray.txt"), &len);
    cr_assert(book);
    char *p = strchr(book + len / 3, '\n');
    cr_assert(p);
    while (*p == '\n' || *p == '\r') p++;
    size_t n = 3400;
    while (((unsigned char)p[n] & 0xc0) == 0x80) n--;
    cp_error err = { 0 };
    cp_encoding e = { 0 };
    cr_assert_eq(cp_tokenize(tok, p, n, CP_TOK_ADD_SPECIAL, &e, &err), CP_OK, "%s", err.msg);
    /* 560 rows: a band of 1.25 MB, which is pages of its own rather than
     * heap (annotate.c, BAND_MAP_BYTES) */
    int T = (int)(e.n > 560 ? 560 : e.n);
    cr_assert_gt(T, 540);
    uint8_t *sens = calloc((size_t)T, 1), *fresh = malloc((size_t)T);
    int32_t *group = malloc((size_t)T * sizeof *group);
    for (int i = 0; i < T; i++) {
        fresh[i] = !(i >= 90 && i < 120); /* reused: never computed, never given */
        group[i] = i < 300 ? 0 : 1;
        sens[i] = i >= 200 && i < 203; /* a planted secret */
    }
    float *dense = calloc((size_t)T * T, sizeof *dense), *ref = calloc((size_t)T * T, sizeof *ref);
    float *sm = calloc((size_t)T, sizeof *sm), *sm_ref = calloc((size_t)T, sizeof *sm_ref);
    cr_assert(sens && fresh && group && dense && ref && sm && sm_ref);
    /* the reference: the dense export, reused rows zeroed as the request path's calloc leaves them */
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, T, 128, &s, &err), CP_OK); /* chunks of 128: rows() runs several times */
    cp_export dex = { .a = ref, .ld = T, .sensitive = sens, .sens_mass = sm_ref };
    cr_assert_eq(cp_forward(m, s, e.ids, NULL, T, CP_LOGITS_NONE, NULL, &dex, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < T; i++)
        if (!fresh[i]) memset(ref + (size_t)i * T, 0, (size_t)T * sizeof *ref);

    struct { int min_len, max_len; double tau, row_limit; } cases[] = {
        { 32, 2048, 1.0, 0.05 }, { 8, 40, 0.3, 0.05 }, { 4, 17, 0.05, 0.5 }, { 16, 64, 0.6, 0.5 },
        { 12, 12, 0.2, 0.5 }, /* every segment max_len long: its first column is the band's last needed one */
    };
    /* `band` draws its cells from the ones the case before it left (an
     * engine's kept cells), the first case's band the widest */
    cp_annot_cells home = { 0 };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cp_annot_opts o;
        cp_annot_opts_default(&o);
        o.min_len = cases[c].min_len, o.max_len = cases[c].max_len, o.tau = cases[c].tau, o.row_limit = cases[c].row_limit;
        cp_annot_input in = { NULL, (size_t)T, T, fresh, sens, sm, group, NULL };
        cp_annot_band band, whole;
        cr_assert_eq(cp_annot_band_init_kept(&band, T, &o, &home, &err), CP_OK, "%s", err.msg);
        if (c > 0) cr_assert(!home.v, "case %zu: the band took the kept cells", c);
        cr_assert_eq(cp_annot_band_init(&whole, T, &o, &err), CP_OK, "%s", err.msg);
        memset(dense, 0, (size_t)T * T * sizeof *dense);
        band_feed f = { &band, &whole, &in, fresh, dense, T };
        cp_export bex = { .sensitive = sens, .sens_mass = sm, .rows = feed_rows, .rows_ctx = &f };
        cr_assert_eq(cp_state_reset(m, s, &err), CP_OK);
        cr_assert_eq(cp_forward(m, s, e.ids, NULL, T, CP_LOGITS_NONE, NULL, &bex, &err), CP_OK, "%s", err.msg);
        cr_assert(memcmp(dense, ref, (size_t)T * T * sizeof *ref) == 0, "rows() hands over the dense export's rows");
        cr_assert(memcmp(sm, sm_ref, (size_t)T * sizeof *sm) == 0, "and its sensitive mass, before rows()");
        cp_annot_input din = in;
        din.A = ref;
        cp_annot_result want, got;
        cr_assert_eq(cp_annotate(&din, &o, &want, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(cp_annotate_band(&in, &band, &o, &got, &err), CP_OK, "%s", err.msg);
        char what[96];
        snprintf(what, sizeof what, "min_len %d max_len %d tau %g row_limit %g", o.min_len, o.max_len, o.tau, o.row_limit);
        int at_edge = 0;
        for (size_t k = 0; k < want.n; k++) at_edge += want.v[k].len == o.max_len;
        cr_log_info("%s: %zu segments (%d of max_len) cover %d tokens; %d runs; rejected %ld by tau, %ld by beta", what, want.n,
                    at_edge, want.tokens_covered, want.runs, want.rejected_tau, want.rejected_beta);
        cr_assert_gt(want.n, 0, "%s: nothing shared: the comparison is empty", what);
        cr_assert_gt(want.rows_sensitive + want.rows_reused, 0);
        assert_same_result(&got, &want, T, what);
        cp_annot_result_free(&got);
        cr_assert_eq(cp_annotate_band(&in, &whole, &o, &got, &err), CP_OK, "%s", err.msg);
        strncat(what, ", rows a chunk a call", sizeof what - strlen(what) - 1);
        assert_same_result(&got, &want, T, what);
        if (o.min_len == o.max_len) cr_assert_gt(at_edge, 0, "%s: no segment of max_len tokens", what);
        /* a band cut for other options is refused, not misread */
        cp_annot_opts other = o;
        other.max_len = o.max_len + 1;
        cp_annot_result none;
        cr_assert_eq(cp_annotate_band(&in, &band, &other, &none, &err), CP_EINVAL);
        cp_annot_result_free(&want), cp_annot_result_free(&got);
        cp_annot_band_free(&band), cp_annot_band_free(&whole);
        /* kept cells are all zeros: the next request's band reads no value of this one's */
        cr_assert(home.v && home.floats >= (size_t)T * T, "case %zu: the widest cells are kept", c);
        size_t stale = 0;
        for (size_t k = 0; k < home.floats; k++) stale += home.v[k] != 0;
        cr_assert_eq(stale, 0, "case %zu: %zu cells of the band kept their values", c, stale);
    }
    cp_annot_cells_free(&home);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
    cp_tokenizer_free(tok);
    cp_encoding_free(&e);
    free(book), free(sens), free(fresh), free(group), free(dense), free(ref), free(sm), free(sm_ref);
}

/* Rows out of order, or past the band, are refused with a message. */
Test(annotate, the_band_refuses_rows_out_of_order)
{
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.max_len = 4;
    cp_annot_band b;
    cp_error err = { 0 };
    cr_assert_eq(cp_annot_band_init(&b, 8, &o, &err), CP_OK);
    float row[8] = { 0.5f, 0.5f };
    int32_t at[2] = { 3, 2 };
    cp_annot_input in = { NULL, 8, 8, NULL, NULL, NULL, NULL, NULL };
    cr_assert_eq(cp_annot_band_add(&b, &in, row, 8, at, 2, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "band row 2"), "%s", err.msg);
    int32_t past = 8;
    cr_assert_eq(cp_annot_band_add(&b, &in, row, 8, &past, 1, &err), CP_EINVAL);
    cp_annot_band_free(&b);
}

/* A fresh row that never reached the band (an export lost on the way) is
 * refused, not read as a row with no attention, which would pass the
 * sensitive-attention budget; reused rows are zero rows by design, and
 * the same band with every fresh row given annotates. */
Test(annotate, a_fresh_row_missing_from_the_band_is_refused)
{
    enum { T = 8 };
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.min_len = 2, o.max_len = 4;
    uint8_t fresh[T] = { 1, 1, 1, 0, 0, 1, 1, 1 };
    float rows[T][T] = { { 0 } };
    for (int i = 0; i < T; i++)
        for (int j = 0; j <= i; j++) rows[i][j] = 1.0f / (float)(i + 1);
    cp_annot_input in = { NULL, T, T, fresh, NULL, NULL, NULL, NULL };
    cp_error err = { 0 };
    cp_annot_result r;
    for (int lose = 0; lose < 2; lose++) {
        cp_annot_band b;
        cr_assert_eq(cp_annot_band_init(&b, T, &o, &err), CP_OK);
        for (int32_t i = 0; i < T; i++)
            if (fresh[i] && !(lose && i == 6)) cr_assert_eq(cp_annot_band_add(&b, &in, rows[i], T, &i, 1, &err), CP_OK, "%s", err.msg);
        if (lose) {
            cr_assert_eq(cp_annotate_band(&in, &b, &o, &r, &err), CP_EINVAL);
            cr_assert(strstr(err.msg, "fresh row 6"), "%s", err.msg);
        } else {
            cr_assert_eq(cp_annotate_band(&in, &b, &o, &r, &err), CP_OK, "%s", err.msg);
            cp_annot_result_free(&r);
        }
        cp_annot_band_free(&b);
    }
}

/* A band's rows are no wider than the prompt: a 300-token prompt's band
 * holds 300 columns a row (row i's columns reach back to 0 at most), not
 * max_len + 1 (2049 by default: 6.6x the memory zeroed per request); a
 * prompt past max_len keeps max_len + 1. */
Test(annotate, a_short_prompts_band_is_as_wide_as_the_prompt)
{
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    cp_error err = { 0 };
    const int Ts[] = { 1, 300, 2049, 5000 };
    const size_t want[] = { 1, 300, 2049, 2049 };
    for (size_t k = 0; k < 4; k++) {
        cp_annot_band b;
        cr_assert_eq(cp_annot_band_init(&b, Ts[k], &o, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(b.ld, want[k], "T %d: rows of %zu floats, not %zu", Ts[k], b.ld, want[k]);
        cp_annot_band_free(&b);
    }
}

/* A run over the whole prompt (every token fresh and in one group: a
 * prompt of empty messages is all template markup) reads its band back to
 * token 0: T rows of T columns.  The band gives what the dense export
 * gives, where a table one column too wide for the band was refused. */
Test(annotate, a_run_over_the_whole_prompt_reads_its_band)
{
    enum { T = 48 };
    static float A[T * T];
    uint32_t seed = 7;
    for (int i = 0; i < T; i++) { /* causal rows summing to 1, mass near the diagonal */
        double sum = 0;
        for (int j = 0; j <= i; j++) {
            seed = seed * 1664525u + 1013904223u;
            A[i * T + j] = (float)(1.0 / (1 + i - j) + (seed >> 8) / 16777216.0 * 0.1);
            sum += A[i * T + j];
        }
        for (int j = 0; j <= i; j++) A[i * T + j] = (float)(A[i * T + j] / sum);
    }
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    o.min_len = 4, o.tau = 1.0;
    cp_annot_input in = { A, T, T, NULL, NULL, NULL, NULL, NULL };
    cp_annot_band band;
    cp_error err = { 0 };
    cr_assert_eq(cp_annot_band_init(&band, T, &o, &err), CP_OK, "%s", err.msg);
    int32_t at[T];
    for (int i = 0; i < T; i++) at[i] = i;
    cr_assert_eq(cp_annot_band_add(&band, &in, A, T, at, T, &err), CP_OK, "%s", err.msg);
    cp_annot_result want, got;
    cr_assert_eq(cp_annotate(&in, &o, &want, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_annotate_band(&in, &band, &o, &got, &err), CP_OK, "the band of a whole-prompt run: %s", err.msg);
    cr_assert_eq(want.runs, 1, "one run over the prompt");
    cr_assert_gt(want.n, 0, "nothing segmented: the comparison is empty");
    assert_same_result(&got, &want, T, "a run over the whole prompt");
    cp_annot_result_free(&want), cp_annot_result_free(&got);
    cp_annot_band_free(&band);
}
