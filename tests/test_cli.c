/* The cacheprune binary as a user runs it: exit codes, messages, --json. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

/* Runs `$CP_BIN args` with stderr folded into the output; returns the exit
 * status and the output in out. */
static int run(const char *args, char *out, size_t cap)
{
    const char *bin = getenv("CP_BIN");
    if (!bin) bin = "build/cacheprune";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(cli, help_and_usage_errors)
{
    static char out[1 << 16];
    cr_assert_eq(run("--help", out, sizeof out), 0);
    cr_assert(strstr(out, "generate") && strstr(out, "synth"), "%s", out);
    cr_assert_eq(run("generate --help", out, sizeof out), 0);
    cr_assert(strstr(out, "--prompt-ids"), "%s", out);
    cr_assert_eq(run("synth --help", out, sizeof out), 0);
    cr_assert(strstr(out, "qwen2.5-0.5b"), "%s", out);
    cr_assert_eq(run("frobnicate", out, sizeof out), 2);
    cr_assert(strstr(out, "unknown command 'frobnicate'"), "%s", out);
    cr_assert_eq(run("generate --model x --prompt-ids 1,a", out, sizeof out), 2);
    cr_assert(strstr(out, "bad entry 2"), "%s", out);
    cr_assert_eq(run("generate --model x --prompt-ids 1 -n -5", out, sizeof out), 2);
    cr_assert(strstr(out, "-n: expected an integer"), "%s", out);
    cr_assert_eq(run("generate --prompt-ids 1", out, sizeof out), 2);
    cr_assert(strstr(out, "--model DIR is required"), "%s", out);
}

Test(cli, generate_json_reproduces_stories_reference)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/stories260K-hf");
    snprintf(args, sizeof args, "generate --model %s --prompt-ids 1 -n 12 --greedy --json", dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
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
    cr_assert_eq(run(args, out, sizeof out), 1);
    cr_assert(strstr(out, "token id 600 at index 1 is outside the vocabulary [0, 512)"), "%s", out);
    cr_assert_eq(run("generate --model /nonexistent --prompt-ids 1", out, sizeof out), 1);
    cr_assert(strstr(out, "/nonexistent/config.json: cannot open"), "%s", out);
    cr_assert_eq(run("generate --model x --prompt a --prompt-ids 1", out, sizeof out), 2);
    cr_assert(strstr(out, "exactly one of --prompt, --chat and --prompt-ids"), "%s", out);
    cr_assert_eq(run("generate --model x --prompt-ids 1 --backend tpu", out, sizeof out), 1);
    cr_assert(strstr(out, "expected cpu or cuda"), "%s", out);
}

Test(cli, generate_from_text_streams_the_story)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/stories260K-hf");
    /* "Once upon a time" + BOS reproduces the reference continuation */
    snprintf(args, sizeof args, "generate --model %s --prompt 'Once upon a time' -n 11", dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strncmp(out, ", there was a little girl named Lily.", 37) == 0, "%s", out);
}

Test(cli, tokenize_prints_ids_pieces_offsets)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/mistral-7b-v0.1-tokenizer");
    snprintf(args, sizeof args, "tokenize --model %s --json ' leading space'", dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "{\"ids\":[28705,5374,2764],\"pieces\":[\"\u2581\",\"\u2581leading\",\"\u2581space\"],"
                          "\"offsets\":[[0,0],[0,8],[8,14]]}") ||
                  strstr(out, "\"offsets\":[[0,0],[0,8],[8,14]]"),
              "%s", out);
    cr_assert(strstr(out, "\"ids\":[28705,5374,2764]"), "%s", out);
    cr_assert_eq(run("tokenize --model /nonexistent hi", out, sizeof out), 1);
    cr_assert(strstr(out, "/nonexistent/tokenizer.json: cannot open"), "%s", out);
}

Test(cli, detect_json_mask_and_quiet_logs)
{
    static char out[1 << 16];
    char dir[512], args[2048];
    shared_path(dir, sizeof dir, "models/qwen-bpe-tokenizer-qwen3");
    snprintf(args, sizeof args, "detect --json --model %s 'mail <pii>Ann</pii> at ann@example.com'", dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "{\"start\":5,\"end\":8,\"type\":\"marked\",\"score\":1}"), "%s", out);
    cr_assert(strstr(out, "\"type\":\"email\""), "%s", out);
    cr_assert(strstr(out, "\"wholly\":false,\"mask\":["), "%s", out);
    /* a failing process plugin: served as wholly sensitive; the log line
     * names the detector, never the text */
    const char *plug = getenv("CP_PLUGINS");
    snprintf(args, sizeof args, "detect --json --plugin-cmd '%s/cp_test_proc_plugin crash' 'the code is TOPSECRET-42'",
             plug && *plug ? plug : "build/tests");
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"wholly\":true"), "%s", out);
    cr_assert(strstr(out, "detector 'process' failed"), "%s", out);
    cr_assert(!strstr(out, "TOPSECRET"), "the log leaked the text: %s", out);
    cr_assert_eq(run("detect --rules /nonexistent/r.txt x", out, sizeof out), 1);
    cr_assert(strstr(out, "/nonexistent/r.txt: cannot open"), "%s", out);
}

Test(cli, annotate_shows_segments_and_cuts)
{
    static char out[1 << 16];
    char dir[512], args[4096];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    snprintf(args, sizeof args,
             "annotate --json --min-len 16 --model %s --prompt 'It was a bright cold day in April, and the clocks were "
             "striking thirteen. Winston Smith, his chin nuzzled into his breast in an effort to escape the vile wind, "
             "slipped quickly through the glass doors of Victory Mansions. My email is w.smith@minitrue.gov.'",
             dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"segments\":[{\"start\":"), "%s", out);
    cr_assert(strstr(out, "\"cuts\":{\"sensitive_tokens\":"), "%s", out);
    cr_assert(!strstr(out, "\"sensitive_tokens\":0,"), "the e-mail must cut the run: %s", out);
    cr_assert(!strstr(out, "minitrue"), "a shared segment holds the e-mail: %s", out);
    cr_assert_eq(run("annotate --model x", out, sizeof out), 2);
}

/* Attack 4 end to end: with canonical segment KV the victim's public text
 * after its secret is stored (the probe hits it) the same way for every
 * candidate, so the attacker's recovery is exactly chance; bad options fail. */
Test(cli, attack_decision_canonical_is_at_chance, .timeout = 120)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    snprintf(args, sizeof args, "attack --model %s --modes cacheprune --attacks decision --segment-kv canonical --trials 1 "
                                "--candidates 4", dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "the probe hit 61 tokens; 4 of 4 candidates predict that"), "%s", out);
    cr_assert(strstr(out, "cacheprune/canonical decision storage       25.0%    25.0%"), "%s", out);
    cr_assert_eq(run("attack --row-limit 2", out, sizeof out), 2);
    cr_assert_eq(run("attack --segment-kv sideways", out, sizeof out), 2, "%s", out);
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
    cr_assert_eq(run(args, out, cap), 0, "%s", out);
    char *rows = read_text(csv, NULL);
    cr_assert(rows, "no CSV at %s", csv);
    return rows;
}

/* Attack 6 end to end: with canonical segment KV the injection before the
 * passage changes the victim's logits by exactly nothing; in-context it does. */
Test(cli, attack_poison_canonical_is_exact, .timeout = 120)
{
    static char out[1 << 16];
    char *rows = attack_csv("poison", "--modes cacheprune --attacks poison --segment-kv canonical --trials 1", out, sizeof out);
    cr_assert(strstr(rows, "cacheprune/canonical,poison,kl_injection,0.000000"), "%s", rows);
    free(rows);
    rows = attack_csv("poison2", "--modes cacheprune --attacks poison --trials 1", out, sizeof out);
    cr_assert(strstr(rows, "cacheprune/in-context,poison,kl_injection,") && !strstr(rows, "kl_injection,0.000000"),
              "in-context KV should carry the injection (else the test proves nothing): %s", rows);
    free(rows);
}

/* Attack 5 end to end: an attacker that reuses a passage's KV computed after
 * a victim's card number and simulates every candidate recovers it exactly
 * when nothing but tau gates storage (in-context, budget off); canonical KV
 * is reused just as much and tells it nothing (chance, 1 of 4). */
Test(cli, attack_context_canonical_is_at_chance, .timeout = 120)
{
    static char out[1 << 16];
    char *rows = attack_csv("context", "--modes cacheprune --attacks context --segment-kv canonical --trials 1 --candidates 4", out,
                            sizeof out);
    cr_assert(strstr(out, "cacheprune/canonical   off         84.0            0      25.0%"), "%s", out);
    cr_assert(strstr(rows, "cacheprune/canonical,context-budget-off,logits,0.2500,0.2500"), "%s", rows);
    free(rows);
    rows = attack_csv("context2", "--modes cacheprune --attacks context --trials 1 --candidates 4", out, sizeof out);
    cr_assert(strstr(rows, "cacheprune/in-context,context-budget-off,logits,1.0000"),
              "in-context KV without the budget should carry the secret (else the test proves nothing): %s", rows);
    free(rows);
}

/* Attack 7 end to end: without quotas one tenant flushes the pool and reads
 * the victim's re-send from its probe, every time; with quotas it cannot
 * flush, so its probe always hits whatever the victim did. */
Test(cli, attack_evict_quota_stops_one_tenant, .timeout = 120)
{
    static char out[1 << 16];
    char dir[512], args[1024];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    snprintf(args, sizeof args, "attack --model %s --modes cacheprune --attacks evict --trials 6", dir);
    cr_assert_eq(run(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "cacheprune           evict    counters     100.0%"), "%s", out);
    cr_assert(!strstr(out, "evict+q  counters     100.0%"), "the quota should stop the flush: %s", out);
}
