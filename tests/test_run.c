/* cacheprune run and workload as an operator uses them: JSONL round trips
 * with errors in place, resume without loss or duplicates, deterministic
 * presets that fit the context, and plan replay. */
#include <cjson/cJSON.h>
#include <math.h>
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../eval/quality.h"
#include "../engine/sampler.h"
#include "../tokenizer/chat.h"
#include "helpers.h"


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

Test(run, jsonl_round_trip_and_resume, .timeout = TEST_TIMEOUT(120))
{
    char dir[512], log[600], out[600], model[512];
    test_tmpdir(dir, sizeof dir, "run");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    write_log(log, 6); /* 8 lines, two of them bad */
    /* the good lines run, and the bad ones fail the command, each named on stderr */
    char errs[700];
    snprintf(errs, sizeof errs, "%s/stderr.txt", dir);
    cr_assert_eq(test_sh("%s run --quiet-progress --model %s --requests %s --out %s > /dev/null 2> %s", bin(), model, log, out, errs), 1);
    char *et = read_text(errs, NULL);
    cr_assert(et && strstr(et, "request line 3: ") && strstr(et, "request line 6: ") && strstr(et, "2 request lines failed"), "%s",
              et ? et : "(no stderr)");
    free(et);
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
    cr_assert_eq(test_sh("%s run --quiet-progress --resume --model %s --requests %s --out %s > /dev/null 2>&1", bin(), model, log, out), 1); /* line 6 is bad */
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

Test(run, presets_are_deterministic_and_fit, .timeout = TEST_TIMEOUT(120))
{
    char dir[512], a[600], b[600];
    test_tmpdir(dir, sizeof dir, "presets");
    cp_tokenizer *tok = open_tokenizer_or_die("models/cp-books-6m");
    const char *presets[] = { "rag-v1", "chat-v1", "meetings-v1" };
    for (int k = 0; k < 3; k++) {
        snprintf(a, sizeof a, "%s/%s-a.jsonl", dir, presets[k]);
        snprintf(b, sizeof b, "%s/%s-b.jsonl", dir, presets[k]);
        cr_assert_eq(test_sh("%s workload --preset %s --seed 7 --out %s 2>/dev/null", bin(), presets[k], a), 0);
        cr_assert_eq(test_sh("%s workload --preset %s --seed 7 --out %s 2>/dev/null", bin(), presets[k], b), 0);
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
    cr_assert_neq(test_sh("%s workload --preset nope --out %s/x 2>/dev/null", bin(), dir), 0);
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

Test(run, plan_replay, .timeout = TEST_TIMEOUT(120))
{
    char dir[512], log[600], out[600], plan[600], out2[600], model[512];
    test_tmpdir(dir, sizeof dir, "replay");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    snprintf(out2, sizeof out2, "%s/out2.jsonl", dir);
    snprintf(plan, sizeof plan, "%s/plan.jsonl", dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    /* seed 7: its plans hold a segment right after a reused one (after an
     * exact run: since the chain proof most later segments are exact) */
    cr_assert_eq(test_sh("%s workload --preset rag-v1 --requests 12 --seed 7 --out %s 2>/dev/null", bin(), log), 0);
    /* a none plan replays as none: everything computed */
    cr_assert_eq(test_sh("%s run --quiet-progress --model %s --requests %s --sharing none --plan-out %s --out %s >/dev/null 2>&1",
                    bin(), model, log, plan, out), 0);
    cr_assert_eq(test_sh("%s run --quiet-progress --model %s --requests %s --plan-in %s --report-reuse --out %s >/dev/null 2>&1", bin(),
                    model, log, plan, out2), 0);
    cr_assert_eq(sum_field(out2, "computed"), sum_field(out, "prompt_tokens"));
    cr_assert_eq(sum_field(out2, "reused"), 0);
    /* a cacheprune plan replays computing exactly the planned tokens, its
     * request-time selection included: at the default R, where the exact
     * prefix (the system prompt after BOS) must stay unranked and
     * unrecomputed, and at R 0, where the forced first k0 tokens of every
     * segment are all that is recomputed (adjacent segments must stay apart) */
    const char *settings[2] = { "", "--recompute 0" };
    for (int st = 0; st < 2; st++) {
        char sum[600], sum2[600];
        snprintf(sum, sizeof sum, "%s/sum%d.json", dir, st);
        snprintf(sum2, sizeof sum2, "%s/sum%d-replay.json", dir, st);
        cr_assert_eq(test_sh("%s run --quiet-progress --model %s --requests %s %s --report-reuse --plan-out %s --out %s --summary-json %s "
                             ">/dev/null 2>&1",
                             bin(), model, log, settings[st], plan, out, sum),
                     0);
        cr_assert_eq(test_sh("%s run --quiet-progress --model %s --requests %s %s --plan-in %s --report-reuse --out %s --summary-json %s "
                             ">/dev/null 2>&1",
                             bin(), model, log, settings[st], plan, out2, sum2),
                     0);
        long planned_fresh = 0, planned_reused = 0, exact = 0, adjacent = 0;
        int n;
        char **v = lines_of(plan, &n);
        cr_assert_eq(n, 12);
        for (int i = 0; i < n; i++) {
            cJSON *j = cJSON_Parse(v[i]);
            const char *p = cJSON_GetObjectItem(j, "plan")->valuestring, *sg = cJSON_GetObjectItem(j, "segs")->valuestring;
            size_t L = strlen(p);
            for (size_t k = 0; k < L; k++) planned_reused += p[k] == 'R' && k + 1 < L, planned_fresh += p[k] != 'R' || k + 1 == L;
            for (size_t k = 0; k < L; k++) exact += sg[k] == 'X', adjacent += k > 0 && sg[k] == 'S' && sg[k - 1] != '.';
            cJSON_Delete(j);
            free(v[i]);
        }
        free(v);
        cr_assert_gt(planned_reused, 0, "the cacheprune plan reused nothing");
        cr_assert_gt(exact, 0, "no exact prefix in the plan: the test proves nothing about it");
        cr_assert_gt(adjacent, 0, "no segment starts right after a reused token: the test proves nothing about adjacent segments");
        cr_assert_eq(sum_field(out2, "computed"), planned_fresh, "%s: the replay computed %ld, the plan %ld", settings[st],
                     sum_field(out2, "computed"), planned_fresh);
        cr_assert_eq(sum_field(out2, "reused"), planned_reused);
        cr_assert_eq(sum_field(out2, "computed"), sum_field(out, "computed"));
        cr_assert_eq(sum_field(out2, "recomputed"), sum_field(out, "recomputed"));
        double sel[2];
        const char *sums[2] = { sum, sum2 };
        for (int w = 0; w < 2; w++) {
            char *text = read_text(sums[w], NULL);
            cr_assert(text, "no %s", sums[w]);
            cJSON *j = cJSON_Parse(text);
            free(text);
            const cJSON *x = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "modes"), 0), "selection_token_layers");
            cr_assert(cJSON_IsNumber(x), "%s has no selection_token_layers", sums[w]);
            sel[w] = x->valuedouble;
            cJSON_Delete(j);
        }
        cr_assert_eq(sel[1], sel[0], "%s: the replay's selection spent %g token-layers, the request's %g", settings[st], sel[1], sel[0]);
    }
}

/* ---- the --compare quality metrics against values worked out by hand ---- */

/* KL(p || q) of two known distributions given as logits (log-probabilities
 * shifted by arbitrary constants: the softmax must undo the shift):
 * p = (0.7, 0.2, 0.1), q = (0.2, 0.5, 0.3):
 *   KL(p||q) = 0.7 ln(0.7/0.2) + 0.2 ln(0.2/0.5) + 0.1 ln(0.1/0.3) = 0.58381...
 *   KL(q||p) = 0.2 ln(0.2/0.7) + 0.5 ln(0.5/0.2) + 0.3 ln(0.3/0.1) = 0.53718...
 * (different: the argument order matters), KL(p||p) = 0. */
Test(run, kl_of_known_distributions)
{
    float lp[3] = { logf(0.7f) + 3, logf(0.2f) + 3, logf(0.1f) + 3 }, lq[3] = { logf(0.2f) - 5, logf(0.5f) - 5, logf(0.3f) - 5 };
    double pq = 0.7 * log(0.7 / 0.2) + 0.2 * log(0.2 / 0.5) + 0.1 * log(0.1 / 0.3);
    double qp = 0.2 * log(0.2 / 0.7) + 0.5 * log(0.5 / 0.2) + 0.3 * log(0.3 / 0.1);
    cr_assert(fabs(pq - 0.583815) < 1e-6 && fabs(qp - 0.537176) < 1e-6, "the hand values: %.6f %.6f", pq, qp);
    cr_assert(fabs(cp_logits_kl(lp, lq, 3) - pq) < 1e-6, "KL(p||q) = %.7f, want %.7f", cp_logits_kl(lp, lq, 3), pq);
    cr_assert(fabs(cp_logits_kl(lq, lp, 3) - qp) < 1e-6, "KL(q||p) = %.7f, want %.7f", cp_logits_kl(lq, lp, 3), qp);
    cr_assert(fabs(cp_logits_kl(lp, lp, 3)) < 1e-12);
    /* only the first n ids count: over the first two, p = (7/9, 2/9), q = (2/7, 5/7) */
    double p0 = 0.7 / 0.9, p1 = 0.2 / 0.9, q0 = 0.2 / 0.7, q1 = 0.5 / 0.7;
    double two = p0 * log(p0 / q0) + p1 * log(p1 / q1);
    cr_assert(fabs(cp_logits_kl(lp, lq, 2) - two) < 1e-6, "KL over 2 ids = %.7f, want %.7f", cp_logits_kl(lp, lq, 2), two);
}

/* Greedy agreement: same ids at the same positions over the longer length. */
Test(run, greedy_agreement_by_hand)
{
    int32_t ref[] = { 1, 2, 3, 4 }, got[] = { 1, 9, 3 }, shifted[] = { 9, 1, 2, 3 };
    cr_assert_float_eq(cp_greedy_agreement(ref, 4, ref, 4), 1.0, 1e-12);
    cr_assert_float_eq(cp_greedy_agreement(ref, 4, got, 3), 2.0 / 4, 1e-12, "1 and 3 agree; 4 positions");
    cr_assert_float_eq(cp_greedy_agreement(got, 3, ref, 4), 2.0 / 4, 1e-12, "the longer length either way");
    cr_assert_float_eq(cp_greedy_agreement(ref, 4, shifted, 4), 0.0, 1e-12, "positions, not content: a shift agrees nowhere");
    cr_assert_float_eq(cp_greedy_agreement(ref, 0, got, 0), 1.0, 1e-12);
    cr_assert_float_eq(cp_greedy_agreement(ref, 4, got, 0), 0.0, 1e-12);
}

/* ROUGE-L F1 from the longest common subsequence, worked by hand. */
Test(run, rouge_l_by_hand)
{
    /* ref 1 2 3 4 5, got 2 9 4 5 7 1: LCS 2 4 5 (3); P = 3/6, R = 3/5, F = 2PR/(P+R) = 6/11 */
    int32_t ref[] = { 1, 2, 3, 4, 5 }, got[] = { 2, 9, 4, 5, 7, 1 };
    cr_assert_float_eq(cp_rouge_l(ref, 5, got, 6), 6.0 / 11, 1e-12, "got %.6f", cp_rouge_l(ref, 5, got, 6));
    cr_assert_float_eq(cp_rouge_l(got, 6, ref, 5), 6.0 / 11, 1e-12, "F1 is symmetric");
    /* a subsequence, not a substring: ref a b c d, got a x b y d -> LCS a b d (3); P 3/5, R 3/4, F = 2/3 */
    int32_t r2[] = { 10, 11, 12, 13 }, g2[] = { 10, 50, 11, 51, 13 };
    cr_assert_float_eq(cp_rouge_l(r2, 4, g2, 5), 2.0 * (0.6 * 0.75) / (0.6 + 0.75), 1e-12, "got %.6f", cp_rouge_l(r2, 4, g2, 5));
    /* repeats count once each: ref 1 1 2, got 1 2 1 -> LCS 2 (1 2 or 1 1); P = R = 2/3 */
    int32_t r3[] = { 1, 1, 2 }, g3[] = { 1, 2, 1 };
    cr_assert_float_eq(cp_rouge_l(r3, 3, g3, 3), 2.0 / 3, 1e-12, "got %.6f", cp_rouge_l(r3, 3, g3, 3));
    /* reversed: 1 2 3 vs 3 2 1 -> LCS 1; F = 1/3 */
    int32_t r4[] = { 1, 2, 3 }, g4[] = { 3, 2, 1 };
    cr_assert_float_eq(cp_rouge_l(r4, 3, g4, 3), 1.0 / 3, 1e-12);
    cr_assert_float_eq(cp_rouge_l(ref, 5, ref, 5), 1.0, 1e-12);
    cr_assert_float_eq(cp_rouge_l(ref, 5, r4 + 3, 0), 0.0, 1e-12, "nothing generated: no overlap");
    cr_assert_float_eq(cp_rouge_l(ref, 0, got, 0), 1.0, 1e-12);
    int32_t none[] = { 7, 8 };
    cr_assert_float_eq(cp_rouge_l(ref, 5, none, 2), 0.0, 1e-12);
}

/* The near-tie diagnostic's pieces, worked by hand: the top-2 margin, the
 * first position where two continuations differ, and greedy agreement over
 * the reference's positions before its first near-tie. */
Test(run, near_tie_pieces_by_hand)
{
    float lg[] = { 0.5f, 3.0f, -1.0f, 2.75f, 3.0f - 1e-4f };
    cr_assert_float_eq(cp_top2_margin(lg, 5), 1e-4f, 1e-6, "3 and 3 - 1e-4: got %g", cp_top2_margin(lg, 5));
    cr_assert_float_eq(cp_top2_margin(lg, 4), 0.25f, 1e-6, "without the last: 3 against 2.75");
    cr_assert_float_eq(cp_top2_margin(lg + 1, 2), 4.0f, 1e-6, "the larger first or second alike");
    cr_assert_float_eq(cp_top2_margin(lg + 2, 2), 3.75f, 1e-6, "-1 then 2.75");
    float tie[] = { 7, 1, 7 };
    cr_assert_float_eq(cp_top2_margin(tie, 3), 0.0f, 0, "an exact tie");
    cr_assert_float_eq(cp_top2_margin(tie, 1), 0.0f, 0, "one logit: no margin");
    int32_t ref[] = { 1, 2, 3, 4 }, got[] = { 1, 2, 9, 4 }, shorter[] = { 1, 2 };
    cr_assert_eq(cp_first_divergence(ref, 4, got, 4), 2);
    cr_assert_eq(cp_first_divergence(ref, 4, ref, 4), 4, "equal: the length");
    cr_assert_eq(cp_first_divergence(ref, 4, shorter, 2), 2, "cut short: where it stops");
    cr_assert_eq(cp_first_divergence(shorter, 2, ref, 4), 2);
    cr_assert_eq(cp_first_divergence(ref, 4, got + 2, 1), 0);
    /* margins 5 5 0.0001 5: decided are positions 0 and 1 (the tie at 2 and all after it are not) */
    float m[] = { 5, 5, 1e-4f, 5 }, first_tie[] = { 1e-4f, 5, 5, 5 };
    cr_assert_float_eq(cp_greedy_agreement_decided(ref, m, 4, got, 4, 1e-3f), 1.0, 1e-12, "the difference is at the tie");
    cr_assert_float_eq(cp_greedy_agreement_decided(ref, m, 4, got, 4, 1e-5f), 3.0 / 4, 1e-12, "no tie below 1e-5: all four");
    int32_t early[] = { 9, 2, 3, 4 };
    cr_assert_float_eq(cp_greedy_agreement_decided(ref, m, 4, early, 4, 1e-3f), 1.0 / 2, 1e-12, "0 differs, 1 agrees");
    cr_assert_float_eq(cp_greedy_agreement_decided(ref, m, 4, got, 1, 1e-3f), 1.0 / 2, 1e-12, "a missing position disagrees");
    cr_assert_float_eq(cp_greedy_agreement_decided(ref, first_tie, 4, got, 4, 1e-3f), -1.0, 0, "no decided position");
}

/* `run --compare none,tenant-prefix`: the quality figures for a mode whose
 * reuse is exact by construction (a tenant's own prefix, in its own
 * context, at its own positions) are KL 0, 100 % greedy agreement and
 * ROUGE-L 1, and that mode did reuse something (else the row proves
 * nothing).  Read from --summary-json (what scripts read), with the
 * summary's own invariants: computed + reused = prompt tokens in every
 * mode, none reuses nothing and is 1x itself, and the table is printed. */
Test(run, compare_reports_exact_quality_for_exact_reuse, .timeout = TEST_TIMEOUT(120))
{
    char dir[512], log[600], model[512], sum[600], cmd[2048];
    test_tmpdir(dir, sizeof dir, "compare");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    snprintf(sum, sizeof sum, "%s/summary.json", dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    FILE *f = fopen(log, "w");
    cr_assert(f);
    for (int i = 0; i < 6; i++)
        fprintf(f, "{\"tenant\":\"t%d\",\"messages\":[{\"role\":\"document\",\"content\":\"The quick brown fox jumps over the lazy dog "
                   "near the river bank every single morning before breakfast, and the old miller watches it from his door.\"},"
                   "{\"role\":\"user\",\"content\":\"What does the fox do, question %d?\"}],\"max_tokens\":8}\n",
                i % 2, i);
    fclose(f);
    /* --dtype f32: exact on every host (on AMX auto computes in bf16, where
     * a prefix hit's shorter prefill rounds differently) */
    snprintf(cmd, sizeof cmd, "%s run --quiet-progress --model %s --dtype f32 --requests %s --compare none,tenant-prefix --summary-json %s 2>/dev/null",
             bin(), model, log, sum);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char line[1024];
    int seen_header = 0;
    while (fgets(line, sizeof line, p))
        if (strncmp(line, "mode ", 5) == 0) seen_header = strstr(line, "KL") && strstr(line, "greedy") && strstr(line, "ROUGE-L");
    cr_assert_eq(pclose(p), 0);
    cr_assert(seen_header, "no quality table");
    char *text = read_text(sum, NULL);
    cr_assert(text, "no %s", sum);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cr_assert(j);
    int seen_row = 0, seen_none = 0;
    for (const cJSON *m = cJSON_GetObjectItem(j, "modes")->child; m; m = m->next) {
        const char *name = cJSON_GetObjectItem(m, "mode")->valuestring;
#define NUM(k) (cJSON_GetObjectItem(m, k) ? cJSON_GetObjectItem(m, k)->valuedouble : -1)
        cr_assert_eq(NUM("requests"), 6);
        cr_assert_eq(NUM("errors"), 0, "%s had errors", name);
        cr_assert_eq(NUM("computed_tokens") + NUM("reused_tokens"), NUM("prompt_tokens"), "%s: computed + reused != prompt", name);
        if (strcmp(name, "none") == 0) {
            seen_none = 1;
            cr_assert_eq(NUM("reused_tokens"), 0);
            cr_assert_eq(NUM("hit_rate"), 0);
            cr_assert_float_eq(NUM("ratio_mean_vs_none"), 1.0, 1e-12);
            cr_assert_float_eq(NUM("ratio_p50_vs_none"), 1.0, 1e-12);
            cr_assert_null(cJSON_GetObjectItem(m, "kl"), "none is not compared with itself");
        } else {
            cr_assert_str_eq(name, "tenant-prefix");
            cr_assert_gt(NUM("hit_rate"), 0, "tenant-prefix reused nothing");
            cr_assert_gt(NUM("reused_tokens"), 0);
            cr_assert_float_eq(NUM("kl"), 0.0, 1e-9, "KL of exact reuse");
            cr_assert_float_eq(NUM("greedy_agreement"), 1.0, 1e-12, "greedy agreement of exact reuse");
            cr_assert_float_eq(NUM("rouge_l"), 1.0, 1e-12, "ROUGE-L of exact reuse");
            seen_row = 1;
        }
#undef NUM
    }
    cr_assert(seen_row && seen_none);
    cJSON_Delete(j);
}

/* ---- the chain proof is no oracle, as run serves a request log ---- */

static cJSON *msg_json(const char *role, const char *text)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", text);
    return m;
}

/* one request line: [P1][user sentence] or, with p2, [P1][sentence][P2][q] */
static void oracle_line(FILE *f, const char *tenant, const char *p1, const char *sentence, const char *p2)
{
    cJSON *o = cJSON_CreateObject(), *ms = cJSON_AddArrayToObject(o, "messages");
    cJSON_AddStringToObject(o, "tenant", tenant);
    cJSON_AddItemToArray(ms, msg_json("document", p1));
    cJSON_AddItemToArray(ms, msg_json("user", sentence));
    if (p2) cJSON_AddItemToArray(ms, msg_json("document", p2)), cJSON_AddItemToArray(ms, msg_json("user", "What happened next?"));
    cJSON_AddNumberToObject(o, "max_tokens", 1);
    char *s = cJSON_PrintUnformatted(o);
    cr_assert(s);
    fprintf(f, "%s\n", s);
    free(s);
    cJSON_Delete(o);
}

/* Tenant a sends [P1][a short sentence no detector marks][P2][q]; tenant b
 * sends [P1][candidate], then [P1][candidate][P2][q].  b's last line as run
 * reports it with --report-reuse (the full cost, which its timing follows):
 * out[0..2] computed, reused, recomputed. */
static void oracle_run(const char *dir, const char *cand, int out[3])
{
    char log[600], res[600], model[512];
    snprintf(log, sizeof log, "%s/oracle-%c.jsonl", dir, cand[15]);
    snprintf(res, sizeof res, "%s/oracle-%c.out", dir, cand[15]);
    shared_path(model, sizeof model, "models/cp-books-6m");
    char *p1 = test_passage(1, 500, 3, 997), *p2 = test_passage(0, 900, 3, 997);
    FILE *f = fopen(log, "w");
    cr_assert(f);
    oracle_line(f, "a", p1, "our meeting word is purple elephant", p2);
    oracle_line(f, "b", p1, cand, NULL);
    oracle_line(f, "b", p1, cand, p2);
    fclose(f);
    cr_assert_eq(test_sh("%s run --quiet-progress --model %s --requests %s --report-reuse --out %s > /dev/null 2>&1", bin(), model, log, res), 0);
    int n;
    char **v = lines_of(res, &n);
    cr_assert_eq(n, 3);
    cJSON *j = cJSON_Parse(v[2]);
    cr_assert(j && cJSON_IsNull(cJSON_GetObjectItem(j, "error")), "%s", v[2]);
    const char *names[3] = { "computed", "reused", "recomputed" };
    for (int i = 0; i < 3; i++) out[i] = (int)cJSON_GetObjectItem(j, names[i])->valuedouble;
    cr_assert_gt(out[1], 150, "b reused %d tokens: P2 was not hit, nothing to test", out[1]);
    cJSON_Delete(j);
    for (int i = 0; i < n; i++) free(v[i]);
    free(v), free(p1), free(p2);
}

Test(run, the_chain_proof_tells_no_tenant_another_s_unstored_sentence, .timeout = TEST_TIMEOUT(120))
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "run-oracle");
    int yes[3], no[3];
    oracle_run(dir, "our meeting word is purple elephant", yes);
    oracle_run(dir, "our meeting word is orange elephant", no);
    cr_assert(memcmp(yes, no, sizeof yes) == 0, "the true guess costs computed %d reused %d recomputed %d, a wrong one %d %d %d", yes[0], yes[1],
              yes[2], no[0], no[1], no[2]);
}

/* ---- where a request's time goes ---- */

/* The stages before the first token of one result line add up to its
 * ttft_ms (within 2 % or 0.5 ms); each stage the mode never runs is 0, and
 * the ones every request runs are not. */
static void check_stage_line(const cJSON *o, const char *mode, int batched)
{
    const cJSON *sg = cJSON_GetObjectItem(o, "stage_ms");
    cr_assert(cJSON_IsObject(sg), "%s: a result line without stage_ms", mode);
    double ttft = cJSON_GetObjectItem(o, "ttft_ms")->valuedouble, before = 0;
#define STAGE(k) (cJSON_GetObjectItem(sg, k) ? cJSON_GetObjectItem(sg, k)->valuedouble : -1)
    const char *first[] = { "queue", "tokenize", "detect", "lookup", "tier", "placement", "selection", "prefill", "export", "first_token" };
    for (size_t k = 0; k < sizeof first / sizeof *first; k++) {
        cr_assert_geq(STAGE(first[k]), 0, "%s: stage %s missing or negative", mode, first[k]);
        before += STAGE(first[k]);
    }
    double tol = fmax(0.02 * ttft, 0.5);
    cr_assert(fabs(before - ttft) <= tol, "%s: the stages before the first token add up to %.3f ms, ttft_ms is %.3f", mode, before, ttft);
    cr_assert_gt(STAGE("tokenize"), 0, "%s", mode);
    cr_assert_gt(STAGE("detect"), 0, "%s", mode);
    cr_assert_gt(STAGE("prefill"), 0, "%s", mode);
    cr_assert_eq(STAGE("tier"), 0, "%s: no tier, yet tier time", mode);
    cr_assert_eq(STAGE("selection"), 0, "%s: no --recompute-by deviation, yet selection time", mode);
    if (!batched) cr_assert_eq(STAGE("queue"), 0, "%s: one request at a time, yet queue time", mode);
    int none = strcmp(mode, "none") == 0, cacheprune = strcmp(mode, "cacheprune") == 0;
    if (none) {
        cr_assert_eq(STAGE("lookup"), 0, "none looks nothing up");
        cr_assert_eq(STAGE("store"), 0, "none stores nothing");
    } else {
        cr_assert_gt(STAGE("lookup"), 0, "%s", mode);
        cr_assert_gt(STAGE("store"), 0, "%s", mode);
    }
    if (cacheprune) {
        cr_assert_gt(STAGE("export"), 0, "cacheprune exports attention");
        cr_assert_gt(STAGE("annotate"), 0, "cacheprune annotates");
    } else {
        cr_assert_eq(STAGE("export"), 0, "%s exports no attention", mode);
        cr_assert_eq(STAGE("annotate"), 0, "%s annotates nothing", mode);
    }
#undef STAGE
}

/* `run --stages --summary-json` on a small rag-v1 log, one request at a
 * time under none, chunk and cacheprune and continuously batched under
 * cacheprune: every request's stages before its first token add up to its
 * TTFT, the stages a mode cannot run stay 0, and the summary's shares of
 * TTFT of those stages add up to 1 per mode. */
Test(run, stages_add_up_to_ttft_and_idle_stages_stay_zero, .timeout = TEST_TIMEOUT(240))
{
    char dir[512], log[600], out[600], sum[600], err[600], model[512];
    test_tmpdir(dir, sizeof dir, "stages");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    snprintf(sum, sizeof sum, "%s/sum.json", dir);
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    cr_assert_eq(test_sh("%s workload --preset rag-v1 --requests 8 --seed 3 --out %s 2>/dev/null", bin(), log), 0);
    for (int batched = 0; batched < 2; batched++) {
        cr_assert_eq(test_sh("%s run --quiet-progress --model %s --requests %s %s --stages --out %s --summary-json %s >/dev/null 2>%s", bin(),
                             model, log, batched ? "--sharing cacheprune --concurrency 2" : "--compare none,chunk,cacheprune", out, sum, err),
                     0);
        int n;
        char **v = lines_of(out, &n);
        cr_assert_eq(n, batched ? 8 : 24);
        for (int i = 0; i < n; i++) {
            cJSON *o = cJSON_Parse(v[i]);
            cr_assert(o);
            const cJSON *md = cJSON_GetObjectItem(o, "mode");
            check_stage_line(o, batched ? "cacheprune" : md->valuestring, batched);
            cJSON_Delete(o);
            free(v[i]);
        }
        free(v);
        char *text = read_text(sum, NULL);
        cr_assert(text);
        cJSON *j = cJSON_Parse(text);
        free(text);
        cr_assert(j);
        int modes = 0;
        for (const cJSON *m = cJSON_GetObjectItem(j, "modes")->child; m; m = m->next, modes++) {
            const cJSON *st = cJSON_GetObjectItem(m, "stages");
            cr_assert(cJSON_IsObject(st), "no stages in the summary");
            double share = 0;
            for (const cJSON *g = st->child; g; g = g->next)
                if (cJSON_IsTrue(cJSON_GetObjectItem(g, "before_first_token"))) share += cJSON_GetObjectItem(g, "share_of_ttft")->valuedouble;
            cr_assert(fabs(share - 1) <= 0.02, "%s: the shares of TTFT before the first token add up to %.4f",
                      cJSON_GetObjectItem(m, "mode")->valuestring, share);
        }
        cr_assert_eq(modes, batched ? 1 : 3);
        cJSON_Delete(j);
        char *e = read_text(err, NULL);
        cr_assert(e && strstr(e, "per stage") && strstr(e, "first_token"), "--stages printed no table");
        free(e);
    }
}
