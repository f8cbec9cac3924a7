/* `run`'s pieces shared with calibrate: per-mode statistics, the summary
 * table / JSON / plot (cli_run_stats.c) and the request loop (cli_run.c);
 * what only run's own files share is in cli_run_internal.h. */
#ifndef CP_CLI_RUN_H
#define CP_CLI_RUN_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "../request.h"

/* top-2 logit margins below which the near-tie diagnostic counts a tie:
 * 1e-3 (the near-tie threshold) and two looser ones */
#define CP_N_TIES 3
static const float cp_near_ties[CP_N_TIES] = { 1e-3f, 1e-2f, 1e-1f };

typedef struct mode_stats {
    const char *mode;
    int n, errors;
    double *ttft; /* per successful request, ms */
    long prompt, computed, reused, recomputed, hit;
    /* token-layers of a request-time selection spent on tokens that stayed
     * reused (recompute.h), and the model's layers: partial / layers is
     * what the selection adds to "computed" in whole tokens */
    long partial_rows;
    int n_layers;
    /* per cp_stage, ms summed over the successful requests (replays: none) */
    double stage_sum[CP_STAGE_N];
    size_t pool_bytes;
    /* quality against none */
    double kl_sum, agree_sum, rouge_sum;
    int quality_n;
    /* the near-tie diagnostic (cli_run.c count_near_ties): requests whose
     * continuation differs from none's, those whose first difference is at
     * a near-tie of none's, and greedy agreement over none's positions
     * before its first near-tie */
    int diverged, diverged_at_tie[CP_N_TIES], decided_n[CP_N_TIES];
    double decided_sum[CP_N_TIES];
} mode_stats;

/* The summary of each mode: ratios to `none` by mean and by median TTFT,
 * quality when have_ref.  peak_rss in bytes (0: unknown). */
void run_print_table(mode_stats *st, int n, int have_ref, size_t peak_rss);
/* the near-tie diagnostic of one mode or setting with quality (nothing without) */
void run_print_near_tie_line(const char *label, const mode_stats *s);
/* the same as JSON (for scripts: they never parse the table); 0 on failure */
int run_write_summary_json(const char *path, mode_stats *st, int n, int have_ref, size_t peak_rss);
void run_plot(const char *png, mode_stats *st, int n);
/* per mode, each stage's mean ms and share of the mean TTFT (--stages) */
void run_print_stages(FILE *f, const mode_stats *st, int n);

/* calibrate's replay: the first max_lines (0: all) request lines of
 * `requests` through `none` and each of the n_set settings, each on its own
 * engine and pool of pool_bytes.  The settings run RUN_GRID_GROUP at a time
 * (every engine of a group holds its own pool: a whole grid at once held
 * them all), each group interleaved request by request with a none of its
 * own, which is the group's quality reference (the same tokens every time:
 * a path's prefill is deterministic) and TTFT baseline.  st_out[0] is the
 * first group's none, st_out[1 + i] setting i's with quality against none;
 * none_ttft[i] (NULL: not wanted) the mean TTFT of setting i's none.  0
 * after printing an error. */
#define RUN_GRID_GROUP 8
int run_grid(cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, const char *requests, size_t max_lines,
             const cp_engine_opts *set, int n_set, size_t pool_bytes, int default_max, int progress, mode_stats *st_out,
             double *none_ttft);

#endif
