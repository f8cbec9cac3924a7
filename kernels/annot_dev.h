/* The annotator's O(T^2) part done elsewhere — on the device, next to the
 * exported attention matrix it was computed from — as the annotator asks for
 * it, run by run (engine/annotate/annotate.c; implementations: the host
 * reference cp_annot_dev_host in engine/annotate/annotate.c, the CUDA one in
 * kernels/cuda/annot_cuda.h).  Results come back to the host: a run's row
 * sums and the validity code of every candidate segment, then, for the
 * segments the DP chose, each row's mass inside its segment. */
#ifndef CP_ANNOT_DEV_H
#define CP_ANNOT_DEV_H

#include <stdint.h>

#include "status.h"

typedef struct cp_annot_params {
    int sink, min_len, max_len;
    double tau, beta;
} cp_annot_params;

typedef struct cp_annot_dev {
    void *ctx;
    /* Run [s, e): per row (index i - s) total mass, mass on the first `sink`
     * columns, mass on sensitive columns (columns 0..i), and
     * codes[(b - s) * W + len - min_len], W = min(max_len, e - s) - min_len + 1:
     * 0 valid, 1 fails tau, 2 fails beta, 255 starts before s.  What inner()
     * needs is kept until the next run. */
    cp_status (*run)(void *ctx, int s, int e, const cp_annot_params *p, double *tot, double *sink_mass, double *sens_mass,
                     uint8_t *codes, cp_error *err);
    /* For rows i in [a, b] of the current run: out[i - a] = the row's mass on
     * columns [a, i]. */
    cp_status (*inner)(void *ctx, int a, int b, double *out, cp_error *err);
} cp_annot_dev;

#endif
