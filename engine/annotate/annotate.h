/* The KV Annotator: from the attention a prefill exported, choose which
 * fresh, non-sensitive tokens form self-contextualized segments (worth
 * sharing) and which of their tokens to recompute on reuse.
 *
 * A segment [a, b] is valid when
 *   internal / external >= tau       internal = mass of rows [a, b] on
 *                                     columns [a, b]; external = their mass
 *                                     on columns before a, sink excluded
 *   sensitive mass <= beta * rows    head-averaged mass on sensitive columns
 * Runs are maximal spans of fresh computed tokens that are not sensitive and
 * whose rows' max-over-heads mass on sensitive columns is <= row_limit; a
 * DP over each run picks disjoint valid segments of min_len..max_len tokens
 * covering the most tokens, O(run length x max_len) with O(1) tests from a
 * banded summed-area table (engine/annotate/sat.h). */
#ifndef CP_ANNOTATE_H
#define CP_ANNOTATE_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/annot_dev.h"
#include "../../kernels/status.h"

typedef struct cp_annot_opts {
    int min_len;     /* 32 */
    int max_len;     /* 2048: the band of the table */
    double tau;      /* 0.25 */
    double beta;     /* 0.02 */
    double row_limit;/* 0.05 */
    int sink;        /* 1 */
    int k0;          /* 2 */
    double r;        /* 0.15 */
} cp_annot_opts;

void cp_annot_opts_default(cp_annot_opts *o);

typedef struct cp_annot_input {
    const float *A;           /* rows and columns by position; rows of tokens not computed may be anything */
    size_t lda;
    int T;
    const uint8_t *fresh;     /* per token: computed by this prefill, not reused (NULL = all) */
    const uint8_t *sensitive; /* per token (NULL = none) */
    const float *sens_mass;   /* per row: max over heads/layers of mass on sensitive columns (NULL = 0) */
    const int32_t *group;     /* per token: runs never span two groups, e.g. messages (NULL = one group) */
    /* optional: the O(T^2) part done elsewhere (kernels/annot_dev.h), next
     * to the matrix: then A is not read here (it may be device memory) */
    const cp_annot_dev *dev;
} cp_annot_input;

typedef struct cp_annot_segment {
    int start, len;
    uint8_t *recompute; /* [len] */
    double internal, external, sensitive;
} cp_annot_segment;

typedef enum cp_cut_reason { CP_CUT_SENSITIVE = 1, CP_CUT_SENS_ATTENTION, CP_CUT_REUSED } cp_cut_reason;

typedef struct cp_annot_result {
    cp_annot_segment *v;
    size_t n;
    /* how often each rule fired */
    int runs;
    int rows_sensitive, rows_sens_attention, rows_reused; /* tokens that cut runs, by reason */
    long rejected_tau, rejected_beta;                      /* candidate segments failing each test */
    int tokens_covered, tokens_recompute;
    uint8_t *cut; /* per token: 0, or the cp_cut_reason that kept it out of every run */
} cp_annot_result;

/* The part of an attention export the annotator reads, O(T x max_len)
 * instead of the dense T x T matrix: row i's columns [i - max_len, i], its
 * sums over [0, i] (total, sink, sensitive) and its mass on the columns of
 * its run left of that band.  The last needs the run each row falls in, so
 * rows arrive in ascending order after the per-row inputs that decide runs
 * (fresh, sensitive, sens_mass, group: those of the cp_annot_input given to
 * cp_annotate) are known for them.  Every sum is taken in the order the
 * dense path takes it: cp_annotate gives bit-identical results from either. */
typedef struct cp_annot_band {
    int T, max_len, sink;
    cp_annot_opts o;    /* the options it was cut for (row_limit decides runs) */
    size_t ld;          /* min(T - 1, max_len) + 1: a row's columns reach back no further than the prompt */
    float *v;           /* [T][ld]: v[i * ld + (i - j)] = A[i][j], 0 where j < 0 */
    size_t v_mapped;    /* v's bytes when it is pages of its own (munmap), else 0 (free) */
    double *tot, *sinkm, *sens; /* per row, over columns [0, i] */
    double *left;       /* per row: sum of columns [s(i), max(i - max_len, s(i))), s(i) its run's start */
    int32_t *start;     /* s(i), or -1 for a row in no run */
    int32_t *sidx;      /* scratch: the sensitive columns up to a call's last row */
    int next;           /* rows below this have been seen */
    size_t v_floats;    /* v's room */
    struct cp_annot_cells *home; /* the kept cells v goes back to (cp_annot_band_init_kept), or NULL */
    uint8_t *given;     /* per row: it was added (its cells written: wiped before kept cells go back) */
} cp_annot_band;

/* Band cells kept from one band to the next by their owner (an engine):
 * a band's cells are written anew for every request, and fresh pages for
 * them cost a page fault each (~200 a rag-v1 request, 0.7 ms of its first
 * token in a virtual machine).  All zeros while kept: a band wipes the rows
 * it wrote before giving them back, so a band drawn from them reads as
 * fresh pages do -- no other request's values.  Not thread-safe: one
 * owner's bands are made and freed on one thread. */
typedef struct cp_annot_cells {
    float *v;
    size_t floats, mapped; /* mapped: v's bytes when pages of their own, else 0 */
} cp_annot_cells;
void cp_annot_cells_free(cp_annot_cells *k);

/* A band for T rows, cut for o's max_len, sink and row_limit (cp_annotate
 * must get the same ones). */
cp_status cp_annot_band_init(cp_annot_band *b, int T, const cp_annot_opts *o, cp_error *err);
/* The same with its cells from *home when they are there and large enough;
 * cp_annot_band_free then wipes what it wrote and keeps the larger of its
 * cells and home's there (up to CP_ANNOT_KEEP_BYTES). */
#define CP_ANNOT_KEEP_BYTES ((size_t)64 << 20)
cp_status cp_annot_band_init_kept(cp_annot_band *b, int T, const cp_annot_opts *o, cp_annot_cells *home, cp_error *err);
void cp_annot_band_free(cp_annot_band *b);
/* n rows of the matrix (row k is row rows_at[k], ascending, above every row
 * added before; row stride ld; columns [0, rows_at[k]] read).  Rows skipped
 * count as zero rows, as in a zeroed dense matrix.  in gives fresh,
 * sensitive, sens_mass and group for every row up to the last one added. */
cp_status cp_annot_band_add(cp_annot_band *b, const cp_annot_input *in, const float *rows, size_t ld, const int32_t *rows_at, int n,
                            cp_error *err);

cp_status cp_annotate(const cp_annot_input *in, const cp_annot_opts *o, cp_annot_result *out, cp_error *err);
/* The same from a band made with in's per-row inputs and o (in->A and
 * in->dev are not read): results bit-identical to cp_annotate's over the
 * dense matrix the band was cut from. */
cp_status cp_annotate_band(const cp_annot_input *in, const cp_annot_band *band, const cp_annot_opts *o, cp_annot_result *out,
                           cp_error *err);
void cp_annot_result_free(cp_annot_result *r);

/* The score of a segment: for tests and tools (builds the table itself). */
/* The host reference of cp_annot_dev over a host matrix A (T rows, row
 * stride lda) and its sensitive columns (NULL = none): what a device
 * implementation must reproduce.  Free with cp_annot_dev_host_free. */
cp_status cp_annot_dev_host(const float *A, size_t lda, int T, const uint8_t *sensitive, cp_annot_dev *out, cp_error *err);
void cp_annot_dev_host_free(cp_annot_dev *d);
int cp_annot_valid(const cp_annot_input *in, const cp_annot_opts *o, int a, int b);

#endif
