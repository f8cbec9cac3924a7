/* Automatic calibration (cli_calib_default.h): find or measure this
 * model's grid, pick under the --quality budget, apply. */
#include "cli_calib_default.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../kernels/fileio.h"
#include "../../kernels/sha256.h"
#include "cli_calib_sample.h"
#include "cli_calib_store.h"
#include "cli_calibration.h"
#include "cli_run.h"

/* The grid: epic, k0 from the run's options, R x the recompute tail (the
 * last reused tokens before the question, forced at every R).  Which of the
 * two buys a model its quality more cheaply is the model's own: the text
 * right before the question moves the first generated tokens most, and a
 * fixed count costs the same in every prompt, while R follows the reused
 * tokens' K/V deviation wherever it is.  R 1 recomputes everything: one
 * point, whatever the tail. */
static const double grid_r[] = { 0, 0.15, 0.3, 0.45, 0.6, 0.85 };
static const int grid_tail[] = { 32, 64, 128, 256 };
#define GRID_R_N ((int)(sizeof grid_r / sizeof grid_r[0]))
#define GRID_TAIL_N ((int)(sizeof grid_tail / sizeof grid_tail[0]))
#define GRID_N (GRID_R_N * GRID_TAIL_N + 1)
#define GRID_POOL_MAX ((size_t)256 << 20)

/* the grid's point i: its R and tail */
static void grid_point(int i, double *r, int *tail)
{
    if (i == GRID_N - 1) *r = 1, *tail = 0;
    else *r = grid_r[i % GRID_R_N], *tail = grid_tail[i / GRID_R_N];
}

int cli_quality_preset(const char *name, double *kl, double *greedy, double *rouge)
{
    static const struct { const char *name; double kl, greedy, rouge; } presets[] = {
        { "high", 0.001, 0.97, 0.97 },
        { "balanced", 0.002, 0.95, 0.95 },
        { "fast", 0.01, 0.90, 0.90 },
    };
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(name, presets[i].name) == 0) {
            *kl = presets[i].kl, *greedy = presets[i].greedy, *rouge = presets[i].rouge;
            return 1;
        }
    return 0;
}

int cli_state_dir(const cli_engine_opts *o, char *out, size_t cap)
{
    const char *env = getenv("CACHEPRUNE_STATE_DIR"), *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    int w = -1;
    if (o->state_dir) w = snprintf(out, cap, "%s", o->state_dir);
    else if (env && *env) w = snprintf(out, cap, "%s", env);
    else if (xdg && xdg[0] == '/') w = snprintf(out, cap, "%s/cacheprune", xdg); /* the XDG spec ignores a relative one */
    else if (home && *home) w = snprintf(out, cap, "%s/.local/state/cacheprune", home);
    return w > 0 && (size_t)w < cap;
}

/* mkdir -p, the directories it makes private to the user */
static int make_dirs(const char *dir, char *why, size_t cap)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return snprintf(why, cap, "path too long"), 0;
    for (char *s = p + 1;; s++) {
        int end = *s == 0;
        if (*s == '/' || end) {
            *s = 0;
            if (mkdir(p, 0700) != 0 && errno != EEXIST) return snprintf(why, cap, "cannot create %s: %s", p, strerror(errno)), 0;
            if (end) break;
            *s = '/';
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return snprintf(why, cap, "%s is not a directory", dir), 0;
    if (access(dir, W_OK) != 0) return snprintf(why, cap, "%s is not writable", dir), 0;
    return 1;
}

static void hex(const uint8_t *d, int n, char *out)
{
    for (int i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* the sample's lines (the first `lines`; 0: all) */
typedef struct sample {
    const char *path; /* the file run_grid reads */
    char tmp[64];     /* a temporary copy of the built-in sample (unlinked after) */
    size_t lines;
    char digest[65];
    char what[600];   /* for the operator */
} sample;

static size_t first_lines(const char *text, size_t len, size_t want, size_t *n)
{
    size_t end = 0;
    *n = 0;
    for (size_t i = 0; i < len && (!want || *n < want); i++)
        if (text[i] == '\n') (*n)++, end = i + 1;
    if ((!want || *n < want) && end < len) (*n)++, end = len; /* a last line without a newline */
    return end;
}

/* what computes the grid's numbers: the compute line up to its BLAS part
 * (the path, the weights' kernels and the attention's), or the backend */
static void compute_of(cp_backend *be, char *out, size_t cap)
{
    cp_error err = { 0 };
    if (cp_cpu_compute_line(be, 0, out, cap, &err) != CP_OK) snprintf(out, cap, "%s", be->name);
    char *blas = strstr(out, "; BLAS");
    if (blas) *blas = 0;
}

/* what the digest covers: the lines, the compute path, and the grid with
 * the options it runs under (the quality of a setting moves with the
 * kernels' rounding, so another path measures its own grid) */
static void digest_of(const char *text, size_t len, const cli_engine_opts *o, const cp_engine_opts *eo, cp_backend *be, char out[65])
{
    char grid[1536];
    int w = snprintf(grid, sizeof grid, "epic k0 %d per-segment %g deviation layer %d weights %d kv %d tau %g", eo->annot.k0,
                     eo->recompute_per_segment, eo->deviation_layer, (int)o->dtype, (int)eo->kv_dtype, eo->annot.tau);
    if (w > 0 && (size_t)w < sizeof grid - 1) {
        grid[w++] = ' ';
        compute_of(be, grid + w, sizeof grid - (size_t)w);
        w = (int)strlen(grid);
    }
    if (w > 0 && (size_t)w < sizeof grid) w += snprintf(grid + w, sizeof grid - (size_t)w, " R/tail");
    for (int i = 0; i < GRID_N && w > 0 && (size_t)w < sizeof grid; i++) {
        double r;
        int tail;
        grid_point(i, &r, &tail);
        w += snprintf(grid + w, sizeof grid - (size_t)w, " %g/%d", r, tail);
    }
    const void *parts[2] = { grid, text };
    size_t lens[2] = { strlen(grid), len };
    uint8_t d[32];
    cp_sha256(parts, lens, 2, d);
    hex(d, 32, out);
}

static int sample_open(const cli_engine_opts *o, const cp_engine_opts *eo, cp_backend *be, sample *s)
{
    memset(s, 0, sizeof *s);
    char *text = NULL;
    size_t len = 0, n = 0;
    cp_error err = { 0 };
    if (o->calib_requests) {
        if (cp_read_file(o->calib_requests, (size_t)1 << 30, &text, &len, &err)) return cli_error("--calib-requests: %s", err.msg), 0;
        len = first_lines(text, len, (size_t)o->calib_sample, &n);
        s->path = o->calib_requests, s->lines = n;
        snprintf(s->what, sizeof s->what, "%s (%zu requests)", o->calib_requests, n);
    } else {
        if (cli_calib_sample_jsonl((int)o->calib_sample, &text, &len, &err)) return cli_error("%s", err.msg), 0;
        first_lines(text, len, 0, &n);
        const char *td = getenv("TMPDIR");
        snprintf(s->tmp, sizeof s->tmp, "%.40s/cp-calib-XXXXXX", td && td[0] == '/' && strlen(td) <= 40 ? td : "/tmp");
        int fd = mkstemp(s->tmp);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!f && fd >= 0) close(fd);
        int ok = f && fwrite(text, 1, len, f) == len;
        if (f) ok = fclose(f) == 0 && ok;
        if (!ok) {
            if (fd >= 0) unlink(s->tmp);
            free(text);
            return cli_error("calibration: cannot write the built-in sample to %s", s->tmp), 0;
        }
        s->path = s->tmp, s->lines = n;
        snprintf(s->what, sizeof s->what, "the built-in public-domain sample (%zu requests)", n);
    }
    if (n == 0) {
        free(text);
        if (s->tmp[0]) unlink(s->tmp);
        return cli_error("--calib-requests %s: no request lines", o->calib_requests), 0;
    }
    digest_of(text, len, o, eo, be, s->digest);
    free(text);
    return 1;
}

/* the grid measured: none and each R over the sample */
static int measure(const cli_engine_opts *o, const sample *s, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain,
                   const cp_engine_opts *eo, int progress, cli_calib_grid *g)
{
    cp_engine_opts set[GRID_N];
    mode_stats st[GRID_N + 1];
    memset(st, 0, sizeof st);
    cp_error err = { 0 };
    for (int i = 0; i < GRID_N; i++) {
        set[i] = *eo;
        set[i].sharing = CP_SHARE_CACHEPRUNE;
        if (cp_recompute_from_name("epic", &set[i].recompute_method, &set[i].recompute_by_deviation, &err)) return cli_error("%s", err.msg), 0;
        grid_point(i, &set[i].annot.r, &set[i].recompute_tail);
    }
    size_t pool = o->pool_bytes < GRID_POOL_MAX ? o->pool_bytes : GRID_POOL_MAX;
    int ok = run_grid(m, tok, chain, s->path, s->lines, set, GRID_N, pool, 16, progress, st, NULL);
    if (ok) {
        g->requests = st[0].n, g->full_tokens = (double)st[0].computed, g->n = GRID_N;
        for (int i = 0; i < GRID_N; i++) {
            cli_calib_point *p = &g->pt[i];
            p->method = set[i].recompute_method, p->by_deviation = set[i].recompute_by_deviation;
            p->r = set[i].annot.r, p->tail = set[i].recompute_tail, p->k0 = set[i].annot.k0;
            cli_calib_measure(&st[i + 1], &p->hit_rate, &p->compute_tokens, &p->kl, &p->greedy, &p->rouge_l);
        }
        if (g->requests < 1 || g->full_tokens < 1) ok = 0, cli_error("calibration: no request of %s ran", s->what);
    }
    for (int i = 0; i <= GRID_N; i++) free(st[i].ttft);
    return ok;
}

/* the stored grid, or a new measurement (kept when the directory takes it) */
static int find_or_measure(const cli_engine_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, const cp_engine_opts *eo,
                           int progress, cli_calib_grid *g, char *where, size_t cap)
{
    sample s;
    if (!sample_open(o, eo, m->be, &s)) return 0;
    char dir[4096], path[4200], why[4300] = "";
    cli_fingerprint_hex(m, g->fingerprint);
    memcpy(g->sample, s.digest, sizeof g->sample);
    int have_dir = cli_state_dir(o, dir, sizeof dir);
    int have_path = have_dir && snprintf(path, sizeof path, "%s/calibration-%.16s-%.16s.json", dir, g->fingerprint, s.digest) < (int)sizeof path;
    cp_error err = { 0 };
    int ok = 1;
    char fp[65];
    memcpy(fp, g->fingerprint, sizeof fp); /* the read clears g first */
    if (have_path && access(path, F_OK) == 0) {
        if (cli_calib_grid_read(path, fp, s.digest, g, &err) == CP_OK) {
            snprintf(where, cap, "%s", path);
            goto done;
        }
        fprintf(stderr, "calibration: %s is not usable (%s): measuring again\n", path, err.msg);
        memcpy(g->fingerprint, fp, sizeof fp);
        memcpy(g->sample, s.digest, sizeof g->sample);
    }
    fprintf(stderr, "calibrating recompute for this model (fingerprint %.12s) on %s, %d settings: once, kept in %s\n", g->fingerprint,
            s.what, GRID_N, have_path ? path : "memory (no state directory: set --state-dir or $CACHEPRUNE_STATE_DIR)");
    if (!(ok = measure(o, &s, m, tok, chain, eo, progress, g))) goto done;
    if (!have_path) {
        snprintf(where, cap, "measured now, not kept");
    } else if (!make_dirs(dir, why, sizeof why) || cli_calib_grid_write(path, g, &err) != CP_OK) {
        fprintf(stderr, "calibration: cannot keep it in %s (%s): this run uses it from memory, the next measures again\n", dir,
                why[0] ? why : err.msg);
        snprintf(where, cap, "measured now, not kept");
    } else {
        snprintf(where, cap, "measured now, kept in %s", path);
    }
done:
    if (s.tmp[0]) unlink(s.tmp);
    return ok;
}

int cli_calib_default(const cli_engine_opts *o, int eligible, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, cp_engine_opts *eo,
                      int progress)
{
    if (o->calibration || o->calibration_off || o->quality_given || !eligible) {
        if (o->budget_given || o->state_dir || o->calib_requests || o->calib_sample)
            return cli_error("--quality, --quality-kl, --quality-greedy, --quality-rouge, --state-dir, --calib-requests and "
                             "--calib-sample steer the automatic calibration: one sharing mode, cacheprune, without "
                             "--calibration FILE or off and without an option a calibration sets"), 0;
        return 1;
    }
    cli_calib_grid g;
    char where[4400];
    memset(&g, 0, sizeof g);
    /* None of the options a calibration sets was given (or this would not
     * run): R and the tail are the grid's to set. */
    if (!find_or_measure(o, m, tok, chain, eo, progress, &g, where, sizeof where)) return 0;
    int best = cli_calib_grid_pick(&g, o->quality_kl, o->quality_greedy, o->quality_rouge);
    cli_calibration c = { .kl_budget = o->quality_kl, .greedy_min = o->quality_greedy, .rouge_min = o->quality_rouge,
                          .requests = g.requests, .meets = best >= 0, .sharing = CP_SHARE_CACHEPRUNE, .segment_kv = eo->segment_kv,
                          .tau = eo->annot.tau, .gradual_start = eo->gradual_start, .deviation_layer = eo->deviation_layer,
                          .per_segment = eo->recompute_per_segment };
    memcpy(c.fingerprint, g.fingerprint, sizeof c.fingerprint);
    if (best >= 0) {
        const cli_calib_point *p = &g.pt[best];
        c.method = p->method, c.by_deviation = p->by_deviation, c.r = p->r, c.k0 = p->k0, c.tail = p->tail;
        c.kl = p->kl, c.greedy = p->greedy, c.rouge_l = p->rouge_l, c.hit_rate = p->hit_rate, c.compute_tokens = p->compute_tokens;
    }
    eo->sharing = CP_SHARE_CACHEPRUNE; /* eligible: the run's one mode */
    cli_calibration_apply(&c, eo);
    char line[512];
    cli_calibration_describe(&c, line, sizeof line);
    fprintf(stderr, "calibration (automatic, %s): %s", where, line);
    if (best >= 0)
        fprintf(stderr, "; the cheapest of %d settings meeting KL <= %g, greedy >= %.1f %%, ROUGE-L >= %.3f, computing %.0f %% of full "
                        "recompute's tokens", g.n, c.kl_budget, 100 * c.greedy_min, c.rouge_min, 100 * c.compute_tokens / g.full_tokens);
    fputc('\n', stderr);
    return 1;
}
