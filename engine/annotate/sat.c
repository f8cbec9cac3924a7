#include "sat.h"

#include <stdlib.h>

/* the band's storage for rows [s, e): band + 1 doubles a row */
static cp_status sat_alloc(cp_sat *t, int s, int e, int band, cp_error *err)
{
    t->s = s;
    t->e = e;
    t->band = band;
    size_t w = (size_t)band + 1, rows = (size_t)(e - s);
    t->v = malloc(rows * w * sizeof *t->v + 1);
    if (!t->v) return cp_fail(err, CP_ENOMEM, "annotator: out of memory for a %zu x %zu summed-area band", rows, w);
    return CP_OK;
}

cp_status cp_sat_build(cp_sat *t, const float *A, size_t lda, int s, int e, int band, cp_error *err)
{
    cp_status rc = sat_alloc(t, s, e, band, err);
    if (rc) return rc;
    size_t w = (size_t)band + 1;
    for (int i = s; i < e; i++) {
        const float *row = A + (size_t)i * lda;
        double *out = t->v + (size_t)(i - s) * w;
        int lo = i - band > s ? i - band : s;
        /* the row's prefix up to lo - 1 (left of the band) */
        double pre = 0;
        for (int j = s; j < lo; j++) pre += row[j];
        for (int j = lo; j <= i; j++) {
            pre += row[j];
            /* S(i, j) = S(i - 1, j) + row prefix; S(i - 1, i) = S(i - 1, i - 1) */
            double above = i > s ? cp_sat_at(t, i - 1, j < i ? j : i - 1) : 0.0;
            out[i - j] = above + pre;
        }
    }
    return CP_OK;
}

cp_status cp_sat_build_band(cp_sat *t, const float *vals, size_t ld, const double *left, int s, int e, int band, cp_error *err)
{
    if (band < 0 || (size_t)band >= ld) return cp_fail(err, CP_EINVAL, "annotator: a %d-column band read from rows of %zu", band + 1, ld);
    cp_status rc = sat_alloc(t, s, e, band, err);
    if (rc) return rc;
    size_t w = (size_t)band + 1;
    for (int i = s; i < e; i++) {
        const float *row = vals + (size_t)i * ld; /* row[i - j] = A[i][j] */
        double *out = t->v + (size_t)(i - s) * w;
        int lo = i - band > s ? i - band : s;
        double pre = left[i]; /* columns [s, lo), summed as cp_sat_build sums them */
        for (int j = lo; j <= i; j++) {
            pre += row[i - j];
            double above = i > s ? cp_sat_at(t, i - 1, j < i ? j : i - 1) : 0.0;
            out[i - j] = above + pre;
        }
    }
    return CP_OK;
}

void cp_sat_free(cp_sat *t)
{
    free(t->v);
    t->v = NULL;
}

double cp_sat_at(const cp_sat *t, int i, int j)
{
    if (i < t->s || j < t->s) return 0.0;
    if (j > i) j = i;
    return t->v[(size_t)(i - t->s) * ((size_t)t->band + 1) + (size_t)(i - j)];
}

void cp_annot_row_sums(const float *A, size_t lda, int s, int e, int sink, const uint8_t *sens, double *total,
                       double *sink_mass, double *sens_mass_avg)
{
#pragma omp parallel for schedule(dynamic, 16) if (e - s > 256)
    for (int i = s; i < e; i++) {
        const float *row = A + (size_t)i * lda;
        double tot = 0, sk = 0, se = 0;
        for (int j = 0; j <= i; j++) {
            tot += row[j];
            if (j < sink) sk += row[j];
            if (sens && sens[j]) se += row[j];
        }
        total[i - s] = tot;
        sink_mass[i - s] = sk;
        sens_mass_avg[i - s] = se;
    }
}
