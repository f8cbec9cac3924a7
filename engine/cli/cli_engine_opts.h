/* The engine options that `run` and `serve` share: sharing mode, segment KV,
 * admission, recompute, annotator, pool budget, chat template, and the
 * detector options (cli_parse_detect_opt).  One parser, so the two commands
 * cannot drift apart. */
#ifndef CP_CLI_ENGINE_OPTS_H
#define CP_CLI_ENGINE_OPTS_H

#include <stddef.h>
#include <stdio.h>

#include "cli.h"
#include "../request.h"

typedef struct cli_engine_opts {
    cp_engine_opts eo;
    const char *sharing; /* "cacheprune" */
    const char *tpl;     /* NULL: from tokenizer_config.json */
    size_t pool_bytes;   /* 1 GiB */
    cli_detect_opts dopt;
    cp_weight_dtype dtype; /* --dtype; auto */
    const char *calibration; /* --calibration FILE (NULL: auto or off) */
    int calibration_off;     /* --calibration off: the built-in setting, no automatic calibration */
    int quality_given;       /* a recompute option the calibration sets was given too */
    int sharing_given;       /* --sharing was given (a calibration file sets it too; automatic
                                calibration runs whenever the run's one mode is cacheprune) */
    char calibration_fp[65]; /* the model it was made for (hex) */
    /* the automatic calibration (cli_calib_default.h): --state-dir,
     * --calib-requests, --calib-sample, the --quality budget */
    const char *state_dir, *calib_requests;
    long long calib_sample;  /* 0: the whole sample */
    double quality_kl, quality_greedy, quality_rouge;
    int budget_given;        /* a --quality option was given */
    /* the shared segment tier (pool/tier.h): --tier URL, --tier-prefix,
     * --tier-password-file, --tier-key-file, --tier-ttl S, --tier-timeout-ms MS */
    const char *tier, *tier_prefix, *tier_password_file;
    const char *tier_key_file;      /* --tier-key-file: the value key every replica on the tier shares */
    double tier_ttl_s, tier_timeout_s;
    /* serve's per-tenant quotas, held across replicas through the tier too */
    size_t tier_quota_bytes;
    uint32_t tier_quota_segments;
    double tier_quota_window_s; /* 0: the tier's default (60) */
} cli_engine_opts;

void cli_engine_opts_default(cli_engine_opts *o);
/* argv[*i] as an engine or detector option: 1 when consumed (*i moved past
 * its value), 0 when it is not one, -1 after printing an error. */
int cli_parse_engine_opt(int argc, char **argv, int *i, cli_engine_opts *o);
/* "1G", "512M", "64K", "1000": 0 after printing an error. */
int cli_parse_bytes(const char *opt, const char *v, size_t *out);
/* With --calibration: reads the file and applies its setting to o->eo and
 * o->sharing (no setting met the budget: prefix-only reuse), saying on
 * stderr which it is; refuses options the file sets (a calibrated run is
 * run as calibrated).  Then the loaded model must be the calibrated one
 * (cli_calibration_matches).  0 after printing an error. */
int cli_engine_opts_calibrate(cli_engine_opts *o);
int cli_calibration_matches(const cli_engine_opts *o, const cp_model *m);
/* --calibration's value (or $CACHEPRUNE_CALIBRATION's): auto, off or a
 * file.  0 after printing an error. */
int cli_calibration_choice(const char *from, const char *v, cli_engine_opts *o);
/* With --tier: the tier for model m's KV (the pool's layout), connected
 * lazily; *out NULL without --tier.  0 after printing an error. */
int cli_tier_open(const cli_engine_opts *o, const cp_model *m, cp_backend *be, cp_tier **out);
/* Closes it after draining its writes (bounded), with one line of its figures on stderr. */
void cli_tier_close(cp_tier *t);
/* The options' help lines. */
void cli_engine_opts_usage(FILE *f);

#endif
