/* cacheprune demo's steps (cli_demo.c parses its options): the story in one screen.  The same multi-tenant log under
 * none, global-prefix, chunk and cacheprune (hit rate, TTFT against none,
 * quality against full recompute), one privacy probe per mode (another
 * tenant tries to recover a victim's card number through the sharing), and
 * a verdict per mode.  It runs this binary's own `workload`, `run` and
 * `attack` as child processes and reads their JSON / CSV summaries. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../kernels/fileio.h"
#include "cli.h"

extern char **environ;

#define DEMO_N_MODES 4

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* runs this binary with argv (argv[0] ignored); 1 when it exits 0 */
static int run_self(const char *self, char **argv, int quiet_stdout)
{
    argv[0] = (char *)self;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (quiet_stdout) posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return cli_error("demo: cannot execute %s: %s", self, strerror(rc)), 0;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return cli_error("demo: waitpid: %s", strerror(errno)), 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return cli_error("demo: `%s %s` failed", self, argv[1]), 0;
    return 1;
}

typedef struct mode_fig {
    char mode[32];
    double hit, ratio, ratio_p50, greedy, kl;
    int have_quality;
    double leak, chance; /* counters channel of the direct attack */
    int have_leak;
    double ctx_leak, ctx_chance; /* attack 5 by the attacker's own logits (budget on) */
    int have_ctx;
} mode_fig;

static mode_fig *fig_of(mode_fig *f, int n, const char *mode)
{
    for (int i = 0; i < n; i++)
        if (strcmp(f[i].mode, mode) == 0) return &f[i];
    return NULL;
}

static int read_summary(const char *path, mode_fig *f, int *n)
{
    char *text;
    size_t len;
    cp_error err;
    if (cp_read_file(path, (size_t)1 << 24, &text, &len, &err)) return cli_error("demo: %s", err.msg), 0;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *modes = cJSON_GetObjectItemCaseSensitive(j, "modes");
    for (const cJSON *m = modes ? modes->child : NULL; m && *n < DEMO_N_MODES; m = m->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "mode");
        if (!cJSON_IsString(name)) continue;
        mode_fig *x = &f[(*n)++];
        memset(x, 0, sizeof *x);
        snprintf(x->mode, sizeof x->mode, "%s", name->valuestring);
#define NUM(k) (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(m, k)) ? cJSON_GetObjectItemCaseSensitive(m, k)->valuedouble : 0)
        x->hit = NUM("hit_rate"), x->ratio = NUM("ratio_mean_vs_none"), x->ratio_p50 = NUM("ratio_p50_vs_none");
        x->have_quality = cJSON_GetObjectItemCaseSensitive(m, "greedy_agreement") != NULL;
        x->greedy = NUM("greedy_agreement"), x->kl = NUM("kl");
#undef NUM
    }
    cJSON_Delete(j);
    return *n > 0 || (cli_error("demo: %s holds no modes", path), 0);
}

/* mode,attack,channel,recovery,chance,... : the direct attack's counters row */
static int read_attack(const char *path, mode_fig *f, int n)
{
    FILE *fp = fopen(path, "r");
    if (!fp) return cli_error("demo: cannot read %s", path), 0;
    char line[512];
    while (fgets(line, sizeof line, fp)) {
        char mode[64], attack[32], channel[32];
        double rec, chance;
        if (sscanf(line, "%63[^,],%31[^,],%31[^,],%lf,%lf", mode, attack, channel, &rec, &chance) != 5) continue;
        char *slash = strchr(mode, '/'); /* "cacheprune/in-context" */
        if (slash) *slash = 0;
        mode_fig *x = fig_of(f, n, mode);
        if (x && strcmp(attack, "direct") == 0 && strcmp(channel, "counters") == 0) x->leak = rec, x->chance = chance, x->have_leak = 1;
        if (x && strcmp(channel, "logits") == 0 && (strcmp(attack, "context-budget-on") == 0 || strcmp(attack, "context-budget--") == 0))
            x->ctx_leak = rec, x->ctx_chance = chance, x->have_ctx = 1;
    }
    fclose(fp);
    return 1;
}

static int leaks(double rec, double chance) { return rec > 2 * chance && rec > 0.5; }

/* none's TTFT over this mode's, said as "N x faster" or "N x slower":
 * a ratio under 1 is printed as its inverse, never as "0.79x lower" */
static double speed_x(double ratio) { return ratio >= 1 || ratio <= 0 ? ratio : 1 / ratio; }

static void verdict(const mode_fig *x)
{
    char speed[128] = "the baseline: every prompt token computed", quality[96] = "";
    if (strcmp(x->mode, "none") != 0)
        snprintf(speed, sizeof speed, "%.2fx %s than none to the first token (p50 %.2fx %s), %.0f %% of prompt tokens reused",
                 speed_x(x->ratio), x->ratio >= 1 ? "faster" : "slower", speed_x(x->ratio_p50), x->ratio_p50 >= 1 ? "faster" : "slower",
                 100 * x->hit);
    if (x->have_quality) snprintf(quality, sizeof quality, ", greedy agreement with full recompute %.0f %%", 100 * x->greedy);
    int bad = (x->have_leak && leaks(x->leak, x->chance)) || (x->have_ctx && leaks(x->ctx_leak, x->ctx_chance));
    printf("  %-14s %s %s%s\n", x->mode, bad ? "LEAKS  " : "private", speed, quality);
    if (x->have_leak)
        printf("  %-14s         card found from the reuse counters: %3.0f %% (chance %.0f %%)\n", "", 100 * x->leak, 100 * x->chance);
    if (x->have_ctx)
        printf("  %-14s         card found from reused KV computed after it (attacker's own logits): %3.0f %% (chance %.0f %%)\n", "",
               100 * x->ctx_leak, 100 * x->ctx_chance);
}

/* the demo's steps, after its options (each step is a child process) */
/* The first line: the compute path the run and attack steps will take
 * (the checkpoint's stored dtype, as their --dtype auto loads it), from its
 * headers, without loading the weights here too. */
static int print_compute(const char *model)
{
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cp_dtype dt;
    if (cp_model_stored_dtype(model, &dt, &err) || cp_backend_cpu_create(&be, &err) || be->set_matrix_dtype(be, dt, &err)) {
        if (be) be->destroy(be);
        return cli_error("demo: %s", err.msg), 0;
    }
    cli_print_compute(be, stdout);
    fflush(stdout);
    be->destroy(be);
    return 1;
}

int cli_demo_run(const char *model, const char *outdir, int requests, int quiet)
{
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return cli_error("demo: cannot find this binary (/proc/self/exe)"), 1;
    self[sl] = 0;
    char kit_model[4096], synth[4096], log[4096], sum[4096], csv[4096], results[4096], nreq[16];
    const char *kit = getenv("CP_SHARED");
    snprintf(kit_model, sizeof kit_model, "%s/models/cp-books-6m", kit && *kit ? kit : "../shared");
    mkdir("build", 0755);
    if (mkdir(outdir, 0755) != 0 && errno != EEXIST) return cli_error("demo: cannot create %s: %s", outdir, strerror(errno)), 1;
    snprintf(synth, sizeof synth, "%s/synth-tiny", outdir);
    snprintf(log, sizeof log, "%s/rag.jsonl", outdir);
    snprintf(sum, sizeof sum, "%s/summary.json", outdir);
    snprintf(csv, sizeof csv, "%s/attack.csv", outdir);
    snprintf(results, sizeof results, "%s/results.jsonl", outdir);
    snprintf(nreq, sizeof nreq, "%d", requests);
    int trained = model != NULL || is_dir(kit_model);
    if (!model && trained) model = kit_model;
    if (!model) {
        char *sa[] = { NULL, "synth", "--shape", "tiny", "--out", synth, "--seed", "1", NULL };
        if (!run_self(self, sa, 1)) return 1;
        model = synth;
    }
    if (!print_compute(model)) return 1;
    if (!trained) printf("demo: no reference kit at %s: using a random-weight synth model (mechanics only)\n", kit_model);
    printf("demo: model %s%s\n\n1. one multi-tenant log (%d %s requests: shared documents, private questions) under every mode\n",
           model, trained ? "" : " (random weights)", requests, trained ? "rag-v1" : "rag-synth-v1 (generated passages)");
    fflush(stdout);
    /* rag-v1 needs the kit's texts and a real tokenizer (its system prompt
     * alone nearly fills 1024 byte-level tokens); without the kit the same
     * shape from passages the project generates itself */
    char *wa[] = { NULL, "workload", "--preset", trained ? "rag-v1" : "rag-synth-v1", "--requests", nreq, "--seed", "1", "--model", (char *)model, "--out", log, NULL };
    if (!run_self(self, wa, 1)) return 1;
    char *ra[] = { NULL, "run", "--model", (char *)model, "--requests", log, "--max-tokens", "8", "--compare", CLI_DEMO_MODES,
                   "--summary-json", sum, "--out", results, quiet ? "--quiet-progress" : NULL, NULL };
    if (!run_self(self, ra, 0)) return 1;
    printf("\n2. the privacy probes: a victim sends its card number; another tenant (a) sends each candidate card and\n"
           "   reads its own reuse counters (shown to it here: the worst case), (b) reuses the victim's next passage\n"
           "   and matches its own next-token logits against each candidate (modes with mid-message segments)\n");
    fflush(stdout);
    char *aa[] = { NULL, "attack", "--model", (char *)model, "--attacks", "direct,context", "--modes", CLI_DEMO_MODES, "--trials", "1",
                   "--candidates", "8", "--repeats", "1", "--report-reuse", "--csv", csv, NULL };
    if (!run_self(self, aa, 1)) return 1;
    mode_fig f[DEMO_N_MODES];
    int n = 0;
    if (!read_summary(sum, f, &n) || !read_attack(csv, f, n)) return 1;
    printf("\n3. verdict\n");
    for (int i = 0; i < n; i++) verdict(&f[i]);
    if (!trained)
        printf("\n   Random weights: attention is noise, so few stretches of text pass the annotator's self-containment\n"
               "   test and cacheprune reuses less than it would on a trained model; quality against full recompute\n"
               "   means nothing here.  Run with the reference kit (CP_SHARED=DIR, a trained cp-books-6m) for real figures.\n");
    printf("\n(results: %s, %s, %s)\n", results, sum, csv);
    return 0;
}

