// CUDA kernel microbenchmarks in the llm.c dev/cuda manner: ceilings measured
// first in the same run (a device-to-device copy; a large cuBLASLt bf16 GEMM),
// then each op of the backend table on real model shapes (Qwen2.5-7B at 4k /
// 8k tokens), timed with CUDA events on the backend's stream after warm-up,
// with the L2 flushed before every repetition, median of the repetitions,
// reported as GB/s or TFLOP/s and as a fraction of the ceiling.  Each op's
// output is spot-checked against a host computation (the full parity tests
// are gpu_check's).  Last, an end-to-end prefill of 8k tokens and decode steps
// on a synthetic qwen2.5-7b (random bf16 weights made on the device) against
// their FLOP and weight-streaming floors.  Prints "SKIP" without a device.
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <time.h>
#include <vector>

#include "../kernels/cuda/annot_cuda.h"
#include "../kernels/cuda/cuda_impl.cuh"
extern "C" {
#include "../model/model.h"
}

namespace {

#define CK(x)                                                                                                                  \
    do {                                                                                                                   \
        cudaError_t e_ = (x);                                                                                              \
        if (e_ != cudaSuccess) {                                                                                           \
            fprintf(stderr, "bench_cuda: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);                       \
            exit(1);                                                                                                       \
        }                                                                                                                  \
    } while (0)

cp_backend *be;
cudaStream_t st;
void *flush_buf;
const size_t flush_bytes = (size_t)256 << 20; // > the H200's 60 MB L2

__device__ __forceinline__ void put(float *p, float v) { *p = v; }
__device__ __forceinline__ void put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }

// uniform in [-scale, scale) from a hash of the index: fresh data, no zeros
template <class T> __global__ void fill_kernel(T *p, size_t n, float scale, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        put(p + i, scale * ((h & 0xffffff) / 8388608.0f - 1.0f));
    }
}

template <class T> T *dev_random(size_t n, float scale, uint32_t seed)
{
    T *p;
    CK(cudaMalloc(&p, n * sizeof(T)));
    fill_kernel<<<1024, 256, 0, st>>>(p, n, scale, seed);
    CK(cudaGetLastError());
    return p;
}
float *dev_f32(size_t n, float scale, uint32_t seed) { return dev_random<float>(n, scale, seed); }
__nv_bfloat16 *dev_bf16(size_t n, float scale, uint32_t seed) { return dev_random<__nv_bfloat16>(n, scale, seed); }

// median milliseconds of fn over reps, L2 flushed before each
template <class F> double time_ms(F fn, int reps = 20)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    fn(), fn(); // warm-up: plans, lazy module loads
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaMemsetAsync(flush_buf, r, flush_bytes, st));
        CK(cudaEventRecord(a, st));
        fn();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    cp_error err;
    if (be->sync(be, &err) != CP_OK) {
        fprintf(stderr, "bench_cuda: %s\n", err.msg);
        exit(1);
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

void row(const char *name, const char *shape, double ms, double amount, const char *unit, double ceiling, const char *check)
{
    double rate = amount / (ms * 1e-3) / (unit[0] == 'T' ? 1e12 : 1e9);
    printf("%-24s %-30s %9.3f ms %9.1f %-7s %5.0f%%  %s\n", name, shape, ms, rate, unit, 100 * rate / ceiling, check);
}

float host_f(const float *d, size_t i)
{
    float v;
    CK(cudaMemcpy(&v, d + i, 4, cudaMemcpyDeviceToHost));
    return v;
}
float host_bf(const __nv_bfloat16 *d, size_t i)
{
    __nv_bfloat16 v;
    CK(cudaMemcpy(&v, d + i, 2, cudaMemcpyDeviceToHost));
    return __bfloat162float(v);
}

double gemm_peak(void)
{
    // bf16 in and out, f32 compute: the library's best on this card
    const int N = 8192;
    cuda_impl *im = impl_of(be);
    __nv_bfloat16 *A = dev_bf16((size_t)N * N, 1, 1), *B = dev_bf16((size_t)N * N, 1, 2), *C;
    CK(cudaMalloc(&C, (size_t)N * N * 2));
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, N, N, N);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, N, N, N);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, N, N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &im->workspace_bytes, sizeof(size_t));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(im->lt, op, la, lb, lc, lc, pref, 1, &h, &found);
    float alpha = 1, beta = 0;
    double ms = found ? time_ms([&] {
        cublasLtMatmul(im->lt, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &h.algo, im->workspace, im->workspace_bytes, st);
    }, 10) : 1e30;
    double tf = 2.0 * N * N * (double)N / (ms * 1e-3) / 1e12;
    printf("%-24s %-30s %9.3f ms %9.1f TFLOP/s  (ceiling)\n", "cuBLASLt bf16 GEMM", "8192^3", ms, tf);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(op);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
    cudaFree(A), cudaFree(B), cudaFree(C);
    return tf;
}

// the 7B shapes
const int H = 3584, I = 18944, NH = 28, NKV = 4, HD = 128, VOCAB = 152064;

void bench_small_ops(double gbs)
{
    const int n = 4096;
    float *x = dev_f32((size_t)n * I, 2, 3), *y = dev_f32((size_t)n * I, 2, 4), *w = dev_f32(H, 1, 5), *o = dev_f32((size_t)n * I, 0, 6);
    char ok[64];
    // rmsnorm: read x and w, write out
    double ms = time_ms([&] { be->rmsnorm(be, o, x, w, n, H, 1e-6f); });
    {
        std::vector<float> xr(H), wr(H);
        CK(cudaMemcpy(xr.data(), x + (size_t)7 * H, H * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(wr.data(), w, H * 4, cudaMemcpyDeviceToHost));
        double ss = 0;
        for (int j = 0; j < H; j++) ss += (double)xr[j] * xr[j];
        double want = xr[5] / sqrt(ss / H + 1e-6) * wr[5], got = host_f(o, (size_t)7 * H + 5);
        snprintf(ok, sizeof ok, "spot err %.1e", fabs(got - want) / fabs(want));
    }
    row("rmsnorm", "4096 x 3584", ms, 2.0 * n * H * 4, "GB/s", gbs, ok);
    // rope on q
    float *c = dev_f32((size_t)n * HD / 2, 1, 7), *s = dev_f32((size_t)n * HD / 2, 1, 8);
    ms = time_ms([&] { be->rope(be, x, NH * HD, c, s, n, NH, HD); });
    row("rope (q)", "4096 x 28 x 128", ms, 2.0 * n * NH * HD * 4 + 2.0 * n * HD / 2 * 4, "GB/s", gbs, "");
    ms = time_ms([&] { be->swiglu(be, o, x, y, (size_t)n * I); });
    row("swiglu", "4096 x 18944", ms, 3.0 * n * I * 4, "GB/s", gbs, "");
    __nv_bfloat16 *table = dev_bf16((size_t)VOCAB * H, 1, 9);
    std::vector<int32_t> ids(n);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919u) % VOCAB);
    int32_t *dids;
    CK(cudaMalloc(&dids, n * 4));
    CK(cudaMemcpy(dids, ids.data(), n * 4, cudaMemcpyHostToDevice));
    const cp_matrix tm = cp_matrix_rows(table, CP_BF16, VOCAB, H);
    ms = time_ms([&] { be->embed(be, o, &tm, dids, n, H); });
    snprintf(ok, sizeof ok, "spot %s", host_f(o, (size_t)3 * H + 11) == host_bf(table, (size_t)ids[3] * H + 11) ? "exact" : "WRONG");
    row("embed (bf16 table)", "4096 x 3584", ms, (double)n * H * 6, "GB/s", gbs, ok);
    // sampling over the vocabulary
    ms = time_ms([&] { be->sample(be, o, VOCAB, 0, 1, 0); });
    row("sample argmax", "152064", ms, VOCAB * 4.0, "GB/s", gbs, "(one block: latency)");
    ms = time_ms([&] { be->sample(be, o, VOCAB, 0.8f, 0.9f, 0.3f); });
    row("sample top-p 0.9", "152064", ms, VOCAB * 4.0 * 62, "GB/s", gbs, "(60 bisection passes)");
    cudaFree(x), cudaFree(y), cudaFree(w), cudaFree(o), cudaFree(c), cudaFree(s), cudaFree(table), cudaFree(dids);
}

void bench_gemms(double peak)
{
    const int n = 4096;
    struct { const char *name; int in, out; } shapes[] = {
        { "q_proj / o_proj", H, H }, { "k_proj / v_proj", H, NKV * HD }, { "gate / up", H, I }, { "down", I, H },
    };
    float *x = dev_f32((size_t)n * I, 1, 11), *y = dev_f32((size_t)n * I, 0, 12);
    __nv_bfloat16 *w = dev_bf16((size_t)I * H, 0.02f, 13);
    for (auto &sh : shapes) {
        const cp_matrix wm = cp_matrix_rows(w, CP_BF16, sh.out, sh.in);
        double ms = time_ms([&] { be->matmul(be, y, sh.out, x, &wm, NULL, n, sh.in, sh.out, 0); });
        // spot check one element against the host (bf16 operands, double sum)
        std::vector<float> xr(sh.in);
        std::vector<__nv_bfloat16> wr(sh.in);
        int i = 1234 % n, j = 777 % sh.out;
        CK(cudaMemcpy(xr.data(), x + (size_t)i * sh.in, sh.in * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(wr.data(), w + (size_t)j * sh.in, sh.in * 2, cudaMemcpyDeviceToHost));
        double want = 0;
        for (int k = 0; k < sh.in; k++) want += (double)__bfloat162float(__float2bfloat16(xr[k])) * __bfloat162float(wr[k]);
        char ok[64], shape[64];
        snprintf(ok, sizeof ok, "spot err %.1e", fabs(host_f(y, (size_t)i * sh.out + j) - want) / (fabs(want) + 1e-3));
        snprintf(shape, sizeof shape, "4096 x %d -> %d", sh.in, sh.out);
        row(sh.name, shape, ms, 2.0 * n * sh.in * sh.out, "TFLOP/s", peak, ok);
    }
    cudaFree(x), cudaFree(y), cudaFree(w);
}

// attention over a causal prompt of T tokens (or one decode query), 7B heads
double bench_attention(int n, int keys, int with_export, double ceiling, int quiet)
{
    size_t qn = (size_t)n * NH * HD, kn = (size_t)keys * NKV * HD;
    float *q = dev_f32(qn, 1, 21), *k = dev_f32(kn, 1, 22), *v = dev_f32(kn, 1, 23), *o = dev_f32(qn, 0, 24);
    std::vector<int32_t> qp(n), kp(keys);
    for (int j = 0; j < keys; j++) kp[j] = j;
    for (int i = 0; i < n; i++) qp[i] = keys - n + i;
    int32_t *dq, *dk;
    CK(cudaMalloc(&dq, n * 4));
    CK(cudaMalloc(&dk, keys * 4));
    CK(cudaMemcpy(dq, qp.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, kp.data(), keys * 4, cudaMemcpyHostToDevice));
    float *ex = NULL, *sm = NULL;
    uint8_t *sens = NULL;
    cp_attn_args a = { q, k, v, dq, dk, o, n, keys, NH, NKV, HD, 0, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL };
    if (with_export) {
        CK(cudaMalloc(&ex, (size_t)n * keys * 4));
        CK(cudaMalloc(&sm, (size_t)n * 4));
        CK(cudaMalloc(&sens, keys));
        CK(cudaMemset(ex, 0, (size_t)n * keys * 4));
        CK(cudaMemset(sm, 0, (size_t)n * 4));
        CK(cudaMemset(sens, 0, keys));
        a.export_a = ex, a.export_ld = keys, a.export_weight = 1.0f / NH, a.sens_cols = sens, a.sens_mass = sm;
    }
    double ms = time_ms([&] { be->attention(be, &a); }, n == 1 ? 50 : 5);
    // spot check: the last query row of head 5 on the host
    int i = n - 1, h = 5, g = h / (NH / NKV);
    std::vector<float> qr(HD), kr((size_t)keys * NKV * HD), vr((size_t)keys * NKV * HD);
    CK(cudaMemcpy(qr.data(), q + (size_t)i * NH * HD + h * HD, HD * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(kr.data(), k, kn * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vr.data(), v, kn * 4, cudaMemcpyDeviceToHost));
    std::vector<double> p(keys);
    double mx = -1e300, sum = 0;
    for (int j = 0; j < keys; j++) {
        if (kp[j] > qp[i]) { p[j] = -1e300; continue; }
        double d = 0;
        for (int t = 0; t < HD; t++) d += (double)qr[t] * kr[(size_t)j * NKV * HD + g * HD + t];
        p[j] = d / sqrt((double)HD), mx = std::max(mx, p[j]);
    }
    double want = 0;
    for (int j = 0; j < keys; j++) sum += p[j] > -1e299 ? exp(p[j] - mx) : 0;
    for (int j = 0; j < keys; j++) want += (p[j] > -1e299 ? exp(p[j] - mx) : 0) / sum * vr[(size_t)j * NKV * HD + g * HD + 9];
    char ok[64], shape[64];
    snprintf(ok, sizeof ok, "spot err %.1e", fabs(host_f(o, (size_t)i * NH * HD + h * HD + 9) - want) / (fabs(want) + 1e-3));
    if (!quiet) {
        if (n == 1) {
            snprintf(shape, sizeof shape, "decode, %d keys, 28/4 x 128", keys);
            row("attention decode", shape, ms, 2.0 * kn * 4, "GB/s", ceiling, ok);
        } else {
            snprintf(shape, sizeof shape, "%d causal, 28/4 x 128%s", n, with_export ? " +export" : "");
            row(with_export ? "attention + export" : "attention prefill", shape, ms, 4.0 * HD * NH * ((double)n * (n + 1) / 2),
                "TFLOP/s", ceiling, ok);
        }
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(dq), cudaFree(dk), cudaFree(ex), cudaFree(sm), cudaFree(sens);
    return ms;
}

// the annotator at 8k tokens: row sums, SAT (band 2048), validity codes of
// every candidate segment (lengths 32..2048)
void bench_annot(double gbs, double prefill_ms)
{
    const int T = 8192, band = 2048, min_len = 32;
    float *A = dev_f32((size_t)T * T, 1.0f / T, 31); // values only matter for validity, not for time
    double *tot, *sk, *se, *px, *ps, *v, *scratch;
    uint8_t *codes;
    const int W = band - min_len + 1;
    CK(cudaMalloc(&tot, T * 8));
    CK(cudaMalloc(&sk, T * 8));
    CK(cudaMalloc(&se, T * 8));
    CK(cudaMalloc(&px, (T + 1) * 8));
    CK(cudaMalloc(&ps, (T + 1) * 8));
    CK(cudaMalloc(&v, (size_t)T * (band + 1) * 8));
    CK(cudaMalloc(&scratch, 2 * T * 8));
    CK(cudaMalloc(&codes, (size_t)T * W));
    double ms_rows = time_ms([&] { cp_cuda_annot_row_sums(be, A, T, 0, T, 1, NULL, tot, sk, se); }, 5);
    row("annot row sums", "8192 rows (lower triangle)", ms_rows, (double)T * T / 2 * 4, "GB/s", gbs, "");
    double ms_sat = time_ms([&] { cp_cuda_sat_build(be, A, T, 0, T, band, v, scratch); }, 5);
    // the lower triangle read once, the band written, then read and written again by the column pass
    double sat_bytes = (double)T * T / 2 * 4 + 3.0 * T * (band + 1) * 8;
    row("SAT build", "8192, band 2048", ms_sat, sat_bytes, "GB/s", gbs, "(target >= 50% of copy)");
    cp_cuda_annot_prefix(be, T, tot, sk, se, px, ps);
    double ms_codes = time_ms([&] { cp_cuda_annot_codes(be, v, 0, T, band, px, ps, min_len, band, 1.0, 0.02, 1, codes); }, 5);
    char note[96];
    snprintf(note, sizeof note, "annotate %.1f%% of an 8k 7B prefill (target <= 5%%)",
             100 * (ms_rows + ms_sat + ms_codes) / (prefill_ms > 0 ? prefill_ms : 1e30));
    row("validity codes", "8192 x 2017 segments", ms_codes, (double)T * W, "GB/s", gbs, note);
    cudaFree(A), cudaFree(tot), cudaFree(sk), cudaFree(se), cudaFree(px), cudaFree(ps), cudaFree(v), cudaFree(scratch), cudaFree(codes);
}

// a qwen2.5-7b with random bf16 weights made on the device
struct synth_7b {
    cp_model m;
    std::vector<cp_tensor_ref> refs;
    size_t params;
};

void synth_7b_make(synth_7b &w)
{
    memset(&w.m, 0, sizeof w.m);
    cp_config *c = &w.m.cfg;
    c->arch = CP_ARCH_QWEN2, c->arch_name = "Qwen2ForCausalLM", c->hidden = H, c->intermediate = I, c->n_layers = 28;
    c->n_heads = NH, c->n_kv_heads = NKV, c->head_dim = HD, c->vocab = VOCAB, c->max_pos = 32768, c->rms_eps = 1e-6f;
    c->rope_theta = 1e6, c->qkv_bias = 1, c->bos_id = -1;
    w.m.be = be;
    w.m.layers = (cp_layer_weights *)calloc(c->n_layers, sizeof *w.m.layers);
    w.m.rope_inv_freq = (double *)malloc(HD / 2 * sizeof(double));
    for (int k = 0; k < HD / 2; k++) w.m.rope_inv_freq[k] = pow(c->rope_theta, -2.0 * k / HD);
    size_t n_refs = cp_model_tensor_refs(&w.m, NULL, 0);
    w.refs.resize(n_refs);
    cp_model_tensor_refs(&w.m, w.refs.data(), n_refs);
    w.params = 0;
    for (size_t i = 0; i < n_refs; i++) {
        size_t elems = (size_t)w.refs[i].rows * w.refs[i].cols;
        w.params += elems;
        if (w.refs[i].matrix) *w.refs[i].slot = dev_bf16(elems, 1.0f / sqrtf((float)w.refs[i].cols), 100 + (uint32_t)i);
        else *w.refs[i].slot = dev_f32(elems, 0.1f, 100 + (uint32_t)i); // norms near 0.1 keep activations bounded
    }
}

void synth_7b_free(synth_7b &w)
{
    for (auto &r : w.refs) be->free(be, *r.slot);
    free(w.m.layers), free(w.m.rope_inv_freq);
}

// prefill of 8192 tokens, then decode steps, against their floors
double bench_e2e(synth_7b &w, cp_state *s, double peak, double gbs)
{
    cp_model &m = w.m;
    const int T = 8192;
    cp_error err;
    std::vector<int32_t> ids(T);
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 7919u + 13) % VOCAB);
    std::vector<float> logits(VOCAB);
    cp_status rc = CP_OK;
    double ms = time_ms([&] {
        cp_state_reset(&m, s, &err);
        if (rc == CP_OK) rc = cp_forward(&m, s, ids.data(), NULL, T, CP_LOGITS_LAST, logits.data(), NULL, &err);
    }, 3);
    if (rc != CP_OK) printf("e2e: %s\n", err.msg);
    double lin = 2.0 * (double)(w.params - (size_t)VOCAB * H) * T, attn = 28 * 4.0 * HD * NH * ((double)T * (T + 1) / 2);
    double floor_ms = (lin + attn) / (peak * 1e12) * 1e3;
    char note[96];
    snprintf(note, sizeof note, "floor %.0f ms at the GEMM ceiling (%.0f%% attention)", floor_ms, 100 * attn / (lin + attn));
    row("e2e prefill 7B", "8192 tokens, 28 layers", ms, lin + attn, "TFLOP/s", peak, note);
    int32_t next = 1;
    double dms = time_ms([&] {
        if (rc == CP_OK) rc = cp_forward(&m, s, &next, NULL, 1, CP_LOGITS_LAST, logits.data(), NULL, &err);
    }, 8);
    snprintf(note, sizeof note, "floor %.2f ms (weights once at the copy rate)", w.params * 2.0 / (gbs * 1e9) * 1e3);
    row("e2e decode 7B", "1 token after 8k", dms, w.params * 2.0, "GB/s", gbs, note);
    return rc == CP_OK ? ms : 0;
}

struct plan {
    std::string marks;
    std::vector<int32_t> ids;
};

// "CPPLANS 1 <count>" then "<n> <marks>" and n ids per request (gpu_pack --plans)
bool read_plans(const char *path, std::vector<plan> &out)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    int count = 0, ok = fscanf(f, "CPPLANS 1 %d", &count) == 1 && count > 0 && count < 100000;
    for (int r = 0; ok && r < count; r++) {
        int n = 0;
        ok = fscanf(f, "%d", &n) == 1 && n > 0 && n < (1 << 20);
        plan p;
        std::vector<char> marks(ok ? n + 1 : 1);
        ok = ok && fscanf(f, " %s", marks.data()) == 1 && (int)strlen(marks.data()) == n;
        p.marks = ok ? marks.data() : "";
        p.ids.resize(ok ? n : 0);
        for (int i = 0; ok && i < n; i++) ok = fscanf(f, "%d", &p.ids[i]) == 1 && p.ids[i] >= 0 && p.ids[i] < VOCAB;
        if (ok) out.push_back(p);
    }
    fclose(f);
    return ok;
}

double now_ms_host()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// One request of a plan, as cp_engine_replay serves it: reused tokens get
// placeholder KV placed in 16-row runs (the speed is real, the KV is not),
// the others are computed, the first token's logits come back.  Wall-clock
// milliseconds.
double replay_one(cp_model &m, cp_state *s, const plan &p, std::vector<float> &logits, cp_status &rc, cp_error &err)
{
    const int n = (int)p.ids.size();
    std::vector<uint8_t> reused(n);
    std::vector<int32_t> slots, toks;
    for (int i = 0; i < n; i++) {
        reused[i] = p.marks[i] == 'R' && i < n - 1;
        if (!reused[i]) slots.push_back(i), toks.push_back(p.ids[i]);
    }
    double t0 = now_ms_host();
    rc = cp_state_reset(&m, s, &err);
    if (rc == CP_OK) rc = cp_state_place_placeholder(&m, s, reused.data(), n, 16, &err);
    if (rc == CP_OK)
        rc = cp_forward_at(&m, s, toks.data(), slots.data(), slots.data(), (int)slots.size(), n, CP_LOGITS_LAST, logits.data(), NULL,
                           &err);
    return now_ms_host() - t0;
}

// rag-v1 plans from cp-books-6m replayed on the 7B (the TTFT target)
void bench_replay(synth_7b &w, cp_state *s, const char *dir)
{
    static const char *names[] = { "none", "in-context", "canonical" };
    std::vector<float> logits(VOCAB);
    double base = 0;
    for (int k = 0; k < 3; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/rag-v1-last40-%s.plans", dir, names[k]);
        std::vector<plan> plans;
        if (!read_plans(path, plans) || plans.empty()) {
            printf("%-24s %s: missing or malformed (make gpu-carry)\n", "replay rag-v1 7B", path);
            continue;
        }
        cp_status rc = CP_OK;
        cp_error err;
        replay_one(w.m, s, plans[0], logits, rc, err); // warm-up
        double sum = 0;
        long computed = 0, total = 0;
        for (auto &p : plans) {
            sum += replay_one(w.m, s, p, logits, rc, err);
            for (size_t i = 0; i < p.marks.size(); i++) computed += p.marks[i] != 'R' || i + 1 == p.marks.size();
            total += (long)p.marks.size();
            if (rc != CP_OK) break;
        }
        if (rc != CP_OK) {
            printf("replay %s: %s\n", names[k], err.msg);
            continue;
        }
        double mean = sum / plans.size();
        if (k == 0) base = mean;
        char shape[64], note[96];
        snprintf(shape, sizeof shape, "%zu requests, plan %s", plans.size(), names[k]);
        snprintf(note, sizeof note, "vs none %.2fx (compute ceiling %.2fx)", base > 0 ? base / mean : 0, (double)total / computed);
        printf("%-24s %-30s %9.3f ms %26s  %s\n", "replay rag-v1 TTFT 7B", shape, mean, "", note);
    }
}

} // namespace

int main(int argc, char **argv)
{
    const char *plans_dir = argc > 1 ? argv[1] : "build/gpu_carry";
    cp_error err = {};
    if (cp_backend_cuda_create(&be, &err) != CP_OK) {
        printf("SKIP bench_cuda: %s\n", err.msg);
        return 0;
    }
    st = impl_of(be)->stream;
    CK(cudaMalloc(&flush_buf, flush_bytes));
    printf("%-24s %-30s %12s %17s %6s\n", "op", "shape", "time", "rate", "of ceil");
    // ceiling 1: device-to-device copy, counting bytes read + written
    size_t cb = (size_t)1 << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, cb));
    CK(cudaMalloc(&dst, cb));
    CK(cudaMemset(src, 1, cb));
    double ms = time_ms([&] { CK(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice, st)); }, 10);
    double gbs = 2.0 * cb / (ms * 1e-3) / 1e9;
    printf("%-24s %-30s %9.3f ms %9.1f GB/s     (ceiling)\n", "device copy", "1 GiB", ms, gbs);
    cudaFree(src), cudaFree(dst);
    double peak = gemm_peak();
    bench_small_ops(gbs);
    bench_gemms(peak);
    double plain = bench_attention(4096, 4096, 0, peak, 0);
    double with_ex = bench_attention(4096, 4096, 1, peak, 0);
    printf("%-24s %-30s %9.2fx  (target <= 1.3x)\n", "export overhead", "4096 causal", with_ex / plain);
    bench_attention(8192, 8192, 0, peak, 0);
    // variant 2: the tensor cores (bf16 inputs), same shapes
    impl_of(be)->attn_mma = 1;
    printf("-- attention variant 2 (mma bf16; compare with sdpa_bench.py's bf16 rows)\n");
    double plain2 = bench_attention(4096, 4096, 0, peak, 0);
    double with_ex2 = bench_attention(4096, 4096, 1, peak, 0);
    printf("%-24s %-30s %9.2fx  (target <= 1.3x)\n", "export overhead (v2)", "4096 causal", with_ex2 / plain2);
    bench_attention(8192, 8192, 0, peak, 0);
    impl_of(be)->attn_mma = 0;
    bench_attention(1, 8192, 0, gbs, 0);
    bench_attention(1, 32768, 0, gbs, 0);
    synth_7b w;
    synth_7b_make(w);
    cp_state *s = NULL;
    double prefill_ms = 0;
    if (cp_state_create(&w.m, 8192 + 16, 8192, &s, &err) != CP_OK) printf("e2e: %s\n", err.msg);
    else {
        prefill_ms = bench_e2e(w, s, peak, gbs);
        bench_replay(w, s, plans_dir);
        cp_state_free(&w.m, s);
    }
    synth_7b_free(w);
    bench_annot(gbs, prefill_ms);
    cudaFree(flush_buf);
    cp_backend_destroy(be);
    return 0;
}
