/* run --concurrency N: the log through the batching scheduler, N requests
 * in flight, one sharing mode, results written in line order. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../kernels/clock.h"
#include "../../kernels/log.h"
#include "../json_fields.h"
#include "../run_lines.h"
#include "../batch/batcher.h"
#include "cli_run_internal.h"

/* One request line in flight (or done, waiting for its turn to be written). */
typedef struct flight {
    cJSON *j;
    cp_request req;
    cp_request_msg *msgs;
    cp_span *spans;
    cp_response resp;
    cp_status rc;
    cp_error err;
    int done;
} flight;

static void flight_free(flight *f)
{
    cp_response_free(&f->resp);
    free(f->msgs), free(f->spans);
    cJSON_Delete(f->j);
    memset(f, 0, sizeof *f);
}

static void flight_done(void *ctx, void *user, cp_status rc, const cp_error *err)
{
    (void)ctx;
    flight *f = user;
    f->rc = rc;
    if (rc) f->err = *err;
    f->done = 1;
}

/* Parses line li and submits it; a line that cannot run is done at once, with its error. */
static void flight_start(const run_opts *ro, mode_run *mr, cp_batcher *b, const jline *line, flight *f)
{
    char why[512] = "";
    memset(f, 0, sizeof *f);
    if ((f->rc = cp_json_parse_strict(line->text, line->len, &f->j, &f->err))) {
        cp_fail_wrap(&f->err, "request line %zu", line->lineno);
    } else if (!cp_run_request_parse(f->j, mr->ten, ro->default_max_tokens, &f->req, &f->msgs, &f->spans, why, sizeof why)) {
        f->rc = cp_fail(&f->err, CP_EFORMAT, "request line %zu: %s", line->lineno, why);
    } else if (run_bind_tier_tenant(ro, f->j, f->req.tenant), (f->rc = cp_batcher_submit(b, &f->req, &f->resp, f, NULL, &f->err)) == CP_OK) {
        return; /* in flight */
    }
    f->done = 1;
}

int run_batched(const run_opts *ro, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, jline *lines, size_t n_lines,
                size_t skip, FILE *out, FILE *plan_out, mode_stats *st_out)
{
    mode_run mr;
    cp_error err = { 0 };
    if (!run_mode_open(ro, m, tok, chain, ro->modes[0], 0, ro->pool_bytes, n_lines, &mr)) return 0;
    if (skip < n_lines) run_warm_up(ro, m, tok, chain, &lines[skip]);
    cp_batcher_opts bo = { .max_running = ro->concurrency, .step_tokens = ro->step_tokens, .prefill_tokens = ro->prefill_tokens,
                           .kv_bytes = ro->kv_budget };
    cp_batcher *b = NULL;
    flight *fl = calloc(n_lines + 1, sizeof *fl);
    int ok = fl && cp_batcher_create(mr.e, &bo, &b, &err) == CP_OK;
    if (!ok) cli_error("%s", fl ? err.msg : "run: out of memory");
    size_t next = skip, written = skip, steps = 0, out_tokens = 0;
    double t0 = cp_now_ms();
    while (ok && written < n_lines) {
        while (next < n_lines && cp_batcher_pending(b) < (size_t)ro->concurrency) flight_start(ro, &mr, b, &lines[next], &fl[next]), next++;
        if (cp_batcher_pending(b)) {
            if (cp_batcher_step(b, flight_done, NULL, &err)) {
                cli_error("run: %s", err.msg);
                ok = 0;
            }
            steps++;
        }
        for (; written < n_lines && written < next && fl[written].done; written++) { /* in line order */
            flight *f = &fl[written];
            if (f->rc == CP_OK) run_count_result(&mr.st, &f->resp, 0), out_tokens += f->resp.n_ids;
            else {
                if (strncmp(f->err.msg, "request line ", 13) != 0) cp_fail_wrap(&f->err, "request line %zu", lines[written].lineno);
                mr.st.errors++, run_line_failed(ro, &mr, &f->err);
            }
            if (out) run_write_result(out, ro, &mr, &lines[written], f->rc, &f->resp, &f->err);
            if (plan_out && f->rc == CP_OK && f->resp.plan) run_write_plan(plan_out, &f->resp);
            cp_debug("request line %zu tenant %u: %d prompt tokens, %d computed, %d reused, ttft %.1f ms%s", lines[written].lineno,
                     f->req.tenant, f->resp.prompt_tokens, f->resp.computed, f->resp.reused, f->resp.ttft_ms, f->rc ? " (error)" : "");
            flight_free(f);
            if (ro->progress && (isatty(2) || (written + 1) % 25 == 0 || written + 1 == n_lines))
                fprintf(stderr, "\r[%s, %d in flight] %zu/%zu requests%s", ro->modes[0], ro->concurrency, written + 1, n_lines,
                        written + 1 == n_lines ? "\n" : ""), fflush(stderr);
        }
    }
    double secs = (cp_now_ms() - t0) / 1e3;
    if (ok)
        printf("batched: %d in flight, %d tokens a step: %zu steps, %zu output tokens in %.2f s = %.1f output tokens/s\n",
               ro->concurrency, ro->step_tokens, steps, out_tokens, secs, secs > 0 ? out_tokens / secs : 0.0);
    cp_batcher_free(b);
    for (size_t i = 0; fl && i < n_lines; i++) flight_free(&fl[i]);
    free(fl);
    if (mr.pool) {
        cp_pool_stats ps;
        cp_pool_stats_get(mr.pool, &ps);
        mr.st.pool_bytes = ps.bytes_used;
    }
    st_out[0] = mr.st;
    mr.st.ttft = NULL;
    run_mode_close(&mr);
    return ok;
}
