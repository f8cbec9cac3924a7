/* Where a reuse prefill's time goes (the goal: reuse must keep paying when
 * GEMMs get fast).  Replays rag-v1 reuse plans ({"ids": [...], "plan":
 * "FRC..."} lines, `run --plan-out`) on a model of real size: per plan, the
 * full prefill of the prompt (none) and the reuse prefill the plan describes
 * (its R tokens placed like pool blocks -- runs of 16 rows, RoPE rotation
 * included -- then its F and C tokens computed against the whole cache),
 * interleaved, so a loaded machine moves both sides.
 *
 *   speedup     = sum of none's times / sum of reuse's times
 *   ceiling     = prompt tokens / tokens computed (every fixed cost free)
 *   of ceiling  = speedup / ceiling (the target: >= 75 % in bf16)
 *
 * The model runs on a timing shim over the CPU backend (as prof_batch):
 * the reuse prefill's stages are placement (the wall time of placing, RoPE
 * tables included), then within the computed tokens' forward: the GEMMs
 * (with the norm or SwiGLU where the backend fuses them into one: its
 * norm_matmuls, swiglu_matmul), attention (computed tokens over the whole
 * cache), the bf16 KV conversion (kv_store_bf16), RoPE, the other ops
 * (embed, the norms and SwiGLU the backend runs alone), copies and
 * transfers, and the host code around them (positions, RoPE tables);
 * planning (the plan's flags into slots) is host time before placement.
 * The plans are replayed as they are, so a request-time method's selection
 * (the engine's default epic probe) is not in these times.
 *
 * usage: prof_reuse --dir MODEL --plans FILE [--last N] [--dtype f32|bf16|auto]
 *                   [--kv-dtype f32|bf16] */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/gemm_dnnl.h"
#include "../model/model.h"
#include "bench_clock.h"
#include "bench_args.h"

/* this process's CPU time in ms (all threads): on a machine shared with
 * other work a steadier yardstick than wall time for compute-bound code */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void check(cp_status rc, const cp_error *err, const char *what)
{
    if (rc) {
        fprintf(stderr, "prof_reuse: %s: %s\n", what, err->msg);
        exit(1);
    }
}

enum { ST_PLAN, ST_PLACE, ST_GEMM, ST_ATTN, ST_KVCONV, ST_ROPE, ST_OPS, ST_MEM, ST_HOST, N_ST };
static const char *const st_name[N_ST] = {
    "planning (plan -> slots)", "placement (+ RoPE rotation)", "GEMMs (+ fused norms, SwiGLU)", "attention over the cache", "bf16 KV conversion",
    "RoPE (q, k)", "embed, norms, SwiGLU", "copies, transfers", "host (positions, RoPE tables)",
};

/* the shim: the backend's table with timed ops; ops get &p->be */
typedef struct prof_be {
    cp_backend be; /* first: an op's be is the shim */
    cp_backend *in;
    double ms[N_ST];
} prof_be;

#define SHIM(st, call)                  \
    do {                                \
        prof_be *p = (prof_be *)be;     \
        double t0 = now_ms();           \
        call;                           \
        p->ms[st] += now_ms() - t0;     \
    } while (0)

static void s_embed(cp_backend *be, float *out, const cp_matrix *table, const int32_t *ids, int n, int dim)
{
    SHIM(ST_OPS, p->in->embed(p->in, out, table, ids, n, dim));
}
static void s_rmsnorm(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    SHIM(ST_OPS, p->in->rmsnorm(p->in, out, x, w, n, dim, eps));
}
static void s_matmul(cp_backend *be, float *y, int ldy, const float *x, const cp_matrix *w, const float *bias, int n, int in, int out,
                     int acc)
{
    SHIM(ST_GEMM, p->in->matmul(p->in, y, ldy, x, w, bias, n, in, out, acc));
}
static void s_rope(cp_backend *be, float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim)
{
    SHIM(ST_ROPE, p->in->rope(p->in, x, ld, cos, sin, n, n_heads, head_dim));
}
static void s_attention(cp_backend *be, const cp_attn_args *a) { SHIM(ST_ATTN, p->in->attention(p->in, a)); }
static void s_swiglu(cp_backend *be, float *out, const float *gate, const float *up, size_t count)
{
    SHIM(ST_OPS, p->in->swiglu(p->in, out, gate, up, count));
}
static void s_copy(cp_backend *be, void *dst, const void *src, size_t bytes) { SHIM(ST_MEM, p->in->copy(p->in, dst, src, bytes)); }
static void s_zero(cp_backend *be, void *dst, size_t bytes) { SHIM(ST_MEM, p->in->zero(p->in, dst, bytes)); }
static cp_status s_upload(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    cp_status rc;
    SHIM(ST_MEM, rc = p->in->upload(p->in, dst, src, bytes, err));
    return rc;
}
/* the fused ops (a GEMM with the norm or SwiGLU in its staging, the MLP in
 * one region): GEMMs */
static int s_norm_matmuls(cp_backend *be, const float *x, const float *norm_w, float eps, int n, int in, const cp_mm_out *outs, int count)
{
    int done;
    SHIM(ST_GEMM, done = p->in->norm_matmuls(p->in, x, norm_w, eps, n, in, outs, count));
    return done;
}
static int s_swiglu_matmul(cp_backend *be, float *y, int ldy, const float *gate, const float *up, const cp_matrix *w, int n, int in, int out,
                           int accumulate)
{
    int done;
    SHIM(ST_GEMM, done = p->in->swiglu_matmul(p->in, y, ldy, gate, up, w, n, in, out, accumulate));
    return done;
}
static int s_mlp(cp_backend *be, float *x, const float *norm_w, float eps, int n, int hidden, const cp_matrix *gate, const cp_matrix *up,
                 const cp_matrix *down, int inter)
{
    int done;
    SHIM(ST_GEMM, done = p->in->mlp(p->in, x, norm_w, eps, n, hidden, gate, up, down, inter));
    return done;
}
static void s_kv_store_bf16(cp_backend *be, uint16_t *dst, float *src, size_t count)
{
    SHIM(ST_KVCONV, p->in->kv_store_bf16(p->in, dst, src, count));
}

static void shim_install(prof_be *p, cp_model *m)
{
    memset(p, 0, sizeof *p);
    p->in = m->be;
    p->be = *m->be;
    p->be.embed = s_embed, p->be.rmsnorm = s_rmsnorm, p->be.matmul = s_matmul, p->be.rope = s_rope;
    p->be.attention = s_attention, p->be.swiglu = s_swiglu, p->be.copy = s_copy, p->be.zero = s_zero, p->be.upload = s_upload;
    if (p->be.kv_store_bf16) p->be.kv_store_bf16 = s_kv_store_bf16;
    if (p->be.norm_matmuls) p->be.norm_matmuls = s_norm_matmuls;
    if (p->be.swiglu_matmul) p->be.swiglu_matmul = s_swiglu_matmul;
    if (p->be.mlp) p->be.mlp = s_mlp; /* the MLP in one region: its GEMMs, norm and SwiGLU */
    m->be = &p->be;
}

/* the time of the ops inside a forward (not placement, not planning) */
static double ops_ms(const double *ms)
{
    double s = 0;
    for (int i = ST_GEMM; i < ST_HOST; i++) s += ms[i];
    return s;
}

typedef struct plan {
    int32_t *ids;
    uint8_t *reused; /* R (and not the last token: its logits start decoding) */
    int n, computed;
} plan;

/* the plan lines of FILE, the last `last` of them */
static plan *read_plans(const char *path, int last, int *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "prof_reuse: cannot open %s\n", path);
        exit(1);
    }
    int cap = 256, n = 0;
    plan *ps = calloc((size_t)cap, sizeof *ps);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while (ps && (len = getline(&line, &lcap, f)) > 0) {
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
        cJSON *ids = j ? cJSON_GetObjectItemCaseSensitive(j, "ids") : NULL, *pl = j ? cJSON_GetObjectItemCaseSensitive(j, "plan") : NULL;
        int k = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
        if (!cJSON_IsString(pl) || k < 1 || (int)strlen(pl->valuestring) != k) {
            fprintf(stderr, "prof_reuse: %s: line %d is not a plan line\n", path, n + 1);
            exit(1);
        }
        if (n == cap) {
            plan *t = realloc(ps, (size_t)(cap *= 2) * sizeof *ps);
            if (!t) break;
            ps = t;
        }
        plan *p = &ps[n++];
        p->n = k;
        p->ids = malloc((size_t)k * sizeof *p->ids);
        p->reused = malloc((size_t)k);
        if (!p->ids || !p->reused) break;
        p->computed = 0;
        for (int i = 0; i < k; i++) {
            p->ids[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble;
            p->reused[i] = pl->valuestring[i] == 'R' && i < k - 1;
            p->computed += !p->reused[i];
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    if (!ps || n == 0) {
        fprintf(stderr, "prof_reuse: no plans read from %s\n", path);
        exit(1);
    }
    int from = last > 0 && last < n ? n - last : 0;
    *n_out = n - from;
    return ps + from;
}

/* the full prefill of p's prompt; ms is the time */
static double run_none(cp_model *m, cp_state *s, const plan *p, int32_t *slots, float *lg)
{
    cp_error err = { 0 };
    check(cp_state_reset(m, s, &err), &err, "reset");
    for (int i = 0; i < p->n; i++) slots[i] = i;
    double t0 = now_ms();
    check(cp_forward_at(m, s, p->ids, slots, slots, p->n, p->n, CP_LOGITS_LAST, lg, NULL, &err), &err, "full prefill");
    return now_ms() - t0;
}

/* the reuse prefill: plan -> slots, placement, the computed tokens; the
 * stages' ms added to st[] (host: the forward's wall time less its ops) */
static double run_reuse(cp_model *m, prof_be *pb, cp_state *s, const plan *p, int32_t *slots, int32_t *toks, float *lg, double *st)
{
    cp_error err = { 0 };
    check(cp_state_reset(m, s, &err), &err, "reset");
    memset(pb->ms, 0, sizeof pb->ms);
    double t0 = now_ms();
    int k = 0;
    for (int i = 0; i < p->n; i++)
        if (!p->reused[i]) slots[k] = i, toks[k++] = p->ids[i];
    double t1 = now_ms();
    check(cp_state_place_placeholder(m, s, p->reused, p->n, 16, &err), &err, "placement");
    double t2 = now_ms();
    double snap[N_ST]; /* placement's own ops (its zeroed source, RoPE tables' uploads): in its wall time */
    memcpy(snap, pb->ms, sizeof snap);
    check(cp_forward_at(m, s, toks, slots, slots, k, p->n, CP_LOGITS_LAST, lg, NULL, &err), &err, "reuse prefill");
    double t3 = now_ms(), fwd_ops = 0;
    st[ST_PLAN] += t1 - t0;
    st[ST_PLACE] += t2 - t1;
    for (int i = ST_GEMM; i < ST_HOST; i++) st[i] += pb->ms[i] - snap[i], fwd_ops += pb->ms[i] - snap[i];
    st[ST_HOST] += (t3 - t2) - fwd_ops;
    return t3 - t0;
}

int main(int argc, char **argv)
{
    const char *dir = "build/synth-qwen2.5-0.5b", *plans = NULL;
    int last = 12;
    cp_weight_dtype dtype = CP_WEIGHTS_F32;
    cp_dtype kv = CP_F32;
    static const char usage[] = "usage: prof_reuse --dir MODEL --plans FILE [--last N] [--dtype f32|bf16|auto] [--kv-dtype f32|bf16]\n";
    const int args = bench_args_check(argc, argv);
    if (args) return bench_usage(args, usage);
    for (int i = 1; i + 1 < argc; i += 2) {
        cp_error e = { 0 };
        if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
        else if (strcmp(argv[i], "--plans") == 0) plans = argv[i + 1];
        else if (strcmp(argv[i], "--last") == 0) last = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--dtype") == 0) {
            if (cp_weight_dtype_from_name(argv[i + 1], &dtype, &e)) { fprintf(stderr, "prof_reuse: %s\n", e.msg); return 2; }
        } else if (strcmp(argv[i], "--kv-dtype") == 0 && (strcmp(argv[i + 1], "f32") == 0 || strcmp(argv[i + 1], "bf16") == 0)) {
            kv = strcmp(argv[i + 1], "bf16") == 0 ? CP_BF16 : CP_F32;
        } else {
            plans = NULL;
            break;
        }
    }
    if (!plans) return bench_usage(2, usage);
    int np;
    plan *ps = read_plans(plans, last, &np);
    cp_error err = { 0 };
    cp_backend *be;
    cp_model *m;
    check(cp_backend_cpu_create(&be, &err), &err, "backend");
    cp_load_opts lo = { .dtype = dtype };
    check(cp_model_load(dir, be, &lo, &m, &err), &err, "load");
    int cap = 0;
    for (int i = 0; i < np; i++) {
        if (ps[i].n > cap) cap = ps[i].n;
        for (int j = 0; j < ps[i].n; j++)
            if (ps[i].ids[j] < 0 || ps[i].ids[j] >= m->cfg.vocab) {
                fprintf(stderr, "prof_reuse: plan %d holds id %d outside this model's vocabulary\n", i, ps[i].ids[j]);
                return 1;
            }
    }
    cp_state *s;
    check(cp_state_create_kv(m, cap + 1, 512, kv, &s, &err), &err, "state"); /* chunks of 512, as the engine's */
    prof_be pb;
    shim_install(&pb, m);
    int32_t *slots = malloc((size_t)cap * sizeof *slots), *toks = malloc((size_t)cap * sizeof *toks);
    float *lg = malloc((size_t)m->cfg.vocab * sizeof *lg);
    if (!slots || !toks || !lg) return fprintf(stderr, "prof_reuse: out of memory\n"), 1;
    double st[N_ST] = { 0 }, none_st[N_ST] = { 0 }, t_none = 0, t_reuse = 0;
    long tokens = 0, computed = 0;
    run_none(m, s, &ps[0], slots, lg); /* warm-up: thread pools, primitives, page faults */
    run_reuse(m, &pb, s, &ps[0], slots, toks, lg, (double[N_ST]){ 0 });
    double c_none = 0, c_reuse = 0;
    for (int i = 0; i < np; i++) {
        memset(pb.ms, 0, sizeof pb.ms);
        double c0 = cpu_ms();
        t_none += run_none(m, s, &ps[i], slots, lg);
        double c1 = cpu_ms();
        for (int k = 0; k < N_ST; k++) none_st[k] += pb.ms[k];
        t_reuse += run_reuse(m, &pb, s, &ps[i], slots, toks, lg, st);
        c_none += c1 - c0, c_reuse += cpu_ms() - c1;
        tokens += ps[i].n, computed += ps[i].computed;
    }
    const char *isa = getenv("CP_CPU_ISA");
    printf("reuse prefill, %d plans of %s (last %d), %s weights, %s KV, CP_CPU_ISA=%s\n  matmul path: %s\n", np, plans, np,
           dtype == CP_WEIGHTS_BF16 ? "bf16" : dtype == CP_WEIGHTS_F32 ? "f32" : "auto", kv == CP_BF16 ? "bf16" : "f32", isa ? isa : "(unset)",
           be->describe(be));
    double speed = t_none / t_reuse, ceil = (double)tokens / computed;
    printf("  prompt tokens %ld, computed %ld (%.1f %%): ceiling %.2fx\n", tokens, computed, 100.0 * computed / tokens, ceil);
    printf("  none %.1f ms, reuse %.1f ms a request: speedup %.2fx, %.1f %% of the ceiling\n", t_none / np, t_reuse / np, speed,
           100 * speed / ceil);
    printf("  process CPU time: none %.1f ms, reuse %.1f ms a request: speedup %.2fx, %.1f %% of the ceiling\n", c_none / np, c_reuse / np,
           c_none / c_reuse, 100 * c_none / c_reuse / ceil);
    printf("  %-32s %12s %8s %12s\n", "stage of a reuse prefill", "ms a request", "share", "none's ms");
    for (int k = 0; k < N_ST; k++)
        printf("  %-32s %12.2f %7.1f%% %12.2f\n", st_name[k], st[k] / np, 100 * st[k] / t_reuse,
               k == ST_HOST ? (t_none - ops_ms(none_st)) / np : none_st[k] / np);
    /* what the ceiling assumes: the reuse prefill costs computed / n of none */
    printf("  ideal reuse (none x computed / tokens) %.1f ms; over it: %.1f ms a request\n", t_none / np / ceil, (t_reuse - t_none / ceil) / np);
    printf("reuse of ceiling: %.1f %%\n", 100 * speed / ceil);
    cp_state_free(m, s);
    m->be = pb.in;
    cp_model_free(m);
    cp_backend_destroy(be);
    return 0;
}
