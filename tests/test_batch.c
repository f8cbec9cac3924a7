/* Continuous batching, the model half: a sequence batched with others of
 * different lengths, positions, reuse plans and chunkings gets what it gets
 * alone (logits within 1e-4 x max|logit| of cp_forward / cp_forward_at,
 * greedy and seeded-sampled ids equal), and on cp-books-6m bit for bit
 * (batch/bitwise_*: every compute path is batch-invariant; `make test`
 * runs them once per path the CPU has, docs/TESTING.md). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/sampler.h"
#include "helpers.h"

#define MAXSEQ 6

/* One request of a test: prompt ids, the position of its first token, how
 * many tokens it decodes, the chunk its prefill is cut into when batched,
 * the step it starts at, and its sampling. */
typedef struct spec {
    int n_prompt, pos0, n_decode, chunk, start;
    float temperature;
    uint64_t seed;
    /* reuse plan: prompt tokens [reuse0, reuse1) get KV placed from a lone
     * full prefill and are not computed (0, 0: none) */
    int reuse0, reuse1;
} spec;

typedef struct outcome {
    float *logits; /* [1 + n_decode][vocab]: the prompt's last, then each decode step's */
    int32_t ids[64];
} outcome;

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static int32_t *prompt_of(const cp_model *m, int n, uint32_t seed)
{
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(lcg(&seed) % (uint32_t)m->cfg.vocab);
    return t;
}

static void sampler_for(const cp_model *m, const spec *sp, cp_sampler *smp)
{
    cp_error err = { 0 };
    cp_sampler_opts o = { .temperature = sp->temperature, .top_p = 1, .seed = sp->seed };
    cr_assert_eq(cp_sampler_init(smp, &o, m->cfg.vocab, &err), CP_OK, "%s", err.msg);
}

/* Places rows [a, b) of src's KV (all layers) into dst at the same slots and positions. */
static void place_from(cp_model *m, cp_state *dst, const cp_state *src, int a, int b)
{
    cp_error err = { 0 };
    const int L = m->cfg.n_layers;
    size_t kvd = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim, layer = (size_t)src->capacity * kvd;
    const float *kp[64], *vp[64];
    int32_t pos[256];
    for (int l = 0; l < L; l++) kp[l] = src->k_pre + l * layer + (size_t)a * kvd, vp[l] = src->v + l * layer + (size_t)a * kvd;
    for (int i = a; i < b; i++) pos[i - a] = src->pos_host[i];
    cr_assert_eq(cp_state_place(m, dst, a, b - a, pos, kp, vp, kvd, &err), CP_OK, "%s", err.msg);
}

/* The computed tokens of a spec's plan: ids, positions, slots; returns how many. */
static int plan_of(const spec *sp, const int32_t *prompt, int32_t *ids, int32_t *pos, int32_t *slots)
{
    int n = 0;
    for (int i = 0; i < sp->n_prompt; i++) {
        if (i >= sp->reuse0 && i < sp->reuse1 && i < sp->n_prompt - 1) continue;
        ids[n] = prompt[i], pos[n] = sp->pos0 + i, slots[n++] = i;
    }
    return n;
}

/* The donor of a reuse plan: the whole prompt prefilled alone. */
static cp_state *donor_of(cp_model *m, const spec *sp, const int32_t *prompt)
{
    cp_error err = { 0 };
    cp_state *d = NULL;
    int32_t pos[256];
    for (int i = 0; i < sp->n_prompt; i++) pos[i] = sp->pos0 + i;
    cr_assert_eq(cp_state_create(m, sp->n_prompt, 64, &d, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_forward(m, d, prompt, pos, sp->n_prompt, CP_LOGITS_NONE, NULL, NULL, &err), CP_OK, "%s", err.msg);
    return d;
}

/* The request alone: cp_forward (or, with a reuse plan, cp_forward_at over
 * the computed tokens) then one cp_forward per decoded token. */
static void run_alone(cp_model *m, const spec *sp, const int32_t *prompt, outcome *o)
{
    cp_error err = { 0 };
    const int V = m->cfg.vocab;
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, sp->n_prompt + sp->n_decode + 1, 64, &s, &err), CP_OK, "%s", err.msg);
    o->logits = malloc((size_t)(1 + sp->n_decode) * V * sizeof(float));
    int32_t ids[256], pos[256], slots[256];
    if (sp->reuse1 > sp->reuse0) {
        cp_state *d = donor_of(m, sp, prompt);
        place_from(m, s, d, sp->reuse0, sp->reuse1 < sp->n_prompt - 1 ? sp->reuse1 : sp->n_prompt - 1);
        cp_state_free(m, d);
        int n = plan_of(sp, prompt, ids, pos, slots);
        cr_assert_eq(cp_forward_at(m, s, ids, pos, slots, n, sp->n_prompt, CP_LOGITS_LAST, o->logits, NULL, &err), CP_OK, "%s", err.msg);
    } else {
        for (int i = 0; i < sp->n_prompt; i++) pos[i] = sp->pos0 + i;
        cr_assert_eq(cp_forward(m, s, prompt, pos, sp->n_prompt, CP_LOGITS_LAST, o->logits, NULL, &err), CP_OK, "%s", err.msg);
    }
    cp_sampler smp;
    sampler_for(m, sp, &smp);
    for (int k = 0; k <= sp->n_decode; k++) {
        o->ids[k] = cp_sample(&smp, o->logits + (size_t)k * V);
        if (k < sp->n_decode)
            cr_assert_eq(cp_forward(m, s, &o->ids[k], NULL, 1, CP_LOGITS_LAST, o->logits + (size_t)(k + 1) * V, NULL, &err), CP_OK,
                         "%s", err.msg);
    }
    cp_sampler_free(&smp);
    cp_state_free(m, s);
}

/* Every request in one stream of batched steps: from its start step, its
 * prefill in chunks (slot mode, positions set first, when it has a reuse
 * plan), then one decode token a step, all through cp_forward_batch. */
static void run_batched(cp_model *m, const spec *sp, int n_req, int32_t *const *prompts, outcome *o, int ws_tokens)
{
    cp_error err = { 0 };
    const int V = m->cfg.vocab;
    cp_batch_ws *ws = NULL;
    cr_assert_eq(cp_batch_ws_create(m, ws_tokens, &ws, &err), CP_OK, "%s", err.msg);
    cp_state *s[MAXSEQ];
    cp_sampler smp[MAXSEQ];
    int32_t ids[MAXSEQ][256], pos[MAXSEQ][256], slots[MAXSEQ][256];
    int n_comp[MAXSEQ], done_pre[MAXSEQ] = { 0 }, done_dec[MAXSEQ] = { 0 };
    for (int r = 0; r < n_req; r++) {
        cr_assert_eq(cp_state_create(m, sp[r].n_prompt + sp[r].n_decode + 1, 4, &s[r], &err), CP_OK, "%s", err.msg);
        o[r].logits = malloc((size_t)(1 + sp[r].n_decode) * V * sizeof(float));
        sampler_for(m, &sp[r], &smp[r]);
        n_comp[r] = plan_of(&sp[r], prompts[r], ids[r], pos[r], slots[r]);
        if (sp[r].reuse1 > sp[r].reuse0) {
            cp_state *d = donor_of(m, &sp[r], prompts[r]);
            place_from(m, s[r], d, sp[r].reuse0, sp[r].reuse1 < sp[r].n_prompt - 1 ? sp[r].reuse1 : sp[r].n_prompt - 1);
            cp_state_free(m, d);
            cr_assert_eq(cp_state_set_positions(s[r], slots[r], pos[r], n_comp[r], &err), CP_OK, "%s", err.msg);
        }
    }
    for (int step = 0;; step++) {
        cp_batch_seq q[MAXSEQ];
        int nq = 0, left = 0, who[MAXSEQ];
        for (int r = 0; r < n_req; r++) {
            left += done_pre[r] < n_comp[r] || done_dec[r] < sp[r].n_decode;
            if (step < sp[r].start) continue;
            cp_batch_seq *b = &q[nq];
            if (done_pre[r] < n_comp[r]) {
                int k = n_comp[r] - done_pre[r] < sp[r].chunk ? n_comp[r] - done_pre[r] : sp[r].chunk;
                int reuse = sp[r].reuse1 > sp[r].reuse0;
                *b = (cp_batch_seq){ .s = s[r], .tokens = ids[r] + done_pre[r], .pos = pos[r] + done_pre[r],
                                     .slots = reuse ? slots[r] + done_pre[r] : NULL, .n = k, .n_keys = sp[r].n_prompt,
                                     .mode = done_pre[r] + k == n_comp[r] ? CP_LOGITS_LAST : CP_LOGITS_NONE, .logits = o[r].logits };
            } else if (done_dec[r] < sp[r].n_decode) {
                *b = (cp_batch_seq){ .s = s[r], .tokens = &o[r].ids[done_dec[r]], .n = 1, .mode = CP_LOGITS_LAST,
                                     .logits = o[r].logits + (size_t)(done_dec[r] + 1) * V };
            } else continue;
            who[nq++] = r;
        }
        if (!left) break;
        cr_assert(step < 1000);
        if (!nq) continue;
        cr_assert_eq(cp_forward_batch(m, ws, q, nq, &err), CP_OK, "step %d: %s", step, err.msg);
        for (int j = 0; j < nq; j++) {
            int r = who[j];
            if (done_pre[r] < n_comp[r]) {
                done_pre[r] += q[j].n;
                if (done_pre[r] == n_comp[r]) o[r].ids[0] = cp_sample(&smp[r], o[r].logits);
            } else {
                done_dec[r]++;
                o[r].ids[done_dec[r]] = cp_sample(&smp[r], o[r].logits + (size_t)done_dec[r] * V);
            }
        }
    }
    for (int r = 0; r < n_req; r++) {
        cp_state_free(m, s[r]);
        cp_sampler_free(&smp[r]);
    }
    cp_batch_ws_free(m, ws);
}

/* batched == alone for every request: logits within 1e-4 x max|logit|
 * (bitwise: the same bytes), ids equal */
static void check_same_as(cp_model *m, const spec *sp, int n_req, int ws_tokens, const char *what, int bitwise)
{
    const int V = m->cfg.vocab;
    int32_t *prompts[MAXSEQ];
    outcome lone[MAXSEQ], bat[MAXSEQ];
    for (int r = 0; r < n_req; r++) {
        prompts[r] = prompt_of(m, sp[r].n_prompt, 1234u + 77u * (uint32_t)r);
        run_alone(m, &sp[r], prompts[r], &lone[r]);
    }
    run_batched(m, sp, n_req, prompts, bat, ws_tokens);
    for (int r = 0; r < n_req; r++) {
        size_t n = (size_t)(1 + sp[r].n_decode) * V;
        float scale = max_abs(lone[r].logits, n), d = max_abs_diff(bat[r].logits, lone[r].logits, n);
        if (bitwise) {
            size_t first = 0;
            while (first < n && memcmp(&bat[r].logits[first], &lone[r].logits[first], sizeof(float)) == 0) first++;
            cr_assert(first == n, "%s: request %d: logit %zu (step %zu, id %zu) batched %.9g, alone %.9g (max |diff| %g): not bit for bit",
                      what, r, first, first / (size_t)V, first % (size_t)V, bat[r].logits[first], lone[r].logits[first], d);
        }
        cr_assert(d <= 1e-4f * scale, "%s: request %d: max |batched - alone| = %g > 1e-4 x %g", what, r, d, scale);
        for (int k = 0; k <= sp[r].n_decode; k++)
            cr_assert_eq(bat[r].ids[k], lone[r].ids[k], "%s: request %d token %d: batched %d, alone %d", what, r, k, bat[r].ids[k],
                         lone[r].ids[k]);
        free(lone[r].logits), free(bat[r].logits), free(prompts[r]);
    }
}

static void check_same(cp_model *m, const spec *sp, int n_req, int ws_tokens, const char *what)
{
    check_same_as(m, sp, n_req, ws_tokens, what, 0);
}

static cp_model *open_model(const char *rel, cp_backend **be)
{
    char dir[512];
    shared_path(dir, sizeof dir, rel);
    return load_model_or_die(dir, be);
}

/* four requests of different lengths and first positions, one with a reuse
 * plan, starting at different steps so prefill chunks and decode tokens of
 * different requests share steps */
static const spec mixed[4] = {
    { .n_prompt = 23, .pos0 = 0, .n_decode = 8, .chunk = 64, .start = 0 },
    { .n_prompt = 9, .pos0 = 40, .n_decode = 10, .chunk = 4, .start = 1 },
    { .n_prompt = 31, .pos0 = 3, .n_decode = 5, .chunk = 7, .start = 2, .reuse0 = 4, .reuse1 = 19 },
    { .n_prompt = 2, .pos0 = 0, .n_decode = 12, .chunk = 1, .start = 5 },
};

Test(batch, greedy_same_alone_and_batched_fixtures)
{
    const char *fixtures[] = { "fixtures/qwen2-tiny", "fixtures/mistral-tiny-swa", "fixtures/llama-tiny" };
    for (int f = 0; f < 3; f++) {
        cp_backend *be = NULL;
        cp_model *m = open_model(fixtures[f], &be);
        check_same(m, mixed, 4, 96, fixtures[f]);
        cp_model_free(m);
        cp_backend_destroy(be);
    }
}

Test(batch, greedy_same_alone_and_batched_cp_books)
{
    cp_backend *be = NULL;
    cp_model *m = open_model("models/cp-books-6m", &be);
    check_same(m, mixed, 4, 96, "cp-books-6m");
    cp_model_free(m);
    cp_backend_destroy(be);
}

Test(batch, seeded_sampling_same_alone_and_batched)
{
    cp_backend *be = NULL;
    cp_model *m = open_model("models/cp-books-6m", &be);
    spec sp[4];
    memcpy(sp, mixed, sizeof sp);
    for (int r = 0; r < 4; r++) sp[r].temperature = 0.9f, sp[r].seed = 1000u + (uint64_t)r * 7919u;
    check_same(m, sp, 4, 96, "cp-books-6m sampled");
    cp_model_free(m);
    cp_backend_destroy(be);
}

/* Chunked prefill of every chunk size from 1 to T (plain and with a reuse
 * plan) equals one prefill, next to a request decoding in the same steps. */
Test(batch, chunked_prefill_any_chunk_equals_one)
{
    cp_backend *be = NULL;
    cp_model *m = open_model("fixtures/mistral-tiny-swa", &be); /* the window makes chunk edges matter */
    for (int plan = 0; plan < 2; plan++)
        for (int chunk = 1; chunk <= 25; chunk++) {
            spec sp[2] = {
                { .n_prompt = 25, .pos0 = 0, .n_decode = 1, .chunk = chunk, .start = 0, .reuse0 = plan ? 6 : 0, .reuse1 = plan ? 14 : 0 },
                { .n_prompt = 5, .pos0 = 2, .n_decode = 30, .chunk = 5, .start = 0 },
            };
            char what[64];
            snprintf(what, sizeof what, "chunk %d%s", chunk, plan ? " with reuse" : "");
            check_same(m, sp, 2, 64, what);
        }
    cp_model_free(m);
    cp_backend_destroy(be);
}

/* Batch invariance, bit for bit, on the path this process runs
 * (CP_CPU_ISA as set, else the CPU's own; OPENBLAS_CORETYPE as set): a
 * 150-token prompt prefilled alone in one call (the prefill-sized GEMMs
 * and attention) and batched in chunks of 32 beside another prompt's
 * 90-token chunk, a reuse plan's 7-token chunks and three short prompts,
 * then every request decoding in shared steps of up to 6 rows (the LM
 * head's rows too: past 4 at once): each request's
 * logits are the bytes of its lone run.  One per weight dtype; the
 * request sizes reach past every row-count switch the CPU backend had
 * (oneDNN above 4 rows, its bf16 attention from CP_DNNL_ATTN_MIN_N, the
 * decode attention up to CPU_ATTN_DECODE_N, the dot kernels up to
 * BF16_SMALL_N), and past CP_DNNL_ROWS. */
static const spec invariant_mix[6] = {
    { .n_prompt = 150, .pos0 = 0, .n_decode = 4, .chunk = 32, .start = 0 },
    { .n_prompt = 90, .pos0 = 0, .n_decode = 6, .chunk = 90, .start = 1 },
    { .n_prompt = 40, .pos0 = 0, .n_decode = 8, .chunk = 7, .start = 0, .reuse0 = 5, .reuse1 = 21 },
    { .n_prompt = 3, .pos0 = 0, .n_decode = 12, .chunk = 1, .start = 2 },
    { .n_prompt = 20, .pos0 = 0, .n_decode = 10, .chunk = 20, .start = 3 },
    { .n_prompt = 5, .pos0 = 0, .n_decode = 12, .chunk = 5, .start = 3 },
};

static void bitwise_on(cp_weight_dtype dt, const char *what)
{
    char dir[512], isa[32] = "";
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    const char *env = getenv("CP_CPU_ISA");
    if (env) snprintf(isa, sizeof isa, "%s", env);
    cp_backend *be = NULL;
    cp_model *m = test_load_as(dir, *isa ? isa : NULL, dt, &be);
    if (*isa) setenv("CP_CPU_ISA", isa, 1); /* test_load_as unsets it */
    char label[160];
    snprintf(label, sizeof label, "cp-books-6m %s, CP_CPU_ISA=%s (%s)", what, *isa ? isa : "auto", be->describe(be));
    check_same_as(m, invariant_mix, 6, 192, label, 1);
    cp_model_free(m);
    cp_backend_destroy(be);
}

Test(batch, bitwise_same_alone_and_batched_bf16, .timeout = TEST_TIMEOUT(120)) { bitwise_on(CP_WEIGHTS_AUTO, "bf16"); }
Test(batch, bitwise_same_alone_and_batched_int8, .timeout = TEST_TIMEOUT(120)) { bitwise_on(CP_WEIGHTS_INT8, "int8"); }
Test(batch, bitwise_same_alone_and_batched_f32, .timeout = TEST_TIMEOUT(120)) { bitwise_on(CP_WEIGHTS_F32, "f32"); }

/* The step refuses what it cannot do, before computing anything. */
Test(batch, bad_arguments_refused)
{
    cp_backend *be = NULL;
    cp_model *m = open_model("fixtures/qwen2-tiny", &be);
    cp_error err = { 0 };
    cp_batch_ws *ws = NULL;
    cp_state *a = NULL, *b = NULL;
    cr_assert_eq(cp_batch_ws_create(m, 8, &ws, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_state_create(m, 4, 4, &a, &err), CP_OK);
    cr_assert_eq(cp_state_create(m, 16, 4, &b, &err), CP_OK);
    int32_t t[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
    cp_batch_seq two[2] = { { .s = a, .tokens = t, .n = 1 }, { .s = a, .tokens = t, .n = 1 } };
    cr_assert_eq(cp_forward_batch(m, ws, two, 2, &err), CP_EINVAL, "one state twice in a step");
    cp_batch_seq big = { .s = b, .tokens = t, .n = 9 };
    cr_assert_eq(cp_forward_batch(m, ws, &big, 1, &err), CP_ERANGE, "more tokens than the workspace");
    cp_batch_seq over = { .s = a, .tokens = t, .n = 5 };
    cr_assert_eq(cp_forward_batch(m, ws, &over, 1, &err), CP_ERANGE, "more tokens than the cache");
    int32_t bad = m->cfg.vocab;
    cp_batch_seq oov = { .s = b, .tokens = &bad, .n = 1 };
    cr_assert_eq(cp_forward_batch(m, ws, &oov, 1, &err), CP_ERANGE, "a token outside the vocabulary");
    int32_t sl[2] = { 3, 2 }, ps[2] = { 0, 1 };
    cp_batch_seq desc = { .s = b, .tokens = t, .pos = ps, .slots = sl, .n = 2, .n_keys = 4 };
    cr_assert_eq(cp_forward_batch(m, ws, &desc, 1, &err), CP_EINVAL, "slots not ascending");
    cp_batch_seq nolog = { .s = b, .tokens = t, .n = 1, .mode = CP_LOGITS_LAST };
    cr_assert_eq(cp_forward_batch(m, ws, &nolog, 1, &err), CP_EINVAL, "logits with no buffer");
    cr_assert_eq(a->n, 0);
    cr_assert_eq(b->n, 0);
    cp_state_free(m, a);
    cp_state_free(m, b);
    cp_batch_ws_free(m, ws);
    cp_model_free(m);
    cp_backend_destroy(be);
}
