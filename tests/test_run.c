/* cacheprune run and workload as an operator uses them: JSONL round trips
 * with errors in place, resume without loss or duplicates, deterministic
 * presets that fit the context, and plan replay. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../tokenizer/chat.h"
#include "helpers.h"

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void)
{
    const char *b = getenv("CP_BIN");
    return b && *b ? b : "build/cacheprune";
}

static char **lines_of(const char *path, int *n)
{
    size_t len;
    char *t = read_text(path, &len);
    cr_assert(t, "cannot read %s", path);
    char **v = calloc(1024, sizeof *v);
    *n = 0;
    for (char *p = strtok(t, "\n"); p && *n < 1024; p = strtok(NULL, "\n")) v[(*n)++] = strdup(p);
    free(t);
    return v;
}

static void write_log(const char *path, int n_good)
{
    FILE *f = fopen(path, "w");
    for (int i = 0; i < n_good; i++) {
        fprintf(f, "{\"tenant\":\"t%d\",\"messages\":[{\"role\":\"document\",\"content\":\"The quick brown fox jumps over the lazy "
                   "dog near the river bank every single morning before breakfast.\"},{\"role\":\"user\",\"content\":\"What "
                   "does the fox do, question %d?\"}],\"max_tokens\":3}\n",
                i % 3, i);
        if (i == 1) fprintf(f, "{\"tenant\":\"t9\",\"messages\":[]}\n");
        if (i == 3) fprintf(f, "this is not json\n");
    }
    fclose(f);
}

Test(run, jsonl_round_trip_and_resume, .timeout = 120)
{
    char dir[512], log[600], out[600], model[512];
    test_tmpdir(dir, sizeof dir, "run");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    write_log(log, 6); /* 8 lines, two of them bad */
    cr_assert_eq(sh("%s run --quiet-progress --model %s --requests %s --out %s > /dev/null 2>&1", bin(), model, log, out), 0);
    int n;
    char **v = lines_of(out, &n);
    cr_assert_eq(n, 8, "one result line per request line");
    for (int i = 0; i < n; i++) {
        cJSON *j = cJSON_Parse(v[i]);
        cr_assert(j, "result line %d is not JSON", i + 1);
        cr_assert_eq((int)cJSON_GetObjectItem(j, "line")->valuedouble, i + 1, "results in order");
        const cJSON *e = cJSON_GetObjectItem(j, "error");
        int bad = i == 2 || i == 5;
        cr_assert(bad ? cJSON_IsString(e) : cJSON_IsNull(e), "line %d: error is %s", i + 1, bad ? "missing" : "unexpected");
        if (!bad) cr_assert(cJSON_IsString(cJSON_GetObjectItem(j, "text")));
        cJSON_Delete(j);
        free(v[i]);
    }
    free(v);
    /* an interrupted run: three whole lines and half of the fourth */
    char *all = read_text(out, NULL), *p = all;
    for (int k = 0; k < 3; k++) p = strchr(p, '\n') + 1;
    FILE *f = fopen(out, "w");
    fwrite(all, 1, (size_t)(p - all) + 10, f);
    fclose(f);
    free(all);
    cr_assert_eq(sh("%s run --quiet-progress --resume --model %s --requests %s --out %s > /dev/null 2>&1", bin(), model, log, out), 0);
    v = lines_of(out, &n);
    cr_assert_eq(n, 8, "after resume: %d lines, want 8", n);
    for (int i = 0; i < n; i++) {
        cJSON *j = cJSON_Parse(v[i]);
        cr_assert(j, "line %d broken after resume", i + 1);
        cr_assert_eq((int)cJSON_GetObjectItem(j, "line")->valuedouble, i + 1, "nothing lost or duplicated");
        cJSON_Delete(j);
        free(v[i]);
    }
    free(v);
}

Test(run, presets_are_deterministic_and_fit, .timeout = 120)
{
    char dir[512], a[600], b[600];
    test_tmpdir(dir, sizeof dir, "presets");
    cp_tokenizer *tok = open_tokenizer_or_die("models/cp-books-6m");
    const char *presets[] = { "rag-v1", "chat-v1", "meetings-v1" };
    for (int k = 0; k < 3; k++) {
        snprintf(a, sizeof a, "%s/%s-a.jsonl", dir, presets[k]);
        snprintf(b, sizeof b, "%s/%s-b.jsonl", dir, presets[k]);
        cr_assert_eq(sh("%s workload --preset %s --seed 7 --out %s 2>/dev/null", bin(), presets[k], a), 0);
        cr_assert_eq(sh("%s workload --preset %s --seed 7 --out %s 2>/dev/null", bin(), presets[k], b), 0);
        size_t la, lb;
        char *ta = read_text(a, &la), *tb = read_text(b, &lb);
        cr_assert(la == lb && memcmp(ta, tb, la) == 0, "%s is not deterministic for a seed", presets[k]);
        free(ta), free(tb);
        int n;
        char **v = lines_of(a, &n);
        cr_assert_eq(n, 150);
        for (int i = 0; i < n; i++) {
            cJSON *j = cJSON_Parse(v[i]);
            const cJSON *ms = cJSON_GetObjectItem(j, "messages");
            cp_message m[64];
            int nm = 0;
            for (const cJSON *x = ms->child; x && nm < 64; x = x->next, nm++) {
                cp_error err;
                cr_assert_eq(cp_role_from_name(cJSON_GetObjectItem(x, "role")->valuestring, &m[nm].role, &err), CP_OK);
                m[nm].text = cJSON_GetObjectItem(x, "content")->valuestring;
                m[nm].len = strlen(m[nm].text);
            }
            cp_prompt p;
            cp_error err;
            cr_assert_eq(cp_chat_render(tok, CP_TPL_PLAIN, m, (size_t)nm, 1, &p, &err), CP_OK, "%s", err.msg);
            cr_assert_leq(p.enc.n + 16, 1024, "%s line %d: %zu tokens", presets[k], i + 1, p.enc.n);
            cp_prompt_free(&p);
            cJSON_Delete(j);
            free(v[i]);
        }
        free(v);
    }
    cr_assert_neq(sh("%s workload --preset nope --out %s/x 2>/dev/null", bin(), dir), 0);
    cp_tokenizer_free(tok);
}

static long sum_field(const char *path, const char *field)
{
    int n;
    char **v = lines_of(path, &n);
    long s = 0;
    for (int i = 0; i < n; i++) {
        cJSON *j = cJSON_Parse(v[i]);
        const cJSON *x = cJSON_GetObjectItem(j, field);
        s += cJSON_IsNumber(x) ? (long)x->valuedouble : 0;
        cJSON_Delete(j);
        free(v[i]);
    }
    free(v);
    return s;
}

Test(run, plan_replay, .timeout = 120)
{
    char dir[512], log[600], out[600], plan[600], out2[600], model[512];
    test_tmpdir(dir, sizeof dir, "replay");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    snprintf(out2, sizeof out2, "%s/out2.jsonl", dir);
    snprintf(plan, sizeof plan, "%s/plan.jsonl", dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    cr_assert_eq(sh("%s workload --preset rag-v1 --requests 12 --seed 3 --out %s 2>/dev/null", bin(), log), 0);
    /* a none plan replays as none: everything computed */
    cr_assert_eq(sh("%s run --quiet-progress --model %s --requests %s --sharing none --plan-out %s --out %s >/dev/null 2>&1",
                    bin(), model, log, plan, out), 0);
    cr_assert_eq(sh("%s run --quiet-progress --model %s --requests %s --plan-in %s --report-reuse --out %s >/dev/null 2>&1", bin(),
                    model, log, plan, out2), 0);
    cr_assert_eq(sum_field(out2, "computed"), sum_field(out, "prompt_tokens"));
    cr_assert_eq(sum_field(out2, "reused"), 0);
    /* a cacheprune plan replays computing exactly the planned tokens */
    cr_assert_eq(sh("%s run --quiet-progress --model %s --requests %s --report-reuse --plan-out %s --out %s >/dev/null 2>&1", bin(),
                    model, log, plan, out), 0);
    cr_assert_eq(sh("%s run --quiet-progress --model %s --requests %s --plan-in %s --report-reuse --out %s >/dev/null 2>&1", bin(),
                    model, log, plan, out2), 0);
    long planned_fresh = 0, planned_reused = 0;
    int n;
    char **v = lines_of(plan, &n);
    cr_assert_eq(n, 12);
    for (int i = 0; i < n; i++) {
        cJSON *j = cJSON_Parse(v[i]);
        const char *p = cJSON_GetObjectItem(j, "plan")->valuestring;
        size_t L = strlen(p);
        for (size_t k = 0; k < L; k++) planned_reused += p[k] == 'R' && k + 1 < L, planned_fresh += p[k] != 'R' || k + 1 == L;
        cJSON_Delete(j);
        free(v[i]);
    }
    free(v);
    cr_assert_gt(planned_reused, 0, "the cacheprune plan reused nothing");
    cr_assert_eq(sum_field(out2, "computed"), planned_fresh);
    cr_assert_eq(sum_field(out2, "reused"), planned_reused);
    cr_assert_eq(sum_field(out2, "computed"), sum_field(out, "computed"));
}
