/* `run`'s summary: table, JSON and plot over the per-mode statistics. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_run.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the p-quantile (nearest rank) of v; sorts v */
static double pct(double *v, int n, double p)
{
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)ceil(p * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static double mean(const double *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : 0;
}

typedef struct summary {
    double hit, mean, p50, p95, ratio_mean, ratio_p50;
} summary;

static void summarize(mode_stats *st, int n, summary *out)
{
    double base_mean = 0, base_p50 = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(st[i].mode, "none") == 0) base_mean = mean(st[i].ttft, st[i].n), base_p50 = pct(st[i].ttft, st[i].n, 0.5);
    for (int i = 0; i < n; i++) {
        mode_stats *s = &st[i];
        summary *o = &out[i];
        o->hit = s->prompt ? (double)s->hit / (double)s->prompt : 0;
        o->mean = mean(s->ttft, s->n), o->p50 = pct(s->ttft, s->n, 0.5), o->p95 = pct(s->ttft, s->n, 0.95);
        o->ratio_mean = base_mean > 0 && o->mean > 0 ? base_mean / o->mean : 0;
        o->ratio_p50 = base_p50 > 0 && o->p50 > 0 ? base_p50 / o->p50 : 0;
    }
}

void run_print_near_tie_line(const char *label, const mode_stats *s)
{
    if (!s->quality_n) return;
    printf("%s near-ties: %d of %d requests differ from none, first at a none top-2 margin", label, s->diverged, s->quality_n);
    for (int t = 0; t < CP_N_TIES; t++) printf("%s < %g: %d", t ? "," : "", cp_near_ties[t], s->diverged_at_tie[t]);
    printf("; greedy over none's positions before its first near-tie");
    for (int t = 0; t < CP_N_TIES; t++)
        printf("%s < %g: %.1f %%", t ? "," : "", cp_near_ties[t], s->decided_n[t] ? 100 * s->decided_sum[t] / s->decided_n[t] : 100.0);
    printf("\n");
}

static void run_print_near_ties(const mode_stats *st, int n)
{
    char label[32];
    for (int i = 0; i < n; i++) {
        snprintf(label, sizeof label, "%-14s", st[i].mode);
        run_print_near_tie_line(label, &st[i]);
    }
}

void run_print_table(mode_stats *st, int n, int have_ref, size_t peak_rss)
{
    summary sm[8];
    if (n > 8) n = 8;
    summarize(st, n, sm);
    printf("\n%-14s %8s %9s %9s %9s %9s %9s %10s %8s %10s", "mode", "hit rate", "ttft mean", "ttft p50", "ttft p95", "vs none",
           "p50 ratio", "computed", "errors", "pool MB");
    if (have_ref) printf(" %9s %8s %8s", "KL", "greedy", "ROUGE-L");
    printf("\n");
    for (int i = 0; i < n; i++) {
        mode_stats *s = &st[i];
        /* no none in this run: no ratio to show (a dash, never "0.00x") */
        char rm[16] = "-", rp[16] = "-";
        if (sm[i].ratio_mean > 0) snprintf(rm, sizeof rm, "%.2fx", sm[i].ratio_mean);
        if (sm[i].ratio_p50 > 0) snprintf(rp, sizeof rp, "%.2fx", sm[i].ratio_p50);
        printf("%-14s %7.1f%% %9.1f %9.1f %9.1f %9s %9s %10ld %8d %10.1f", s->mode, 100 * sm[i].hit, sm[i].mean, sm[i].p50, sm[i].p95,
               rm, rp, s->computed, s->errors, s->pool_bytes / 1048576.0);
        if (have_ref && s->quality_n)
            printf(" %9.4f %7.1f%% %8.3f", s->kl_sum / s->quality_n, 100 * s->agree_sum / s->quality_n, s->rouge_sum / s->quality_n);
        printf("\n");
    }
    for (int i = 0; i < n; i++)
        if (st[i].partial_rows && st[i].n_layers)
            printf("%-14s selection: %ld token-layers on tokens left reused = %.0f tokens' compute (computed + selection %.0f)\n",
                   st[i].mode, st[i].partial_rows, (double)st[i].partial_rows / st[i].n_layers,
                   st[i].computed + (double)st[i].partial_rows / st[i].n_layers);
    if (have_ref) run_print_near_ties(st, n);
    printf("(ttft in ms; hit rate = prompt tokens whose KV came from the pool; 'vs none' = mean TTFT of none / this mode,\n"
           " 'p50 ratio' the same by medians; modes run interleaved, request by request, after a warm-up");
    if (peak_rss) printf("; peak RSS %.0f MB", peak_rss / 1048576.0);
    printf(")\n");
}

/* A stage's mean ms per request and its share of the mean TTFT (both over
 * the successful requests); the stages after the first token are shares of
 * TTFT too, though they are not part of it. */
static void stage_mean(const mode_stats *s, int k, double *ms, double *share)
{
    double ttft = mean(s->ttft, s->n);
    *ms = s->n ? s->stage_sum[k] / s->n : 0;
    *share = ttft > 0 ? *ms / ttft : 0;
}

void run_print_stages(FILE *f, const mode_stats *st, int n)
{
    fprintf(f, "\nper stage: mean ms per request (share of mean TTFT)\n%-12s", "stage");
    for (int i = 0; i < n; i++) fprintf(f, " %22s", st[i].mode);
    fprintf(f, "\n");
    for (int k = 0; k <= CP_STAGE_N; k++) {
        if (k == CP_STAGE_BEFORE_FIRST) { /* the stages so far partition TTFT */
            fprintf(f, "%-12s", "= ttft");
            for (int i = 0; i < n; i++) {
                double sum = 0;
                for (int q = 0; q < CP_STAGE_BEFORE_FIRST; q++) sum += st[i].n ? st[i].stage_sum[q] / st[i].n : 0;
                fprintf(f, " %9.3f (mean %7.3f)", sum, mean(st[i].ttft, st[i].n));
            }
            fprintf(f, "\n");
        }
        if (k == CP_STAGE_N) break;
        fprintf(f, "%-12s", cp_stage_name(k));
        for (int i = 0; i < n; i++) {
            double ms, share;
            stage_mean(&st[i], k, &ms, &share);
            fprintf(f, " %9.3f (%6.1f %%)   ", ms, 100 * share);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "(annotate and store run after the first token: their shares are of TTFT, not in it)\n");
}

int run_write_summary_json(const char *path, mode_stats *st, int n, int have_ref, size_t peak_rss)
{
    summary sm[8];
    if (n > 8) n = 8;
    summarize(st, n, sm);
    cJSON *root = cJSON_CreateObject(), *modes = cJSON_AddArrayToObject(root, "modes");
    if (!root || !modes) return cJSON_Delete(root), 0;
    if (peak_rss) cJSON_AddNumberToObject(root, "peak_rss_bytes", (double)peak_rss);
    for (int i = 0; i < n; i++) {
        mode_stats *s = &st[i];
        cJSON *o = cJSON_CreateObject();
        if (!o) return cJSON_Delete(root), 0;
        cJSON_AddItemToArray(modes, o);
        cJSON_AddStringToObject(o, "mode", s->mode);
        cJSON_AddNumberToObject(o, "requests", s->n + s->errors);
        cJSON_AddNumberToObject(o, "errors", s->errors);
        cJSON_AddNumberToObject(o, "hit_rate", sm[i].hit);
        cJSON_AddNumberToObject(o, "ttft_mean_ms", sm[i].mean);
        cJSON_AddNumberToObject(o, "ttft_p50_ms", sm[i].p50);
        cJSON_AddNumberToObject(o, "ttft_p95_ms", sm[i].p95);
        cJSON_AddNumberToObject(o, "ratio_mean_vs_none", sm[i].ratio_mean);
        cJSON_AddNumberToObject(o, "ratio_p50_vs_none", sm[i].ratio_p50);
        cJSON_AddNumberToObject(o, "prompt_tokens", (double)s->prompt);
        cJSON_AddNumberToObject(o, "computed_tokens", (double)s->computed);
        cJSON_AddNumberToObject(o, "reused_tokens", (double)s->reused);
        cJSON_AddNumberToObject(o, "recomputed_tokens", (double)s->recomputed);
        cJSON_AddNumberToObject(o, "pool_bytes", (double)s->pool_bytes);
        cJSON_AddNumberToObject(o, "selection_token_layers", (double)s->partial_rows);
        cJSON_AddNumberToObject(o, "compute_tokens", s->computed + (s->n_layers ? (double)s->partial_rows / s->n_layers : 0));
        /* per stage: mean ms per request and share of the mean TTFT */
        cJSON *stages = cJSON_AddObjectToObject(o, "stages");
        for (int k = 0; stages && k < CP_STAGE_N; k++) {
            double ms, share;
            stage_mean(s, k, &ms, &share);
            cJSON *g = cJSON_AddObjectToObject(stages, cp_stage_name(k));
            if (!g) break;
            cJSON_AddNumberToObject(g, "mean_ms", ms);
            cJSON_AddNumberToObject(g, "share_of_ttft", share);
            cJSON_AddBoolToObject(g, "before_first_token", k < CP_STAGE_BEFORE_FIRST);
        }
        if (have_ref && s->quality_n) {
            cJSON_AddNumberToObject(o, "kl", s->kl_sum / s->quality_n);
            cJSON_AddNumberToObject(o, "greedy_agreement", s->agree_sum / s->quality_n);
            cJSON_AddNumberToObject(o, "rouge_l", s->rouge_sum / s->quality_n);
            cJSON_AddNumberToObject(o, "diverged_requests", s->diverged);
            cJSON_AddNumberToObject(o, "diverged_at_near_tie_1e-3", s->diverged_at_tie[0]);
            cJSON_AddNumberToObject(o, "greedy_before_near_tie_1e-3", s->decided_n[0] ? s->decided_sum[0] / s->decided_n[0] : 1);
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f) ok = fclose(f) == 0 && ok;
    free(text);
    return ok;
}

/* Three panels a person can read at a glance: TTFT per mode (mean and
 * median bars), hit rate per mode, and each mode's place on the
 * quality/speed plane (greedy agreement with full recompute against the
 * TTFT ratio to none: up and right is better). */
void run_plot(const char *png, mode_stats *st, int n)
{
    char dat[4096], gp[4096];
    snprintf(dat, sizeof dat, "%s.dat", png);
    snprintf(gp, sizeof gp, "%s.gp", png);
    summary sm[8];
    if (n > 8) n = 8;
    summarize(st, n, sm);
    FILE *f = fopen(dat, "w"), *g = fopen(gp, "w");
    if (!f || !g) {
        if (f) fclose(f);
        if (g) fclose(g);
        cli_error("--plot: cannot write %s", dat);
        return;
    }
    int have_q = 0;
    for (int i = 0; i < n; i++) {
        double agree = st[i].quality_n ? 100 * st[i].agree_sum / st[i].quality_n : strcmp(st[i].mode, "none") == 0 ? 100 : -1;
        have_q |= st[i].quality_n > 0;
        fprintf(f, "\"%s\" %.3f %.3f %.3f %.3f %.3f\n", st[i].mode, sm[i].mean, sm[i].p50, 100 * sm[i].hit, sm[i].ratio_mean, agree);
    }
    fclose(f);
    fprintf(g,
            "set terminal pngcairo size 1500,480 font ',11' noenhanced\n"
            "set output '%s'\nset multiplot layout 1,3\nset style fill solid 0.7 border -1\nset grid ytics\n"
            "set xtics rotate by -25 nomirror\nset key top right\n"
            "set title 'time to first token (ms)'\nset yrange [0:*]\nset style data histograms\nset style histogram clustered gap 1\n"
            "plot '%s' using 2:xtic(1) title 'mean' lc rgb '#4477aa', '' using 3 title 'median' lc rgb '#88ccee'\n"
            "set title 'KV hit rate (%% of prompt tokens from the pool)'\nset yrange [0:100]\nunset key\n"
            "plot '%s' using 4:xtic(1) lc rgb '#228833'\n"
            "unset style\nset style fill solid 0.7\nset title 'quality against speed (up and right is better)'\n"
            "set xlabel 'TTFT ratio to none (mean)'\nset ylabel 'greedy agreement with full recompute (%%)'\n"
            "set xtics norotate\nset yrange [0:115]\nset xrange [0:*]\n"
            "plot '%s' using 5:($6 >= 0 ? $6 : 1/0) with points pt 7 ps 2 lc rgb '#aa3377', "
            "'' using 5:($6 >= 0 ? $6 : 1/0):1 with labels left rotate by 30 offset 1,0.6\n"
            "unset multiplot\n",
            png, dat, dat, dat);
    fclose(g);
    if (!have_q) fprintf(stderr, "--plot: no quality figures (compare with none for the third panel)\n");
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", gp);
    if (system(cmd) != 0) cli_error("--plot: gnuplot failed or is not installed (apt-get install gnuplot-nox)");
    else fprintf(stderr, "plot written to %s\n", png);
}
