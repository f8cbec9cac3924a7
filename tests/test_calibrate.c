/* cacheprune calibrate and run --calibration: the file calibrate writes is
 * read back and applied (the run computes exactly what calibrate measured
 * for the chosen setting); a budget no setting meets falls back to
 * prefix-only reuse; the file is read strictly. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static char *passage(int which, size_t want) { return test_passage(which, want, 3, 997); }

/* one request line: documents `docs` (indices into d) then a question */
static void request_line(FILE *f, const char *tenant, char **d, const int *docs, int n, const char *q)
{
    cJSON *o = cJSON_CreateObject(), *ms = cJSON_AddArrayToObject(o, "messages");
    cJSON_AddStringToObject(o, "tenant", tenant);
    for (int i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "document");
        cJSON_AddStringToObject(m, "content", d[docs[i]]);
        cJSON_AddItemToArray(ms, m);
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", q);
    cJSON_AddItemToArray(ms, u);
    cJSON_AddNumberToObject(o, "max_tokens", 16); /* 4 tokens agreed exactly under every setting */
    char *s = cJSON_PrintUnformatted(o);
    fprintf(f, "%s\n", s);
    free(s);
    cJSON_Delete(o);
}

/* Four requests; the passages come back after other documents, so their
 * stored KV lost context and reuse is not exact. */
static void small_log(const char *path)
{
    char *d[2] = { passage(0, 700), passage(1, 500) };
    FILE *f = fopen(path, "w");
    cr_assert(f);
    int a[1] = { 0 }, b[2] = { 1, 0 }, c[2] = { 0, 1 };
    request_line(f, "t1", d, a, 1, "What happened next?");
    request_line(f, "t2", d, b, 2, "Who spoke first?");
    request_line(f, "t3", d, c, 2, "Where were they?");
    request_line(f, "t4", d, b, 2, "Why did it end?");
    fclose(f);
    free(d[0]), free(d[1]);
}

static cJSON *read_json(const char *path)
{
    size_t len;
    char *t = read_text(path, &len);
    cr_assert(t, "cannot read %s", path);
    cJSON *j = cJSON_Parse(t);
    free(t);
    cr_assert(j, "%s is not JSON", path);
    return j;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsNumber(v), "no number '%s'", k);
    return v->valuedouble;
}

typedef struct paths {
    char dir[512], log[600], cal[600], sum[600], model[512];
} paths;

static void paths_make(paths *p, const char *name)
{
    test_tmpdir(p->dir, sizeof p->dir, name);
    snprintf(p->log, sizeof p->log, "%s/log.jsonl", p->dir);
    snprintf(p->cal, sizeof p->cal, "%s/cal.json", p->dir);
    snprintf(p->sum, sizeof p->sum, "%s/sum.json", p->dir);
    shared_path(p->model, sizeof p->model, "models/cp-books-6m");
    small_log(p->log);
}

Test(calibrate, the_chosen_setting_is_the_one_run_uses, .timeout = TEST_TIMEOUT(180))
{
    paths p;
    paths_make(&p, "calibrate-apply");
    char args[4096], out[16384];
    /* every setting meets a budget this loose: the cheapest is chosen */
    snprintf(args, sizeof args,
             "calibrate --quiet-progress --model %s --requests %s --out %s --methods gradual,attention --ratios 0.5,1 "
             "--segment-kvs in-context --kl-budget 100 --greedy-min 0",
             p.model, p.log, p.cal);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cJSON *cal = read_json(p.cal);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cal, "meets_budget")));
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(cal, "setting"), *meas = cJSON_GetObjectItemCaseSensitive(cal, "measured");
    cr_assert(cJSON_IsObject(set) && cJSON_IsObject(meas));
    double r = num(set, "recompute"), want_compute = num(meas, "compute_tokens");
    const char *by = cJSON_GetObjectItemCaseSensitive(set, "recompute_by")->valuestring;
    /* R = 1 recomputes everything reused: never the cheapest when R 0.5 is there */
    cr_assert(r == 0.5, "the cheapest setting has R %g", r);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --calibration %s --summary-json %s", p.model, p.log, p.cal,
             p.sum);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    char said[128];
    snprintf(said, sizeof said, "recompute by %s, R 0.5", by);
    cr_assert(strstr(out, said), "run does not say it runs the calibrated setting (%s): %s", said, out);
    cJSON *sum = read_json(p.sum);
    const cJSON *mode = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sum, "modes"), 0);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(mode, "mode")->valuestring, "cacheprune");
    /* the same log, model and setting: the same tokens computed, selection included */
    cr_assert_eq(num(mode, "compute_tokens"), want_compute, "run computed %g, calibrate measured %g for the chosen setting",
                 num(mode, "compute_tokens"), want_compute);
    cr_assert_gt(num(mode, "reused_tokens"), 0, "nothing reused: the test proves nothing");
    cJSON_Delete(cal), cJSON_Delete(sum);
}

Test(calibrate, an_unmet_budget_falls_back_to_prefix_only, .timeout = TEST_TIMEOUT(180))
{
    paths p;
    paths_make(&p, "calibrate-fallback");
    char args[4096], out[16384];
    /* exact quality with R < 1 across contexts: no setting meets it, by
     * KL alone (greedy unbounded), by greedy agreement alone, nor by
     * ROUGE-L alone */
    const char *budgets[3] = { "--kl-budget 0 --greedy-min 0", "--kl-budget 100 --greedy-min 1",
                               "--kl-budget 100 --greedy-min 0 --rouge-min 1" };
    cJSON *cal = NULL;
    for (int b = 0; b < 3; b++) {
        snprintf(args, sizeof args,
                 "calibrate --quiet-progress --model %s --requests %s --out %s --methods attention --ratios 0.15 --segment-kvs "
                 "in-context %s",
                 p.model, p.log, p.cal, budgets[b]);
        cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
        cJSON_Delete(cal);
        cal = read_json(p.cal);
        cr_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cal, "meets_budget")), "an exact budget (%s) was met", budgets[b]);
    }
    cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cal, "setting")));
    cr_assert_eq(num(cal, "rouge_min"), 1, "the file does not record the ROUGE-L bound it was asked for");
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --calibration %s --summary-json %s", p.model, p.log, p.cal,
             p.sum);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "prefix-only"), "run does not say it fell back: %s", out);
    cr_assert(strstr(out, "ROUGE-L >= 1.000"), "run does not name the ROUGE-L bound that was not met: %s", out);
    cJSON *sum = read_json(p.sum);
    const cJSON *mode = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sum, "modes"), 0);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(mode, "mode")->valuestring, "tenant-prefix");
    /* four tenants, none repeating: an exact per-tenant prefix has nothing to hit */
    cr_assert_eq(num(mode, "reused_tokens"), 0);
    cJSON_Delete(cal), cJSON_Delete(sum);
}

/* A calibrated request-time knob (extra: the calibrate options setting it,
 * key / value: the file's field) is written and applied: at R 0 the knob is
 * all that is recomputed, so run computes what calibrate measured only with
 * it applied (and more than the same setting without it). */
static void knob_is_applied(const char *name, const char *extra, const char *key, double value)
{
    paths p;
    paths_make(&p, name);
    char args[4096], out[16384];
    snprintf(args, sizeof args,
             "calibrate --quiet-progress --model %s --requests %s --out %s --methods gradual --ratios 0 %s "
             "--segment-kvs in-context --kl-budget 100 --greedy-min 0",
             p.model, p.log, p.cal, extra);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cJSON *cal = read_json(p.cal);
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(cal, "setting"), *meas = cJSON_GetObjectItemCaseSensitive(cal, "measured");
    cr_assert(cJSON_IsObject(set) && cJSON_IsObject(meas));
    cr_assert_eq(num(set, key), value, "the file's %s is %g, not %g", key, num(set, key), value);
    double want_compute = num(meas, "compute_tokens");
    double got[2];
    for (int way = 0; way < 2; way++) { /* 0: the calibration; 1: the same setting by hand, without the knob */
        if (way == 0)
            snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --calibration %s --summary-json %s", p.model, p.log,
                     p.cal, p.sum);
        else
            snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --recompute-by gradual --recompute 0 --summary-json %s",
                     p.model, p.log, p.sum);
        cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
        cJSON *sum = read_json(p.sum);
        got[way] = num(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sum, "modes"), 0), "compute_tokens");
        cJSON_Delete(sum);
    }
    cr_assert_eq(got[0], want_compute, "run computed %g, calibrate measured %g with %s", got[0], want_compute, extra);
    cr_assert_gt(got[0], got[1], "%s recomputed nothing (%g against %g without it)", extra, got[0], got[1]);
    cJSON_Delete(cal);
}

Test(calibrate, a_calibrated_tail_is_applied, .timeout = TEST_TIMEOUT(180)) { knob_is_applied("calibrate-tail", "--tails 24", "tail", 24); }

Test(calibrate, a_calibrated_per_segment_R_is_applied, .timeout = TEST_TIMEOUT(180))
{
    knob_is_applied("calibrate-per-segment", "--recompute-per-segment 0.25", "per_segment", 0.25);
}

/* the file is read strictly: an unknown field, a setting with a field
 * missing, a file for another model, or a calibrated option given too */
Test(calibrate, the_file_is_read_strictly, .timeout = TEST_TIMEOUT(60))
{
    char dir[512], cal[600], log[600], model[512], args[4096], out[8192];
    test_tmpdir(dir, sizeof dir, "calibrate-strict");
    snprintf(cal, sizeof cal, "%s/cal.json", dir);
    snprintf(log, sizeof log, "%s/log.jsonl", dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    FILE *f = fopen(log, "w");
    fputs("{\"tenant\":\"a\",\"prompt\":\"hello there\",\"max_tokens\":1}\n", f);
    fclose(f);
    static const char *const fp = "0000000000000000000000000000000000000000000000000000000000000000";
    struct { const char *body, *want; } cases[] = {
        { "\"meets_budget\": false, \"setting\": null, \"extra\": 1", "extra" },
        { "\"meets_budget\": true, \"setting\": {\"sharing\": \"cacheprune\", \"segment_kv\": \"in-context\", \"recompute_by\": "
          "\"gradual\", \"recompute\": 0.3, \"k0\": 2, \"tau\": 1, \"gradual_start\": 2}",
          "required" },
        { "\"meets_budget\": true, \"setting\": {\"sharing\": \"global-prefix\", \"segment_kv\": \"in-context\", \"recompute_by\": "
          "\"gradual\", \"recompute\": 0.3, \"k0\": 2, \"tau\": 1, \"gradual_start\": 2, \"deviation_layer\": 1}",
          "global-prefix" },
        { "\"meets_budget\": false, \"setting\": null", "another model" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        f = fopen(cal, "w");
        fprintf(f, "{\"format\": 1, \"model_fingerprint\": \"%s\", \"kl_budget\": 0.002, \"greedy_min\": 0.95, \"requests\": 3, %s}\n", fp,
                cases[i].body);
        fclose(f);
        snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --calibration %s", model, log, cal);
        cr_assert_neq(test_cli_output(args, out, sizeof out), 0, "case %zu ran", i);
        cr_assert(strstr(out, cases[i].want), "case %zu: the error does not name '%s': %s", i, cases[i].want, out);
    }
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --calibration %s --recompute 0.5", model, log, cal);
    cr_assert_neq(test_cli_output(args, out, sizeof out), 0, "a calibrated option given too ran");
    cr_assert(strstr(out, "give it or them"), "%s", out);
}
