/* run --concurrency as an operator uses it: the same log one request at a
 * time and with many in flight gives every line the same result (text,
 * error in place), in line order. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static const char *bin(void)
{
    const char *b = getenv("CP_BIN");
    return b && *b ? b : "build/cacheprune";
}

/* ten requests of different lengths, max_tokens and sampling (five documents, each asked twice in a
 * row by different tenants), two bad lines */
static void write_log(const char *path)
{
    static const char *words[] = { "river", "lantern", "orchard", "harbour", "letter", "mirror", "garden", "candle" };
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = 0; i < 10; i++) {
        fprintf(f, "{\"tenant\":\"t%d\",\"messages\":[{\"role\":\"document\",\"content\":\"", i % 3);
        int d = i / 2; /* two requests in a row on one document: the second can reuse what the first stored */
        for (int k = 0; k < 3 + (d * 7) % 19; k++) fprintf(f, "The %s stood by the %s. ", words[(d + k) % 8], words[(3 * k + d) % 8]);
        fprintf(f, "\"},{\"role\":\"user\",\"content\":\"What about the %s, question %d?\"}],\"max_tokens\":%d%s}\n", words[i % 8], i,
                1 + (i * 3) % 9, i % 4 == 3 ? ",\"temperature\":0.9,\"seed\":11" : "");
        if (i == 2) fprintf(f, "{\"tenant\":\"t9\",\"messages\":[]}\n");
        if (i == 6) fprintf(f, "not json\n");
    }
    fclose(f);
}

static cJSON **results(const char *path, int *n)
{
    size_t len;
    char *t = read_text(path, &len);
    cr_assert(t, "no results in %s", path);
    cJSON **v = calloc(64, sizeof *v);
    *n = 0;
    for (char *p = strtok(t, "\n"); p && *n < 64; p = strtok(NULL, "\n")) v[(*n)++] = cJSON_Parse(p);
    free(t);
    return v;
}

/* runs the log under one sharing mode at each concurrency; results and plans */
static void run_each(const char *dir, const char *log, const char *sharing, const char *const *conc, int n_conc, char (*out)[600],
                     char (*plans)[600])
{
    char model[512];
    shared_path(model, sizeof model, "models/cp-books-6m");
    for (int c = 0; c < n_conc; c++) {
        snprintf(out[c], sizeof out[c], "%s/%s-out%d.jsonl", dir, sharing, c);
        snprintf(plans[c], sizeof plans[c], "%s/%s-plan%d.jsonl", dir, sharing, c);
        /* the log's two bad lines fail the command (exit 1) after every good
         * one ran */
        cr_assert_eq(test_sh("%s run --quiet-progress --model %s --dtype f32 --requests %s --sharing %s --concurrency %s --step-tokens 16 --out %s "
                             "--plan-out %s > /dev/null 2>&1",
                             bin(), model, log, sharing, conc[c], out[c], plans[c]),
                     1, "run --sharing %s --concurrency %s did not exit 1 for its two bad lines", sharing, conc[c]);
    }
}

/* every line's result (error in place, text, prompt size, and with plans
 * its reuse) the same in each run, in line order */
static void expect_same_results(char (*out)[600], int n_conc, const char *const *conc, int want_lines)
{
    int n[4];
    cJSON **v[4];
    for (int c = 0; c < n_conc; c++) v[c] = results(out[c], &n[c]);
    cr_assert_eq(n[0], want_lines, "one result line per request line");
    for (int c = 1; c < n_conc; c++) {
        cr_assert_eq(n[c], n[0], "--concurrency %s: %d lines", conc[c], n[c]);
        for (int i = 0; i < n[0]; i++) {
            cJSON *a = v[0][i], *b = v[c][i];
            cr_assert(a && b);
            cr_assert_eq((int)cJSON_GetObjectItem(b, "line")->valuedouble, (int)cJSON_GetObjectItem(a, "line")->valuedouble,
                         "--concurrency %s: results out of line order", conc[c]);
            const cJSON *ea = cJSON_GetObjectItem(a, "error"), *eb = cJSON_GetObjectItem(b, "error");
            cr_assert_eq(cJSON_IsNull(ea), cJSON_IsNull(eb), "line %d: error in one run only", i + 1);
            if (!cJSON_IsNull(ea)) continue;
            cr_assert_str_eq(cJSON_GetObjectItem(b, "text")->valuestring, cJSON_GetObjectItem(a, "text")->valuestring,
                             "--concurrency %s, line %d: another text", conc[c], i + 1);
            const char *keys[] = { "prompt_tokens", "computed", "reused", "recomputed" };
            for (int k = 0; k < 4; k++)
                cr_assert_eq(cJSON_GetObjectItem(b, keys[k])->valuedouble, cJSON_GetObjectItem(a, keys[k])->valuedouble,
                             "--concurrency %s, line %d: another %s", conc[c], i + 1, keys[k]);
        }
    }
    for (int c = 0; c < n_conc; c++) {
        for (int i = 0; i < n[c]; i++) cJSON_Delete(v[c][i]);
        free(v[c]);
    }
}

/* Two --plan-out files with the same prompts and the same hits token by
 * token, and per line the same number of recomputed hits (C).  Which hits
 * are recomputed may differ: the default method ranks them by K/V
 * deviation, and a batched step's GEMM sums in another order, so stored KV
 * differs by rounding and near-ties in the ranking can flip — allowed by
 * design ("under cacheprune the plans differ").  Hits come from
 * token hashes, so they may not differ at all. */
static int same_hits(const char *a, const char *b)
{
    size_t la, lb;
    char *x = read_text(a, &la), *y = read_text(b, &lb);
    int same = x && y && la == lb;
    long cx = 0, cy = 0;
    for (size_t i = 0; same && i < la; i++) {
        cx += x[i] == 'C', cy += y[i] == 'C';
        char u = x[i] == 'C' ? 'R' : x[i], v = y[i] == 'C' ? 'R' : y[i];
        if (u != v || (x[i] == '\n' && cx != cy)) same = 0;
    }
    free(x), free(y);
    return same && cx == cy;
}

Test(batch, run_concurrency_same_results_as_one_at_a_time, .timeout = TEST_TIMEOUT(120))
{
    char dir[512], log[600], out[2][600], plans[2][600];
    test_tmpdir(dir, sizeof dir, "batch_cli");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    write_log(log);
    const char *conc[2] = { "1", "8" };
    run_each(dir, log, "none", conc, 2, out, plans);
    expect_same_results(out, 2, conc, 12);
}

/* Under cacheprune a request retrieves only after every request ahead of
 * it stored (one prefills at a time): the hits are the sequential
 * engine's token for token, so the hit rate is too, and each output is the
 * lone run's. */
Test(batch, run_concurrency_cacheprune_same_plans_as_sequential, .timeout = TEST_TIMEOUT(120))
{
    char dir[512], log[600], out[2][600], plans[2][600];
    test_tmpdir(dir, sizeof dir, "batch_cli_cp");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    write_log(log);
    const char *conc[2] = { "0", "8" };
    run_each(dir, log, "cacheprune", conc, 2, out, plans);
    expect_same_results(out, 2, conc, 12);
    cr_assert(same_hits(plans[0], plans[1]), "--plan-out: another hit, or another number recomputed, between --concurrency 0 and 8");
    size_t len;
    char *p = read_text(plans[0], &len);
    cr_assert(p && strchr(p, 'R'), "no request reused anything: the test shows nothing");
    free(p);
}

/* options that cannot work are refused before anything runs */
Test(batch, run_concurrency_refuses_what_it_cannot_do)
{
    char outb[4096], model[512];
    shared_path(model, sizeof model, "models/cp-books-6m");
    char args[1024];
    snprintf(args, sizeof args, "run --model %s --requests /dev/null --concurrency 8 --step-tokens 8", model);
    cr_assert_eq(test_cli_output(args, outb, sizeof outb), 2, "%s", outb);
    cr_assert(strstr(outb, "--step-tokens"), "%s", outb);
    snprintf(args, sizeof args, "run --model %s --requests /dev/null --concurrency 2 --compare none,cacheprune", model);
    cr_assert_eq(test_cli_output(args, outb, sizeof outb), 2, "%s", outb);
}
