/* cacheprune calibrate: replays a sample of the operator's own request log
 * with and without reuse over a grid of quality settings, prints the
 * frontier (quality against tokens computed and TTFT) and writes a
 * calibration file with the cheapest setting meeting the budget (or none:
 * then run / serve fall back to prefix-only reuse). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_calib_store.h"
#include "cli_calibration.h"
#include "cli_engine_opts.h"
#include "cli_run.h"

#define MAX_GRID 64

static void usage(FILE *f)
{
    fputs("usage: cacheprune calibrate --model DIR --requests FILE.jsonl [options]\n"
          "\n"
          "Runs the log's first --sample requests with no reuse and under every setting of the grid (each on\n"
          "its own engine and pool, 8 settings at a time, each group interleaved request by request with a run\n"
          "of no reuse), prints each setting's hit rate, tokens\n"
          "computed (selection cost included), TTFT ratio to none, KL, greedy agreement and ROUGE-L, marks\n"
          "the frontier, and writes the cheapest setting (fewest tokens computed) that meets the budget.\n"
          "\n"
          "  --kl-budget X         mean first-token KL to full recompute at most X (0.002)\n"
          "  --greedy-min P        greedy agreement at least P, a fraction (0.95)\n"
          "  --rouge-min P         ROUGE-L against full recompute at least P (0: no bound; 0.97 is a suggested bound)\n"
          "  --out FILE            the calibration file (calibration.json)\n"
          "  --sample N            the first N requests (default: all)\n"
          "  --methods LIST        recompute methods: attention, deviation, gradual, flagged, epic\n"
          "                        (default attention,deviation,gradual,epic)\n"
          "  --ratios LIST         R values (0.15,0.3)\n"
          "  --k0s LIST            k0 values (2)\n"
          "  --taus LIST           tau values (the annotator's default, 0.25)\n"
          "  --tails LIST          --recompute-tail values: the last N reused tokens forced (0)\n"
          "  --segment-kvs LIST    in-context, canonical (in-context,canonical)\n"
          "  --max-tokens N        for lines without max_tokens (16)\n"
          "  --pool-bytes N        the pool of each setting (256M; give the size you run with: a smaller pool\n"
          "                        evicts, and reuse costs quality in proportion to what it hits)\n"
          "  --quiet-progress      no progress line\n"
          "  other engine options as for `run` (detector, --pool-bytes, --gradual-start, ...); the privacy\n"
          "  options (--mask-pad, --row-limit, --beta, --admit-k) are never part of the grid\n",
          f);
}

typedef struct grid_opts {
    const char *model, *requests, *out;
    const char *methods, *ratios, *k0s, *taus, *kvs, *tails;
    double kl_budget, greedy_min, rouge_min;
    long long sample, max_tokens;
    int progress;
} grid_opts;

/* a comma list into at most cap strings (in buf, a copy) */
static int split(char *buf, char **out, int cap)
{
    int n = 0;
    for (char *t = strtok(buf, ","); t && n < cap; t = strtok(NULL, ",")) out[n++] = t;
    return n;
}

typedef struct axis {
    char *buf;
    char *v[16];
    int n;
} axis;

static int axis_of(const char *list, const char *opt, axis *a)
{
    a->buf = strdup(list);
    if (!a->buf) return cli_error("calibrate: out of memory"), 0;
    a->n = split(a->buf, a->v, 16);
    if (a->n == 0) return cli_error("%s: an empty list", opt), 0;
    return 1;
}

/* The grid: methods x R x k0 x tau x segment KV, from the base options. */
static int build_grid(const grid_opts *g, const cp_engine_opts *base, cp_engine_opts *set, int *n_set)
{
    axis am = { 0 }, ar = { 0 }, ak = { 0 }, at = { 0 }, av = { 0 }, an = { 0 };
    int ok = axis_of(g->methods, "--methods", &am) && axis_of(g->ratios, "--ratios", &ar) && axis_of(g->k0s, "--k0s", &ak) &&
             axis_of(g->taus, "--taus", &at) && axis_of(g->kvs, "--segment-kvs", &av) && axis_of(g->tails, "--tails", &an);
    cp_error err = { 0 };
    *n_set = 0;
    for (int v = 0; ok && v < av.n; v++)
        for (int mi = 0; ok && mi < am.n; mi++)
            for (int r = 0; ok && r < ar.n; r++)
                for (int k = 0; ok && k < ak.n; k++)
                    for (int t = 0; ok && t < at.n; t++)
                        for (int n = 0; ok && n < an.n; n++) {
                        if (*n_set == MAX_GRID) {
                            ok = 0, cli_error("calibrate: more than %d settings in the grid", MAX_GRID);
                            break;
                        }
                        cp_engine_opts o = *base;
                        long long k0, tail;
                        double rr, tau;
                        o.sharing = CP_SHARE_CACHEPRUNE;
                        if (cp_segkv_from_name(av.v[v], &o.segment_kv, &err) ||
                            cp_recompute_from_name(am.v[mi], &o.recompute_method, &o.recompute_by_deviation, &err)) {
                            ok = 0, cli_error("calibrate: %s", err.msg);
                            break;
                        }
                        if (o.segment_kv == CP_SEGKV_STRICT) { /* strict is a privacy choice, not a quality knob */
                            ok = 0, cli_error("calibrate: --segment-kvs takes in-context and canonical");
                            break;
                        }
                        ok = cli_parse_float("--ratios", ar.v[r], 0, 1, &rr) && cli_parse_int("--k0s", ak.v[k], 0, 1 << 20, &k0) &&
                             cli_parse_float("--taus", at.v[t], 0, 1e9, &tau) && cli_parse_int("--tails", an.v[n], 0, 1 << 20, &tail);
                        o.annot.r = rr, o.annot.k0 = (int)k0, o.annot.tau = tau, o.recompute_tail = (int)tail;
                        if (ok) set[(*n_set)++] = o;
                    }
    free(am.buf), free(ar.buf), free(ak.buf), free(at.buf), free(av.buf), free(an.buf);
    return ok;
}

typedef struct point {
    double hit, compute, ttft, ratio, kl, greedy, rouge;
    int frontier, meets;
} point;

static double mean_of(const double *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : 0;
}

/* base: the mean TTFT of the none that ran beside this setting */
static void measure(double base, const mode_stats *s, point *p)
{
    cli_calib_measure(s, &p->hit, &p->compute, &p->kl, &p->greedy, &p->rouge);
    p->ttft = mean_of(s->ttft, s->n);
    p->ratio = p->ttft > 0 ? base / p->ttft : 0;
}

/* on the frontier: no other setting computes no more, with no worse KL
 * and greedy agreement, and is better in one of them */
static void mark_frontier(point *p, int n)
{
    for (int i = 0; i < n; i++) {
        p[i].frontier = 1;
        for (int j = 0; j < n && p[i].frontier; j++)
            if (j != i && p[j].compute <= p[i].compute && p[j].kl <= p[i].kl && p[j].greedy >= p[i].greedy &&
                (p[j].compute < p[i].compute || p[j].kl < p[i].kl || p[j].greedy > p[i].greedy))
                p[i].frontier = 0;
    }
}

static void setting_name(const cp_engine_opts *o, char *out, size_t cap)
{
    snprintf(out, cap, "%s %s R%g k0 %d tau %g tail %d", cp_segkv_name(o->segment_kv),
             cp_recompute_name(o->recompute_method, o->recompute_by_deviation), o->annot.r, o->annot.k0, o->annot.tau, o->recompute_tail);
}

static void print_frontier(const cp_engine_opts *set, const point *p, int n, const mode_stats *none)
{
    printf("\n%-52s %8s %10s %8s %9s %8s %8s %s\n", "setting", "hit rate", "computed", "vs none", "KL", "greedy", "ROUGE-L", "");
    printf("%-52s %7.1f%% %10ld %7.2fx %9s %8s %8s\n", "none (full recompute)", 0.0, none->computed, 1.0, "-", "-", "-");
    for (int i = 0; i < n; i++) {
        char name[96];
        setting_name(&set[i], name, sizeof name);
        printf("%-52s %7.1f%% %10.0f %7.2fx %9.4f %7.1f%% %8.3f %s%s\n", name, 100 * p[i].hit, p[i].compute, p[i].ratio, p[i].kl,
               100 * p[i].greedy, p[i].rouge, p[i].frontier ? "frontier" : "", p[i].meets ? (p[i].frontier ? ", meets" : "meets") : "");
    }
    printf("(computed = tokens computed, a selection's partial layers included as whole-token equivalents; 'vs none' = mean TTFT\n"
           " of none / the setting's, interleaved on this machine: the settings run %d at a time, each group beside a none)\n",
           RUN_GRID_GROUP);
}

static void print_near_ties(const cp_engine_opts *set, const mode_stats *st, int n)
{
    for (int i = 0; i < n; i++) {
        char name[96];
        setting_name(&set[i], name, sizeof name);
        run_print_near_tie_line(name, &st[i]);
    }
}

static const char *const value_opts[] = { "--model", "--requests", "--out", "--sample", "--methods", "--ratios", "--k0s", "--taus",
                                          "--tails", "--segment-kvs", "--kl-budget", "--greedy-min", "--rouge-min", "--max-tokens", NULL };

static int parse_args(int argc, char **argv, grid_opts *g, cli_engine_opts *ce)
{
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_engine_opt(argc, argv, &i, ce);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(stdout), 1;
        if (strcmp(a, "--quiet-progress") == 0) {
            g->progress = 0;
            continue;
        }
        if (!cli_one_of(a, value_opts)) return cli_unknown("calibrate", a), 2;
        if (!(v = cli_value("calibrate", argc, argv, &i))) return 2;
        if (strcmp(a, "--model") == 0) g->model = v;
        else if (strcmp(a, "--requests") == 0) g->requests = v;
        else if (strcmp(a, "--out") == 0) g->out = v;
        else if (strcmp(a, "--methods") == 0) g->methods = v;
        else if (strcmp(a, "--ratios") == 0) g->ratios = v;
        else if (strcmp(a, "--k0s") == 0) g->k0s = v;
        else if (strcmp(a, "--taus") == 0) g->taus = v;
        else if (strcmp(a, "--tails") == 0) g->tails = v;
        else if (strcmp(a, "--segment-kvs") == 0) g->kvs = v;
        else if (strcmp(a, "--sample") == 0 && !cli_parse_int(a, v, 1, 1 << 30, &g->sample)) return 2;
        else if (strcmp(a, "--max-tokens") == 0 && !cli_parse_int(a, v, 0, 1 << 20, &g->max_tokens)) return 2;
        else if (strcmp(a, "--kl-budget") == 0 && !cli_parse_float(a, v, 0, 1e9, &g->kl_budget)) return 2;
        else if (strcmp(a, "--greedy-min") == 0 && !cli_parse_float(a, v, 0, 1, &g->greedy_min)) return 2;
        else if (strcmp(a, "--rouge-min") == 0 && !cli_parse_float(a, v, 0, 1, &g->rouge_min)) return 2;
    }
    if (!g->model || !g->requests) return cli_error("calibrate: --model and --requests are required (see --help)"), 2;
    if (ce->calibration) return cli_error("calibrate: --calibration is what calibrate writes (--out)"), 2;
    if (ce->budget_given || ce->state_dir || ce->calib_requests || ce->calib_sample)
        return cli_error("calibrate: its budget is --kl-budget, --greedy-min, --rouge-min and its sample --requests, --sample "
                         "(--quality, --state-dir, --calib-requests and --calib-sample are for run and serve)"), 2;
    if (ce->tier) return cli_error("calibrate: --tier is for run and serve (each setting here has its own cold pool)"), 2;
    return 0;
}

/* the cheapest setting meeting the budget: fewest tokens computed, then TTFT */
static int choose(point *p, int n, const grid_opts *g)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        p[i].meets = p[i].kl <= g->kl_budget && p[i].greedy >= g->greedy_min && p[i].rouge >= g->rouge_min;
        if (p[i].meets && (best < 0 || p[i].compute < p[best].compute || (p[i].compute == p[best].compute && p[i].ttft < p[best].ttft)))
            best = i;
    }
    return best;
}

static int write_choice(const grid_opts *g, const cp_model *m, const cp_engine_opts *set, const point *p, int best, int requests)
{
    cli_calibration c = { .kl_budget = g->kl_budget, .greedy_min = g->greedy_min, .rouge_min = g->rouge_min, .requests = requests, .meets = best >= 0 };
    cli_fingerprint_hex(m, c.fingerprint);
    if (best >= 0) {
        const cp_engine_opts *o = &set[best];
        c.sharing = o->sharing, c.segment_kv = o->segment_kv, c.method = o->recompute_method, c.by_deviation = o->recompute_by_deviation;
        c.r = o->annot.r, c.k0 = o->annot.k0, c.tau = o->annot.tau, c.gradual_start = o->gradual_start, c.deviation_layer = o->deviation_layer;
        c.tail = o->recompute_tail, c.per_segment = o->recompute_per_segment;
        c.kl = p[best].kl, c.greedy = p[best].greedy, c.rouge_l = p[best].rouge, c.hit_rate = p[best].hit;
        c.compute_tokens = p[best].compute, c.ttft_ratio = p[best].ratio;
    }
    cp_error err = { 0 };
    if (cli_calibration_write(g->out, &c, &err)) return cli_error("%s", err.msg), 0;
    char line[512];
    cli_calibration_describe(&c, line, sizeof line);
    printf("\ncalibration -> %s: %s\n", g->out, line);
    return 1;
}

int cli_calibrate(int argc, char **argv)
{
    grid_opts g = { .out = "calibration.json", .methods = "attention,deviation,gradual,epic", .ratios = "0.15,0.3", .k0s = "2",
                    .taus = "0.25", .tails = "0", .kvs = "in-context,canonical", .kl_budget = 0.002, .greedy_min = 0.95, .max_tokens = 16, .progress = 1 };
    cli_engine_opts ce;
    cli_engine_opts_default(&ce);
    ce.calibration = NULL; /* $CACHEPRUNE_CALIBRATION is for run and serve */
    ce.pool_bytes = (size_t)256 << 20; /* per setting: --pool-bytes */
    int pr = parse_args(argc, argv, &g, &ce);
    if (pr) return pr == 1 ? 0 : pr;
    ce.eo.mask_pad = ce.dopt.mask_pad;
    cp_engine_opts *set = calloc(MAX_GRID, sizeof *set);
    mode_stats *st = calloc(MAX_GRID + 1, sizeof *st);
    point *p = calloc(MAX_GRID, sizeof *p);
    double base[MAX_GRID];
    int n_set = 0, rcode = 1, have_chain = 0;
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cp_model *m = NULL;
    cp_tokenizer *tok = NULL;
    cp_detect_chain chain;
    if (!set || !st || !p) {
        cli_error("calibrate: out of memory");
        goto done;
    }
    if (!cli_make_backend("cpu", &be)) goto done;
    if (cp_model_load(g.model, be, NULL, &m, &err) || cp_tokenizer_load(g.model, &tok, &err) ||
        (ce.tpl ? cp_template_from_name(ce.tpl, &ce.eo.tpl, &err) : cp_template_detect(tok, &ce.eo.tpl, &err))) {
        cli_error("%s", err.msg);
        goto done;
    }
    if (!cli_make_chain(&chain, &ce.dopt)) goto done;
    have_chain = 1;
    if (!build_grid(&g, &ce.eo, set, &n_set)) goto done;
    /* each setting gets the whole pool: a smaller one evicts, and the hit
     * rate (and with it what reuse costs in quality) would not be the run's */
    if (!run_grid(m, tok, &chain, g.requests, (size_t)g.sample, set, n_set, ce.pool_bytes, (int)g.max_tokens, g.progress, st, base))
        goto done;
    for (int i = 0; i < n_set; i++) measure(base[i], &st[i + 1], &p[i]);
    mark_frontier(p, n_set);
    int best = choose(p, n_set, &g);
    print_frontier(set, p, n_set, &st[0]);
    print_near_ties(set, st + 1, n_set);
    if (!write_choice(&g, m, set, p, best, st[0].n)) goto done;
    rcode = 0;
done:
    for (int i = 0; st && i <= n_set; i++) free(st[i].ttft);
    free(set), free(st), free(p);
    if (have_chain) cp_chain_free(&chain);
    cp_tokenizer_free(tok);
    cp_model_free(m);
    cp_backend_destroy(be);
    return rcode;
}
