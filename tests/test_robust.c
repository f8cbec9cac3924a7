/* Robust input everywhere: odd files refused instead of blocking on them,
 * outputs that would overwrite inputs refused, every CLI number and list
 * value checked, an honest --resume.  Each test covers one kind of hostile
 * input and fails when the check that refuses it is removed. */
#define _DEFAULT_SOURCE /* realpath */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/dtype.h"
#include "../kernels/fileio.h"
#include "../model/pack.h"
#include "../model/safetensors.h"
#include "../tokenizer/tokenizer.h"
#include "helpers.h"

static void make_fifo(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
    unlink(out);
    cr_assert_eq(mkfifo(out, 0600), 0, "mkfifo %s", out);
}

/* A model directory whose files link to cp-books-6m's, except `fifo_name`,
 * which is a FIFO nobody writes. */
static void model_with_fifo(char *dir, size_t cap, const char *name, const char *fifo_name)
{
    char src[512], path[1024];
    shared_path(src, sizeof src, "models/cp-books-6m");
    test_tmpdir(dir, cap, name);
    static const char *const files[] = { "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json" };
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (strcmp(files[i], fifo_name) == 0) {
            cr_assert_eq(mkfifo(path, 0600), 0);
            continue;
        }
        char target[1024];
        snprintf(target, sizeof target, "%s/%s", src, files[i]);
        char *abs = realpath(target, NULL);
        cr_assert(abs, "%s", target);
        cr_assert_eq(symlink(abs, path), 0);
        free(abs);
    }
}

/* The library's readers: each refuses a FIFO at once, saying what it is. */
Test(robust, fifo_refused_by_every_reader, .timeout = TEST_TIMEOUT(10))
{
    char dir[512], fifo[600];
    test_tmpdir(dir, sizeof dir, "fifo_lib");
    make_fifo(fifo, sizeof fifo, dir, "f");
    cp_error err = { 0 };
    char *text = NULL;
    cr_assert_eq(cp_read_file(fifo, 1024, &text, NULL, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "not a regular file (a FIFO)"), "%s", err.msg);
    cr_assert_null(text);
    st_set *s = NULL;
    err.msg[0] = 0;
    cr_assert_neq(st_open_file(fifo, &s, &err), CP_OK);
    cr_assert(strstr(err.msg, "not a regular file"), "%s", err.msg);
    cp_backend *be;
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK);
    cp_model *m = NULL;
    cp_pack_extra x;
    err.msg[0] = 0;
    cr_assert_neq(cp_pack_read(fifo, be, &m, &x, &err), CP_OK);
    cr_assert(strstr(err.msg, "not a regular file"), "%s", err.msg);
    cp_backend_destroy(be);
    /* a directory is no regular file either */
    cr_assert_eq(cp_read_file(dir, 1024, &text, NULL, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "directory"), "%s", err.msg);
}

/* `timeout 10 $CP_BIN ARGS` with stderr folded in: a hang becomes exit 124 */
static int cli_timed(char *out, size_t cap, const char *dir, const char *args)
{
    const char *b = getenv("CP_BIN");
    char path[700];
    snprintf(path, sizeof path, "%s/cli_out.txt", dir);
    int rc = test_sh("timeout 10 %s %s > %s 2>&1", b && *b ? b : "build/cacheprune", args, path);
    size_t n;
    char *t = read_text(path, &n);
    snprintf(out, cap, "%s", t ? t : "");
    free(t);
    return rc;
}

/* The CLI: a FIFO as config, weights, tokenizer, request log, plan file or
 * rules file is an error naming it (exit 1), never a hang. */
Test(robust, fifo_refused_by_the_cli, .timeout = TEST_TIMEOUT(60))
{
    static char out[1 << 14];
    char dir[512], args[4096], model[512], fifo[700], log[700];
    static const char *const files[] = { "config.json", "model.safetensors", "tokenizer.json" };
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "fifo_model_%d", i);
        model_with_fifo(dir, sizeof dir, name, files[i]);
        snprintf(args, sizeof args, "generate --model %s --prompt hello -n 1", dir);
        int rc = cli_timed(out, sizeof out, dir, args);
        cr_assert_eq(rc, 1, "%s as a FIFO: exit %d: %s", files[i], rc, out);
        cr_assert(strstr(out, files[i]) && strstr(out, "not a regular file (a FIFO)"), "%s", out);
    }
    shared_path(model, sizeof model, "models/cp-books-6m");
    test_tmpdir(dir, sizeof dir, "fifo_cli");
    make_fifo(fifo, sizeof fifo, dir, "f");
    snprintf(log, sizeof log, "%s/r.jsonl", dir);
    const char line[] = "{\"tenant\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}\n";
    cr_assert(write_bytes(log, line, sizeof line - 1));
    const char *inputs[] = { "--requests", "--plan-in", "--rules" };
    for (int i = 0; i < 3; i++) {
        if (i == 0) snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s", model, fifo);
        else snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s %s %s", model, log, inputs[i], fifo);
        int rc = cli_timed(out, sizeof out, dir, args);
        cr_assert_eq(rc, 1, "%s FIFO: exit %d: %s", inputs[i], rc, out);
        cr_assert(strstr(out, "not a regular file (a FIFO)"), "%s: %s", inputs[i], out);
    }
}

/* --out is never an input or another output, however it is spelt. */
Test(robust, out_is_not_an_input, .timeout = TEST_TIMEOUT(30))
{
    static char out[1 << 14];
    char dir[512], model[700], src[512], args[4096];
    shared_path(src, sizeof src, "models/cp-books-6m");
    test_tmpdir(dir, sizeof dir, "out_input");
    /* a copy of the model: were the check broken, the run would write over
     * this config.json, never the kit's */
    snprintf(model, sizeof model, "%s/model", dir);
    cr_assert_eq(test_sh("mkdir %s && cp %s/config.json %s/model.safetensors %s/tokenizer.json %s/tokenizer_config.json %s/", model,
                         src, src, src, src, model),
                 0);
    char log[700], link[700], plan[700];
    snprintf(log, sizeof log, "%s/r.jsonl", dir);
    snprintf(link, sizeof link, "%s/link.jsonl", dir);
    snprintf(plan, sizeof plan, "%s/plan.jsonl", dir);
    const char line[] = "{\"tenant\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}\n";
    cr_assert(write_bytes(log, line, sizeof line - 1));
    cr_assert_eq(symlink("r.jsonl", link), 0);
    /* the same file as the log: by another spelling, and through a symlink */
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --out %s/./r.jsonl", model, log, dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "is the same file as --requests"), "%s", out);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --out %s", model, link, log);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    size_t n;
    char *t = read_text(log, &n);
    cr_assert(n == sizeof line - 1 && memcmp(t, line, n) == 0, "the log was overwritten");
    free(t);
    /* two outputs into one file (which does not exist yet) */
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --plan-out %s --out %s/../%s/plan.jsonl", model, log,
             plan, dir, strrchr(dir, '/') + 1);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--out and --plan-out are the same file"), "%s", out);
    cr_assert_neq(access(plan, F_OK), 0, "nothing written");
    /* nor a file of the model directory */
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --summary-json %s/config.json", model, log, model);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "is the model's config.json"), "%s", out);
    /* distinct files still run */
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --plan-out %s --out %s/o.jsonl", model, log, plan, dir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
}

/* Sizes: finite, whole bytes, in range; never an abort or a 0-byte budget. */
Test(robust, pool_bytes_checked, .timeout = TEST_TIMEOUT(30))
{
    static char out[1 << 14];
    char args[4096];
    static const char *const bad[] = { "nan", "1e30", "inf", "0", "0.4", "-1", "0x10", "1.5", "' 5'", "12Q", "5KB" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "run --model x --requests y --pool-bytes %s", bad[i]);
        cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "--pool-bytes %s: %s", bad[i], out);
        cr_assert(strstr(out, "--pool-bytes: expected a whole number of bytes from 1 to 2^60"), "%s: %s", bad[i], out);
    }
    /* the units: 1.5K is 1536 bytes, which holds no pool block (so run says so, naming the figure) */
    char model[512];
    shared_path(model, sizeof model, "models/cp-books-6m");
    char dir[512], empty[700];
    test_tmpdir(dir, sizeof dir, "pool_bytes");
    snprintf(empty, sizeof empty, "%s/empty.jsonl", dir);
    cr_assert(write_bytes(empty, "", 0));
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --pool-bytes 1.5K", model, empty);
    test_cli_output(args, out, sizeof out);
    cr_assert(strstr(out, "budget of 1536 bytes"), "%s", out);
    /* serve's sizes go through the same parser */
    cr_assert_eq(test_cli_output("serve --model x --keys y --max-body nan", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--max-body: expected a whole number"), "%s", out);
}

/* Other numbers: no leading blanks, no hex, nothing after the digits. */
Test(robust, numbers_checked, .timeout = TEST_TIMEOUT(30))
{
    static char out[1 << 14];
    static const char *const bad[] = { "run --model x --requests y --max-tokens ' 5'", "run --model x --requests y --tau nan",
                                       "run --model x --requests y --beta 0x1p-1", "run --model x --requests y --tau infinity",
                                       "generate --model x --prompt-ids 1 -n 1e3", "run --model x --requests y --admit-k +2",
                                       "generate --model x --prompt-ids '1, 2'", "generate --model x --prompt-ids 1,+2" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(test_cli_output(bad[i], out, sizeof out), 2, "%s: %s", bad[i], out);
        cr_assert(strstr(out, "expected"), "%s: %s", bad[i], out);
    }
}

/* Unknown list values are errors naming the value and the valid ones. */
Test(robust, unknown_list_values_refused, .timeout = TEST_TIMEOUT(30))
{
    static char out[1 << 14];
    static const char *const cases[][2] = {
        { "attack --model x --attacks nope", "unknown attack 'nope' (direct, token" },
        { "attack --model x --modes none,nope", "--modes: unknown sharing mode 'nope' (none, tenant-prefix" },
        { "attack --model x --modes none,,chunk", "--modes: an empty entry" },
        { "run --model x --requests y --compare none,nope", "--compare: unknown sharing mode 'nope' (none, tenant-prefix" },
        { "run --model x --requests y --compare none,chunk,none", "'none' is named twice" },
        { "run --model x --requests y --compare none,tenant-prefix,global-prefix,chunk,cacheprune,,", "an empty entry" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_eq(test_cli_output(cases[i][0], out, sizeof out), 2, "%s: %s", cases[i][0], out);
        cr_assert(strstr(out, cases[i][1]), "%s: %s", cases[i][0], out);
    }
}

/* --resume does not run again the requests whose lines are there, and the
 * pool it continues with is cold, as its message says. */
Test(robust, resume_does_not_recompute, .timeout = TEST_TIMEOUT(60))
{
    static char out[1 << 14];
    char dir[512], model[512], log[700], res[700], sum[700], args[4096];
    shared_path(model, sizeof model, "models/cp-books-6m");
    test_tmpdir(dir, sizeof dir, "resume");
    snprintf(log, sizeof log, "%s/r.jsonl", dir);
    snprintf(res, sizeof res, "%s/o.jsonl", dir);
    snprintf(sum, sizeof sum, "%s/s.json", dir);
    FILE *f = fopen(log, "w");
    /* one tenant, one document: request 2 onwards reuses request 1's prefix in a warm pool */
    for (int i = 0; i < 5; i++)
        fprintf(f, "{\"tenant\":\"t\",\"messages\":[{\"role\":\"document\",\"content\":\"The quick brown fox jumps over the lazy "
                   "dog near the river bank every single morning before breakfast.\"},{\"role\":\"user\",\"content\":\"Question %d?\"}],"
                   "\"max_tokens\":2}\n",
                i);
    fclose(f);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --out %s", model, log, res);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    char *all = read_text(res, NULL), *p = all;
    for (int k = 0; k < 2; k++) p = strchr(p, '\n') + 1;
    cJSON *w3 = cJSON_Parse(p);
    cr_assert(w3 && cJSON_GetObjectItem(w3, "reused")->valuedouble > 0,
              "in the uninterrupted run request 3 reuses request 1's prefix (the test's premise): %s", p);
    cJSON_Delete(w3);
    size_t keep = (size_t)(p - all);
    cr_assert(write_bytes(res, all, keep)); /* two whole lines */
    snprintf(args, sizeof args, "run --quiet-progress --resume --model %s --requests %s --out %s --summary-json %s", model, log, res,
             sum);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "resuming after 2 result lines") && strstr(out, "the pool starts cold"), "%s", out);
    char *s = read_text(sum, NULL);
    cJSON *j = cJSON_Parse(s);
    cr_assert(j, "%s", s);
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "modes"), 0);
    cr_assert_eq(cJSON_GetObjectItem(m0, "requests")->valuedouble, 3, "only the 3 unfinished requests run: %s", s);
    cJSON_Delete(j);
    free(s);
    char *now = read_text(res, NULL);
    cr_assert(memcmp(now, all, keep) == 0, "the finished lines are kept as they were");
    /* request 3 is the first of the resumed run: a cold pool has nothing to reuse */
    cJSON *l3 = cJSON_Parse(now + keep);
    cr_assert(l3);
    cr_assert_eq(cJSON_GetObjectItem(l3, "line")->valuedouble, 3);
    cr_assert_eq(cJSON_GetObjectItem(l3, "reused")->valuedouble, 0, "the pool starts cold: %s", now + keep);
    cJSON_Delete(l3);
    free(now);
    /* --resume with two modes is refused before --out is touched (it cut the half line first) */
    const char half[] = "{\"line\":1}\n{\"li";
    cr_assert(write_bytes(res, half, sizeof half - 1));
    snprintf(args, sizeof args, "run --quiet-progress --resume --model %s --requests %s --out %s --compare none,chunk", model, log, res);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--resume works with one sharing mode"), "%s", out);
    size_t hn;
    char *h = read_text(res, &hn);
    cr_assert(hn == sizeof half - 1 && memcmp(h, half, hn) == 0, "--out untouched");
    free(h);
    free(all);
}

/* A prompt past the model's context is refused wherever it enters, with
 * the numbers; one that fits still runs (stories260K: 512 positions). */
Test(robust, context_enforced_by_generate_and_annotate, .timeout = TEST_TIMEOUT(60))
{
    static char out[1 << 14], args[1 << 14];
    char model[512];
    shared_path(model, sizeof model, "models/stories260K-hf");
    char ids[4096] = "1";
    for (int i = 1; i < 512; i++) strcat(ids, ",1"); /* 512 ids */
    snprintf(args, sizeof args, "generate --model %s -n 1 --prompt-ids %s", model, ids);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "generate: 512 prompt tokens + 1 to generate = 513, past the model's context of 512 tokens"), "%s", out);
    snprintf(args, sizeof args, "annotate --model %s --prompt-ids %s,1", model, ids);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "annotate: 513 prompt tokens, past the model's context of 512 tokens"), "%s", out);
    ids[strlen(ids) - 2] = 0; /* 511 ids + 1 to generate: exactly the context */
    snprintf(args, sizeof args, "generate --model %s -n 1 --greedy --prompt-ids %s", model, ids);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "annotate --model %s --prompt-ids %s,1", model, ids);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
}

/* cp-books-6m's tokenizer.json with a 'single' template of n_bos BOS tokens
 * and n_seq times the sequence, loaded */
static cp_status load_with_template(int n_bos, int n_seq, cp_tokenizer **t, cp_error *err)
{
    char src[512];
    shared_path(src, sizeof src, "models/cp-books-6m/tokenizer.json");
    char *text = read_text(src, NULL);
    cr_assert(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *post = cJSON_GetObjectItem(root, "post_processor");
    cJSON *single = cJSON_GetObjectItem(post, "single");
    cr_assert(cJSON_IsArray(single) && cJSON_GetArraySize(single) == 2, "the kit's template is <s> $A");
    cJSON *bos = cJSON_GetArrayItem(single, 0), *seq = cJSON_GetArrayItem(single, 1), *mine = cJSON_CreateArray();
    for (int i = 0; i < n_bos; i++) cJSON_AddItemToArray(mine, cJSON_Duplicate(bos, 1));
    for (int i = 0; i < n_seq; i++) cJSON_AddItemToArray(mine, cJSON_Duplicate(seq, 1));
    cJSON_ReplaceItemInObject(post, "single", mine);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *t = NULL;
    cp_status rc = cp_tokenizer_from_json(json, strlen(json), NULL, "template.json", t, err);
    free(json);
    return rc;
}

/* A TemplateProcessing that adds 100 000 BOS tokens to every prompt is
 * refused at load, naming the bound; so is a second $A. */
Test(robust, template_processing_bounded, .timeout = TEST_TIMEOUT(30))
{
    cp_tokenizer *t = NULL;
    cp_error err = { 0 };
    cr_assert_eq(load_with_template(100000, 1, &t, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "TemplateProcessing adds more than 64 special tokens"), "%s", err.msg);
    cr_assert_null(t);
    cr_assert_eq(load_with_template(65, 1, &t, &err), CP_EFORMAT, "65: one past the bound");
    /* 64 still load (the bound itself) and add what they say */
    cr_assert_eq(load_with_template(64, 1, &t, &err), CP_OK, "%s", err.msg);
    cp_encoding e = { 0 };
    cr_assert_eq(cp_tokenize(t, "hi", 2, CP_TOK_ADD_SPECIAL, &e, &err), CP_OK);
    cr_assert_geq(e.n, 65, "64 BOS tokens and the text");
    for (int i = 0; i < 64; i++) cr_assert_eq(e.ids[i], 1);
    cp_encoding_free(&e);
    cp_tokenizer_free(t);
    /* the sequence twice: every prompt copied */
    cr_assert_eq(load_with_template(1, 2, &t, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "names the sequence more than once"), "%s", err.msg);
}

/* detect - reads all of stdin or refuses: 256 MiB + 1 byte is an error
 * (exit 1), never a prefix scanned and "nothing found". */
Test(robust, detect_stdin_over_limit_refused, .timeout = TEST_TIMEOUT(30))
{
    char dir[512];
    test_tmpdir(dir, sizeof dir, "detect_stdin");
    const char *b = getenv("CP_BIN");
    int rc = test_sh("head -c 268435457 /dev/zero | %s detect - > %s/o.txt 2>&1", b && *b ? b : "build/cacheprune", dir);
    char path[700];
    snprintf(path, sizeof path, "%s/o.txt", dir);
    char *t = read_text(path, NULL);
    cr_assert_eq(rc, 1, "%s", t);
    cr_assert(strstr(t, "stdin holds more than its limit of 256 MiB"), "%s", t);
    free(t);
    /* a short input is read whole, past the first 64 KiB buffer */
    rc = test_sh("{ head -c 70000 /dev/zero | tr '\\0' ' '; printf 'card 4111 1111 1111 1111'; } | %s detect --json - > %s/o.txt 2>&1",
                 b && *b ? b : "build/cacheprune", dir);
    t = read_text(path, NULL);
    cr_assert_eq(rc, 0, "%s", t);
    cr_assert(strstr(t, "\"start\":70005,\"end\":70024,\"type\":\"card\""), "%s", t);
    free(t);
}

/* The scan reads raw bits: every non-finite pattern of each dtype found at
 * its index (unaligned, past the first block), finite extremes are not. */
Test(robust, nonfinite_scan_per_dtype)
{
    enum { N = 10000 };
    static unsigned char buf[4 * N + 1];
    const struct { cp_dtype t; size_t esz; uint32_t bad[3], good[3]; } c[] = {
        { CP_F32, 4, { 0x7fc00000u, 0x7f800000u, 0xff800001u }, { 0x7f7fffffu, 0xff7fffffu, 0x00000001u } },
        { CP_F16, 2, { 0x7e00u, 0x7c00u, 0xfc01u }, { 0x7bffu, 0xfbffu, 0x0001u } },
        { CP_BF16, 2, { 0x7fc0u, 0x7f80u, 0xff81u }, { 0x7f7fu, 0xff7fu, 0x0001u } },
    };
    for (int k = 0; k < 3; k++) {
        unsigned char *p = buf + 1; /* safetensors data need not be aligned */
        for (int v = 0; v < 3; v++) {
            memset(buf, 0, sizeof buf);
            for (size_t i = 0; i < N; i++) memcpy(p + i * c[k].esz, &c[k].good[i % 3], c[k].esz);
            cr_assert_eq(cp_first_nonfinite(p, c[k].t, N), N, "%s: finite extremes", cp_dtype_name(c[k].t));
            memcpy(p + 9000 * c[k].esz, &c[k].bad[v], c[k].esz);
            memcpy(p + 9999 * c[k].esz, &c[k].bad[(v + 1) % 3], c[k].esz);
            cr_assert_eq(cp_first_nonfinite(p, c[k].t, N), 9000, "%s pattern %#x", cp_dtype_name(c[k].t), c[k].bad[v]);
            cr_assert_eq(cp_first_nonfinite(p, c[k].t, 9000), 9000, "the count bounds the scan");
        }
    }
}

/* A checkpoint holding one NaN or Inf is refused at load, naming the
 * tensor and the element (it loaded, and generate emitted id 0 forever). */
Test(robust, nonfinite_weights_refused_at_load, .timeout = TEST_TIMEOUT(30))
{
    char dir[512], path[700];
    size_t n, off;
    unsigned char *st = test_books_checkpoint_copy("nan_weights", "model.layers.1.mlp.up_proj.weight", dir, sizeof dir, &n, &off);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const uint16_t pat[2] = { 0x7fc0u /* NaN */, 0xff80u /* -Inf */ };
    cp_backend *be;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK);
    for (int v = 0; v < 2; v++) {
        unsigned char *w = malloc(n);
        memcpy(w, st, n);
        memcpy(w + off + 2 * 12345, &pat[v], 2);
        cr_assert(write_bytes(path, w, n));
        free(w);
        cp_model *m = NULL;
        err.msg[0] = 0;
        cr_assert_eq(cp_model_load(dir, be, NULL, &m, &err), CP_EFORMAT, "pattern %#x loaded", pat[v]);
        cr_assert(strstr(err.msg, "tensor 'model.layers.1.mlp.up_proj.weight' holds a non-finite value (NaN or Inf) at element 12345"),
                  "%s", err.msg);
        cr_assert_null(m);
    }
    /* the untouched file loads */
    cr_assert(write_bytes(path, st, n));
    cp_model *m = NULL;
    cr_assert_eq(cp_model_load(dir, be, NULL, &m, &err), CP_OK, "%s", err.msg);
    cp_model_free(m);
    cp_backend_destroy(be);
    free(st);
}

/* eval-detect: a reversed or out-of-range gold span is an error naming it,
 * never skipped or scored as an empty span. */
Test(robust, eval_detect_refuses_bad_spans, .timeout = TEST_TIMEOUT(30))
{
    require_kit(); /* eval-detect tokenizes with the kit's cp-books-6m tokenizer */
    static char out[1 << 14];
    char dir[512], data[700], args[4096];
    test_tmpdir(dir, sizeof dir, "eval_spans");
    snprintf(data, sizeof data, "%s/d.json", dir);
    static const char *const bad[][2] = {
        { "[{\"full_text\":\"call Bob at 555\",\"spans\":[{\"entity_type\":\"PERSON\",\"start_position\":9,\"end_position\":5}]}]",
          "start_position 9 is not before end_position 5" },
        { "[{\"full_text\":\"call Bob\",\"spans\":[{\"entity_type\":\"PERSON\",\"start_position\":5,\"end_position\":99}]}]",
          "end_position" },
        { "[{\"full_text\":\"call Bob\",\"spans\":[{\"entity_type\":\"PERSON\",\"start_position\":-1,\"end_position\":3}]}]",
          "start_position" },
        { "[{\"full_text\":\"call Bob\",\"spans\":[{\"entity_type\":\"PERSON\",\"start_position\":\"5\",\"end_position\":8}]}]",
          "start_position" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert(write_bytes(data, bad[i][0], strlen(bad[i][0])));
        snprintf(args, sizeof args, "eval-detect --quiet-progress --data %s", data);
        cr_assert_eq(test_cli_output(args, out, sizeof out), 1, "%s: %s", bad[i][0], out);
        cr_assert(strstr(out, "text 0: a gold span") && strstr(out, bad[i][1]), "%s: %s", bad[i][0], out);
    }
    const char good[] = "[{\"full_text\":\"call Bob\",\"spans\":[{\"entity_type\":\"PERSON\",\"start_position\":5,\"end_position\":8}]}]";
    cr_assert(write_bytes(data, good, sizeof good - 1));
    snprintf(args, sizeof args, "eval-detect --quiet-progress --data %s", data);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 0, "%s", out);
}

/* Replay plans: a non-numeric id or an unknown letter is an error naming
 * it (they became 0 and 'F'), in run --plan-in and in gpu_pack. */
Test(robust, plan_ids_and_letters_checked, .timeout = TEST_TIMEOUT(30))
{
    static char out[1 << 14];
    char dir[512], model[512], log[700], plan[700], args[4096];
    shared_path(model, sizeof model, "models/cp-books-6m");
    test_tmpdir(dir, sizeof dir, "plans");
    snprintf(log, sizeof log, "%s/r.jsonl", dir);
    snprintf(plan, sizeof plan, "%s/p.jsonl", dir);
    const char line[] = "{\"tenant\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}\n";
    cr_assert(write_bytes(log, line, sizeof line - 1));
    static const char *const bad[][2] = {
        { "{\"ids\":[1,\"x\",3],\"plan\":\"FFF\"}\n", "ids[]" },
        { "{\"ids\":[1,2.5,3],\"plan\":\"FFF\"}\n", "ids[]" },
        { "{\"ids\":[1,2,3],\"plan\":\"FQF\"}\n", "code 1 is 'Q', not F, R or C" },
    };
    const char *cb = getenv("CP_BIN"), *sl;
    if (!cb || !*cb) cb = "build/cacheprune";
    sl = strrchr(cb, '/');
    char gpu_pack[600]; /* beside cacheprune (make test builds it) */
    snprintf(gpu_pack, sizeof gpu_pack, "%.*s/gpu_pack", sl ? (int)(sl - cb) : 1, sl ? cb : ".");
    cr_assert_eq(access(gpu_pack, X_OK), 0, "%s not built", gpu_pack);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert(write_bytes(plan, bad[i][0], strlen(bad[i][0])));
        snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --plan-in %s --out %s/o.jsonl", model, log, plan, dir);
        test_cli_output(args, out, sizeof out);
        char res[700];
        snprintf(res, sizeof res, "%s/o.jsonl", dir);
        char *t = read_text(res, NULL);
        cr_assert(t && strstr(t, bad[i][1]), "%s: the result line's error names it: %s %s", bad[i][0], t, out);
        free(t);
        int rc = test_sh("%s --plans %s --out %s/p.plans > /dev/null 2>&1", gpu_pack, plan, dir);
        cr_assert_eq(rc, 1, "gpu_pack took %s", bad[i][0]);
    }
    /* the optional segments must agree with the plan (run only: gpu_pack
     * replays the plan letters alone) */
    static const char *const bad_segs[][2] = {
        { "{\"ids\":[1,2,3],\"plan\":\"FCR\",\"segs\":\".X-\"}\n", "'segs' 1 is 'X' where the plan has 'C'" },
        { "{\"ids\":[1,2,3],\"plan\":\"FRR\",\"segs\":\"SS-\"}\n", "'segs' 0 is 'S' where the plan has 'F'" },
        { "{\"ids\":[1,2,3],\"plan\":\"FRR\",\"segs\":\".S\"}\n", "'segs' must be a string as long as the plan" },
    };
    for (size_t i = 0; i < sizeof bad_segs / sizeof *bad_segs; i++) {
        cr_assert(write_bytes(plan, bad_segs[i][0], strlen(bad_segs[i][0])));
        snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --plan-in %s --out %s/o.jsonl", model, log, plan, dir);
        test_cli_output(args, out, sizeof out);
        char res[700];
        snprintf(res, sizeof res, "%s/o.jsonl", dir);
        char *t = read_text(res, NULL);
        cr_assert(t && strstr(t, bad_segs[i][1]), "%s: the result line's error names it: %s %s", bad_segs[i][0], t, out);
        free(t);
    }
}

/* synth --tokenizer loads the tokenizer before copying it: a broken one is
 * refused and nothing is written; nor is it copied over itself. */
Test(robust, synth_tokenizer_loaded_first, .timeout = TEST_TIMEOUT(30))
{
    static char out[1 << 14];
    char dir[512], tokdir[700], outdir[700], args[4096];
    test_tmpdir(dir, sizeof dir, "synth_tok");
    snprintf(tokdir, sizeof tokdir, "%s/tok", dir);
    snprintf(outdir, sizeof outdir, "%s/out", dir);
    cr_assert_eq(mkdir(tokdir, 0755), 0);
    char path[800];
    snprintf(path, sizeof path, "%s/tokenizer.json", tokdir);
    const char broken[] = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}";
    cr_assert(write_bytes(path, broken, sizeof broken - 1));
    snprintf(args, sizeof args, "synth --shape tiny --out %s --tokenizer %s --quiet-progress", outdir, tokdir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "synth: --tokenizer") && strstr(out, "tokenizer.json"), "%s", out);
    cr_assert_neq(access(outdir, F_OK), 0, "nothing written for a broken tokenizer");
    /* a good tokenizer, into its own directory */
    char src[512];
    shared_path(src, sizeof src, "models/cp-books-6m");
    cr_assert_eq(test_sh("cp %s/tokenizer.json %s/tokenizer_config.json %s/", src, src, tokdir), 0);
    snprintf(args, sizeof args, "synth --shape tiny --out %s/./ --tokenizer %s --quiet-progress", tokdir, tokdir);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "is the same file as --tokenizer"), "%s", out);
}

static void write_abc(const char *path, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "%s", path);
    for (size_t i = 0; i < n; i++) fputc('a' + (int)(i % 26), f);
    cr_assert_eq(fclose(f), 0);
}

/* cp_read_file sizes its buffer from fstat: a file of exactly the cap is
 * read whole, one byte over is refused, and the bytes are the file's. */
Test(robust, read_file_at_and_over_its_cap, .timeout = TEST_TIMEOUT(10))
{
    char dir[512], path[600];
    test_tmpdir(dir, sizeof dir, "read_cap");
    snprintf(path, sizeof path, "%s/f", dir);
    for (size_t n = 0; n <= 5; n++) {
        write_abc(path, n);
        cp_error err = { 0 };
        char *text = NULL;
        size_t len = 99;
        cr_assert_eq(cp_read_file(path, 5, &text, &len, &err), CP_OK, "%zu bytes: %s", n, err.msg);
        cr_assert_eq(len, n);
        cr_assert_eq(strlen(text), n);
        for (size_t i = 0; i < n; i++) cr_assert_eq(text[i], 'a' + (int)(i % 26));
        free(text);
    }
    write_abc(path, 6);
    cp_error err = { 0 };
    char *text = NULL;
    cr_assert_eq(cp_read_file(path, 5, &text, NULL, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "larger than the 5-byte cap"), "%s", err.msg);
    cr_assert_null(text);
}

/* A regular file whose size fstat does not know (procfs says 0) is read
 * by growing the buffer, up to the cap and no further. */
Test(robust, read_file_grows_past_a_zero_stat_size, .timeout = TEST_TIMEOUT(10))
{
    cp_error err = { 0 };
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(cp_read_file("/proc/self/status", 1 << 20, &text, &len, &err), CP_OK, "%s", err.msg);
    cr_assert_gt(len, 100);
    cr_assert(strstr(text, "Pid:"), "the status file's text, not its stat size");
    free(text);
    cr_assert_eq(cp_read_file("/proc/self/status", 50, &text, &len, &err), CP_EFORMAT);
    cr_assert_null(text);
}
