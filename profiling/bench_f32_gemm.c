/* The f32 GEMM providers side by side at the 0.5B shape's MLP products
 * (profiling/bench_f32_gemm.sh runs it once per OpenBLAS kernel set,
 * interleaved): OpenBLAS sgemm / sgemv with whatever kernel set this
 * process loaded (OPENBLAS_CORETYPE, or what the CPU runtime chose from
 * cpuid), and oneDNN's f32 GEMM (dnnl_sgemm, its own cpuid dispatch), at
 * a prefill's rows and at decode's one row.  Rates are per second of the
 * process's CPU time, best of --reps: on a shared, busy machine wall time
 * measures the other work as much as the kernel, while the CPU time the
 * kernel itself took does not (OpenMP waits are passive, so waiting
 * threads add none); with one thread (OMP_NUM_THREADS=1) it is the
 * kernel's own speed.
 *
 *   build/bench_f32_gemm [--rows N (512)] [--reps R (7)] */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/backend.h"
#include "bench_args.h"

char *openblas_get_corename(void);

static float *buf(size_t n, unsigned seed)
{
    float *p = malloc(n * sizeof *p);
    if (!p) { fprintf(stderr, "bench_f32_gemm: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) p[i] = (float)((seed = seed * 1103515245u + 12345u) >> 9) / 8388608.0f - 0.5f;
    return p;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* GFLOP per CPU-second of the best of reps runs of y[M,N] = x[M,K] . W[N,K]^T */
static double run(int dnnl, int M, int N, int K, int reps)
{
    float *x = buf((size_t)M * K, 1), *w = buf((size_t)N * K, 2), *y = buf((size_t)M * N, 3);
    double best = 1e30;
    for (int r = 0; r <= reps; r++) { /* the first warms up (oneDNN makes its kernel) */
        double t = cpu_now();
        if (dnnl) {
            if (dnnl_sgemm('N', 'T', M, N, K, 1, x, K, w, K, 0, y, N) != dnnl_success) { best = 1e30; break; }
        } else if (M == 1) cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1, w, K, x, 1, 0, y, 1);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, x, K, w, K, 0, y, N);
        t = cpu_now() - t;
        if (r > 0 && t < best) best = t;
    }
    free(x), free(w), free(y);
    return best < 1e29 ? 2.0 * M * N * K / best / 1e9 : 0;
}

int main(int argc, char **argv)
{
    int rows = 512, reps = 7;
    static const char usage[] = "usage: bench_f32_gemm [--rows N] [--reps R]\n";
    const int args = bench_args_check(argc, argv);
    if (args) return bench_usage(args, usage);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--rows") == 0) rows = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
        else return bench_usage(2, usage);
    }
    if (rows < 1 || reps < 1) return bench_usage(2, usage);
    /* the backend's compute line names the kernel set and who chose it */
    cp_backend *be = NULL;
    cp_error err = { 0 };
    char line[1024] = "";
    if (cp_backend_cpu_create(&be, &err) == CP_OK) cp_cpu_compute_line(be, 1, line, sizeof line, &err), be->destroy(be);
    const int N = 4864, K = 896; /* qwen2.5-0.5b: gate/up */
    double bp = run(0, rows, N, K, reps), dp = run(1, rows, N, K, reps), bd = run(0, 1, N, K, reps * 4), dd = run(1, 1, N, K, reps * 4);
    printf("f32 GEMM %d threads, OpenBLAS %s: prefill %d x %d x %d GFLOP/CPU-s OpenBLAS %.1f oneDNN %.1f; decode 1 row OpenBLAS %.1f oneDNN %.1f\n",
           omp_get_max_threads(), openblas_get_corename(), rows, N, K, bp, dp, bd, dd);
    printf("%s\n", line);
    return 0;
}
