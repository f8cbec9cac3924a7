/* The batched attention entry (kernels/backend.h, attention_batch): a
 * step's calls, each with its own cache, positions, window, export and
 * sensitive columns, give bit for bit what one attention() call each
 * gives — decode rows (the CPU's one parallel region over every
 * sequence's (row, KV head) pairs), a prefill chunk, an exporting call,
 * a 16-row call that oneDNN takes on the int8 path, rows that see no key.
 * Every sequence's data differs, so a row that read another sequence's
 * cache, positions or window, or an export written into another's
 * matrix, shows as a differing bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops_cpu.h"
#include "helpers.h"

static uint32_t rng = 9001;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return ((float)(rng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

enum { H = 14, KV = 2, HD = 64, QD = H * HD, KD = KV * HD }; /* the 0.5B shape's heads */

/* one sequence of the step: n queries at positions q0.., nk keys at
 * positions kpos(j), window w, an export and sensitive mass or not */
typedef struct spec {
    int n, nk, window, q0, k_stride, export, sens;
} spec;

typedef struct seq {
    float *q, *k, *v;
    uint16_t *k16, *v16;
    int32_t *qp, *kp;
    uint8_t *cols;
    float *out[2], *ex[2], *mass[2]; /* [0] lone calls, [1] the batched one */
} seq;

static void seq_make(seq *s, const spec *p)
{
    const size_t qn = (size_t)p->n * QD, kn = (size_t)p->nk * KD, en = (size_t)p->n * p->nk;
    s->q = malloc(qn * 4), s->k = malloc(kn * 4), s->v = malloc(kn * 4), s->k16 = malloc(kn * 2), s->v16 = malloc(kn * 2);
    s->qp = malloc((size_t)p->n * 4), s->kp = malloc((size_t)p->nk * 4), s->cols = malloc((size_t)p->nk);
    cr_assert(s->q && s->k && s->v && s->k16 && s->v16 && s->qp && s->kp && s->cols);
    for (int r = 0; r < 2; r++) {
        s->out[r] = malloc(qn * 4), s->ex[r] = calloc(en, 4), s->mass[r] = calloc((size_t)p->n, 4);
        cr_assert(s->out[r] && s->ex[r] && s->mass[r]);
        for (size_t i = 0; i < qn; i++) s->out[r][i] = NAN; /* every element must be written */
    }
    for (int i = 0; i < p->n; i++) s->qp[i] = p->q0 + i;
    /* a stride coprime to nk permutes the positions over the slots (a
     * reuse placement's order); offset so some sequences' keys start late */
    for (int j = 0; j < p->nk; j++) s->kp[j] = (int32_t)(((long)j * p->k_stride) % p->nk) + (p->q0 < 0 ? -p->q0 : 0);
    if (p->q0 < 0)
        for (int i = 0; i < p->n; i++) s->qp[i] = i; /* before every key: nothing visible */
    for (size_t i = 0; i < qn; i++) s->q[i] = 2 * rnd();
    for (size_t i = 0; i < kn; i++) {
        s->k16[i] = cp_f32_to_bf16(rnd()), s->v16[i] = cp_f32_to_bf16(rnd());
        s->k[i] = cp_bf16_to_f32(s->k16[i]), s->v[i] = cp_bf16_to_f32(s->v16[i]);
    }
    for (int j = 0; j < p->nk; j++) s->cols[j] = (uint8_t)(j % 3 == 1);
}

static void seq_free(seq *s)
{
    free(s->q), free(s->k), free(s->v), free(s->k16), free(s->v16), free(s->qp), free(s->kp), free(s->cols);
    for (int r = 0; r < 2; r++) free(s->out[r]), free(s->ex[r]), free(s->mass[r]);
}

/* sequence s's call writing into its copy r, over the f32 or bf16 cache */
static cp_attn_args seq_args(const seq *s, const spec *p, int r, int bf16)
{
    cp_attn_args a = { .q = s->q, .q_pos = s->qp, .k_pos = s->kp, .out = s->out[r], .n = p->n, .n_keys = p->nk, .n_heads = H,
                       .n_kv_heads = KV, .head_dim = HD, .window = p->window };
    if (bf16) a.k16 = s->k16, a.v16 = s->v16;
    else a.k = s->k, a.v = s->v;
    if (p->export) a.export_a = s->ex[r], a.export_ld = p->nk, a.export_weight = 1.0f / H;
    if (p->sens) a.sens_cols = s->cols, a.sens_mass = s->mass[r];
    return a;
}

static const spec step[] = {
    { 1, 300, 0, 299, 7, 0, 0 },  /* a long decode row: the step's pairs run threaded */
    { 1, 37, 8, 36, 5, 0, 0 },    /* a window over permuted slots */
    { 3, 90, 0, 40, 1, 0, 0 },    /* rows among later keys (masked causally) */
    { 1, 50, 0, 49, 3, 1, 1 },    /* exporting, with sensitive mass: the general path */
    { 20, 64, 16, 44, 1, 0, 0 },  /* a prefill chunk past the decode kernel's rows */
    { 16, 33, 0, 17, 1, 0, 0 },   /* 16 rows: the decode kernel, or oneDNN on the int8 path */
    { 1, 1, 0, 0, 1, 0, 0 },      /* one key */
    { 2, 20, 0, -10, 1, 0, 0 },   /* no key visible: zeros */
    { 1, 129, 4, 128, 2, 0, 1 },  /* sensitive mass without an export, windowed */
};
#define N_SEQ ((int)(sizeof step / sizeof step[0]))

/* the step through attention_batch against one attention() each, bitwise:
 * outputs, exports, sensitive mass */
static void check_step(cp_backend *be, int bf16)
{
    cr_assert(be->attention_batch, "the cpu backend has a batched attention");
    seq s[N_SEQ];
    cp_attn_args a[N_SEQ];
    for (int i = 0; i < N_SEQ; i++) seq_make(&s[i], &step[i]);
    for (int i = 0; i < N_SEQ; i++) {
        cp_attn_args lone = seq_args(&s[i], &step[i], 0, bf16);
        be->attention(be, &lone);
        a[i] = seq_args(&s[i], &step[i], 1, bf16);
    }
    be->attention_batch(be, a, N_SEQ);
    cp_error err = { 0 };
    cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < N_SEQ; i++) {
        const spec *p = &step[i];
        cr_assert(memcmp(s[i].out[0], s[i].out[1], (size_t)p->n * QD * 4) == 0, "sequence %d (bf16 %d): batched output differs", i, bf16);
        cr_assert(memcmp(s[i].ex[0], s[i].ex[1], (size_t)p->n * p->nk * 4) == 0, "sequence %d (bf16 %d): export differs", i, bf16);
        cr_assert(memcmp(s[i].mass[0], s[i].mass[1], (size_t)p->n * 4) == 0, "sequence %d (bf16 %d): sensitive mass differs", i, bf16);
    }
    /* the step is not degenerate: exports and masses were written, the
     * no-key rows are zeros and the others are not */
    cr_assert(s[3].ex[1][0] != 0 && s[3].mass[1][0] > 0 && s[8].mass[1][0] > 0);
    for (int d = 0; d < 2 * QD; d++) cr_assert_eq(s[7].out[1][d], 0.0f);
    cr_assert(s[0].out[1][0] != 0 && s[1].out[1][0] != 0);
    for (int i = 0; i < N_SEQ; i++) seq_free(&s[i]);
}

Test(attn_batch, a_step_is_bitwise_one_call_a_sequence_f32_and_bf16_kv)
{
    cp_backend *be = test_cpu_backend_on(NULL);
    check_step(be, 0);
    check_step(be, 1);
    cp_backend_destroy(be);
}

/* int8 matrices: where the CPU has bf16 compute, oneDNN takes calls of 16
 * rows and more; the batch must send each call where attention() does */
Test(attn_batch, the_int8_paths_route_as_attention_does)
{
    cp_backend *be = test_cpu_backend_on(NULL);
    cp_error err = { 0 };
    cr_assert_eq(be->set_matrix_dtype(be, CP_I8, &err), CP_OK, "%s", err.msg);
    check_step(be, 0);
    check_step(be, 1);
    cp_backend_destroy(be);
}

/* a batch of one, and of none, changes nothing else */
Test(attn_batch, one_and_zero_calls)
{
    cp_backend *be = test_cpu_backend_on(NULL);
    seq s;
    seq_make(&s, &step[1]);
    cp_attn_args lone = seq_args(&s, &step[1], 0, 0), b = seq_args(&s, &step[1], 1, 0);
    be->attention(be, &lone);
    be->attention_batch(be, &b, 1);
    be->attention_batch(be, &b, 0);
    cr_assert(memcmp(s.out[0], s.out[1], (size_t)QD * 4) == 0);
    seq_free(&s);
    cp_backend_destroy(be);
}

/* An exporting decode call's row is one work item of the step's parallel
 * region, its KV heads in order: two threads adding a row's heads into
 * its one export row raced (a bit that changed from run to run).  The
 * plan counts the items; the run, repeated, equals the call alone. */
Test(attn_batch, an_exporting_row_is_one_work_item_its_heads_in_order)
{
    const spec p = { 2, 300, 0, 298, 7, 1, 1 }; /* two rows: threaded, an export and a mass */
    seq s;
    seq_make(&s, &p);
    cp_attn_args a[2] = { seq_args(&s, &p, 1, 0), seq_args(&s, &p, 1, 0) };
    a[1].export_a = NULL, a[1].sens_mass = NULL, a[1].sens_cols = NULL; /* the same rows, not exporting: a pair an item */
    int first[3];
    size_t off[2];
    const size_t floats = cpu_attention_decode_many_plan(a, 2, first, off);
    cr_assert_eq(first[0], 0);
    cr_assert_eq(first[1], p.n, "an exporting call's items are its rows (%d), got %d", p.n, first[1]);
    cr_assert_eq(first[2], p.n + p.n * KV, "a plain call's items are its (row, KV head) pairs");
    float *S = malloc(floats * sizeof *S), *alone = malloc((size_t)p.n * QD * 4);
    cr_assert(S && alone);
    cp_attn_args one = seq_args(&s, &p, 0, 0);
    cpu_attention_decode(&one, S, CPU_ATTN_AUTO);
    memcpy(alone, s.out[0], (size_t)p.n * QD * 4);
    for (int rep = 0; rep < 50; rep++) {
        memset(s.ex[1], 0, (size_t)p.n * p.nk * 4), memset(s.mass[1], 0, (size_t)p.n * 4);
        cpu_attention_decode_many(a, 1, first, off, S, CPU_ATTN_AUTO);
        cr_assert(memcmp(s.out[1], alone, (size_t)p.n * QD * 4) == 0, "run %d: output differs", rep);
        cr_assert(memcmp(s.ex[0], s.ex[1], (size_t)p.n * p.nk * 4) == 0, "run %d: export differs from the call alone", rep);
        cr_assert(memcmp(s.mass[0], s.mass[1], (size_t)p.n * 4) == 0, "run %d: sensitive mass differs", rep);
    }
    cr_assert(s.ex[1][0] != 0 && s.mass[1][0] > 0);
    free(S), free(alone);
    seq_free(&s);
}

/* A compute path runs its own attention kernels: CP_CPU_ISA=avx2 on an
 * AVX-512 CPU gives the AVX2 pair kernel's bits (what a CPU with only
 * AVX2 runs), generic the portable loops', avx512 the AVX-512 ones' --
 * else a path test on a wider CPU never ran the narrower kernels.  Where
 * the CPU has both vector kernels, their bits must differ somewhere on
 * this step, so a path that ran the wrong one shows. */
Test(attn_batch, each_compute_path_runs_its_own_attention_kernels)
{
    static const struct { const char *isa; cpu_attn_kernel k; } paths[] = {
        { "generic", CPU_ATTN_PORTABLE }, { "avx2", CPU_ATTN_AVX2 }, { "avx512", CPU_ATTN_AVX512 },
    };
    const int threads = omp_get_max_threads();
    int ran = 0;
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (cpu_attn_pair_kernel(HD, paths[p].k) != paths[p].k) continue; /* this CPU lacks it */
        cp_backend *be = test_cpu_backend_on(paths[p].isa);
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int i = 0; i < N_SEQ; i++) {
                seq s;
                seq_make(&s, &step[i]);
                cp_attn_args a = seq_args(&s, &step[i], 0, bf16), b = seq_args(&s, &step[i], 1, bf16);
                be->attention(be, &a);
                float *scr = malloc(cpu_attention_rows_scratch_floats(&b, threads, paths[p].k) * sizeof(float));
                cr_assert(scr);
                cpu_attention_rows(&b, scr, threads, paths[p].k);
                free(scr);
                const spec *sp = &step[i];
                cr_assert(memcmp(s.out[0], s.out[1], (size_t)sp->n * QD * 4) == 0, "CP_CPU_ISA=%s sequence %d (bf16 %d): not the %s kernel's output",
                          paths[p].isa, i, bf16, cpu_attn_kernel_name(paths[p].k));
                cr_assert(memcmp(s.ex[0], s.ex[1], (size_t)sp->n * sp->nk * 4) == 0 && memcmp(s.mass[0], s.mass[1], (size_t)sp->n * 4) == 0,
                          "CP_CPU_ISA=%s sequence %d (bf16 %d): not the %s kernel's export or mass", paths[p].isa, i, bf16,
                          cpu_attn_kernel_name(paths[p].k));
                seq_free(&s);
            }
        for (int bf16 = 0; bf16 < 2; bf16++) { /* an export-only call (no output rows): the path's softmax */
            seq s;
            seq_make(&s, &step[3]);
            cp_attn_args a = seq_args(&s, &step[3], 0, bf16), b = seq_args(&s, &step[3], 1, 0);
            a.out = b.out = NULL;
            be->attention(be, &a);
            float *scr = malloc(cpu_attention_scratch_floats(&b) * sizeof(float));
            cr_assert(scr);
            cpu_attention_with(&b, scr, paths[p].k);
            free(scr);
            const size_t en = (size_t)step[3].n * step[3].nk;
            cr_assert(memcmp(s.ex[0], s.ex[1], en * 4) == 0 && memcmp(s.mass[0], s.mass[1], (size_t)step[3].n * 4) == 0,
                      "CP_CPU_ISA=%s (bf16 %d): an export-only call is not the %s softmax's", paths[p].isa, bf16, cpu_attn_kernel_name(paths[p].k));
            cr_assert(s.ex[0][0] != 0);
            seq_free(&s);
        }
        cp_backend_destroy(be);
        ran++;
    }
    cr_assert(ran >= 1);
    if (cpu_attn_pair_kernel(HD, CPU_ATTN_AVX2) != CPU_ATTN_AVX2 || cpu_attn_pair_kernel(HD, CPU_ATTN_AVX512) != CPU_ATTN_AVX512) return;
    int differ = 0; /* the vector kernels are told apart on this step */
    for (int i = 0; i < N_SEQ && !differ; i++) {
        seq s;
        seq_make(&s, &step[i]);
        cp_attn_args a = seq_args(&s, &step[i], 0, 0), b = seq_args(&s, &step[i], 1, 0);
        float *scr = malloc(cpu_attention_rows_scratch_floats(&a, threads, CPU_ATTN_AVX2) * sizeof(float));
        cr_assert(scr);
        cpu_attention_rows(&a, scr, threads, CPU_ATTN_AVX2);
        free(scr);
        scr = malloc(cpu_attention_rows_scratch_floats(&b, threads, CPU_ATTN_AVX512) * sizeof(float));
        cr_assert(scr);
        cpu_attention_rows(&b, scr, threads, CPU_ATTN_AVX512);
        free(scr);
        differ = memcmp(s.out[0], s.out[1], (size_t)step[i].n * QD * 4) != 0;
        seq_free(&s);
    }
    cr_assert(differ, "the AVX2 and AVX-512 kernels gave the same bits on every sequence: the check above tells no path apart");
}
