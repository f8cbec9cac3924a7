/* What the skinny-GEMM benchmarks (bench_gemm_rows, bench_bf16p) share:
 * an aligned allocation that exits with the program's name when memory
 * runs out, a deterministic fill, and the shape of one matrix of a layer. */
#ifndef CP_BENCH_GEMM_COMMON_H
#define CP_BENCH_GEMM_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* 64-byte aligned, rounded up to 64; exits naming prog when it fails */
static inline void *bench_xmalloc(const char *prog, size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "%s: out of memory (%zu bytes)\n", prog, bytes);
        exit(1);
    }
    return p;
}

/* n values in [-0.5, 0.5) from a 64-bit LCG: the same inputs every run */
static inline void bench_fill(float *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((seed >> 40) / 16777216.0 - 0.5);
    }
}

typedef struct bench_shape {
    const char *name;
    int out, in, per_layer; /* per_layer: times a layer runs it (0: the LM head, once a step) */
} bench_shape;

#endif
