/* Where a batched decode step's time goes (what bounds the output tokens/s
 * run --concurrency 16 gains over concurrency 1 on the 0.5B shape).
 *
 * The model runs on a timing shim over the CPU backend: every op a forward
 * step calls (embed, norms, each matmul by its shape, RoPE, attention,
 * SwiGLU, copies and transfers) is timed, and the rest of the step's wall
 * time is the host code around them.  Two views:
 *   1. cp_forward_batch alone: a pure decode step of B sequences over a
 *      context of C tokens (B = 1 and B = 16), by stage;
 *   2. the whole batcher path (cp_batcher_step: scheduler, per-request job
 *      work, sampling, the forward): B requests decoding together against
 *      one at a time, by stage, with output tokens/s and their ratio.
 * Times are sums over the steps measured (no minimum: the shares are the
 * result); the ratios are in one run, so a loaded machine moves both sides.
 *
 * --prefill T [--dtype D]: instead, one prefill of T tokens (one chunk,
 * the LM head for the last position only), by stage — where a prefill's
 * time goes (the int8 prefill's among them).
 *
 * usage: prof_batch --dir MODEL_DIR [--steps N] [--context C] [--batch B]
 *        prof_batch --dir MODEL_DIR --prefill T [--dtype f32|bf16|int8|auto] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/batch/batcher.h"
#include "../tokenizer/tokenizer.h"

#include "bench_clock.h"

static void check(cp_status rc, const cp_error *err)
{
    if (rc) {
        fprintf(stderr, "prof_batch: %s\n", err->msg);
        exit(1);
    }
}

enum { ST_EMBED, ST_NORM, ST_QKV, ST_O, ST_GATE_UP, ST_DOWN, ST_MLP, ST_HEAD, ST_MM_OTHER, ST_ROPE, ST_ATTN, ST_SWIGLU, ST_MEM, ST_PLACE, N_ST };
static const char *const st_name[N_ST] = { "embed", "rmsnorm", "matmul q/k/v(/o)", "matmul o", "matmul gate/up", "matmul down",
                                           "mlp in one region", "matmul lm head", "matmul other", "rope", "attention", "swiglu",
                                           "copy/zero/transfer", "place_kv" };

/* The shim: the backend's table with the timed ops replaced; ops receive
 * &p->be and forward to the real backend. */
typedef struct prof_be {
    cp_backend be; /* first: an op's be is the shim */
    cp_backend *in;
    int hidden, qd, kvd, inter, vocab;
    double ms[N_ST];
    long calls[N_ST];
} prof_be;

#define SHIM(st, call)                          \
    do {                                        \
        prof_be *p = (prof_be *)be;             \
        double t0 = now_ms();                   \
        call;                                   \
        p->ms[st] += now_ms() - t0;             \
        p->calls[st]++;                         \
    } while (0)

static void s_embed(cp_backend *be, float *out, const cp_matrix *table, const int32_t *ids, int n, int dim)
{
    SHIM(ST_EMBED, p->in->embed(p->in, out, table, ids, n, dim));
}
static void s_rmsnorm(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    SHIM(ST_NORM, p->in->rmsnorm(p->in, out, x, w, n, dim, eps));
}
static int mm_stage(const prof_be *p, int in, int out)
{
    if (in == p->hidden && (out == p->qd || out == p->kvd)) return ST_QKV; /* o too when q_dim = hidden */
    if (in == p->qd && out == p->hidden) return ST_O;
    if (in == p->hidden && out == p->inter) return ST_GATE_UP;
    if (in == p->inter && out == p->hidden) return ST_DOWN;
    if (in == p->hidden && out == p->vocab) return ST_HEAD;
    return ST_MM_OTHER;
}
static void s_matmul(cp_backend *be, float *y, int ldy, const float *x, const cp_matrix *w, const float *bias, int n, int in, int out,
                     int acc)
{
    SHIM(mm_stage(p, in, out), p->in->matmul(p->in, y, ldy, x, w, bias, n, in, out, acc));
}
static void s_rope(cp_backend *be, float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim)
{
    SHIM(ST_ROPE, p->in->rope(p->in, x, ld, cos, sin, n, n_heads, head_dim));
}
static void s_attention(cp_backend *be, const cp_attn_args *a) { SHIM(ST_ATTN, p->in->attention(p->in, a)); }
static void s_attention_batch(cp_backend *be, const cp_attn_args *a, int count)
{
    SHIM(ST_ATTN, p->in->attention_batch(p->in, a, count));
}
static void s_swiglu(cp_backend *be, float *out, const float *gate, const float *up, size_t count)
{
    SHIM(ST_SWIGLU, p->in->swiglu(p->in, out, gate, up, count));
}
/* the fused int8 prefill ops (backend.h): timed as the matmul stage of
 * their products, the norm or SwiGLU they fold in included */
static int s_norm_matmuls(cp_backend *be, const float *x, const float *norm_w, float eps, int n, int in, const cp_mm_out *outs, int count)
{
    int done;
    SHIM(mm_stage(p, in, outs[0].out), done = p->in->norm_matmuls(p->in, x, norm_w, eps, n, in, outs, count));
    return done;
}
static int s_swiglu_matmul(cp_backend *be, float *y, int ldy, const float *gate, const float *up, const cp_matrix *w, int n, int in, int out,
                           int acc)
{
    int done;
    SHIM(mm_stage(p, in, out), done = p->in->swiglu_matmul(p->in, y, ldy, gate, up, w, n, in, out, acc));
    return done;
}
/* the layer's MLP in one region (backend.h): gate/up, SwiGLU and down */
static int s_mlp(cp_backend *be, float *x, const float *norm_w, float eps, int n, int hidden, const cp_matrix *gate, const cp_matrix *up,
                 const cp_matrix *down, int inter)
{
    int done;
    SHIM(ST_MLP, done = p->in->mlp(p->in, x, norm_w, eps, n, hidden, gate, up, down, inter));
    return done;
}
static void s_copy(cp_backend *be, void *dst, const void *src, size_t bytes) { SHIM(ST_MEM, p->in->copy(p->in, dst, src, bytes)); }
static void s_zero(cp_backend *be, void *dst, size_t bytes) { SHIM(ST_MEM, p->in->zero(p->in, dst, bytes)); }
static cp_status s_upload(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    cp_status rc;
    SHIM(ST_MEM, rc = p->in->upload(p->in, dst, src, bytes, err));
    return rc;
}
static cp_status s_download(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    cp_status rc;
    SHIM(ST_MEM, rc = p->in->download(p->in, dst, src, bytes, err));
    return rc;
}
static void s_place_kv(cp_backend *be, float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n,
                       const float *cos, const float *sin, int n_kv_heads, int head_dim)
{
    SHIM(ST_PLACE, p->in->place_kv(p->in, k, k_pre, v, src_k, src_v, src_ld, n, cos, sin, n_kv_heads, head_dim));
}

/* Ops not timed keep the real backend's functions: they read only be->impl
 * and be->matrix_dtype, which the copy carries (the dtype is not changed
 * while the shim is installed). */
static void shim_install(prof_be *p, cp_model *m)
{
    memset(p, 0, sizeof *p);
    p->in = m->be;
    p->be = *m->be;
    p->be.embed = s_embed, p->be.rmsnorm = s_rmsnorm, p->be.matmul = s_matmul, p->be.rope = s_rope;
    p->be.attention = s_attention, p->be.swiglu = s_swiglu, p->be.copy = s_copy, p->be.zero = s_zero;
    p->be.upload = s_upload, p->be.download = s_download, p->be.place_kv = s_place_kv;
    p->be.attention_batch = m->be->attention_batch ? s_attention_batch : NULL;
    if (m->be->norm_matmuls) p->be.norm_matmuls = s_norm_matmuls;
    if (m->be->swiglu_matmul) p->be.swiglu_matmul = s_swiglu_matmul;
    if (m->be->mlp) p->be.mlp = s_mlp;
    const cp_config *c = &m->cfg;
    p->hidden = c->hidden, p->qd = c->n_heads * c->head_dim, p->kvd = c->n_kv_heads * c->head_dim;
    p->inter = c->intermediate, p->vocab = c->vocab;
    m->be = &p->be;
}

static void shim_reset(prof_be *p)
{
    memset(p->ms, 0, sizeof p->ms);
    memset(p->calls, 0, sizeof p->calls);
}

static double ops_ms(const prof_be *p)
{
    double s = 0;
    for (int i = 0; i < N_ST; i++) s += p->ms[i];
    return s;
}

/* One column of a breakdown: per step ms of each stage and of the rest. */
typedef struct column {
    const char *label;
    double ms[N_ST], rest, total;
    long calls[N_ST];
    int steps, tokens;
} column;

static void take(column *c, const prof_be *p, double wall, int steps, int tokens, const char *label)
{
    c->label = label, c->steps = steps, c->tokens = tokens, c->total = wall / steps;
    for (int i = 0; i < N_ST; i++) c->ms[i] = p->ms[i] / steps, c->calls[i] = p->calls[i] / steps;
    c->rest = (wall - ops_ms(p)) / steps;
}

static void print_columns(const char *title, const column *c, int n, const char *rest_name)
{
    printf("\n%s\n%-22s", title, "stage (ms per step)");
    for (int j = 0; j < n; j++) printf(" %14s %6s", c[j].label, "share");
    printf("\n");
    for (int i = 0; i <= N_ST; i++) {
        int any = i == N_ST;
        for (int j = 0; j < n && !any; j++) any = c[j].ms[i] > 0;
        if (!any) continue;
        printf("%-22s", i < N_ST ? st_name[i] : rest_name);
        for (int j = 0; j < n; j++) {
            double v = i < N_ST ? c[j].ms[i] : c[j].rest;
            printf(" %14.3f %5.1f%%", v, 100 * v / c[j].total);
        }
        printf("\n");
    }
    printf("%-22s", "step total");
    for (int j = 0; j < n; j++) printf(" %14.3f %6s", c[j].total, "");
    printf("\n%-22s", "calls per step");
    for (int j = 0; j < n; j++) {
        long k = 0;
        for (int i = 0; i < N_ST; i++) k += c[j].calls[i];
        printf(" %14ld %6s", k, "");
    }
    printf("\n");
}

/* View 1: cp_forward_batch, B decoders over ctx tokens each, steps times. */
static void forward_view(cp_model *m, prof_be *p, int B, int ctx, int steps, column *out, const char *label)
{
    cp_error err = { 0 };
    cp_batch_ws *ws = NULL;
    check(cp_batch_ws_create(m, B, &ws, &err), &err);
    cp_state **dec = calloc((size_t)B, sizeof *dec);
    cp_batch_seq *q = calloc((size_t)B, sizeof *q);
    int32_t *toks = malloc((size_t)ctx * sizeof *toks), one = 5;
    float *logits = malloc((size_t)B * m->cfg.vocab * sizeof *logits);
    if (!dec || !q || !toks || !logits) fprintf(stderr, "prof_batch: out of memory\n"), exit(1);
    for (int i = 0; i < ctx; i++) toks[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab);
    for (int i = 0; i < B; i++) {
        check(cp_state_create(m, ctx + steps + 2, 64, &dec[i], &err), &err);
        check(cp_forward(m, dec[i], toks, NULL, ctx, CP_LOGITS_NONE, NULL, NULL, &err), &err);
        q[i] = (cp_batch_seq){ .s = dec[i], .tokens = &one, .n = 1, .mode = CP_LOGITS_LAST, .logits = logits + (size_t)i * m->cfg.vocab };
    }
    check(cp_forward_batch(m, ws, q, B, &err), &err); /* warm */
    shim_reset(p);
    double t0 = now_ms();
    for (int s = 0; s < steps; s++) check(cp_forward_batch(m, ws, q, B, &err), &err);
    take(out, p, now_ms() - t0, steps, B * steps, label);
    for (int i = 0; i < B; i++) cp_state_free(m, dec[i]);
    free(dec), free(q), free(toks), free(logits);
    cp_batch_ws_free(m, ws);
}

static void on_done(void *ctx, void *user, cp_status rc, const cp_error *err)
{
    (void)user, (void)err;
    if (rc) ++*(int *)ctx;
}

/* View 2: B requests through a batcher (sharing none), each generating gen
 * tokens: the whole run (prefill steps too, as run --concurrency measures
 * it) into whole, and its pure decode steps into dec — those after the
 * first B steps (one prompt prefills a step; these prompts fit one chunk)
 * while all B are still running. */
static void batcher_view(cp_model *m, cp_tokenizer *tok, prof_be *p, int B, int gen, int serial, column *dec, column *whole,
                         const char *label)
{
    cp_error err = { 0 };
    cp_engine_opts eo;
    cp_engine_opts_default(&eo);
    eo.sharing = CP_SHARE_NONE;
    cp_engine *e = NULL;
    check(cp_engine_create(m, tok, NULL, NULL, &eo, &e, &err), &err);
    cp_batcher_opts bo = { .max_running = B, .step_tokens = B + 32, .kv_bytes = (size_t)512 << 20, .serial_prefill = serial };
    cp_batcher *b = NULL;
    check(cp_batcher_create(e, &bo, &b, &err), &err);
    cp_request_msg *msgs = calloc((size_t)B, sizeof *msgs);
    cp_request *reqs = calloc((size_t)B, sizeof *reqs);
    cp_response *resp = calloc((size_t)B, sizeof *resp);
    char (*text)[96] = calloc((size_t)B, sizeof *text);
    if (!msgs || !reqs || !resp || !text) fprintf(stderr, "prof_batch: out of memory\n"), exit(1);
    for (int i = 0; i < B; i++) {
        snprintf(text[i], sizeof text[i], "Request %d: tell me about the harbour, the mill and the ferry of town %d.", i, i);
        msgs[i] = (cp_request_msg){ CP_ROLE_USER, text[i], strlen(text[i]), 0, NULL, 0 };
        reqs[i] = (cp_request){ .tenant = (uint32_t)i, .msgs = &msgs[i], .n_msgs = 1, .max_tokens = gen, .ignore_eos = 1,
                                .sampling = { .top_p = 1 } };
        check(cp_batcher_submit(b, &reqs[i], &resp[i], NULL, NULL, &err), &err);
    }
    int failed = 0, steps = 0, all_steps = 0;
    double wall = 0, all_wall = 0;
    shim_reset(p);
    prof_be keep = *p;
    while (cp_batcher_pending(b)) {
        prof_be before = *p;
        size_t pend = cp_batcher_pending(b);
        double t0 = now_ms();
        check(cp_batcher_step(b, on_done, &failed, &err), &err);
        double t = now_ms() - t0;
        all_wall += t, all_steps++;
        if (all_steps > B && pend == (size_t)B) {
            wall += t, steps++;
            for (int i = 0; i < N_ST; i++) keep.ms[i] += p->ms[i] - before.ms[i], keep.calls[i] += p->calls[i] - before.calls[i];
        }
    }
    if (failed || !steps) fprintf(stderr, "prof_batch: %d requests failed, %d decode steps\n", failed, steps), exit(1);
    take(dec, &keep, wall, steps, B * steps, label);
    take(whole, p, all_wall, all_steps, B * gen, label);
    for (int i = 0; i < B; i++) cp_response_free(&resp[i]);
    free(msgs), free(reqs), free(resp), free(text);
    cp_batcher_free(b);
    cp_engine_free(e);
}

static double rate(const column *c);

/* --prefill: one prefill of T tokens after a warm-up prefill of 64 */
static void prefill_view(cp_model *m, prof_be *p, int T)
{
    cp_error err = { 0 };
    cp_state *s = NULL;
    check(cp_state_create(m, T, T, &s, &err), &err);
    int32_t *toks = malloc((size_t)T * sizeof *toks);
    float *logits = malloc((size_t)m->cfg.vocab * sizeof *logits);
    if (!toks || !logits) fprintf(stderr, "prof_batch: out of memory\n"), exit(1);
    for (int i = 0; i < T; i++) toks[i] = (int32_t)((i * 7919) % 20000 % m->cfg.vocab);
    check(cp_forward(m, s, toks, NULL, T < 64 ? T : 64, CP_LOGITS_LAST, logits, NULL, &err), &err);
    check(cp_state_reset(m, s, &err), &err);
    shim_reset(p);
    double t0 = now_ms();
    check(cp_forward(m, s, toks, NULL, T, CP_LOGITS_LAST, logits, NULL, &err), &err);
    column c;
    take(&c, p, now_ms() - t0, 1, T, "prefill");
    char title[96];
    snprintf(title, sizeof title, "cp_forward, a prefill of %d tokens (one chunk, LM head for the last)", T);
    print_columns(title, &c, 1, "host code (rest)");
    printf("prefill: %.1f tok/s\n", rate(&c));
    cp_state_free(m, s);
    free(toks), free(logits);
}

static double rate(const column *c) { return 1e3 * c->tokens / (c->total * c->steps); }

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int steps = 8, ctx = 64, B = 16, prefill = 0;
    cp_load_opts lo = { .dtype = CP_WEIGHTS_BACKEND };
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0) dir = argv[++i];
        else if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--context") == 0) ctx = atoi(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0) B = atoi(argv[++i]);
        else if (strcmp(argv[i], "--prefill") == 0) prefill = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dtype") == 0) {
            cp_error e = { 0 };
            if (cp_weight_dtype_from_name(argv[++i], &lo.dtype, &e)) fprintf(stderr, "prof_batch: %s\n", e.msg), exit(2);
        }
    }
    if (!dir || prefill < 0 || prefill > 32768 || steps < 1 || steps > 1000 || ctx < 1 || ctx > 4096 || B < 2 || B > 64) {
        fprintf(stderr, "usage: prof_batch --dir MODEL_DIR [--steps N (8)] [--context C (64)] [--batch B (16, 2-64)] | --prefill T [--dtype D]\n");
        return 2;
    }
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cp_model *m = NULL;
    cp_tokenizer *tok = NULL;
    check(cp_backend_cpu_create(&be, &err), &err);
    check(cp_model_load(dir, be, &lo, &m, &err), &err);
    prof_be p;
    if (prefill > 0) {
        shim_install(&p, m);
        printf("prof_batch: %s (%d layers, hidden %d), %s\n", dir, m->cfg.n_layers, m->cfg.hidden, be->describe(be));
        prefill_view(m, &p, prefill);
        m->be = be;
        cp_model_free(m);
        cp_backend_destroy(be);
        return 0;
    }
    check(cp_tokenizer_load(dir, &tok, &err), &err);
    shim_install(&p, m);
    printf("prof_batch: %s (%d layers, hidden %d, vocab %d), %s\n", dir, m->cfg.n_layers, m->cfg.hidden, m->cfg.vocab,
           be->describe ? be->describe(be) : be->name);
    char l1[32], lb[32];
    snprintf(l1, sizeof l1, "B=1");
    snprintf(lb, sizeof lb, "B=%d", B);
    column fw[2];
    forward_view(m, &p, 1, ctx, steps, &fw[0], l1);
    forward_view(m, &p, B, ctx, steps, &fw[1], lb);
    char title[160];
    snprintf(title, sizeof title, "cp_forward_batch, a pure decode step over %d tokens of context, %d steps", ctx, steps);
    print_columns(title, fw, 2, "host code (rest)");
    printf("forward: B=%d gives %.2fx the tokens/s of B=1\n", B, rate(&fw[1]) / rate(&fw[0]));
    column bd[3], bw[3];
    int gen = B + steps; /* so that B requests all decode together for steps steps */
    char ls[48];
    snprintf(ls, sizeof ls, "B=%d serial", B);
    batcher_view(m, tok, &p, 1, gen, 0, &bd[0], &bw[0], l1);
    batcher_view(m, tok, &p, B, gen, 1, &bd[1], &bw[1], ls); /* one prompt prefills a step (the rule with a pool) */
    batcher_view(m, tok, &p, B, gen, 0, &bd[2], &bw[2], lb); /* no pool: prompts share a step */
    print_columns("cp_batcher_step (sharing none), its pure decode steps: scheduler + jobs + sampling + forward", bd, 3,
                  "host (sched/job/sample)");
    printf("batcher decode steps: B=%d gives %.2fx the output tokens/s of B=1 (%.2f vs %.2f tokens/s)\n", B, rate(&bd[2]) / rate(&bd[0]),
           rate(&bd[2]), rate(&bd[0]));
    snprintf(title, sizeof title, "the whole run of %d requests x %d tokens (prefill steps too; what run --concurrency reports)", B, gen);
    print_columns(title, bw, 3, "host (sched/job/sample)");
    printf("whole run, output tokens/s against B=1: B=%d serial prefill %.2fx (%d steps), B=%d prompts sharing a step %.2fx (%d "
           "steps); B=1: %d steps a request\n",
           B, rate(&bw[1]) / rate(&bw[0]), bw[1].steps, B, rate(&bw[2]) / rate(&bw[0]), bw[2].steps, bw[0].steps);
    m->be = be;
    cp_tokenizer_free(tok);
    cp_model_free(m);
    cp_backend_destroy(be);
    return 0;
}
