/* `run`'s pieces shared between its files: per-mode statistics, the
 * summary table / JSON / plot (cli_run_stats.c) and the request loop
 * (cli_run.c). */
#ifndef CP_CLI_RUN_H
#define CP_CLI_RUN_H

#include <stddef.h>
#include <stdint.h>

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
    size_t pool_bytes;
    /* quality against none */
    double kl_sum, agree_sum, rouge_sum;
    int quality_n;
} mode_stats;

/* The summary of each mode: ratios to `none` by mean and by median TTFT,
 * quality when have_ref.  peak_rss in bytes (0: unknown). */
void run_print_table(mode_stats *st, int n, int have_ref, size_t peak_rss);
/* the same as JSON (for scripts: they never parse the table); 0 on failure */
int run_write_summary_json(const char *path, mode_stats *st, int n, int have_ref, size_t peak_rss);
void run_plot(const char *png, mode_stats *st, int n);

#endif
