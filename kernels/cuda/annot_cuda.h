/* The annotator's O(T^2) part on the device, for one run [s, e) of an
 * exported attention matrix A (device memory, row stride lda): the same
 * quantities as engine/annotate/sat.h computes on the host, in doubles,
 * so the segments the annotator chooses do not depend on where they were
 * computed.  Every pointer is device memory; the calls queue on the
 * backend's stream (errors reach its next sync()).  Only in CUDA builds. */
#ifndef CP_ANNOT_CUDA_H
#define CP_ANNOT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../annot_dev.h"
#include "../backend.h"

/* Per row i in [s, e) (index i - s): total mass, mass on the first `sink`
 * columns and on columns flagged in sens (NULL = none), columns 0..i —
 * as cp_annot_row_sums. */
void cp_cuda_annot_row_sums(cp_backend *be, const float *A, size_t lda, int s, int e, int sink, const uint8_t *sens,
                            double *tot, double *sink_mass, double *sens_mass);

/* px[k] = sum of (tot - sink_mass) over the run's first k rows, ps[k] the
 * same of sens_mass (k = 0 .. e - s; e - s + 1 values each). */
void cp_cuda_annot_prefix(cp_backend *be, int n, const double *tot, const double *sink_mass, const double *sens_mass, double *px,
                          double *ps);

/* The banded summed-area table in cp_sat's layout,
 * v[(i - s) * (band + 1) + (i - j)] = S(i, j) for max(s, i - band) <= j <= i
 * (other offsets unwritten); scratch holds 2 (e - s) doubles.  Row prefix
 * sums (one block a row), a scan of the row totals, then column sums (one
 * thread a column, in place). */
void cp_cuda_sat_build(cp_backend *be, const float *A, size_t lda, int s, int e, int band, double *v, double *scratch);

/* Validity of every candidate segment [b - len + 1, b] of the run, for
 * min_len <= len <= min(max_len, e - s): codes[(b - s) * W + len - min_len]
 * with W = min(max_len, e - s) - min_len + 1 is 0 valid, 1 fails tau, 2
 * fails beta (the annotator's check()), 255 where the segment would start
 * before s.  v from cp_cuda_sat_build with band = min(max_len, e - s). */
void cp_cuda_annot_codes(cp_backend *be, const double *v, int s, int e, int band, const double *px, const double *ps, int min_len,
                         int max_len, double tau, double beta, int sink, uint8_t *codes);

/* The annotator's device half (kernels/annot_dev.h) over an exported
 * matrix A in device memory (T rows, row stride lda) and its sensitive
 * columns (device bytes, NULL = none): the kernels above per run, results
 * downloaded.  Close with cp_cuda_annot_dev_close. */
cp_status cp_cuda_annot_dev_open(cp_backend *be, const float *A, size_t lda, int T, const uint8_t *sens, cp_annot_dev *out,
                                 cp_error *err);
void cp_cuda_annot_dev_close(cp_annot_dev *d);

#ifdef __cplusplus
}
#endif

#endif
