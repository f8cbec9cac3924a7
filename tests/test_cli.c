/* The cacheprune binary as a user runs it: exit codes, messages, --json. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../tokenizer/tokenizer.h"
#include "helpers.h"

/* Runs `$CP_BIN args` with stderr folded into the output; returns the exit
 * status and the output in out. */

Test(cli, help_and_usage_errors)
{
    static char out[1 << 16];
    cr_assert_eq(test_cli_output("--help", out, sizeof out), 0);
    cr_assert(strstr(out, "generate") && strstr(out, "synth"), "%s", out);
    cr_assert_eq(test_cli_output("generate --help", out, sizeof out), 0);
    cr_assert(strstr(out, "--prompt-ids"), "%s", out);
    cr_assert_eq(test_cli_output("synth --help", out, sizeof out), 0);
    cr_assert(strstr(out, "qwen2.5-0.5b"), "%s", out);
    cr_assert_eq(test_cli_output("frobnicate", out, sizeof out), 2);
    cr_assert(strstr(out, "unknown command 'frobnicate'"), "%s", out);
    cr_assert_eq(test_cli_output("generate --model x --prompt-ids 1,a", out, sizeof out), 2);
    cr_assert(strstr(out, "bad entry 2"), "%s", out);
    cr_assert_eq(test_cli_output("generate --model x --prompt-ids 1 -n -5", out, sizeof out), 2);
    cr_assert(strstr(out, "-n: expected an integer"), "%s", out);
    cr_assert_eq(test_cli_output("generate --prompt-ids 1", out, sizeof out), 2);
    cr_assert(strstr(out, "--model DIR is required"), "%s", out);
}

Test(cli, generate_json_reproduces_stories_reference)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/stories260K-hf");
    snprintf(args, sizeof args, "generate --model %s --prompt-ids 1 -n 12 --greedy --json", dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    /* the first 12 ids of reference_greedy.json after BOS */
    cr_assert(strstr(out, "{\"ids\":[403,407,261,378,432,383,286,261,376,298,315,421],"
                          "\"text\":\"Once upon a time, there was a little girl\""),
              "%s", out);
    cr_assert(strstr(out, "\"prefill_ms\":") && strstr(out, "\"decode_tok_s\":"), "%s", out);
}

Test(cli, generate_reports_bad_model_and_ids)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/stories260K-hf");
    snprintf(args, sizeof args, "generate --model %s --prompt-ids 1,600 -n 2", dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 1);
    cr_assert(strstr(out, "token id 600 at index 1 is outside the vocabulary [0, 512)"), "%s", out);
    cr_assert_eq(test_cli_output("generate --model /nonexistent --prompt-ids 1", out, sizeof out), 1);
    cr_assert(strstr(out, "model directory /nonexistent does not exist"), "%s", out);
    cr_assert_eq(test_cli_output("generate --model /nonexistent --prompt hello", out, sizeof out), 1);
    cr_assert(strstr(out, "model directory /nonexistent does not exist") && !strstr(out, "tokenizer.json"), "%s", out);
    cr_assert_eq(test_cli_output("generate --model x --prompt a --prompt-ids 1", out, sizeof out), 2);
    cr_assert(strstr(out, "exactly one of --prompt, --chat and --prompt-ids"), "%s", out);
    cr_assert_eq(test_cli_output("generate --model x --prompt-ids 1 --backend tpu", out, sizeof out), 1);
    cr_assert(strstr(out, "expected cpu or cuda"), "%s", out);
}

/* A SentencePiece-only checkpoint (tokenizer.model, no tokenizer.json) is
 * named as such by generate and run: a copy of cp-books-6m without its
 * tokenizer.json and with an empty tokenizer.model. */
Test(cli, a_sentencepiece_only_model_says_it_needs_tokenizer_json)
{
    static char out[1 << 16];
    char src[256], tmp[256], dir[300], cmd[2048], args[1024];
    shared_path(src, sizeof src, "models/cp-books-6m");
    test_tmpdir(tmp, sizeof tmp, "spm-only");
    snprintf(dir, sizeof dir, "%s/model", tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/config.json '%s'/model.safetensors '%s'/tokenizer_config.json '%s'/ && : > '%s'/tokenizer.model",
             dir, src, src, src, dir, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(args, sizeof args, "generate --model %s --prompt hello", dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "SentencePiece models need tokenizer.json"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s.jsonl", dir);
    FILE *f = fopen(cmd, "w");
    cr_assert(f);
    fputs("{\"tenant\": \"a\", \"prompt\": \"hello\"}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "run --model %s --requests %s.jsonl --quiet-progress", dir, dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "SentencePiece models need tokenizer.json"), "%s", out);
    snprintf(args, sizeof args, "run --model /nonexistent --requests %s.jsonl --quiet-progress", dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "model directory /nonexistent does not exist"), "%s", out);
}

Test(cli, generate_from_text_streams_the_story)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/stories260K-hf");
    /* "Once upon a time" + BOS reproduces the reference continuation */
    snprintf(args, sizeof args, "generate --model %s --prompt 'Once upon a time' -n 11", dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cr_assert(strncmp(out, ", there was a little girl named Lily.", 37) == 0, "%s", out);
}

Test(cli, tokenize_prints_ids_pieces_offsets)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/mistral-7b-v0.1-tokenizer");
    snprintf(args, sizeof args, "tokenize --model %s --json ' leading space'", dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "{\"ids\":[28705,5374,2764],\"pieces\":[\"\u2581\",\"\u2581leading\",\"\u2581space\"],"
                          "\"offsets\":[[0,0],[0,8],[8,14]]}") ||
                  strstr(out, "\"offsets\":[[0,0],[0,8],[8,14]]"),
              "%s", out);
    cr_assert(strstr(out, "\"ids\":[28705,5374,2764]"), "%s", out);
    cr_assert_eq(test_cli_output("tokenize --model /nonexistent hi", out, sizeof out), 1);
    cr_assert(strstr(out, "model directory /nonexistent does not exist"), "%s", out);
}

Test(cli, detect_json_mask_and_quiet_logs)
{
    static char out[1 << 16];
    char dir[512], args[2048];
    shared_path(dir, sizeof dir, "models/qwen-bpe-tokenizer-qwen3");
    snprintf(args, sizeof args, "detect --json --model %s 'mail <pii>Ann</pii> at ann@example.com'", dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "{\"start\":5,\"end\":8,\"type\":\"marked\",\"score\":1}"), "%s", out);
    cr_assert(strstr(out, "\"type\":\"email\""), "%s", out);
    cr_assert(strstr(out, "\"wholly\":false,\"mask\":["), "%s", out);
    /* a failing process plugin: served as wholly sensitive; the log line
     * names the detector, never the text */
    const char *plug = getenv("CP_PLUGINS");
    snprintf(args, sizeof args, "detect --json --plugin-cmd '%s/cp_test_proc_plugin crash' 'the code is TOPSECRET-42'",
             plug && *plug ? plug : "build/tests");
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"wholly\":true"), "%s", out);
    cr_assert(strstr(out, "detector 'process' failed"), "%s", out);
    cr_assert(!strstr(out, "TOPSECRET"), "the log leaked the text: %s", out);
    /* a text that starts with '-' after --: the text, not an option */
    cr_assert_eq(test_cli_output("detect --no-names --no-ner -- '--password=hunter2x'", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "secret") && strstr(out, "hunter2x"), "%s", out);
    cr_assert_eq(test_cli_output("detect -- a b", out, sizeof out), 2, "%s", out);
    cr_assert_eq(test_cli_output("detect --rules /nonexistent/r.txt x", out, sizeof out), 1);
    cr_assert(strstr(out, "/nonexistent/r.txt: cannot open"), "%s", out);
}

/* `annotate --json` against what the tokenizer says independently: the
 * e-mail's tokens (those overlapping its bytes) and one padding token each
 * side are the sensitive cut, no segment holds any of them, and each
 * segment flags k0 + ceil(r * len) tokens for recompute (2, 0.15). */
Test(cli, annotate_shows_segments_and_cuts)
{
    static char out[1 << 16];
    static const char text[] = "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin "
                               "nuzzled into his breast in an effort to escape the vile wind, slipped quickly through the glass doors "
                               "of Victory Mansions. My email is w.smith@minitrue.gov.";
    char dir[512], args[4096];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    snprintf(args, sizeof args, "annotate --json --no-names --min-len 16 --model %s --prompt '%s' 2>/dev/null", dir, text);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cp_tokenizer *tok = open_tokenizer_or_die("models/cp-books-6m");
    cp_encoding e = { 0 };
    cp_error err = { 0 };
    cr_assert_eq(cp_tokenize(tok, text, strlen(text), CP_TOK_ADD_SPECIAL, &e, &err), CP_OK, "%s", err.msg);
    size_t m0 = (size_t)(strstr(text, "w.smith") - text), m1 = m0 + strlen("w.smith@minitrue.gov");
    int first = -1, last = -1;
    for (int k = 0; k < (int)e.n; k++)
        if (e.start[k] < m1 && e.end[k] > m0) last = k, first = first < 0 ? k : first;
    cr_assert(first > 0 && last + 1 < (int)e.n);
    int lo = first - 1, hi = last + 1; /* padding 1 */
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "not JSON: %s", out);
    cr_assert_eq(cJSON_GetObjectItem(j, "tokens")->valueint, (int)e.n, "annotate tokenized another prompt");
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "cuts"), "sensitive_tokens")->valueint, hi - lo + 1,
                 "the e-mail's %d tokens and one each side are sensitive", last - first + 1);
    const cJSON *segs = cJSON_GetObjectItem(j, "segments"), *g;
    cr_assert_gt(cJSON_GetArraySize(segs), 0, "nothing shared: %s", out);
    cJSON_ArrayForEach(g, segs)
    {
        int st = cJSON_GetObjectItem(g, "start")->valueint, len = cJSON_GetObjectItem(g, "len")->valueint;
        cr_assert(st + len <= lo || st > hi, "segment [%d, +%d) holds a token of the e-mail [%d, %d]", st, len, lo, hi);
        int want = 2 + (int)ceil(0.15 * len);
        cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(g, "recompute")), want < len ? want : len);
    }
    cJSON_Delete(j);
    cp_encoding_free(&e);
    cp_tokenizer_free(tok);
    cr_assert_eq(test_cli_output("annotate --model x", out, sizeof out), 2);
}

/* Runs `attack --model cp-books-6m ARGS --csv TMP` (must succeed) and
 * returns the CSV; out receives the printed table. */
static char *attack_csv(const char *tag, const char *attack_args, char *out, size_t cap)
{
    char dir[512], args[2048], csv[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    test_tmpdir(csv, sizeof csv, tag);
    strcat(csv, "/a.csv");
    snprintf(args, sizeof args, "attack --model %s %s --csv %s", dir, attack_args, csv);
    cr_assert_eq(test_cli_output(args, out, cap), 0, "%s", out);
    char *rows = read_text(csv, NULL);
    cr_assert(rows, "no CSV at %s", csv);
    return rows;
}

/* The recovery column of the CSV row mode,attack,channel (must exist). */
static double csv_recovery(const char *rows, const char *mode, const char *attack, const char *channel, double *chance)
{
    char key[256];
    snprintf(key, sizeof key, "\n%s,%s,%s,", mode, attack, channel);
    const char *at = strstr(rows, key);
    cr_assert(at, "no CSV row %s: %s", key + 1, rows);
    double rec, ch = NAN;
    cr_assert_geq(sscanf(at + strlen(key), "%lf,%lf", &rec, &ch), 1, "row %s", key + 1);
    if (chance) *chance = ch;
    return rec;
}

/* The chain and admission probes end to end: what the attacker is told
 * (its reused tokens, every one with --report-reuse for the chain probe; its
 * own under the default view for admission, where the view is the channel)
 * is the same for every candidate, so recovery is exactly chance. */
Test(cli, attack_chain_and_admission_counters_are_at_chance, .timeout = TEST_TIMEOUT(180))
{
    static char out[1 << 16];
    enum { K = 4 };
    char *rows = attack_csv("chain", "--modes cacheprune --attacks chain --trials 1 --candidates 4 --repeats 1 --report-reuse", out,
                            sizeof out);
    double chance, rec = csv_recovery(rows, "cacheprune", "chain", "counters", &chance);
    cr_assert_float_eq(chance, 1.0 / K, 1e-4);
    cr_assert_float_eq(rec, 1.0 / K, 1e-4, "the chain probe's counters recover %g of the sentences, want 1/%d", rec, K);
    free(rows);
    rows = attack_csv("admission", "--modes cacheprune --attacks admission --trials 1 --candidates 4 --repeats 1", out, sizeof out);
    rec = csv_recovery(rows, "cacheprune", "admission", "counters", &chance);
    cr_assert_float_eq(rec, 1.0 / K, 1e-4, "the admission probe's counters recover %g of the documents, want 1/%d", rec, K);
    free(rows);
}

/* Attack 4 end to end: with canonical segment KV the victim's public text
 * after its secret is stored (the probe hits it) the same way for every
 * candidate, so the attacker's recovery is exactly chance; bad options fail. */
Test(cli, attack_decision_canonical_is_at_chance, .timeout = TEST_TIMEOUT(120))
{
    static char out[1 << 16];
    enum { K = 4 };
    char *rows = attack_csv("decision", "--modes cacheprune --attacks decision --segment-kv canonical --trials 1 --candidates 4", out,
                            sizeof out);
    /* the probe hit the stored text, and every candidate predicts exactly that */
    const char *line = strstr(out, "decision trial 1: the probe hit ");
    cr_assert(line, "%s", out);
    int hit = -1, consistent = -1, of = -1;
    cr_assert_eq(sscanf(line, "decision trial 1: the probe hit %d tokens; %d of %d candidates predict that", &hit, &consistent, &of), 3,
                 "%s", line);
    cr_assert_gt(hit, 0, "canonical stores the text after the secret: the probe should hit it");
    cr_assert(consistent == K && of == K, "%d of %d candidates consistent, want all %d", consistent, of, K);
    /* so the attacker is left with a uniform guess: recovery = chance = 1/K */
    double chance, rec = csv_recovery(rows, "cacheprune/canonical", "decision", "storage", &chance);
    cr_assert_float_eq(chance, 1.0 / K, 1e-4);
    cr_assert_float_eq(rec, 1.0 / K, 1e-4, "recovery %g, want 1/%d", rec, K);
    free(rows);
    cr_assert_eq(test_cli_output("attack --row-limit 2", out, sizeof out), 2);
    cr_assert_eq(test_cli_output("attack --segment-kv sideways", out, sizeof out), 2, "%s", out);
}

/* Attack 6 end to end: with canonical segment KV the injection before the
 * passage changes the victim's logits by exactly nothing; in-context it does. */
Test(cli, attack_poison_canonical_is_exact, .timeout = TEST_TIMEOUT(120))
{
    static char out[1 << 16];
    char *rows = attack_csv("poison", "--modes cacheprune --attacks poison --segment-kv canonical --trials 1", out, sizeof out);
    cr_assert_eq(csv_recovery(rows, "cacheprune/canonical", "poison", "kl_injection", NULL), 0.0, "%s", rows);
    free(rows);
    rows = attack_csv("poison2", "--modes cacheprune --attacks poison --trials 1", out, sizeof out);
    cr_assert_gt(csv_recovery(rows, "cacheprune/in-context", "poison", "kl_injection", NULL), 0.0,
                 "in-context KV should carry the injection (else the test proves nothing): %s", rows);
    free(rows);
}

/* Attack 5 end to end: an attacker that reuses a passage's KV computed after
 * a victim's card number and simulates every candidate recovers it exactly
 * when nothing but tau gates storage (in-context, budget off); canonical KV
 * is reused just as much and tells it nothing (chance, 1 of 4). */
Test(cli, attack_context_canonical_is_at_chance, .timeout = TEST_TIMEOUT(120))
{
    static char out[1 << 16];
    enum { K = 4 };
    char *rows = attack_csv("context", "--modes cacheprune --attacks context --segment-kv canonical --trials 1 --candidates 4", out,
                            sizeof out);
    /* the table row: label, budget, tokens reused, KL spread between the candidates, recoveries, chance */
    const char *line = strstr(out, "cacheprune/canonical   off ");
    cr_assert(line, "%s", out);
    double reused, spread, by_logits, by_text, chance;
    cr_assert_eq(sscanf(line, "cacheprune/canonical off %lf %lf %lf%% %lf%% %lf%%", &reused, &spread, &by_logits, &by_text, &chance), 5,
                 "%s", line);
    cr_assert_gt(reused, 0, "the probe reused the victim's passage (else the test proves nothing)");
    cr_assert_eq(spread, 0, "canonical KV is the same for every candidate: the spread is exactly 0");
    cr_assert_float_eq(chance, 100.0 / K, 1e-9);
    double ch, rec = csv_recovery(rows, "cacheprune/canonical", "context-budget-off", "logits", &ch);
    cr_assert(fabs(rec - 1.0 / K) < 1e-4 && fabs(ch - 1.0 / K) < 1e-4, "canonical: recovery %g, chance %g, want 1/%d", rec, ch, K);
    free(rows);
    rows = attack_csv("context2", "--modes cacheprune --attacks context --trials 1 --candidates 4", out, sizeof out);
    cr_assert_float_eq(csv_recovery(rows, "cacheprune/in-context", "context-budget-off", "logits", NULL), 1.0, 1e-4,
                       "in-context KV without the budget should carry the secret (else the test proves nothing): %s", rows);
    free(rows);
}

/* Attack 7 end to end: without quotas one tenant flushes the pool and reads
 * the victim's re-send from its probe, every time; with quotas it cannot
 * flush, so its probe always hits whatever the victim did. */
/* about 1.5 s of CPU a trial on an idle machine (12-passage flood, epic R 0.35); the
 * limit leaves room for ASan and a loaded machine */
Test(cli, attack_evict_quota_stops_one_tenant, .timeout = TEST_TIMEOUT(180))
{
    static char out[1 << 16];
    char *rows = attack_csv("evict", "--modes cacheprune --attacks evict --trials 6", out, sizeof out);
    cr_assert_float_eq(csv_recovery(rows, "cacheprune", "evict", "counters", NULL), 1.0, 1e-9, "without quotas: every bit read, %s", rows);
    /* with the quota the passage survives the flood: the probe hits in every
     * trial, whatever the victim did, so the hit carries no bit */
    cr_assert_float_eq(csv_recovery(rows, "cacheprune", "evict+q", "probe-hit", NULL), 1.0, 1e-9, "the quota should keep the passage: %s",
                       rows);
    free(rows);
}
