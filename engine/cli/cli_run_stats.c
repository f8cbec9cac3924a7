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
        printf("%-14s %7.1f%% %9.1f %9.1f %9.1f %8.2fx %8.2fx %10ld %8d %10.1f", s->mode, 100 * sm[i].hit, sm[i].mean, sm[i].p50,
               sm[i].p95, sm[i].ratio_mean, sm[i].ratio_p50, s->computed, s->errors, s->pool_bytes / 1048576.0);
        if (have_ref && s->quality_n)
            printf(" %9.4f %7.1f%% %8.3f", s->kl_sum / s->quality_n, 100 * s->agree_sum / s->quality_n, s->rouge_sum / s->quality_n);
        printf("\n");
    }
    printf("(ttft in ms; hit rate = prompt tokens whose KV came from the pool; 'vs none' = mean TTFT of none / this mode,\n"
           " 'p50 ratio' the same by medians; modes run interleaved, request by request, after a warm-up");
    if (peak_rss) printf("; peak RSS %.0f MB", peak_rss / 1048576.0);
    printf(")\n");
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
        if (have_ref && s->quality_n) {
            cJSON_AddNumberToObject(o, "kl", s->kl_sum / s->quality_n);
            cJSON_AddNumberToObject(o, "greedy_agreement", s->agree_sum / s->quality_n);
            cJSON_AddNumberToObject(o, "rouge_l", s->rouge_sum / s->quality_n);
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

void run_plot(const char *png, mode_stats *st, int n)
{
    char dat[4096], gp[4096];
    snprintf(dat, sizeof dat, "%s.dat", png);
    snprintf(gp, sizeof gp, "%s.gp", png);
    FILE *f = fopen(dat, "w"), *g = fopen(gp, "w");
    if (!f || !g) {
        if (f) fclose(f);
        if (g) fclose(g);
        cli_error("--plot: cannot write %s", dat);
        return;
    }
    for (int i = 0; i < n; i++)
        fprintf(f, "%s %.3f %.3f\n", st[i].mode, mean(st[i].ttft, st[i].n), st[i].prompt ? 100.0 * st[i].hit / st[i].prompt : 0);
    fclose(f);
    fprintf(g, "set terminal png size 900,420\nset output '%s'\nset multiplot layout 1,2\nset style fill solid 0.6\n"
               "set boxwidth 0.6\nset xtics rotate by -30\nset title 'mean TTFT (ms)'\nplot '%s' using 2:xtic(1) with boxes notitle\n"
               "set title 'KV hit rate (%%)'\nset yrange [0:100]\nplot '%s' using 3:xtic(1) with boxes notitle\nunset multiplot\n",
            png, dat, dat);
    fclose(g);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", gp);
    if (system(cmd) != 0) cli_error("--plot: gnuplot failed or is not installed (apt-get install gnuplot-nox)");
    else fprintf(stderr, "plot written to %s\n", png);
}
