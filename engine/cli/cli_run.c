/* cacheprune run: a multi-tenant request log (JSONL) through the engine,
 * one result line per request, a summary table; --compare runs the same log
 * under several sharing modes side by side, with quality against `none`
 * (full recompute) when it is among them; --plan-out / --plan-in write and
 * replay reuse plans.  This file is the command and the modes' loop;
 * --concurrency and the files are its siblings (cli_run_internal.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../../kernels/log.h"
#include "cli.h"
#include "cli_calib_default.h"
#include "cli_engine_opts.h"
#include "cli_run.h"
#include "cli_run_internal.h"
#include "../../eval/quality.h"
#include "../request_json.h"
#include "../run_lines.h"
#include "../json_fields.h"
#include "../request.h"
#include "../tenant.h"
#include "../batch/batcher.h"

static void usage(FILE *f)
{
    fputs("usage: cacheprune run --model DIR --requests FILE.jsonl [options]\n"
          "\n"
          "Request lines: {\"tenant\": \"name\", \"messages\": [{\"role\": \"system|user|assistant|document\", \"content\": \"...\",\n"
          "                \"sensitive\": false, \"spans\": [[start, end], ...]}], \"max_tokens\": 16,\n"
          "                \"temperature\": 0, \"top_p\": 1, \"seed\": 0}   (or \"prompt\": \"...\" for one user message)\n"
          "  tenant: a string of 1-256 bytes (UTF-8, no NUL); same bytes = same tenant.  A field of the wrong\n"
          "  type or range, an unknown or repeated field, or a span outside its message makes that line an\n"
          "  error in place (nothing of it runs).\n"
          "\n"
          "  --compare LIST        e.g. none,tenant-prefix,global-prefix,chunk,cacheprune: side by side (each\n"
          "                        mode on its own engine and pool, interleaved; --pool-bytes split between them)\n"
          "  --max-tokens N        default for lines without max_tokens (16)\n"
          "  --out FILE            result lines (JSONL); with --resume, requests whose lines are already there\n"
          "                        are not run again (the pool starts cold)\n"
          "  --resume              continue an interrupted --out file: nothing lost or duplicated\n"
          "  --plan-out FILE       each request's reuse plan (ids and fresh/reused/recomputed per token)\n"
          "  --plan-in FILE        replay plans (from another model with the same tokenizer) instead of deciding\n"
          "  --plot FILE.png       TTFT and hit rate per mode (gnuplot)\n"
          "  --summary-json FILE   the summary as JSON: per mode hit rate, TTFT mean/p50/p95, ratios to none by\n"
          "                        mean and p50, tokens, errors, pool bytes, KL / greedy / ROUGE-L, and per\n"
          "                        stage of a request (tokenize, detect, lookup, tier, placement, selection,\n"
          "                        prefill, export, first token; annotate and store after it) its mean ms and\n"
          "                        its share of the mean TTFT\n"
          "  --stages              the same per-stage table on stderr\n"
          "  --quiet-progress      no progress line\n"
          "  --concurrency N       N requests in flight, continuously batched (one forward step carries every\n"
          "                        running request's next token and one new prompt's prefill chunk); results are\n"
          "                        written in line order.  Not with --compare or --plan-in.  0 (default): one\n"
          "                        request at a time\n"
          "  --step-tokens N       with --concurrency: tokens one step carries, decode and prefill (default 512,\n"
          "                        the prefill chunk: a log's replay is for throughput, and a step then carries\n"
          "                        a whole chunk beside the decoders; serve's default is 32, for inter-token\n"
          "                        latency; must exceed N)\n"
          "  --prefill-tokens N    with --concurrency: tokens a step carries when none of its requests decodes\n"
          "                        (default 512, the sequential path's chunk)\n"
          "  --kv-budget MB        with --concurrency: KV memory the requests in flight may reserve (1024)\n"
          "engine options (shared with `serve`):\n",
          f);
    cli_engine_opts_usage(f);
    fputs("detector options, as for `cacheprune detect`:\n",
          f);
    cli_detect_opts_help(f);
}

void run_bind_tier_tenant(const run_opts *ro, const cJSON *j, uint32_t tenant)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tenant");
    cp_error err = { 0 };
    if (ro->tier && cJSON_IsString(t) && cp_tier_bind_tenant(ro->tier, tenant, t->valuestring, strlen(t->valuestring), &err))
        cp_warn("%s", err.msg); /* unbound: its private segments just stay local */
}

/* ---- the modes, interleaved --------------------------------------------------------
 * Every mode runs each request before the next request starts, each on its
 * own engine and pool, so a stall of the shared machine lands on one request
 * of every mode, not on all requests of one mode (ratios to `none` seen at
 * 6-10x from a few seconds of interference when the modes ran one after the
 * other). */

/* none's result for the request in flight: what the other modes' quality is
 * measured against (only this request's: nothing accumulates) */
typedef struct reference {
    float *logits;
    int32_t *ids;
    float *margins; /* none's top-2 margins per id (NULL: not known) */
    size_t n_ids;
} reference;

void run_mode_close(mode_run *mr)
{
    cp_tenant_table_free(mr->ten);
    cp_engine_free(mr->e);
    cp_pool_free(mr->pool);
    free(mr->st.ttft);
    memset(mr, 0, sizeof *mr);
}

int run_mode_open(const run_opts *ro, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, const char *name, int replay,
                  size_t pool_bytes, size_t n_lines, mode_run *mr)
{
    memset(mr, 0, sizeof *mr);
    cp_error err = { 0 };
    cp_engine_opts eo = ro->eo;
    if (cp_sharing_from_name(name, &eo.sharing, &err)) return cli_error("%s", err.msg), 0;
    mr->name = name;
    mr->st.mode = replay ? "replay" : name;
    mr->st.n_layers = m->cfg.n_layers;
    if (eo.sharing != CP_SHARE_NONE || replay) {
        cp_kv_layout l;
        cp_engine_kv_layout_as(m, eo.kv_dtype ? eo.kv_dtype : CP_F32, &l);
        cp_pool_opts po;
        cp_pool_opts_default(&po);
        po.budget_bytes = pool_bytes;
        if (cp_pool_create(&l, m->be, &po, &mr->pool, &err)) return cli_error("%s", err.msg), 0;
    }
    if (cp_engine_create(m, tok, mr->pool, chain, &eo, &mr->e, &err) || cp_tenant_table_create(&mr->ten, &err)) {
        cli_error("%s", err.msg);
        run_mode_close(mr);
        return 0;
    }
    if (!replay && eo.sharing != CP_SHARE_NONE) cp_engine_set_tier(mr->e, ro->tier);
    if (!(mr->st.ttft = calloc(n_lines + 1, sizeof *mr->st.ttft))) {
        cli_error("run: out of memory for %zu requests", n_lines);
        run_mode_close(mr);
        return 0;
    }
    return 1;
}

void run_count_result(mode_stats *st, const cp_response *resp, int replay)
{
    st->ttft[st->n++] = resp->ttft_ms;
    st->prompt += resp->prompt_tokens, st->computed += resp->computed, st->reused += resp->reused;
    st->recomputed += resp->recomputed, st->hit += resp->private_hit_tokens + resp->shared_hit_tokens;
    st->partial_rows += resp->partial_rows;
    for (int k = 0; k < CP_STAGE_N; k++) st->stage_sum[k] += resp->stage_ms[k];
    if (replay) st->hit += resp->reused + resp->recomputed;
}

/* How much of the disagreement with full recompute starts at one of its
 * near-ties (top-2 margin below each of cp_near_ties): there, the argmax is a coin
 * that rounding alone may flip.  Diagnostic only: the greedy agreement
 * reported as such stays cp_greedy_agreement. */
static void count_near_ties(mode_stats *st, const reference *ref, const cp_response *resp)
{
    if (!ref->margins) return;
    size_t k = cp_first_divergence(ref->ids, ref->n_ids, resp->ids, resp->n_ids);
    int differs = k < ref->n_ids || k < resp->n_ids;
    st->diverged += differs;
    for (int t = 0; t < CP_N_TIES; t++) {
        st->diverged_at_tie[t] += differs && k < ref->n_ids && ref->margins[k] < cp_near_ties[t];
        double d = cp_greedy_agreement_decided(ref->ids, ref->margins, ref->n_ids, resp->ids, resp->n_ids, cp_near_ties[t]);
        if (d >= 0) st->decided_sum[t] += d, st->decided_n[t]++;
    }
}

/* A line that did not run, on stderr whether or not --out keeps it: its
 * number and reason (the message names the line), with the mode when
 * several run side by side. */
void run_line_failed(const run_opts *ro, const mode_run *mr, const cp_error *err)
{
    if (ro->n_modes > 1) cli_error("run: %s (mode %s)", err->msg, mr->name);
    else cli_error("run: %s", err->msg);
}

/* One request line through one mode: statistics, quality against `ref`
 * (none's result for this line, kept when is_ref), the result line. */
static void mode_request(const run_opts *ro, mode_run *mr, const jline *line, const jline *plan, int V, reference *ref, int is_ref,
                         FILE *out, FILE *plan_out)
{
    cp_error err = { 0 };
    cJSON *j = NULL;
    cp_request req = { 0 };
    cp_request_msg *msgs = NULL;
    cp_span *spans = NULL;
    cp_response resp;
    memset(&resp, 0, sizeof resp);
    char why[512] = "";
    cp_status rc;
    mode_stats *st = &mr->st;
    if (plan) { /* replay: {"ids": [...], "plan": "FRRC..."} */
        int32_t *v;
        uint8_t *p;
        int n, mt;
        rc = cp_run_plan_parse(plan->text, plan->len, line->text, line->len, ro->default_max_tokens, &v, &p, &n, &mt, &err);
        if (rc == CP_OK) rc = cp_engine_replay(mr->e, v, p, n, mt, &resp, &err);
        else cp_fail_wrap(&err, "plan line %zu, request line %zu", plan->lineno, line->lineno);
        free(v), free(p);
    } else if ((rc = cp_json_parse_strict(line->text, line->len, &j, &err))) {
        cp_fail_wrap(&err, "request line %zu", line->lineno);
    } else if (!cp_run_request_parse(j, mr->ten, ro->default_max_tokens, &req, &msgs, &spans, why, sizeof why)) {
        rc = cp_fail(&err, CP_EFORMAT, "request line %zu: %s", line->lineno, why);
    } else {
        run_bind_tier_tenant(ro, j, req.tenant);
        if ((rc = cp_engine_run(mr->e, &req, &resp, &err))) cp_fail_wrap(&err, "request line %zu", line->lineno);
    }
    if (rc == CP_OK) {
        run_count_result(st, &resp, plan != NULL);
        if (ref && is_ref) { /* keep none's outputs for the other modes */
            ref->logits = malloc((size_t)V * sizeof(float));
            if (ref->logits) memcpy(ref->logits, cp_engine_last_logits(mr->e), (size_t)V * sizeof(float));
            ref->ids = resp.ids, ref->n_ids = resp.n_ids, ref->margins = resp.margins;
            resp.ids = NULL, resp.n_ids = 0, resp.margins = NULL;
        } else if (ref && ref->logits) {
            double rl = cp_rouge_l(ref->ids, ref->n_ids, resp.ids, resp.n_ids);
            if (rl >= 0) {
                st->kl_sum += cp_logits_kl(ref->logits, cp_engine_last_logits(mr->e), V);
                st->agree_sum += cp_greedy_agreement(ref->ids, ref->n_ids, resp.ids, resp.n_ids);
                st->rouge_sum += rl;
                st->quality_n++;
                count_near_ties(st, ref, &resp);
            }
        }
    } else {
        st->errors++;
        run_line_failed(ro, mr, &err);
    }
    if (out) run_write_result(out, ro, mr, line, rc, &resp, &err);
    if (plan_out && rc == CP_OK && resp.plan) run_write_plan(plan_out, &resp);
    /* the operator's log: figures, never text */
    cp_debug("request line %zu tenant %u: %d prompt tokens, %d computed, %d reused, %d recomputed, %d private + %d shared hit, "
             "ttft %.1f ms%s",
             line->lineno, req.tenant, resp.prompt_tokens, resp.computed, resp.reused, resp.recomputed, resp.private_hit_tokens,
             resp.shared_hit_tokens, resp.ttft_ms, rc ? " (error)" : "");
    cp_response_free(&resp);
    free(msgs), free(spans);
    cJSON_Delete(j);
}

/* One throwaway request on an engine of its own (no pool), so the first
 * timed request of the first mode does not pay for cold caches and thread
 * start-up. */
void run_warm_up(const run_opts *ro, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, const jline *line)
{
    mode_run w;
    if (!run_mode_open(ro, m, tok, chain, "none", 0, 0, 1, &w)) return;
    mode_request(ro, &w, line, NULL, 0, NULL, 0, NULL, NULL);
    run_mode_close(&w);
}

static size_t peak_rss_bytes(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (size_t)ru.ru_maxrss * 1024 : 0;
}

static int run_modes(const run_opts *ro, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, jline *lines, size_t n_lines,
                     jline *plans, size_t skip, FILE *out, FILE *plan_out, int have_ref, mode_stats *st_out)
{
    mode_run mr[8];
    int n = 0, ok = 1, pooled = 0;
    for (int i = 0; i < ro->n_modes; i++) pooled += plans || strcmp(ro->modes[i], "none") != 0;
    /* the budget is for the whole run: each pooled mode gets its share */
    size_t share = pooled ? ro->pool_bytes / (size_t)pooled : ro->pool_bytes;
    for (; n < ro->n_modes && ok; n++) ok = run_mode_open(ro, m, tok, chain, ro->modes[n], plans != NULL, share, n_lines, &mr[n]);
    if (!ok) n--;
    if (ok && skip < n_lines && !plans) run_warm_up(ro, m, tok, chain, &lines[skip]);
    int V = cp_usable_vocab(m, tok);
    /* a resumed run does not run again what it already wrote: every restart
     * makes progress (the pool starts cold, and the summary covers what ran) */
    for (size_t li = skip; ok && li < n_lines; li++) {
        reference ref = { 0 };
        for (int i = 0; i < n; i++)
            mode_request(ro, &mr[i], &lines[li], plans ? &plans[li] : NULL, V, have_ref ? &ref : NULL, have_ref && i == 0, out,
                         i == 0 ? plan_out : NULL);
        free(ref.logits), free(ref.ids), free(ref.margins);
        if (ro->progress && (isatty(2) || (li + 1) % 25 == 0 || li + 1 == n_lines))
            fprintf(stderr, "\r[%s%s] %zu/%zu requests%s", ro->modes[0], n > 1 ? ", ..." : "", li + 1, n_lines,
                    li + 1 == n_lines ? "\n" : ""), fflush(stderr);
    }
    for (int i = 0; i < n; i++) {
        if (mr[i].pool) {
            cp_pool_stats ps;
            cp_pool_stats_get(mr[i].pool, &ps);
            mr[i].st.pool_bytes = ps.bytes_used;
        }
        st_out[i] = mr[i].st;
        mr[i].st.ttft = NULL; /* moved to st_out */
        run_mode_close(&mr[i]);
    }
    return ok;
}

typedef struct grid_progress {
    int on, first, total; /* this group's settings: first + 1 .. first + n of total */
} grid_progress;

/* One group of calibrate's settings beside a none of its own, interleaved
 * request by request.  none's statistics go to none_st (NULL: dropped),
 * setting i's to st_out[i]; *none_ttft the none's mean TTFT. */
static int grid_group(cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, jline *lines, size_t n_lines, const cp_engine_opts *set,
                      int n_set, size_t pool_bytes, int default_max, grid_progress pg, mode_stats *none_st, mode_stats *st_out,
                      double *none_ttft)
{
    int n = n_set + 1, ok = 1, opened = 0;
    mode_run *mr = calloc((size_t)n, sizeof *mr);
    run_opts *ro = calloc((size_t)n, sizeof *ro);
    if (!mr || !ro) ok = 0, cli_error("calibrate: out of memory for %d settings", n_set);
    for (int i = 0; ok && i < n; i++) { /* 0: none, the reference; then each setting on its own engine and pool */
        ro[i] = (run_opts){ .default_max_tokens = default_max, .n_modes = 1 };
        if (i) ro[i].eo = set[i - 1];
        else cp_engine_opts_default(&ro[i].eo), ro[i].eo.tpl = set[0].tpl, ro[i].eo.mask_pad = set[0].mask_pad;
        ok = run_mode_open(&ro[i], m, tok, chain, i ? cp_sharing_name(set[i - 1].sharing) : "none", 0, pool_bytes, n_lines, &mr[i]);
        opened += ok;
    }
    if (ok && n_lines) run_warm_up(&ro[0], m, tok, chain, &lines[0]);
    int V = cp_usable_vocab(m, tok);
    for (size_t li = 0; ok && li < n_lines; li++) {
        reference ref = { 0 };
        for (int i = 0; i < n; i++) mode_request(&ro[i], &mr[i], &lines[li], NULL, V, &ref, i == 0, NULL, NULL);
        free(ref.logits), free(ref.ids), free(ref.margins);
        if (pg.on && ((li + 1) % 10 == 0 || li + 1 == n_lines))
            fprintf(stderr, "\r[calibrate: settings %d-%d of %d] %zu/%zu requests%s", pg.first + 1, pg.first + n_set, pg.total, li + 1,
                    n_lines, li + 1 == n_lines && pg.first + n_set == pg.total ? "\n" : ""),
                fflush(stderr);
    }
    if (ok) {
        double sum = 0;
        for (int k = 0; k < mr[0].st.n; k++) sum += mr[0].st.ttft[k];
        *none_ttft = mr[0].st.n ? sum / mr[0].st.n : 0;
    }
    for (int i = 0; i < opened; i++) {
        mode_stats *dst = i ? &st_out[i - 1] : none_st;
        if (ok && dst) {
            *dst = mr[i].st;
            mr[i].st.ttft = NULL;
        }
        run_mode_close(&mr[i]);
    }
    free(mr), free(ro);
    return ok;
}

int run_grid(cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, const char *requests, size_t max_lines,
             const cp_engine_opts *set, int n_set, size_t pool_bytes, int default_max, int progress, mode_stats *st_out,
             double *none_ttft)
{
    cp_error err = { 0 };
    size_t n_lines = 0;
    jline *lines = run_read_lines(requests, &n_lines, &err);
    if (!lines) return cli_error("%s", err.msg), 0;
    if (max_lines && n_lines > max_lines) {
        for (size_t i = max_lines; i < n_lines; i++) free(lines[i].text);
        n_lines = max_lines;
    }
    int ok = 1;
    for (int g0 = 0; ok && g0 < n_set; g0 += RUN_GRID_GROUP) {
        int gn = n_set - g0 < RUN_GRID_GROUP ? n_set - g0 : RUN_GRID_GROUP;
        double base = 0;
        grid_progress pg = { progress, g0, n_set };
        ok = grid_group(m, tok, chain, lines, n_lines, set + g0, gn, pool_bytes, default_max, pg, g0 ? NULL : &st_out[0], st_out + 1 + g0,
                        &base);
        for (int i = 0; ok && none_ttft && i < gn; i++) none_ttft[g0 + i] = base;
    }
    if (!ok) /* what a finished group left */
        for (int i = 0; i <= n_set; i++) free(st_out[i].ttft), st_out[i].ttft = NULL;
    run_free_lines(lines, n_lines);
    return ok;
}

/* run's own options that take a value (the engine options are
 * cli_parse_engine_opt's) */
static const char *const run_value_opts[] = { "--model", "--requests", "--out", "--plan-out", "--plan-in", "--plot", "--summary-json",
                                              "--compare", "--max-tokens", "--concurrency", "--step-tokens", "--prefill-tokens",
                                              "--kv-budget", NULL };

int cli_run(int argc, char **argv)
{
    /* --step-tokens: a replayed log has no reader waiting between tokens, so
     * a step carries a whole prefill chunk beside the decoders (the
     * sequential path's chunk), not serve's 32: measured on cp-books-6m,
     * 48 rag-v1 requests, 2-core Xeon with AMX, same run, --concurrency 8
     * took 0.88x the speed of --concurrency 1 at 32 tokens a step, 1.36x at
     * 512 (docs/RESULTS.md, batching); answers are the same either way */
    run_opts ro = { .progress = 1, .default_max_tokens = 16, .step_tokens = 0,
                  .prefill_tokens = CP_BATCH_PREFILL_TOKENS, .kv_budget = (size_t)1024 << 20 };
    cli_engine_opts ce;
    cli_engine_opts_default(&ce);
    const char *compare = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_engine_opt(argc, argv, &i, &ce);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v;
        long long k;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(stdout), 0;
        if (strcmp(a, "--resume") == 0) { ro.resume = 1; continue; }
        if (strcmp(a, "--quiet-progress") == 0) { ro.progress = 0; continue; }
        if (strcmp(a, "--stages") == 0) { ro.stages = 1; continue; }
        if (!cli_one_of(a, run_value_opts)) return cli_unknown("run", a), 2;
        if (!(v = cli_value("run", argc, argv, &i))) return 2;
        if (strcmp(a, "--model") == 0) ro.model = v;
        else if (strcmp(a, "--requests") == 0) ro.requests = v;
        else if (strcmp(a, "--out") == 0) ro.out = v;
        else if (strcmp(a, "--plan-out") == 0) ro.plan_out = v;
        else if (strcmp(a, "--plan-in") == 0) ro.plan_in = v;
        else if (strcmp(a, "--plot") == 0) ro.plot = v;
        else if (strcmp(a, "--summary-json") == 0) ro.summary_json = v;
        else if (strcmp(a, "--compare") == 0) compare = v;
        else if (strcmp(a, "--max-tokens") == 0) {
            if (!cli_parse_int(a, v, 0, 1 << 20, &k)) return 2;
            ro.default_max_tokens = (int)k;
        } else if (strcmp(a, "--concurrency") == 0) {
            if (!cli_parse_int(a, v, 0, 4096, &k)) return 2;
            ro.concurrency = (int)k;
        } else if (strcmp(a, "--step-tokens") == 0) {
            if (!cli_parse_int(a, v, 2, 1 << 16, &k)) return 2;
            ro.step_tokens = (int)k;
        } else if (strcmp(a, "--prefill-tokens") == 0) {
            if (!cli_parse_int(a, v, 2, 1 << 16, &k)) return 2;
            ro.prefill_tokens = (int)k;
        } else if (strcmp(a, "--kv-budget") == 0) {
            if (!cli_parse_int(a, v, 1, 1 << 20, &k)) return 2;
            ro.kv_budget = (size_t)k << 20;
        }
    }
    if (ce.calibration && compare) return cli_error("run: --calibration runs its one setting (not with --compare)"), 2;
    if (!cli_engine_opts_calibrate(&ce)) return 2;
    ro.eo = ce.eo, ro.dopt = ce.dopt, ro.tpl = ce.tpl, ro.pool_bytes = ce.pool_bytes;
    const char *sharing = ce.sharing;
    if (!ro.model || !ro.requests) {
        cli_error("run: --model and --requests are required (see --help)");
        return 2;
    }
    if (ro.resume && !ro.out) return cli_error("run: --resume needs --out"), 2;
    if (!run_files_distinct(&ro)) return 2;
    if (ro.concurrency && (compare || ro.plan_in))
        return cli_error("run: --concurrency replays one sharing mode's own decisions (not with --compare or --plan-in)"), 2;
    if (!ro.step_tokens) /* not given: the prefill chunk, above the decoders */
        ro.step_tokens = ro.concurrency < CP_BATCH_PREFILL_TOKENS ? CP_BATCH_PREFILL_TOKENS : ro.concurrency + CP_BATCH_STEP_TOKENS_CPU;
    if (ro.concurrency && ro.step_tokens <= ro.concurrency)
        return cli_error("run: --step-tokens %d must exceed --concurrency %d (each request in flight decodes one a step)", ro.step_tokens,
                         ro.concurrency), 2;
    char *mode_buf;
    if ((ro.n_modes = cli_parse_modes(compare ? "--compare" : "--sharing", compare ? compare : sharing, ro.modes, 8, &mode_buf)) < 0)
        return 2;
    /* before --out is touched (its half-written last line is cut below) */
    if (ro.resume && ro.n_modes > 1) return free(mode_buf), cli_error("run: --resume works with one sharing mode"), 2;
    if (ce.tier && (ro.n_modes > 1 || ro.plan_in))
        return free(mode_buf), cli_error("run: --tier serves one sharing mode (not with --compare or --plan-in)"), 2;
    ro.eo.mask_pad = ro.dopt.mask_pad;
    int rcode = 1;
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cp_model *m = NULL;
    cp_tokenizer *tok = NULL;
    cp_detect_chain chain;
    int have_chain = 0;
    jline *lines = NULL, *plans = NULL;
    size_t n_lines = 0, n_plans = 0, skip = 0;
    FILE *out = NULL, *plan_out = NULL;
    mode_stats st[8];
    memset(st, 0, sizeof st);
    if (!cli_make_backend("cpu", &be)) goto done;
    cp_load_opts lo = { .dtype = ce.dtype };
    if (cp_model_load(ro.model, be, &lo, &m, &err) || cp_tokenizer_load(ro.model, &tok, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_print_compute(be, stderr);
    if (!cli_calibration_matches(&ce, m)) goto done;
    if (!cli_tier_open(&ce, m, be, &ro.tier)) goto done;
    if (ro.tpl ? cp_template_from_name(ro.tpl, &ro.eo.tpl, &err) : cp_template_detect(tok, &ro.eo.tpl, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    if (!cli_make_chain(&chain, &ro.dopt)) goto done;
    have_chain = 1;
    if (!(lines = run_read_lines(ro.requests, &n_lines, &err))) {
        cli_error("%s", err.msg);
        goto done;
    }
    if (ro.plan_in && !(plans = run_read_lines(ro.plan_in, &n_plans, &err))) {
        cli_error("%s", err.msg);
        goto done;
    }
    if (plans && n_plans != n_lines) {
        cli_error("--plan-in has %zu plans for %zu requests", n_plans, n_lines);
        goto done;
    }
    /* after the log is read (a bad path costs no calibration); without a calibration file or the knobs it sets: this model's own (cli_calib_default.h) */
    int cacheprune_mode = 0; /* a side-by-side run's cacheprune row is what `run` alone would run: the same calibration */
    for (int i = 0; i < ro.n_modes; i++) cacheprune_mode |= strcmp(ro.modes[i], "cacheprune") == 0;
    if (!cli_calib_default(&ce, cacheprune_mode && !ro.plan_in, m, tok, &chain, &ro.eo, ro.progress)) goto done;
    for (int i = 0; i < ro.n_modes && ro.eo.sharing == CP_SHARE_TENANT_PREFIX; i++) /* a budget no setting met */
        if (strcmp(ro.modes[i], "cacheprune") == 0) ro.modes[i] = "tenant-prefix";
    if (ro.out) {
        if (ro.resume) skip = run_resume_skip(ro.out); /* whole lines already written are kept */
        out = fopen(ro.out, ro.resume ? "a" : "w");
        if (!out) {
            cli_error("%s: cannot write", ro.out);
            goto done;
        }
    }
    if (ro.plan_out && !(plan_out = fopen(ro.plan_out, "w"))) {
        cli_error("%s: cannot write", ro.plan_out);
        goto done;
    }
    int have_ref = 0;
    for (int i = 0; i < ro.n_modes; i++) have_ref |= strcmp(ro.modes[i], "none") == 0;
    have_ref = have_ref && ro.n_modes > 1 && !plans;
    if (have_ref) /* none first, so the others can be compared with it */
        for (int i = 0; i < ro.n_modes; i++)
            if (strcmp(ro.modes[i], "none") == 0) {
                const char *t = ro.modes[0];
                ro.modes[0] = ro.modes[i], ro.modes[i] = t;
            }
    if (ro.resume && skip)
        fprintf(stderr, "resuming after %zu result lines: those requests are not run again (the pool starts cold; the summary "
                        "covers the %zu that run now)\n", skip, skip < n_lines ? n_lines - skip : 0);
    if (ro.concurrency ? !run_batched(&ro, m, tok, &chain, lines, n_lines, skip, out, plan_out, st)
                       : !run_modes(&ro, m, tok, &chain, lines, n_lines, plans, skip, out, plan_out, have_ref, st))
        goto done;
    size_t rss = peak_rss_bytes();
    run_print_table(st, ro.n_modes, have_ref, rss);
    if (ro.stages) run_print_stages(stderr, st, ro.n_modes);
    if (ro.summary_json && !run_write_summary_json(ro.summary_json, st, ro.n_modes, have_ref, rss)) {
        cli_error("--summary-json: cannot write %s", ro.summary_json);
        goto done;
    }
    if (ro.plot) run_plot(ro.plot, st, ro.n_modes);
    /* every good line ran; a bad one still fails the command, so a script sees it */
    int failed = 0;
    for (int i = 0; i < ro.n_modes; i++) failed = st[i].errors > failed ? st[i].errors : failed;
    if (failed) cli_error("run: %d request line%s failed (each named above)", failed, failed == 1 ? "" : "s");
    rcode = failed ? 1 : 0;
done:
    for (int i = 0; i < 8; i++) free(st[i].ttft);
    run_free_lines(lines, n_lines), run_free_lines(plans, n_plans);
    free(mode_buf);
    cli_tier_close(ro.tier); /* its pending writes drained (bounded) first */
    if (out) fclose(out);
    if (plan_out) fclose(plan_out);
    if (have_chain) cp_chain_free(&chain);
    cp_tokenizer_free(tok);
    cp_model_free(m);
    cp_backend_destroy(be);
    return rcode;
}
