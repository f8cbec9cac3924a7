/* The built-in calibration sample (public-domain text, cli_calib_sample.c):
 * a request log automatic calibration replays when the operator names no
 * log of their own. */
#ifndef CP_CLI_CALIB_SAMPLE_H
#define CP_CLI_CALIB_SAMPLE_H

#include <stddef.h>

#include "../../kernels/status.h"

#define CLI_CALIB_SAMPLE_REQUESTS 32

/* The sample's first n requests (n <= 0 or more than it has: all) as JSONL
 * lines, malloc'd and NUL-terminated; *len its length. */
cp_status cli_calib_sample_jsonl(int n, char **out, size_t *len, cp_error *err);

#endif
