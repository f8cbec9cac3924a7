/* The annotator's O(T^2) loops on the host (kernels/cuda mirrors them):
 * a banded summed-area table over one run of an attention matrix, and the
 * per-row sums the annotator's O(1) queries need. */
#ifndef CP_ANNOT_SAT_H
#define CP_ANNOT_SAT_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/status.h"

/* For a run [s, e) of rows of a lower-triangular attention matrix A (row i,
 * column j, j <= i; row stride lda):
 *   S(i, j) = sum over s <= i' <= i, s <= j' <= j of A[i'][j']
 * kept for the band i - band <= j <= i (j >= s).  Mass beyond the diagonal
 * is zero, so S(i', j) = S(i', i') for j > i', and the internal mass of a
 * segment [a, b] (b - a < band) is  S(b, b) - S(b, a - 1).
 * Memory (e - s) x (band + 1) doubles: with band = the longest segment
 * allowed, results are identical to a full table for every such segment. */
typedef struct cp_sat {
    int s, e, band;
    double *v; /* v[(i - s) * (band + 1) + (i - j)] = S(i, j) */
} cp_sat;

cp_status cp_sat_build(cp_sat *t, const float *A, size_t lda, int s, int e, int band, cp_error *err);
/* The same table from a band of A (row i's column j at vals[i * ld + (i - j)]
 * for i - j < ld; ld > band) and, per row, left[i] = the row's sum over
 * columns [s, max(i - band', s)) for the band' >= band the band was cut for,
 * summed from column s up as cp_sat_build does: bit-identical to it. */
cp_status cp_sat_build_band(cp_sat *t, const float *vals, size_t ld, const double *left, int s, int e, int band, cp_error *err);
void cp_sat_free(cp_sat *t);
/* S(i, j) for s <= i < e; 0 for i < s or j < s; j in [i - band, i], or > i */
double cp_sat_at(const cp_sat *t, int i, int j);
/* sum over rows and columns of [a, b], requires s <= a <= b < e, b - a < band + 1 */
static inline double cp_sat_square(const cp_sat *t, int a, int b) { return cp_sat_at(t, b, b) - cp_sat_at(t, b, a - 1); }
/* row i's mass on columns [a, i] (i - a <= band) */
static inline double cp_sat_row_from(const cp_sat *t, int i, int a)
{
    return (cp_sat_at(t, i, i) - cp_sat_at(t, i - 1, i - 1)) - (cp_sat_at(t, i, a - 1) - cp_sat_at(t, i - 1, a - 1));
}

/* Per row i in [s, e): total mass, mass on the first `sink` columns, and
 * mass on columns flagged in sens (each row read once). */
void cp_annot_row_sums(const float *A, size_t lda, int s, int e, int sink, const uint8_t *sens, double *total,
                       double *sink_mass, double *sens_mass_avg);

#endif
