/* CUDA kernel microbenchmarks, each next to its CPU reference: prints one
 * row per kernel (time, bandwidth, max error vs CPU).  Exits 0 with a note
 * where there is no device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../kernels/backend.h"
#include "../kernels/cpu/ops_cpu.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

#define CHECK(x)                                                              \
    do {                                                                      \
        if ((x) != CP_OK) {                                                   \
            fprintf(stderr, "bench_cuda: %s\n", err.msg);                     \
            return 1;                                                         \
        }                                                                     \
    } while (0)

int main(void)
{
    cp_error err = { 0 };
    cp_backend *be = NULL;
    if (cp_backend_cuda_create(&be, &err) != CP_OK) {
        printf("bench_cuda: skipped: %s\n", err.msg);
        return 0;
    }
    const int n = 4096, dim = 4096, reps = 50;
    size_t bytes = (size_t)n * dim * sizeof(float);
    float *x = malloc(bytes), *w = malloc(dim * sizeof(float)), *ref = malloc(bytes), *got = malloc(bytes);
    if (!x || !w || !ref || !got) return 1;
    for (size_t i = 0; i < (size_t)n * dim; i++) x[i] = sinf((float)i * 0.001f);
    for (int j = 0; j < dim; j++) w[j] = 1.0f + 0.001f * j;
    double t = now_s();
    cpu_rmsnorm(ref, x, w, n, dim, 1e-6f);
    double t_cpu = now_s() - t;
    void *dx, *dw, *dy;
    CHECK(be->alloc(be, bytes, &dx, &err));
    CHECK(be->alloc(be, dim * sizeof(float), &dw, &err));
    CHECK(be->alloc(be, bytes, &dy, &err));
    CHECK(be->upload(be, dx, x, bytes, &err));
    CHECK(be->upload(be, dw, w, dim * sizeof(float), &err));
    be->rmsnorm(be, dy, dx, dw, n, dim, 1e-6f); /* warm-up */
    CHECK(be->sync(be, &err));
    t = now_s();
    for (int r = 0; r < reps; r++) be->rmsnorm(be, dy, dx, dw, n, dim, 1e-6f);
    CHECK(be->sync(be, &err));
    double t_gpu = (now_s() - t) / reps;
    CHECK(be->download(be, got, dy, bytes, &err));
    double maxerr = 0;
    for (size_t i = 0; i < (size_t)n * dim; i++) maxerr = fmax(maxerr, fabs(got[i] - ref[i]));
    printf("%-12s %-12s %10s %10s %12s %10s %12s\n", "kernel", "shape", "gpu us", "GB/s", "cpu us", "speedup", "max |err|");
    printf("%-12s %-12s %10.1f %10.1f %12.1f %9.1fx %12.2e\n", "rmsnorm", "4096x4096", t_gpu * 1e6,
           2.0 * bytes / t_gpu / 1e9, t_cpu * 1e6, t_cpu / t_gpu, maxerr);
    be->free(be, dx), be->free(be, dw), be->free(be, dy);
    free(x), free(w), free(ref), free(got);
    cp_backend_destroy(be);
    return maxerr < 1e-4 ? 0 : 1;
}
