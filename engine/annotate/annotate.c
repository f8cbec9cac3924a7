#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "annotate.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sat.h"

/* tau 0.25: a segment reused outside its creator's context is corrected by
 * request-time recompute (epic, R 0.85), so self-containment buys little
 * quality and costs reuse.  On cp-books-6m, rag-v1's first 60 requests
 * reuse 85.3 % of prompt tokens at tau 0.25 (greedy agreement 97.5 %,
 * fewer tokens computed) against 71.1 % at tau 1 and 81.1 % for 16-token
 * chunks; tau 0.5 gives 84.8 % at 95.0 %.  On chat-v1 it costs 0.6 points
 * (4.8 % against 5.4 %), where the sensitive-attention budget decides
 * (profiling/reuse_gap.sh).  tau is a quality knob, not a privacy one: the
 * mask, row_limit and beta decide what may be shared. */
void cp_annot_opts_default(cp_annot_opts *o)
{
    *o = (cp_annot_opts){ .min_len = 32, .max_len = 2048, .tau = 0.25, .beta = 0.02, .row_limit = 0.05, .sink = 1, .k0 = 2, .r = 0.15 };
}

void cp_annot_result_free(cp_annot_result *r)
{
    for (size_t i = 0; i < r->n; i++) free(r->v[i].recompute);
    free(r->v);
    free(r->cut);
    memset(r, 0, sizeof *r);
}

/* One run's prepared sums: O(1) internal, external and sensitive mass —
 * from the host SAT, or (in->dev) row sums and validity codes made
 * elsewhere, with no table here. */
typedef struct run {
    int s, e;
    cp_sat sat;
    double *px;  /* prefix over rows of (total - sink mass) */
    double *ps;  /* prefix over rows of head-averaged sensitive mass */
    double *tot, *sink, *sens;
    uint8_t *codes; /* in->dev: [(b - s) * W + len - min_len] */
    int W;
} run;

static void run_free(run *r)
{
    cp_sat_free(&r->sat);
    free(r->px), free(r->ps), free(r->tot), free(r->sink), free(r->sens), free(r->codes);
}

static cp_annot_params params_of(const cp_annot_opts *o)
{
    return (cp_annot_params){ o->sink, o->min_len, o->max_len, o->tau, o->beta };
}

/* A run's row sums from a band, which must have cut its rows into the same
 * runs (a row it saw in another run was made for other inputs). */
static cp_status band_rows(const cp_annot_band *b, int s, int e, run *r, cp_error *err)
{
    for (int i = s; i < e; i++) {
        if (i < b->next && b->start[i] != s)
            return cp_fail(err, CP_EINVAL, "annotator: the band put row %d in a run from %d, not %d", i, b->start[i], s);
        r->tot[i - s] = b->tot[i];
        r->sink[i - s] = b->sinkm[i];
        r->sens[i - s] = b->sens[i];
    }
    return CP_OK;
}

static cp_status run_build(const cp_annot_input *in, const cp_annot_band *bd, const cp_annot_opts *o, int s, int e, run *r,
                           cp_error *err)
{
    memset(r, 0, sizeof *r);
    r->s = s;
    r->e = e;
    size_t L = (size_t)(e - s);
    r->px = malloc((L + 1) * sizeof *r->px);
    r->ps = malloc((L + 1) * sizeof *r->ps);
    r->tot = malloc(L * sizeof *r->tot);
    r->sink = malloc(L * sizeof *r->sink);
    r->sens = malloc(L * sizeof *r->sens);
    if (!r->px || !r->ps || !r->tot || !r->sink || !r->sens) {
        run_free(r);
        return cp_fail(err, CP_ENOMEM, "annotator: out of memory for a %zu-token run", L);
    }
    int band = o->max_len < e - s ? o->max_len : e - s;
    cp_status rc = CP_OK;
    if (in->dev) {
        r->W = band - o->min_len + 1;
        cp_annot_params p = params_of(o);
        if (r->W < 1) rc = cp_fail(err, CP_EINVAL, "annotator: run [%d, %d) is shorter than %d", s, e, o->min_len);
        else if (!(r->codes = malloc(L * (size_t)r->W))) rc = cp_fail(err, CP_ENOMEM, "annotator: out of memory for validity codes");
        else rc = in->dev->run(in->dev->ctx, s, e, &p, r->tot, r->sink, r->sens, r->codes, err);
    } else if (bd) {
        rc = band_rows(bd, s, e, r, err);
    } else {
        cp_annot_row_sums(in->A, in->lda, s, e, o->sink, in->sensitive, r->tot, r->sink, r->sens);
    }
    r->px[0] = r->ps[0] = 0;
    for (size_t i = 0; rc == CP_OK && i < L; i++) {
        r->px[i + 1] = r->px[i] + r->tot[i] - r->sink[i];
        r->ps[i + 1] = r->ps[i] + r->sens[i];
    }
    /* the table reaches back as far as a row can within the run: a run over
     * the whole prompt (every token fresh template markup, e.g. 50 empty
     * messages) is T long, and its band of T columns reaches T - 1 back */
    const int reach = band < e - s ? band : e - s - 1;
    if (rc == CP_OK && bd && !in->dev) rc = cp_sat_build_band(&r->sat, bd->v, bd->ld, bd->left, s, e, reach, err);
    else if (rc == CP_OK && !in->dev) rc = cp_sat_build(&r->sat, in->A, in->lda, s, e, reach, err);
    if (rc) run_free(r);
    return rc;
}

/* each row's mass on columns [a, i] for i in [a, b]: from the table here or
 * from the device */
static cp_status inner_rows(const cp_annot_input *in, const run *r, int a, int b, double *out, cp_error *err)
{
    if (in->dev) return in->dev->inner(in->dev->ctx, a, b, out, err);
    for (int i = a; i <= b; i++) out[i - a] = cp_sat_row_from(&r->sat, i, a);
    return CP_OK;
}

static double internal(const run *r, int a, int b) { return cp_sat_square(&r->sat, a, b); }

static double external(const run *r, int a, int b, int sink)
{
    if (a < sink) return 0; /* everything before a is sink */
    double x = r->px[b + 1 - r->s] - r->px[a - r->s] - internal(r, a, b);
    return x > 0 ? x : 0;
}

static double sens_mass(const run *r, int a, int b) { return r->ps[b + 1 - r->s] - r->ps[a - r->s]; }

/* 0 valid, 1 fails tau, 2 fails beta */
static int check(const run *r, const cp_annot_opts *o, int a, int b)
{
    if (sens_mass(r, a, b) > o->beta * (b - a + 1)) return 2;
    double in = internal(r, a, b), ex = external(r, a, b, o->sink);
    return in >= o->tau * ex ? 0 : 1;
}

/* Recompute flags: the first k0 tokens, then the largest external shares;
 * the count depends on the length alone.  inner: each row's mass inside
 * the segment (inner_rows). */
static cp_status flags(const run *r, const cp_annot_opts *o, const double *inner, cp_annot_segment *g, cp_error *err)
{
    int n = g->len, a = g->start;
    g->recompute = calloc((size_t)n, 1);
    double *share = malloc((size_t)n * sizeof *share);
    if (!g->recompute || !share) {
        free(share);
        return cp_fail(err, CP_ENOMEM, "annotator: out of memory");
    }
    int want = o->k0 + (int)ceil(o->r * n);
    if (want > n) want = n;
    for (int k = 0; k < n; k++) {
        int i = a + k;
        double tot = r->tot[i - r->s];
        double ext = tot - (a >= o->sink ? r->sink[i - r->s] : 0) - inner[k];
        share[k] = tot > 0 ? ext / tot : 0;
    }
    int marked = 0;
    for (int k = 0; k < n && k < o->k0; k++) g->recompute[k] = 1, marked++;
    while (marked < want) { /* want is small next to n: repeated max is fine */
        int best = -1;
        for (int k = 0; k < n; k++)
            if (!g->recompute[k] && (best < 0 || share[k] > share[best])) best = k;
        g->recompute[best] = 1;
        marked++;
    }
    free(share);
    return CP_OK;
}

static cp_status dp_run(const cp_annot_input *in, const cp_annot_band *bd, const cp_annot_opts *o, int s, int e, cp_annot_result *out,
                        cp_error *err)
{
    run r;
    cp_status rc = run_build(in, bd, o, s, e, &r, err);
    if (rc) return rc;
    int L = e - s;
    int *f = malloc((size_t)(L + 1) * sizeof *f), *from = malloc((size_t)(L + 1) * sizeof *from);
    if (!f || !from) {
        free(f), free(from);
        run_free(&r);
        return cp_fail(err, CP_ENOMEM, "annotator: out of memory");
    }
    const uint8_t *codes = r.codes; /* in->dev: [(b - s) * W + len - min_len] */
    const int W = r.W;
    /* f[x]: most tokens covered in [s, s + x); from[x]: start of the segment
     * ending at s + x - 1 in that optimum, or -1 */
    f[0] = 0;
    from[0] = -1;
    for (int x = 1; x <= L; x++) {
        f[x] = f[x - 1];
        from[x] = -1;
        int b = s + x - 1;
        int lo = x - o->max_len > 0 ? x - o->max_len : 0;
        for (int ax = x - o->min_len; ax >= lo; ax--) {
            int c = codes ? codes[(size_t)(x - 1) * W + (x - ax) - o->min_len] : check(&r, o, s + ax, b);
            if (c == 1) out->rejected_tau++;
            if (c == 2) out->rejected_beta++;
            if (c == 0 && f[ax] + (x - ax) > f[x]) {
                f[x] = f[ax] + (x - ax);
                from[x] = ax;
            }
        }
    }
    /* segments, right to left, then reversed into place */
    size_t first = out->n;
    for (int x = L; x > 0 && rc == CP_OK;) {
        if (from[x] < 0) {
            x--;
            continue;
        }
        cp_annot_segment *v = realloc(out->v, (out->n + 1) * sizeof *v);
        if (!v) {
            rc = cp_fail(err, CP_ENOMEM, "annotator: out of memory");
            break;
        }
        out->v = v;
        cp_annot_segment *g = &out->v[out->n++];
        memset(g, 0, sizeof *g);
        g->start = s + from[x];
        g->len = x - from[x];
        double *inner = malloc((size_t)g->len * sizeof *inner);
        if (!inner) rc = cp_fail(err, CP_ENOMEM, "annotator: out of memory");
        if (rc == CP_OK) rc = inner_rows(in, &r, g->start, g->start + g->len - 1, inner, err);
        if (rc == CP_OK) {
            double in_mass = 0; /* internal mass: the rows' masses inside the segment */
            for (int k = 0; k < g->len; k++) in_mass += inner[k];
            g->internal = in_mass;
            double ex = g->start < o->sink ? 0 : r.px[g->start + g->len - s] - r.px[g->start - s] - in_mass;
            g->external = ex > 0 ? ex : 0;
            g->sensitive = sens_mass(&r, g->start, g->start + g->len - 1);
            rc = flags(&r, o, inner, g, err);
        }
        free(inner);
        out->tokens_covered += g->len;
        for (int k = 0; rc == CP_OK && k < g->len; k++) out->tokens_recompute += g->recompute[k];
        x = from[x];
    }
    for (size_t i = first, j = out->n; i + 1 < j; i++, j--) {
        cp_annot_segment t = out->v[i];
        out->v[i] = out->v[j - 1];
        out->v[j - 1] = t;
    }
    free(f), free(from);
    run_free(&r);
    return rc;
}

/* 0 when token i may be in a run, else why not */
static int cut_of(const cp_annot_input *in, const cp_annot_opts *o, int i)
{
    if (in->fresh && !in->fresh[i]) return CP_CUT_REUSED;
    else if (in->sensitive && in->sensitive[i]) return CP_CUT_SENSITIVE;
    else if (in->sens_mass && in->sens_mass[i] > o->row_limit) return CP_CUT_SENS_ATTENTION;
    return 0;
}

/* the start of row i's run given the start of row i - 1's (-1: none), as
 * cp_annotate's scan cuts them: -1 when row i is in no run */
static int run_start(const cp_annot_input *in, const cp_annot_opts *o, int i, int prev)
{
    if (cut_of(in, o, i)) return -1;
    if (prev < 0 || (in->group && in->group[i] != in->group[prev])) return i;
    return prev;
}

/* A band's cells from this size up are pages of their own (mmap): the
 * annotator reads only the cells of the rows it was given, [i - len, i]
 * of a row i in a run, so the rest need no memset, and fresh anonymous
 * pages are zero anyway (no other request's values, no uninitialised
 * reads should a reader ever stray).  calloc zeroed the whole band in
 * place once glibc's adaptive threshold kept such sizes on its heap: 2.9 MB
 * a rag-v1 request (850 rows), ~0.17 ms of its export stage. */
#define BAND_MAP_BYTES ((size_t)1 << 20)

static float *band_cells_alloc(size_t count, size_t *mapped)
{
    *mapped = 0;
    size_t bytes = count * sizeof(float);
    if (bytes < BAND_MAP_BYTES) return calloc(count, sizeof(float));
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    *mapped = bytes;
    return p;
}

static void band_cells_release(float *v, size_t mapped)
{
    if (mapped) munmap(v, mapped);
    else free(v);
}

void cp_annot_cells_free(cp_annot_cells *k)
{
    if (k->v) band_cells_release(k->v, k->mapped);
    memset(k, 0, sizeof *k);
}

/* A kept band's cells back to its home, the rows it wrote wiped first
 * (row i's cells: [0, i - max(0, i - max_len)]); the smaller of its cells
 * and whatever home holds is released. */
static void band_cells_home(cp_annot_band *b)
{
    cp_annot_cells *h = b->home;
    if (b->v_floats * sizeof(float) > CP_ANNOT_KEEP_BYTES || (h->v && h->floats >= b->v_floats)) {
        band_cells_release(b->v, b->v_mapped);
        return;
    }
    for (int i = 0; i < b->next; i++)
        if (b->given[i]) {
            const int lo = i - b->max_len > 0 ? i - b->max_len : 0;
            memset(b->v + (size_t)i * b->ld, 0, (size_t)(i - lo + 1) * sizeof(float));
        }
    cp_annot_cells_free(h);
    *h = (cp_annot_cells){ b->v, b->v_floats, b->v_mapped };
}

void cp_annot_band_free(cp_annot_band *b)
{
    if (b->v && b->home && b->given) band_cells_home(b);
    else if (b->v) band_cells_release(b->v, b->v_mapped);
    free(b->tot), free(b->sinkm), free(b->sens), free(b->left), free(b->start), free(b->sidx), free(b->given);
    memset(b, 0, sizeof *b);
}

cp_status cp_annot_band_init_kept(cp_annot_band *b, int T, const cp_annot_opts *o, cp_annot_cells *home, cp_error *err)
{
    memset(b, 0, sizeof *b);
    if (T < 0 || o->max_len < 1 || o->sink < 0)
        return cp_fail(err, CP_EINVAL, "annotator: a band of %d rows, max_len %d, sink %d", T, o->max_len, o->sink);
    /* a prompt shorter than max_len needs no wider rows: the band of a
     * 400-token prompt was 2049 floats a row, 3.3 MB zeroed per request */
    size_t n = (size_t)T, w = (size_t)(T > 0 && T - 1 < o->max_len ? T - 1 : o->max_len) + 1;
    if (n && w > SIZE_MAX / sizeof(float) / n - 1) return cp_fail(err, CP_ERANGE, "annotator: a %zu x %zu band overflows", n, w);
    b->T = T, b->max_len = o->max_len, b->sink = o->sink, b->o = *o, b->ld = w;
    b->v_floats = n * w + 1;
    if (home && home->v && home->floats >= b->v_floats) { /* all zeros: see cp_annot_cells */
        b->v = home->v, b->v_floats = home->floats, b->v_mapped = home->mapped;
        home->v = NULL, home->floats = home->mapped = 0;
    } else {
        b->v = band_cells_alloc(b->v_floats, &b->v_mapped);
    }
    b->home = home;
    b->given = calloc(n + 1, 1);
    b->tot = calloc(n + 1, sizeof *b->tot), b->sinkm = calloc(n + 1, sizeof *b->sinkm), b->sens = calloc(n + 1, sizeof *b->sens);
    b->left = calloc(n + 1, sizeof *b->left);
    b->start = malloc((n + 1) * sizeof *b->start), b->sidx = malloc((n + 1) * sizeof *b->sidx);
    if (!b->v || !b->tot || !b->sinkm || !b->sens || !b->left || !b->start || !b->sidx || !b->given) {
        cp_annot_band_free(b);
        return cp_fail(err, CP_ENOMEM, "annotator: out of memory for a %zu x %zu attention band", n, w);
    }
    return CP_OK;
}

cp_status cp_annot_band_init(cp_annot_band *b, int T, const cp_annot_opts *o, cp_error *err)
{
    return cp_annot_band_init_kept(b, T, o, NULL, err);
}

/* The band cells and left sum of row i (its run start b->start[i] set) */
static void band_cells(cp_annot_band *b, const float *row, int i)
{
    const int s = b->start[i];
    if (s >= 0) { /* the run's columns left of the band, in cp_sat_build's order */
        int lo = i - b->max_len > s ? i - b->max_len : s;
        double pre = 0;
        for (int j = s; j < lo; j++) pre += row[j];
        b->left[i] = pre;
    }
    /* out[k] = row[i - k], k = 0 .. min(i, max_len): restrict lets it run on vectors */
    float *out = b->v + (size_t)i * b->ld;
    for (int j = i - b->max_len > 0 ? i - b->max_len : 0; j <= i; j++) out[i - j] = row[j];
    b->given[i] = 1;
}

/* Rows a group sums side by side: each row's sum is one chain of dependent
 * double adds (the dense path's order, kept for its bits), so one row at a
 * time waits on the add's latency at every column; BAND_GROUP chains
 * interleaved fill the adders and keep each chain's order. */
#define BAND_GROUP 8 /* band_group's locals name 8 */

/* rows k0 .. k0 + g - 1 of a call (g <= BAND_GROUP): their sums over [0, i]
 * (total, sink, sensitive: each in cp_annot_row_sums' order), band cells
 * and left sums.  sidx: the sensitive columns up to the call's last row,
 * ascending (ns of them). */
static void band_group(cp_annot_band *b, const float *rows, size_t ld, const int32_t *at, int g, const int32_t *sidx, int ns)
{
    const float *r[BAND_GROUP];
    double tot[BAND_GROUP] = { 0 };
    for (int q = 0; q < g; q++) r[q] = rows + (size_t)q * ld;
    int j = 0;
    if (g == BAND_GROUP) { /* rows ascend: each reaches column at[0]; the chains in locals (as an array they went through memory) */
        const float *r0 = r[0], *r1 = r[1], *r2 = r[2], *r3 = r[3], *r4 = r[4], *r5 = r[5], *r6 = r[6], *r7 = r[7];
        double t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0, t5 = 0, t6 = 0, t7 = 0;
        for (; j <= at[0]; j++) {
            t0 += r0[j], t1 += r1[j], t2 += r2[j], t3 += r3[j];
            t4 += r4[j], t5 += r5[j], t6 += r6[j], t7 += r7[j];
        }
        tot[0] = t0, tot[1] = t1, tot[2] = t2, tot[3] = t3, tot[4] = t4, tot[5] = t5, tot[6] = t6, tot[7] = t7;
    }
    for (int q = 0; q < g; q++) {
        double t = tot[q];
        for (int c = j; c <= at[q]; c++) t += r[q][c];
        double sk = 0, se = 0;
        for (int c = 0; c < b->sink && c <= at[q]; c++) sk += r[q][c];
        for (int k = 0; k < ns && sidx[k] <= at[q]; k++) se += r[q][sidx[k]];
        b->tot[at[q]] = t, b->sinkm[at[q]] = sk, b->sens[at[q]] = se;
        band_cells(b, r[q], at[q]);
    }
}

/* Rows at or above 2^15 summed elements a call are summed on the threads:
 * each row's sums keep their one order */
#define BAND_PARALLEL_ELEMS (1L << 15)

cp_status cp_annot_band_add(cp_annot_band *b, const cp_annot_input *in, const float *rows, size_t ld, const int32_t *rows_at, int n,
                            cp_error *err)
{
    long elems = 0;
    for (int k = 0, next = b->next; k < n; k++) { /* every row checked before any is added */
        int i = rows_at[k];
        if (i < next || i >= b->T || ld < (size_t)i + 1)
            return cp_fail(err, CP_EINVAL, "annotator: band row %d after row %d of %d (row stride %zu)", i, next - 1, b->T, ld);
        next = i + 1, elems += i + 1;
    }
    if (n <= 0) return CP_OK;
    /* run starts in row order (each from the one before; rows the export
     * skipped are zero rows: the calloc'd zeros are their sums), then the
     * rows' sums and band cells, independent of each other */
    for (; b->next <= rows_at[n - 1]; b->next++) b->start[b->next] = run_start(in, &b->o, b->next, b->next ? b->start[b->next - 1] : -1);
    int ns = 0;
    if (in->sensitive)
        for (int j = 0; j <= rows_at[n - 1]; j++)
            if (in->sensitive[j]) b->sidx[ns++] = j;
    const int groups = (n + BAND_GROUP - 1) / BAND_GROUP;
#pragma omp parallel for schedule(dynamic, 1) if (elems >= BAND_PARALLEL_ELEMS)
    for (int k = 0; k < groups; k++) {
        const int k0 = k * BAND_GROUP, g = n - k0 < BAND_GROUP ? n - k0 : BAND_GROUP;
        band_group(b, rows + (size_t)k0 * ld, ld, rows_at + k0, g, b->sidx, ns);
    }
    return CP_OK;
}

static cp_status annotate(const cp_annot_input *in, const cp_annot_band *bd, const cp_annot_opts *o, cp_annot_result *out,
                          cp_error *err)
{
    memset(out, 0, sizeof *out);
    if (o->min_len < 1 || o->max_len < o->min_len || o->tau < 0 || o->beta < 0 || o->k0 < 0 || o->r < 0 || o->r > 1 || o->sink < 0)
        return cp_fail(err, CP_EINVAL, "annotator: options out of range (min_len %d, max_len %d, tau %g, beta %g, k0 %d, r %g)",
                       o->min_len, o->max_len, o->tau, o->beta, o->k0, o->r);
    if (bd && (bd->T != in->T || bd->max_len != o->max_len || bd->sink != o->sink || bd->o.row_limit != o->row_limit))
        return cp_fail(err, CP_EINVAL, "annotator: the band was cut for other options (%d rows, max_len %d, sink %d)", bd->T,
                       bd->max_len, bd->sink);
    if (in->T < 0 || (!bd && in->lda < (size_t)in->T))
        return cp_fail(err, CP_EINVAL, "annotator: %d tokens with row stride %zu", in->T, in->lda);
    out->cut = calloc((size_t)in->T + 1, 1);
    if (!out->cut) return cp_fail(err, CP_ENOMEM, "annotator: out of memory");
    cp_status rc = CP_OK;
    int start = -1;
    for (int i = 0; i <= in->T && rc == CP_OK; i++) {
        int ok = 0;
        if (i < in->T) {
            out->cut[i] = (uint8_t)cut_of(in, o, i);
            out->rows_reused += out->cut[i] == CP_CUT_REUSED;
            out->rows_sensitive += out->cut[i] == CP_CUT_SENSITIVE;
            out->rows_sens_attention += out->cut[i] == CP_CUT_SENS_ATTENTION;
            ok = !out->cut[i];
        }
        /* a new group (message) ends the run before it */
        int new_group = ok && start >= 0 && in->group && in->group[i] != in->group[start];
        if ((!ok || new_group) && start >= 0) {
            out->runs++;
            if (i - start >= o->min_len) rc = dp_run(in, bd, o, start, i, out, err);
            start = -1;
        }
        if (ok && start < 0) start = i;
    }
    if (rc) cp_annot_result_free(out);
    return rc;
}

cp_status cp_annotate(const cp_annot_input *in, const cp_annot_opts *o, cp_annot_result *out, cp_error *err)
{
    return annotate(in, NULL, o, out, err);
}

cp_status cp_annotate_band(const cp_annot_input *in, const cp_annot_band *band, const cp_annot_opts *o, cp_annot_result *out,
                           cp_error *err)
{
    /* every fresh row must have come (a reused one is a zero row by design):
     * one that never did would read as a row with no attention at all, on
     * the secrets too, and pass the sensitive-attention budget unseen */
    for (int i = 0; in->fresh && i < in->T && i < band->T; i++)
        if (in->fresh[i] && !band->given[i]) {
            memset(out, 0, sizeof *out);
            return cp_fail(err, CP_EINVAL, "annotator: fresh row %d of %d never reached the band (its attention export is missing)", i,
                           in->T);
        }
    cp_annot_input host = *in;
    host.dev = NULL; /* everything comes from the band */
    return annotate(&host, band, o, out, err);
}

/* the host reference of cp_annot_dev: a run built here, kept for inner() */
typedef struct host_dev {
    cp_annot_input in;
    cp_annot_opts o;
    run r;
    int have;
} host_dev;

static cp_status host_run(void *ctx, int s, int e, const cp_annot_params *p, double *tot, double *sink_mass, double *sens_mass,
                          uint8_t *codes, cp_error *err)
{
    host_dev *h = ctx;
    if (h->have) run_free(&h->r), h->have = 0;
    if (s < 0 || e > h->in.T || e - s < p->min_len)
        return cp_fail(err, CP_EINVAL, "annotator: run [%d, %d) of %d tokens is shorter than %d", s, e, h->in.T, p->min_len);
    cp_annot_opts_default(&h->o);
    h->o.sink = p->sink, h->o.min_len = p->min_len, h->o.max_len = p->max_len, h->o.tau = p->tau, h->o.beta = p->beta;
    cp_status rc = run_build(&h->in, NULL, &h->o, s, e, &h->r, err);
    if (rc) return rc;
    h->have = 1;
    const int L = e - s, W = (p->max_len < L ? p->max_len : L) - p->min_len + 1;
    memcpy(tot, h->r.tot, (size_t)L * sizeof *tot);
    memcpy(sink_mass, h->r.sink, (size_t)L * sizeof *sink_mass);
    memcpy(sens_mass, h->r.sens, (size_t)L * sizeof *sens_mass);
    for (int b = s; b < e; b++)
        for (int w = 0; w < W; w++) {
            int a = b - (p->min_len + w) + 1;
            codes[(size_t)(b - s) * W + w] = a < s ? 255 : (uint8_t)check(&h->r, &h->o, a, b);
        }
    return CP_OK;
}

static cp_status host_inner(void *ctx, int a, int b, double *out, cp_error *err)
{
    host_dev *h = ctx;
    if (!h->have || a < h->r.s || b >= h->r.e || b < a)
        return cp_fail(err, CP_EINVAL, "annotator: rows [%d, %d] are outside the current run", a, b);
    for (int i = a; i <= b; i++) out[i - a] = cp_sat_row_from(&h->r.sat, i, a);
    return CP_OK;
}

cp_status cp_annot_dev_host(const float *A, size_t lda, int T, const uint8_t *sensitive, cp_annot_dev *out, cp_error *err)
{
    if (T < 0 || lda < (size_t)T) return cp_fail(err, CP_EINVAL, "annotator: %d tokens with row stride %zu", T, lda);
    host_dev *h = calloc(1, sizeof *h);
    if (!h) return cp_fail(err, CP_ENOMEM, "annotator: out of memory");
    h->in = (cp_annot_input){ .A = A, .lda = lda, .T = T, .sensitive = sensitive };
    *out = (cp_annot_dev){ h, host_run, host_inner };
    return CP_OK;
}

void cp_annot_dev_host_free(cp_annot_dev *d)
{
    host_dev *h = d->ctx;
    if (h && h->have) run_free(&h->r);
    free(h);
    d->ctx = NULL;
}

int cp_annot_valid(const cp_annot_input *in, const cp_annot_opts *o, int a, int b)
{
    run r;
    cp_error err;
    if (run_build(in, NULL, o, a, b + 1, &r, &err) != CP_OK) return -1;
    int c = check(&r, o, a, b);
    run_free(&r);
    return c == 0;
}
