/* The file automatic calibration keeps in the state directory: for one
 * model (its fingerprint) and one sample (the sha256 of its request lines
 * and of the grid), what every setting of the grid measured against full
 * recompute.  The pick under a quality budget is made from it on every
 * start, so a new budget needs no new measurement.  The file is hostile
 * input: read strictly (unknown or repeated fields, values out of range,
 * another model or sample are errors, and the caller measures again). */
#ifndef CP_CLI_CALIB_STORE_H
#define CP_CLI_CALIB_STORE_H

#include "../request.h"
#include "cli_calibration.h"
#include "cli_run.h"

#define CLI_CALIB_MAX_POINTS 32

typedef struct cli_calib_point {
    cp_recompute_method method;
    int by_deviation;
    double r;
    int k0;
    int tail;   /* the last reused tokens of the prompt forced (--recompute-tail) */
    /* against full recompute over the sample */
    double kl, greedy, rouge_l, hit_rate;
    double compute_tokens; /* a selection's partial layers included, in whole tokens */
} cli_calib_point;

typedef struct cli_calib_grid {
    char fingerprint[65]; /* the model's, hex */
    char sample[65];      /* sha256 of the sample's request lines and the grid, hex */
    int requests;
    double full_tokens;   /* tokens full recompute computes over the sample */
    int n;
    cli_calib_point pt[CLI_CALIB_MAX_POINTS];
} cli_calib_grid;

/* A setting's figures from calibrate's replay (s against none). */
void cli_calib_measure(const mode_stats *s, double *hit, double *compute, double *kl, double *greedy, double *rouge);
/* Written to a temporary file beside path, then renamed over it: a reader
 * never sees half a file. */
cp_status cli_calib_grid_write(const char *path, const cli_calib_grid *g, cp_error *err);
/* Read and checked: its fingerprint and sample must be these (hex). */
cp_status cli_calib_grid_read(const char *path, const char *fingerprint, const char *sample, cli_calib_grid *g, cp_error *err);
/* The cheapest point (fewest tokens computed; then the smaller R, then the
 * shorter tail) whose
 * KL <= kl, greedy >= greedy and ROUGE-L >= rouge; -1 when none is. */
int cli_calib_grid_pick(const cli_calib_grid *g, double kl, double greedy, double rouge);

#endif
