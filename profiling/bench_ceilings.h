/* The kernel-level measurements bench_forward prints beside its model
 * runs (bench_ceilings.c): library ceilings and the backend's kernels at a
 * model's GEMM shapes.  Each allocates what it times and exits the
 * process on out of memory (a benchmark, not a library). */
#ifndef CP_BENCH_CEILINGS_H
#define CP_BENCH_CEILINGS_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/cpu/gemm_bf16.h"
#include "../kernels/cpu/gemm_i8.h"
#include "../model/model.h"

/* n uniform floats in [-0.5, 0.5) from seed (exits on out of memory) */
float *rand_buf(size_t n, uint64_t seed);
double sgemm_gflops(int M, int N, int K, int reps);
double dnnl_sgemm_gflops(int M, int N, int K, int reps);
double sgemv_gflops(int N, int K, int reps);
void bf16_gemm_gflops(int M, int N, int K, int reps, double *widened, double *onednn, const char **impl);
double gemv_gbs(int N, int K, cpu_isa isa, int bf16);
void bf16_kernel_crossover(int N, int K, cpu_isa isa);
void skinny_table(int N, int K, cpu_isa isa, q8_isa qk);
void prefill_i8_table(const cp_config *c, int T, int threads);
void packed_i8_table(int threads, int only_n, int reps);

#endif
