/* `run`'s files: the request log and --plan-in read as lines, a result
 * line per request (--out) and a plan line per request (--plan-out)
 * written, --resume's cut of a half-written --out, and the check that no
 * output overwrites an input or another output. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../kernels/fileio.h"
#include "cli_run_internal.h"

void run_free_lines(jline *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) free(v[i].text);
    free(v);
}

jline *run_read_lines(const char *path, size_t *n, cp_error *err)
{
    char *text;
    size_t len, cap = 64, lineno = 0;
    *n = 0;
    if (cp_read_file(path, (size_t)1 << 30, &text, &len, err)) return NULL;
    jline *v = cp_malloc(cap * sizeof *v, "request lines", err);
    for (char *p = text, *nl; v && p < text + len; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl) nl = text + len;
        lineno++;
        size_t l = (size_t)(nl - p);
        while (l && (p[l - 1] == '\r' || p[l - 1] == ' ' || p[l - 1] == '\t')) l--;
        if (l == 0) continue; /* blank lines are not requests */
        if (*n == cap) {
            jline *w = realloc(v, (cap *= 2) * sizeof *v);
            if (!w) {
                cp_fail(err, CP_ENOMEM, "%s: out of memory at line %zu", path, lineno);
                run_free_lines(v, *n), v = NULL;
                break;
            }
            v = w;
        }
        char *copy = cp_malloc(l + 1, "request line", err);
        if (!copy) {
            run_free_lines(v, *n), v = NULL;
            break;
        }
        memcpy(copy, p, l);
        copy[l] = 0;
        v[(*n)++] = (jline){ copy, l, lineno };
    }
    free(text);
    if (!v) *n = 0;
    return v;
}

void run_write_result(FILE *out, const run_opts *ro, const mode_run *mr, const jline *line, cp_status rc,
                      const cp_response *resp, const cp_error *err)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    cJSON_AddNumberToObject(o, "line", (double)line->lineno);
    if (ro->n_modes > 1) cJSON_AddStringToObject(o, "mode", mr->name);
    cp_response view;
    cp_response_tenant_view(resp, ro->eo.report_reuse, &view);
    if (rc == CP_OK) {
        cJSON_AddStringToObject(o, "text", resp->text ? resp->text : "");
        cJSON_AddNumberToObject(o, "ttft_ms", round(resp->ttft_ms * 1000) / 1000);
        cJSON_AddNumberToObject(o, "prompt_tokens", view.prompt_tokens);
        cJSON_AddNumberToObject(o, "computed", view.computed);
        cJSON_AddNumberToObject(o, "reused", view.reused);
        cJSON_AddNumberToObject(o, "recomputed", view.recomputed);
        cJSON_AddNumberToObject(o, "segments_hit", view.segments_hit);
        /* where its time went (cp_stage): those before first_token add up to ttft_ms */
        cJSON *sg = cJSON_AddObjectToObject(o, "stage_ms");
        for (int k = 0; sg && k < CP_STAGE_N; k++) cJSON_AddNumberToObject(sg, cp_stage_name(k), round(resp->stage_ms[k] * 1000) / 1000);
        cJSON_AddNullToObject(o, "error");
    } else {
        cJSON_AddStringToObject(o, "error", err->msg);
    }
    char *s = cJSON_PrintUnformatted(o);
    if (s) fprintf(out, "%s\n", s), fflush(out);
    free(s);
    cJSON_Delete(o);
}

void run_write_plan(FILE *plan_out, const cp_response *resp)
{
    cJSON *o = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(o, "ids");
    char *p = malloc((size_t)resp->prompt_tokens + 1), *sg = malloc((size_t)resp->prompt_tokens + 1);
    for (int k = 0; ids && k < resp->prompt_tokens; k++) {
        uint8_t code = resp->plan[k] | (resp->plan_flags ? resp->plan_flags[k] : 0);
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(resp->prompt_ids[k]));
        if (p) p[k] = "FRC"[code & CP_PLAN_STATE];
        /* the segments and exact tokens, so a replay's method spends what this request's did */
        if (sg) sg[k] = code & CP_PLAN_EXACT ? 'X' : code & CP_PLAN_SEG_START ? 'S' : (code & CP_PLAN_STATE) ? '-' : '.';
    }
    if (p) p[resp->prompt_tokens] = 0, cJSON_AddStringToObject(o, "plan", p);
    if (sg) sg[resp->prompt_tokens] = 0, cJSON_AddStringToObject(o, "segs", sg);
    char *s = p && sg && ids ? cJSON_PrintUnformatted(o) : NULL;
    if (s) fprintf(plan_out, "%s\n", s);
    else cli_error("--plan-out: out of memory writing a plan");
    free(s), free(p), free(sg);
    cJSON_Delete(o);
}

/* No output of run overwrites an input or another output (--out equal to
 * --requests destroyed the log; --plan-out X --out X interleaved both). */
int run_files_distinct(const run_opts *ro)
{
    char dat[4096], gp[4096];
    if (ro->plot) snprintf(dat, sizeof dat, "%s.dat", ro->plot), snprintf(gp, sizeof gp, "%s.gp", ro->plot);
    cli_path outs[] = { { "--out", ro->out }, { "--plan-out", ro->plan_out }, { "--summary-json", ro->summary_json },
                        { "--plot", ro->plot }, { "--plot", ro->plot ? dat : NULL }, { "--plot", ro->plot ? gp : NULL } };
    cli_path ins[3 + 8] = { { "--requests", ro->requests }, { "--plan-in", ro->plan_in },
                            { "--plugin-config", ro->dopt.plugin_config } };
    int n_in = 3;
    for (int i = 0; i < ro->dopt.n_rules && i < 8; i++) ins[n_in++] = (cli_path){ "--rules", ro->dopt.rules[i] };
    return cli_outputs_distinct("run", outs, (int)(sizeof outs / sizeof *outs), ins, n_in, ro->model);
}

size_t run_resume_skip(const char *path)
{
    char *prev = NULL;
    size_t plen = 0, skip = 0;
    cp_error e2;
    if (cp_read_file(path, (size_t)1 << 30, &prev, &plen, &e2) == CP_OK) {
        size_t keep = 0;
        for (size_t i = 0; i < plen; i++)
            if (prev[i] == '\n') skip++, keep = i + 1;
        if (truncate(path, (off_t)keep) != 0) skip = 0; /* drop a half-written last line */
        free(prev);
    }
    return skip;
}
