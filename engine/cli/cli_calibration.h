/* The calibration file `cacheprune calibrate` writes and `run` / `serve`
 * read (--calibration FILE): for one model, the cheapest measured setting
 * of the quality knobs (sharing, segment KV, recompute method, R, k0, tau,
 * gradual start, deviation layer) that met a quality budget on the
 * operator's own sample, or none (then only prefix reuse, which is exact,
 * is allowed).  JSON, read strictly: an unknown, repeated or out-of-range
 * field is an error, never a default. */
#ifndef CP_CLI_CALIBRATION_H
#define CP_CLI_CALIBRATION_H

#include "../request.h"

typedef struct cli_calibration {
    char fingerprint[65]; /* the model's, hex */
    double kl_budget, greedy_min;
    double rouge_min;     /* ROUGE-L at least (absent in a file: 0, no bound, what every file before it asked) */
    int requests;
    int meets;            /* 0: no setting met the budget */
    /* the setting (meets only) */
    cp_sharing sharing;
    cp_segkv segment_kv;
    cp_recompute_method method;
    int by_deviation;
    double r, tau, gradual_start;
    int k0, deviation_layer;
    int tail;             /* --recompute-tail (absent in a file: 0, what every file before it measured) */
    double per_segment;   /* --recompute-per-segment (absent: 0) */
    /* what it measured */
    double kl, greedy, rouge_l, hit_rate, compute_tokens, ttft_ratio;
} cli_calibration;

void cli_fingerprint_hex(const cp_model *m, char out[65]);
cp_status cli_calibration_write(const char *path, const cli_calibration *c, cp_error *err);
cp_status cli_calibration_read(const char *path, cli_calibration *c, cp_error *err);
/* The calibrated setting into o (meets), or prefix-only reuse: a sharing
 * mode that reuses more than exact prefixes becomes tenant-prefix. */
void cli_calibration_apply(const cli_calibration *c, cp_engine_opts *o);
/* one line naming the setting, for the operator */
void cli_calibration_describe(const cli_calibration *c, char *out, size_t cap);

#endif
