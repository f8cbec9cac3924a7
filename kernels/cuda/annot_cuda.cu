// The annotator's O(T^2) part on the device (annot_cuda.h): row sums, the
// banded summed-area table and the validity of every candidate segment.
// Doubles throughout, as on the CPU (engine/annotate/sat.c), so a
// segment's validity only differs from the host's on an exact tie.
// Bandwidth-bound: the SAT reads the band of A once and writes the band of
// the table twice (row prefixes, then column sums in place).
#include <nvtx3/nvToolsExt.h>

#include "annot_cuda.h"
#include "cuda_impl.cuh"

namespace {

constexpr int THREADS = 256;

// Block-wide exclusive scan of one double per thread (every thread gets its
// prefix and the block total).  Uses sh[THREADS].
__device__ double block_exclusive_scan(double v, double *sh, double *total)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int off = 1; off < (int)blockDim.x; off <<= 1) { // Hillis-Steele, in place with a read-then-write barrier
        double add = threadIdx.x >= (unsigned)off ? sh[threadIdx.x - off] : 0.0;
        __syncthreads();
        sh[threadIdx.x] += add;
        __syncthreads();
    }
    double excl = threadIdx.x ? sh[threadIdx.x - 1] : 0.0; // not incl - v: that would round
    *total = sh[blockDim.x - 1];
    __syncthreads();
    return excl;
}

__device__ double block_sum_d(double v, double *sh)
{
    double total;
    block_exclusive_scan(v, sh, &total);
    return total;
}

// one block per row of the run
__global__ void row_sums_kernel(const float *A, size_t lda, int s, int sink, const uint8_t *sens, double *tot, double *sk,
                                double *se)
{
    __shared__ double sh[THREADS];
    const int i = s + blockIdx.x;
    const float *row = A + (size_t)i * lda;
    double t = 0, k = 0, x = 0;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        double a = row[j];
        t += a;
        if (j < sink) k += a;
        if (sens && sens[j]) x += a;
    }
    t = block_sum_d(t, sh);
    k = block_sum_d(k, sh);
    x = block_sum_d(x, sh);
    if (threadIdx.x == 0) tot[blockIdx.x] = t, sk[blockIdx.x] = k, se[blockIdx.x] = x;
}

// out[k] = sum of in[0..k) for k = 0..n, one block; each thread a contiguous
// slice (a <- a - b when b is given)
__device__ void scan_to(const double *a, const double *b, int n, double *out, double *sh)
{
    int per = (n + blockDim.x - 1) / blockDim.x, k0 = threadIdx.x * per, k1 = min(n, k0 + per);
    double mine = 0;
    for (int k = k0; k < k1; k++) mine += a[k] - (b ? b[k] : 0.0);
    double total, pre = block_exclusive_scan(mine, sh, &total);
    for (int k = k0; k < k1; k++) {
        out[k] = pre;
        pre += a[k] - (b ? b[k] : 0.0);
    }
    if (threadIdx.x == 0) out[n] = total;
}

__global__ void prefix_kernel(int n, const double *tot, const double *sk, const double *se, double *px, double *ps)
{
    __shared__ double sh[THREADS];
    scan_to(tot, sk, n, px, sh);
    scan_to(se, NULL, n, ps, sh);
}

// SAT phase 1, one block per row i: R(i, j) = sum of A[i][s..j] for j in the
// band, into v's layout; rowtot[i - s] = R(i, i)
__global__ void sat_rows_kernel(const float *A, size_t lda, int s, int band, double *v, double *rowtot)
{
    __shared__ double sh[THREADS];
    const int i = s + blockIdx.x, lo = max(s, i - band), len = i - lo + 1;
    const float *row = A + (size_t)i * lda;
    double pre = 0; // the part of the row left of the band
    for (int j = s + threadIdx.x; j < lo; j += blockDim.x) pre += row[j];
    pre = block_sum_d(pre, sh);
    int per = (len + blockDim.x - 1) / blockDim.x, k0 = threadIdx.x * per, k1 = min(len, k0 + per);
    double mine = 0;
    for (int k = k0; k < k1; k++) mine += row[lo + k];
    double total, acc = pre + block_exclusive_scan(mine, sh, &total);
    double *out = v + (size_t)blockIdx.x * (band + 1);
    for (int k = k0; k < k1; k++) {
        acc += row[lo + k];
        out[i - (lo + k)] = acc;
    }
    if (threadIdx.x == 0) rowtot[blockIdx.x] = pre + total;
}

// SAT phase 3, one thread per column j: S(i, j) = P(j - 1) + sum over
// i' in [j, i] of R(i', j), walking down the column's band in place
__global__ void sat_cols_kernel(int s, int e, int band, const double *P, double *v)
{
    const int j = s + blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= e) return;
    double acc = j > s ? P[j - s] : 0.0; // P[k] = rows s .. s + k - 1
    for (int d = 0; d <= band && j + d < e; d++) {
        double *cell = v + (size_t)(j + d - s) * (band + 1) + d;
        acc += *cell;
        *cell = acc;
    }
}

__global__ void totals_prefix_kernel(int n, const double *rowtot, double *P)
{
    __shared__ double sh[THREADS];
    scan_to(rowtot, NULL, n, P, sh);
}

__device__ __forceinline__ double sat_at(const double *v, int s, int band, int i, int j)
{
    if (i < s || j < s) return 0.0;
    if (j > i) j = i;
    return v[(size_t)(i - s) * (band + 1) + (i - j)];
}

// grid (rows of the run), threads over lengths
__global__ void codes_kernel(const double *v, int s, int e, int band, const double *px, const double *ps, int min_len, int W,
                             double tau, double beta, int sink, uint8_t *codes)
{
    const int b = s + blockIdx.x;
    for (int w = threadIdx.x; w < W; w += blockDim.x) {
        const int len = min_len + w, a = b - len + 1;
        uint8_t c = 255;
        if (a >= s) {
            double in = sat_at(v, s, band, b, b) - sat_at(v, s, band, b, a - 1);
            double ex = a < sink ? 0.0 : fmax(0.0, px[b + 1 - s] - px[a - s] - in);
            double sm = ps[b + 1 - s] - ps[a - s];
            c = sm > beta * len ? 2 : in >= tau * ex ? 0 : 1;
        }
        codes[(size_t)(b - s) * W + w] = c;
    }
}

// rows i in [a, b]: the mass on columns [a, i], from the run's table
__global__ void inner_kernel(const double *v, int s, int band, int a, int b, double *out)
{
    const int i = a + blockIdx.x * blockDim.x + threadIdx.x;
    if (i > b) return;
    out[i - a] = (sat_at(v, s, band, i, i) - sat_at(v, s, band, i - 1, i - 1)) -
                 (sat_at(v, s, band, i, a - 1) - sat_at(v, s, band, i - 1, a - 1));
}

// the device half of kernels/annot_dev.h: buffers grown per run, the
// current run's table kept for inner()
struct dev_annot {
    cp_backend *be;
    const float *A;
    size_t lda;
    int T;
    const uint8_t *sens;
    int s, e, band, have;
    double *tot, *sk, *se, *px, *ps, *v, *scratch, *inner;
    uint8_t *codes;
    size_t rows_cap, v_cap, codes_cap;
};

void dev_annot_free_buffers(dev_annot *d)
{
    void *p[] = { d->tot, d->sk, d->se, d->px, d->ps, d->v, d->scratch, d->inner, d->codes };
    for (void *x : p)
        if (x) cudaFree(x);
    d->tot = d->sk = d->se = d->px = d->ps = d->v = d->scratch = d->inner = NULL;
    d->codes = NULL;
    d->rows_cap = d->v_cap = d->codes_cap = 0;
}

cp_status dev_sync(dev_annot *d, cp_error *err) { return d->be->sync(d->be, err); }

cp_status dev_run(void *ctx, int s, int e, const cp_annot_params *p, double *tot, double *sink_mass, double *sens_mass,
                  uint8_t *codes, cp_error *err)
{
    dev_annot *d = static_cast<dev_annot *>(ctx);
    const int n = e - s, band = p->max_len < n ? p->max_len : n, W = band - p->min_len + 1;
    if (s < 0 || e > d->T || W < 1) return cp_fail(err, CP_EINVAL, "device annotator: run [%d, %d) of %d tokens is too short", s, e, d->T);
    const size_t rows = (size_t)n + 1, vsz = (size_t)n * (band + 1), csz = (size_t)n * W;
    cudaError_t ce = cudaSuccess;
    if (rows > d->rows_cap || vsz > d->v_cap || csz > d->codes_cap) {
        dev_annot_free_buffers(d);
        double **r[] = { &d->tot, &d->sk, &d->se, &d->px, &d->ps, &d->inner };
        for (double **x : r)
            if (ce == cudaSuccess) ce = cudaMalloc(x, rows * sizeof(double));
        if (ce == cudaSuccess) ce = cudaMalloc(&d->scratch, 2 * rows * sizeof(double));
        if (ce == cudaSuccess) ce = cudaMalloc(&d->v, vsz * sizeof(double));
        if (ce == cudaSuccess) ce = cudaMalloc(&d->codes, csz);
        if (ce != cudaSuccess) {
            dev_annot_free_buffers(d);
            return cp_fail(err, CP_ENOMEM, "device annotator: %s", cudaGetErrorString(ce));
        }
        d->rows_cap = rows, d->v_cap = vsz, d->codes_cap = csz;
    }
    cp_cuda_annot_row_sums(d->be, d->A, d->lda, s, e, p->sink, d->sens, d->tot, d->sk, d->se);
    cp_cuda_annot_prefix(d->be, n, d->tot, d->sk, d->se, d->px, d->ps);
    cp_cuda_sat_build(d->be, d->A, d->lda, s, e, band, d->v, d->scratch);
    cp_cuda_annot_codes(d->be, d->v, s, e, band, d->px, d->ps, p->min_len, p->max_len, p->tau, p->beta, p->sink, d->codes);
    cp_status rc = dev_sync(d, err);
    cudaStream_t st = impl_of(d->be)->stream;
    struct { void *dst; const void *src; size_t bytes; } dl[] = { { tot, d->tot, (size_t)n * 8 }, { sink_mass, d->sk, (size_t)n * 8 },
                                                                   { sens_mass, d->se, (size_t)n * 8 }, { codes, d->codes, csz } };
    for (auto &x : dl)
        if (rc == CP_OK && (ce = cudaMemcpyAsync(x.dst, x.src, x.bytes, cudaMemcpyDeviceToHost, st)) != cudaSuccess)
            rc = cp_fail(err, CP_EDEVICE, "device annotator: download: %s", cudaGetErrorString(ce));
    if (rc == CP_OK && (ce = cudaStreamSynchronize(st)) != cudaSuccess)
        rc = cp_fail(err, CP_EDEVICE, "device annotator: %s", cudaGetErrorString(ce));
    d->s = s, d->e = e, d->band = band, d->have = rc == CP_OK;
    return rc;
}

cp_status dev_inner(void *ctx, int a, int b, double *out, cp_error *err)
{
    dev_annot *d = static_cast<dev_annot *>(ctx);
    if (!d->have || a < d->s || b >= d->e || b < a || b - a + 1 > d->band)
        return cp_fail(err, CP_EINVAL, "device annotator: rows [%d, %d] are outside the current run", a, b);
    const int n = b - a + 1;
    inner_kernel<<<(n + THREADS - 1) / THREADS, THREADS, 0, impl_of(d->be)->stream>>>(d->v, d->s, d->band, a, b, d->inner);
    cp_cuda_note(d->be, cudaGetLastError(), "annotator inner launch");
    cp_status rc = dev_sync(d, err);
    return rc ? rc : d->be->download(d->be, out, d->inner, (size_t)n * sizeof(double), err);
}

} // namespace

extern "C" cp_status cp_cuda_annot_dev_open(cp_backend *be, const float *A, size_t lda, int T, const uint8_t *sens, cp_annot_dev *out,
                                            cp_error *err)
{
    if (T < 0 || lda < (size_t)T) return cp_fail(err, CP_EINVAL, "device annotator: %d tokens with row stride %zu", T, lda);
    dev_annot *d = static_cast<dev_annot *>(calloc(1, sizeof(dev_annot)));
    if (!d) return cp_fail(err, CP_ENOMEM, "device annotator: out of memory");
    d->be = be, d->A = A, d->lda = lda, d->T = T, d->sens = sens;
    out->ctx = d, out->run = dev_run, out->inner = dev_inner;
    return CP_OK;
}

extern "C" void cp_cuda_annot_dev_close(cp_annot_dev *o)
{
    dev_annot *d = static_cast<dev_annot *>(o->ctx);
    if (d) {
        cudaStreamSynchronize(impl_of(d->be)->stream);
        dev_annot_free_buffers(d);
        free(d);
    }
    o->ctx = NULL;
}

extern "C" void cp_cuda_annot_row_sums(cp_backend *be, const float *A, size_t lda, int s, int e, int sink, const uint8_t *sens,
                                       double *tot, double *sink_mass, double *sens_mass)
{
    if (e <= s) return;
    row_sums_kernel<<<e - s, THREADS, 0, impl_of(be)->stream>>>(A, lda, s, sink, sens, tot, sink_mass, sens_mass);
    cp_cuda_note(be, cudaGetLastError(), "annotator row sums launch");
}

extern "C" void cp_cuda_annot_prefix(cp_backend *be, int n, const double *tot, const double *sink_mass, const double *sens_mass,
                                     double *px, double *ps)
{
    if (n < 0) return;
    prefix_kernel<<<1, THREADS, 0, impl_of(be)->stream>>>(n, tot, sink_mass, sens_mass, px, ps);
    cp_cuda_note(be, cudaGetLastError(), "annotator prefix launch");
}

extern "C" void cp_cuda_sat_build(cp_backend *be, const float *A, size_t lda, int s, int e, int band, double *v, double *scratch)
{
    if (e <= s || band < 0) return;
    cudaStream_t st = impl_of(be)->stream;
    int n = e - s;
    nvtxRangePushA("SAT");
    double *rowtot = scratch, *P = scratch + n; // P needs n + 1: its last value is never read, so n suffice past rowtot
    sat_rows_kernel<<<n, THREADS, 0, st>>>(A, lda, s, band, v, rowtot);
    cp_cuda_note(be, cudaGetLastError(), "SAT rows launch");
    totals_prefix_kernel<<<1, THREADS, 0, st>>>(n - 1, rowtot, P); // P[k], k < n: rows s .. s + k - 1
    cp_cuda_note(be, cudaGetLastError(), "SAT totals launch");
    sat_cols_kernel<<<(n + THREADS - 1) / THREADS, THREADS, 0, st>>>(s, e, band, P, v);
    cp_cuda_note(be, cudaGetLastError(), "SAT columns launch");
    nvtxRangePop();
}

extern "C" void cp_cuda_annot_codes(cp_backend *be, const double *v, int s, int e, int band, const double *px, const double *ps,
                                    int min_len, int max_len, double tau, double beta, int sink, uint8_t *codes)
{
    int top = max_len < e - s ? max_len : e - s, W = top - min_len + 1;
    if (e <= s || W < 1) return;
    nvtxRangePushA("selection");
    codes_kernel<<<e - s, W < THREADS ? ((W + 31) / 32) * 32 : THREADS, 0, impl_of(be)->stream>>>(v, s, e, band, px, ps, min_len, W,
                                                                                                  tau, beta, sink, codes);
    cp_cuda_note(be, cudaGetLastError(), "annotator codes launch");
    nvtxRangePop();
}
