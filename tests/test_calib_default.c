/* Automatic calibration (engine/cli/cli_calib_default.h): run without
 * --calibration measures this model's grid once, keeps it in the state
 * directory and reads it back after; a corrupt file, one for another model
 * or with values out of range is measured again; --calibration FILE, off
 * and the options a calibration sets override it; the state directory
 * comes from --state-dir, $CACHEPRUNE_STATE_DIR or $XDG_STATE_HOME, and
 * one that cannot be written costs a notice, not the run; a tighter
 * --quality budget never picks a cheaper setting.  The suite's other
 * commands run with it off (helpers.c); these turn it on. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers.h"

typedef struct ctx {
    char dir[512], state[600], log[600], model[512];
} ctx;

static void ctx_make(ctx *c, const char *name)
{
    require_kit();
    test_tmpdir(c->dir, sizeof c->dir, name);
    snprintf(c->state, sizeof c->state, "%s/state", c->dir);
    snprintf(c->log, sizeof c->log, "%s/log.jsonl", c->dir);
    shared_path(c->model, sizeof c->model, "models/cp-books-6m");
    FILE *f = fopen(c->log, "w");
    cr_assert(f);
    fputs("{\"tenant\":\"a\",\"prompt\":\"Once upon a time\",\"max_tokens\":2}\n", f);
    fclose(f);
}

/* run on the log with automatic calibration on, over the sample's first
 * `sample` requests (1: a passage alone, 2: and one reused after two
 * others), plus extra options; env adds shell assignments */
static int run_auto(const ctx *c, const char *env, int sample, const char *extra, char *out, size_t cap)
{
    char args[4096], envs[4096];
    int w1 = snprintf(envs, sizeof envs, "CACHEPRUNE_CALIBRATION=auto %s", env);
    int w2 = snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --calib-sample %d %s", c->model, c->log, sample, extra);
    cr_assert(w1 > 0 && w1 < (int)sizeof envs && w2 > 0 && w2 < (int)sizeof args, "command too long");
    return test_cli_output_env(envs, args, out, cap);
}

/* the one calibration file in dir (its path in out); 0 when there is none or more */
static int the_file(const char *dir, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "calibration-", 12) == 0 && strlen(e->d_name) > 17 && strcmp(e->d_name + strlen(e->d_name) - 5, ".json") == 0)
            n++, snprintf(out, cap, "%s/%s", dir, e->d_name);
    closedir(d);
    return n == 1;
}

static cJSON *read_json(const char *path)
{
    char *t = read_text(path, NULL);
    cr_assert(t, "cannot read %s", path);
    cJSON *j = cJSON_Parse(t);
    free(t);
    cr_assert(j, "%s is not JSON", path);
    return j;
}

static void write_json(const char *path, const cJSON *j)
{
    char *t = cJSON_Print(j);
    cr_assert(t);
    cr_assert(write_bytes(path, t, strlen(t)));
    free(t);
}

static double mtime_of(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "no %s", path);
    return (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
}

Test(calib_default, first_use_measures_and_keeps_it_later_uses_read_it_back, .timeout = TEST_TIMEOUT(240))
{
    ctx c;
    ctx_make(&c, "calib-first");
    char out[16384], path[1200], extra[700];
    snprintf(extra, sizeof extra, "--state-dir %s", c.state);
    cr_assert_eq(run_auto(&c, "", 2, extra, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "calibrating recompute for this model"), "first use gave no notice: %s", out);
    cr_assert(the_file(c.state, path, sizeof path), "first use kept no calibration file in %s: %s", c.state, out);
    cr_assert(strstr(out, "calibration (automatic, measured now, kept in"), "%s", out);
    cJSON *g = read_json(path);
    cJSON *pts = cJSON_GetObjectItemCaseSensitive(g, "grid");
    cr_assert_eq(cJSON_GetArraySize(pts), 25, "the grid has not 25 settings (6 R x 4 tails, and R 1)");
    /* every R is measured at every tail: the tail is part of the setting kept */
    int tails[300] = { 0 };
    cJSON *pt;
    cJSON_ArrayForEach(pt, pts)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(pt, "recompute_tail");
        cr_assert(cJSON_IsNumber(t) && t->valueint >= 0 && t->valueint < 300, "a grid point without its recompute_tail");
        tails[t->valueint]++;
    }
    cr_assert(tails[32] == 6 && tails[64] == 6 && tails[128] == 6 && tails[256] == 6, "the tails 32 / 64 / 128 / 256 are not each measured at 6 R");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(g, "requests")->valueint, 2);
    cJSON_Delete(g);
    char *before = read_text(path, NULL);
    double t0 = mtime_of(path);
    cr_assert_eq(run_auto(&c, "", 2, extra, out, sizeof out), 0, "%s", out);
    cr_assert_null(strstr(out, "calibrating"), "the second use measured again: %s", out);
    char said[1400];
    snprintf(said, sizeof said, "calibration (automatic, %s)", path);
    cr_assert(strstr(out, said), "the second use does not say it read %s: %s", path, out);
    char *after = read_text(path, NULL);
    cr_assert_str_eq(after, before, "the second use rewrote the file");
    cr_assert_eq(mtime_of(path), t0, "the second use touched the file");
    /* a side-by-side run's cacheprune row is the same calibrated setting (what the demo shows) */
    snprintf(extra, sizeof extra, "--state-dir %s --compare none,cacheprune", c.state);
    cr_assert_eq(run_auto(&c, "", 2, extra, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, said) && !strstr(out, "calibrating"), "--compare's cacheprune did not read the kept calibration: %s", out);
    snprintf(extra, sizeof extra, "--state-dir %s", c.state);
    free(before), free(after);
    /* another sample is another file, measured once too */
    cr_assert_eq(run_auto(&c, "", 1, extra, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "calibrating recompute"), "another sample reused the first one's grid: %s", out);
    cr_assert_not(the_file(c.state, path, sizeof path), "another sample did not get a file of its own");
}

/* the file, changed by edit, is refused with reason `why` and measured again into a valid one */
static void rejected(const ctx *c, const char *path, const char *why, void (*edit)(cJSON *))
{
    char out[16384], extra[700];
    snprintf(extra, sizeof extra, "--state-dir %s", c->state);
    cJSON *g = read_json(path);
    if (edit) {
        edit(g);
        write_json(path, g);
    } else {
        cr_assert(write_bytes(path, "{\"format\": 1, \"grid\": [", 23));
    }
    cr_assert_eq(run_auto(c, "", 1, extra, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "is not usable") && strstr(out, why), "the changed file was not refused for '%s': %s", why, out);
    cr_assert(strstr(out, "calibrating recompute"), "the refused file was not measured again: %s", out);
    cJSON *back = read_json(path);
    char *a = cJSON_PrintUnformatted(back), *b = cJSON_PrintUnformatted(g);
    cr_assert(edit == NULL || strcmp(a, b) != 0, "the refused file was not rewritten");
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(back, "model_fingerprint");
    cr_assert(cJSON_IsString(fp) && strspn(fp->valuestring, "0123456789abcdef") == 64 && strncmp(fp->valuestring, "0000", 4) != 0);
    free(a), free(b);
    cJSON_Delete(back), cJSON_Delete(g);
}

static void other_model(cJSON *g)
{
    cJSON_ReplaceItemInObjectCaseSensitive(g, "model_fingerprint",
                                           cJSON_CreateString("0000000000000000000000000000000000000000000000000000000000000000"));
}

static void greedy_out_of_range(cJSON *g)
{
    cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(g, "grid"), 3);
    cJSON_ReplaceItemInObjectCaseSensitive(p, "greedy", cJSON_CreateNumber(1.5));
}

static void unknown_field(cJSON *g) { cJSON_AddNumberToObject(g, "recompute_default", 0.1); }

static void another_sample(cJSON *g)
{
    cJSON_ReplaceItemInObjectCaseSensitive(g, "sample", cJSON_CreateString("1111111111111111111111111111111111111111111111111111111111111111"));
}

Test(calib_default, a_corrupt_other_model_or_out_of_range_file_is_measured_again, .timeout = TEST_TIMEOUT(300))
{
    ctx c;
    ctx_make(&c, "calib-hostile");
    char out[16384], path[1200], extra[700];
    snprintf(extra, sizeof extra, "--state-dir %s", c.state);
    cr_assert_eq(run_auto(&c, "", 1, extra, out, sizeof out), 0, "%s", out);
    cr_assert(the_file(c.state, path, sizeof path), "%s", out);
    rejected(&c, path, "JSON", NULL);
    rejected(&c, path, "another model", other_model);
    rejected(&c, path, "another sample", another_sample);
    rejected(&c, path, "greedy", greedy_out_of_range);
    rejected(&c, path, "recompute_default", unknown_field);
}

Test(calib_default, a_calibration_file_off_or_an_explicit_knob_overrides_it, .timeout = TEST_TIMEOUT(240))
{
    ctx c;
    ctx_make(&c, "calib-override");
    char out[16384], path[1200], extra[1400], cal[700];
    snprintf(extra, sizeof extra, "--state-dir %s", c.state);
    cr_assert_eq(run_auto(&c, "", 1, extra, out, sizeof out), 0, "%s", out);
    cr_assert(the_file(c.state, path, sizeof path), "%s", out);
    char *g0 = read_text(path, NULL); /* the kept file as measured, to put back */
    cr_assert(g0);
    cJSON *g = read_json(path);
    const char *fp = cJSON_GetObjectItemCaseSensitive(g, "model_fingerprint")->valuestring;
    snprintf(cal, sizeof cal, "%s/cal.json", c.dir);
    FILE *f = fopen(cal, "w");
    cr_assert(f);
    fprintf(f, "{\"format\": 1, \"model_fingerprint\": \"%s\", \"kl_budget\": 0.002, \"greedy_min\": 0.95, \"requests\": 3, "
               "\"meets_budget\": true, \"setting\": {\"sharing\": \"cacheprune\", \"segment_kv\": \"in-context\", \"recompute_by\": "
               "\"epic\", \"recompute\": 0.625, \"k0\": 2, \"tau\": 1, \"gradual_start\": 2, \"deviation_layer\": 1}}\n", fp);
    fclose(f);
    cJSON_Delete(g);
    const char *ways[] = { "--calibration %s", "--recompute 0.5", "--calibration off", "--recompute-by gradual" };
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        char way[800], args[2048];
        snprintf(way, sizeof way, ways[i], cal);
        snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s %s", c.model, c.log, way);
        /* a broken kept file would be measured again if the automatic calibration ran */
        cr_assert(write_bytes(path, "{", 1));
        char env[800];
        snprintf(env, sizeof env, "CACHEPRUNE_CALIBRATION=auto CACHEPRUNE_STATE_DIR=%s", c.state);
        cr_assert_eq(test_cli_output_env(env, args, out, sizeof out), 0, "%s: %s", way, out);
        cr_assert_null(strstr(out, "automatic"), "%s still ran the automatic calibration: %s", way, out);
        if (i == 0) cr_assert(strstr(out, "R 0.625"), "--calibration FILE's setting was not applied: %s", out);
    }
    /* --sharing cacheprune names the default mode: the kept calibration still runs */
    char env[1600], args[2048];
    cr_assert(write_bytes(path, g0, strlen(g0)));
    snprintf(env, sizeof env, "CACHEPRUNE_CALIBRATION=auto CACHEPRUNE_STATE_DIR=%s", c.state);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --calib-sample 1 --sharing cacheprune", c.model, c.log);
    cr_assert_eq(test_cli_output_env(env, args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "calibration (automatic, ") && !strstr(out, "calibrating"), "--sharing cacheprune left the kept calibration out: %s",
              out);
    /* with a calibration file --sharing is one of the options it sets */
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --calibration %s --sharing cacheprune", c.model, c.log, cal);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--calibration sets"), "%s", out);
    /* $CACHEPRUNE_CALIBRATION names a file too */
    snprintf(env, sizeof env, "CACHEPRUNE_CALIBRATION=%s", cal);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s", c.model, c.log);
    cr_assert_eq(test_cli_output_env(env, args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "R 0.625"), "$CACHEPRUNE_CALIBRATION's file was not applied: %s", out);
    /* the options only the automatic calibration reads are refused where it does not run */
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --recompute 0.5 --quality fast", c.model, c.log);
    cr_assert_neq(test_cli_output_env("CACHEPRUNE_CALIBRATION=auto", args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "--quality"), "%s", out);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --compare none,chunk --state-dir %s", c.model, c.log,
             c.state);
    cr_assert_neq(test_cli_output_env("CACHEPRUNE_CALIBRATION=auto", args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "--state-dir"), "%s", out);
    snprintf(args, sizeof args, "calibrate --quiet-progress --model %s --requests %s --quality high", c.model, c.log);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --quality best", c.model, c.log);
    cr_assert_eq(test_cli_output(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "high, balanced or fast"), "%s", out);
    free(g0);
}

Test(calib_default, the_state_directory_comes_from_the_option_the_environment_or_xdg, .timeout = TEST_TIMEOUT(300))
{
    ctx c;
    ctx_make(&c, "calib-dirs");
    char out[16384], path[1200], dirs[3][700], env[2200], extra[800];
    for (int i = 0; i < 3; i++) snprintf(dirs[i], sizeof dirs[i], "%s/d%d", c.dir, i);
    /* the option wins over the environment, which wins over XDG */
    snprintf(env, sizeof env, "CACHEPRUNE_STATE_DIR=%s XDG_STATE_HOME=%s/xdg", dirs[1], c.dir);
    snprintf(extra, sizeof extra, "--state-dir %s", dirs[0]);
    cr_assert_eq(run_auto(&c, env, 1, extra, out, sizeof out), 0, "%s", out);
    cr_assert(the_file(dirs[0], path, sizeof path), "--state-dir %s got no file: %s", dirs[0], out);
    cr_assert_eq(run_auto(&c, env, 1, "", out, sizeof out), 0, "%s", out);
    cr_assert(the_file(dirs[1], path, sizeof path), "$CACHEPRUNE_STATE_DIR got no file: %s", out);
    snprintf(env, sizeof env, "CACHEPRUNE_STATE_DIR= XDG_STATE_HOME=$PWD/%s", dirs[2]);
    cr_assert_eq(run_auto(&c, env, 1, "", out, sizeof out), 0, "%s", out);
    snprintf(extra, sizeof extra, "%s/cacheprune", dirs[2]);
    cr_assert(the_file(extra, path, sizeof path), "$XDG_STATE_HOME/cacheprune got no file: %s", out);
    /* a directory that cannot be made: a notice, the run goes on from memory */
    snprintf(extra, sizeof extra, "%s/plain", c.dir);
    cr_assert(write_bytes(extra, "x", 1));
    snprintf(extra, sizeof extra, "--state-dir %s/plain/state", c.dir);
    cr_assert_eq(run_auto(&c, "", 1, extra, out, sizeof out), 0, "an unwritable state directory failed the run: %s", out);
    cr_assert(strstr(out, "cannot keep it in") && strstr(out, "from memory"), "no notice for an unwritable directory: %s", out);
    cr_assert(strstr(out, "measured now, not kept"), "%s", out);
}

/* a kept grid rewritten with known figures: R, KL, greedy, ROUGE-L, tokens,
 * tail (the last point: a longer tail that beats a larger R on cost) */
static const double known[6][6] = {
    { 0, 0.004, 0.88, 0.89, 100, 64 },       { 0.3, 0.0015, 0.93, 0.94, 200, 64 }, { 0.6, 0.0008, 0.96, 0.96, 300, 64 },
    { 0.85, 0.0004, 0.98, 0.985, 400, 64 }, { 1, 0, 1, 0.999, 500, 0 },          { 0, 0.0009, 0.955, 0.955, 250, 256 },
};

static void known_grid(cJSON *g)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < 6; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "recompute_by", "epic");
        cJSON_AddNumberToObject(p, "recompute", known[i][0]);
        cJSON_AddNumberToObject(p, "k0", 2);
        cJSON_AddNumberToObject(p, "recompute_tail", known[i][5]);
        cJSON_AddNumberToObject(p, "kl", known[i][1]);
        cJSON_AddNumberToObject(p, "greedy", known[i][2]);
        cJSON_AddNumberToObject(p, "rouge_l", known[i][3]);
        cJSON_AddNumberToObject(p, "hit_rate", 0.5);
        cJSON_AddNumberToObject(p, "compute_tokens", known[i][4]);
        cJSON_AddItemToArray(a, p);
    }
    cJSON_ReplaceItemInObjectCaseSensitive(g, "grid", a);
    cJSON_ReplaceItemInObjectCaseSensitive(g, "full_tokens", cJSON_CreateNumber(1000));
}

Test(calib_default, a_tighter_quality_budget_never_picks_a_cheaper_setting, .timeout = TEST_TIMEOUT(240))
{
    ctx c;
    ctx_make(&c, "calib-budget");
    char out[16384], path[1200], extra[1200];
    snprintf(extra, sizeof extra, "--state-dir %s", c.state);
    cr_assert_eq(run_auto(&c, "", 1, extra, out, sizeof out), 0, "%s", out);
    cr_assert(the_file(c.state, path, sizeof path), "%s", out);
    cJSON *g = read_json(path);
    known_grid(g);
    write_json(path, g);
    cJSON_Delete(g);
    /* loosest to tightest, and the R each picks from the known grid */
    static const struct { const char *opts, *r, *tail; } budgets[] = {
        { "--quality-kl 1 --quality-greedy 0 --quality-rouge 0", "R 0,", "tail 64," },
        { "--quality fast", "R 0.3,", "tail 64," },
        { "", "R 0,", "tail 256," }, /* balanced, the default: the long tail is cheaper than R 0.6 */
        { "--quality-greedy 0.96", "R 0.6,", "tail 64," },
        { "--quality high", "R 0.85,", NULL },
        { "--quality high --quality-kl 0.0001", "R 1,", NULL },
        { "--quality high --quality-kl 0.0001 --quality-rouge 1", "prefix-only", NULL },
    };
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        snprintf(extra, sizeof extra, "--state-dir %s %s", c.state, budgets[i].opts);
        cr_assert_eq(run_auto(&c, "", 1, extra, out, sizeof out), 0, "%s", out);
        cr_assert_null(strstr(out, "calibrating"), "a budget measured again: %s", out);
        cr_assert(strstr(out, budgets[i].r), "budget '%s' did not pick %s: %s", budgets[i].opts, budgets[i].r, out);
        if (budgets[i].tail) cr_assert(strstr(out, budgets[i].tail), "budget '%s' did not pick %s: %s", budgets[i].opts, budgets[i].tail, out);
    }
}

/* serve measures (or reads back) before it listens, and says which */
Test(calib_default, serve_calibrates_before_it_listens_and_reads_it_back_after, .timeout = TEST_TIMEOUT(240))
{
    ctx c;
    ctx_make(&c, "calib-serve");
    char keys[700], path[1200];
    snprintf(keys, sizeof keys, "%s/keys", c.dir);
    cr_assert(write_bytes(keys, "sk-alice-0123456789abcdef alice\n", 32));
    chmod(keys, 0600);
    const char *bin = getenv("CP_BIN");
    for (int round = 0; round < 2; round++) {
        /* out removed first: the loop must not read the round before's "listening" while the new one starts */
        int rc = test_sh("rm -f %s/out %s/err; CACHEPRUNE_CALIBRATION=auto %s serve --model %s --keys %s --port 0 --state-dir %s --calib-sample 1 "
                         "> %s/out 2> %s/err & pid=$!; i=0; while [ $i -lt 1500 ] && ! grep -q listening %s/out; do sleep 0.1; "
                         "i=$((i+1)); done; kill $pid; wait $pid; grep -q listening %s/out",
                         c.dir, c.dir, bin && *bin ? bin : "build/cacheprune", c.model, keys, c.state, c.dir, c.dir, c.dir, c.dir);
        snprintf(path, sizeof path, "%s/err", c.dir);
        char *err = read_text(path, NULL);
        cr_assert(err);
        cr_assert_eq(rc, 0, "serve did not listen: %s", err);
        cr_assert(strstr(err, "calibration (automatic"), "serve did not apply the automatic calibration: %s", err);
        if (round == 0) cr_assert(strstr(err, "calibrating recompute"), "the first start measured nothing: %s", err);
        else cr_assert_null(strstr(err, "calibrating"), "the second start measured again: %s", err);
        free(err);
        cr_assert(the_file(c.state, path, sizeof path), "serve kept no calibration");
    }
}
