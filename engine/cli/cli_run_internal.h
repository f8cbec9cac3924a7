/* `run`'s internals shared between its files (beside cli_run.h, which
 * calibrate shares too):
 *
 *   cli_run.c          the command: help, options and checks, then the log
 *                      through the sharing modes, interleaved, with quality
 *                      against `none`; calibrate's replay (run_grid)
 *   cli_run_batched.c  --concurrency: the log through the batching scheduler
 *   cli_run_io.c       the files: request and plan lines in, result and plan
 *                      lines out, --resume, outputs that overwrite no input */
#ifndef CP_CLI_RUN_INTERNAL_H
#define CP_CLI_RUN_INTERNAL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>

#include "cli.h"
#include "cli_run.h"
#include "../tenant.h"

typedef struct run_opts {
    const char *model, *requests, *out, *plan_out, *plan_in, *plot, *tpl, *summary_json;
    const char *modes[8];
    int n_modes, resume, progress, default_max_tokens, stages;
    int concurrency, step_tokens, prefill_tokens; /* --concurrency: 0 = one request at a time, through cp_engine_run */
    size_t pool_bytes, kv_budget;
    cp_engine_opts eo;
    cli_detect_opts dopt;
    cp_tier *tier; /* --tier: NULL without */
} run_opts;

/* A non-blank line of a JSONL file: its bytes (NUL bytes kept, so they are
 * seen and refused) and its physical line number (blank lines counted). */
typedef struct jline {
    char *text;
    size_t len, lineno;
} jline;

/* one sharing mode's engine, pool, tenants and figures */
typedef struct mode_run {
    const char *name;
    cp_pool *pool;
    cp_engine *e;
    cp_tenant_table *ten;
    mode_stats st;
} mode_run;

/* cli_run.c */

/* opens mode `name` (replay: for --plan-in) with a pool of pool_bytes,
 * room for n_lines results; 0 after printing an error */
int run_mode_open(const run_opts *ro, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, const char *name, int replay,
                  size_t pool_bytes, size_t n_lines, mode_run *mr);
void run_mode_close(mode_run *mr);
/* a served request into its mode's figures (replay: the plan's reuse is the hit) */
void run_count_result(mode_stats *st, const cp_response *resp, int replay);
/* a line that did not run, on stderr: its number and reason */
void run_line_failed(const run_opts *ro, const mode_run *mr, const cp_error *err);
/* the request's tenant id bytes, for the tier's private key space */
void run_bind_tier_tenant(const run_opts *ro, const cJSON *j, uint32_t tenant);
/* one throwaway request on an engine of its own, before the timed ones */
void run_warm_up(const run_opts *ro, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, const jline *line);

/* cli_run_io.c */

/* the non-blank lines of path; NULL (and *n 0) after filling err */
jline *run_read_lines(const char *path, size_t *n, cp_error *err);
void run_free_lines(jline *v, size_t n);
/* one result line of --out */
void run_write_result(FILE *out, const run_opts *ro, const mode_run *mr, const jline *line, cp_status rc,
                      const cp_response *resp, const cp_error *err);
/* one plan line of --plan-out */
void run_write_plan(FILE *plan_out, const cp_response *resp);
/* whether no output of run is an input or another output; 0 after printing an error */
int run_files_distinct(const run_opts *ro);
/* --resume: cuts a half-written last line off the --out file at path and
 * returns how many whole result lines it keeps (0 if none or unreadable) */
size_t run_resume_skip(const char *path);

/* cli_run_batched.c: --concurrency; 0 after printing an error */
int run_batched(const run_opts *ro, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, jline *lines, size_t n_lines,
                size_t skip, FILE *out, FILE *plan_out, mode_stats *st_out);

#endif
