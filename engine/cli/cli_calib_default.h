/* Automatic calibration: `run` and `serve` with sharing cacheprune and
 * neither --calibration FILE nor an option a calibration sets use a
 * recompute setting measured for the model they load.  It is measured once
 * (the built-in public-domain sample, or --calib-requests), kept in the state
 * directory under the model's fingerprint and the sample's digest
 * (cli_calib_store.h), and read back on later starts; a file that does not
 * read back strictly is measured again.  The --quality budget picks among
 * the measured settings.  The setting is per model and sample, never per
 * request (THREAT_MODEL.md). */
#ifndef CP_CLI_CALIB_DEFAULT_H
#define CP_CLI_CALIB_DEFAULT_H

#include "cli_engine_opts.h"

#define CLI_QUALITY_DEFAULT "balanced"

/* The bounds of a --quality preset (high, balanced, fast); 0 when name is none. */
int cli_quality_preset(const char *name, double *kl, double *greedy, double *rouge);
/* The state directory: --state-dir, $CACHEPRUNE_STATE_DIR,
 * $XDG_STATE_HOME/cacheprune, ~/.local/state/cacheprune; 0 when none can
 * be named (no HOME). */
int cli_state_dir(const cli_engine_opts *o, char *out, size_t cap);
/* Applies the automatic calibration to eo when it is on and eligible (one
 * sharing mode, cacheprune); with it off or not eligible, refuses the
 * options that only it reads.  eo holds the run's template and detector
 * options (the measurement runs with them).  0 after printing an error. */
int cli_calib_default(const cli_engine_opts *o, int eligible, cp_model *m, cp_tokenizer *tok, cp_detect_chain *chain, cp_engine_opts *eo,
                      int progress);

#endif
