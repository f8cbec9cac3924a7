/* f32 weights, f32 compute, batch-invariant: the CPU backend's matmul for
 * f32 matrices (BLAS builds) at every row count.
 *
 * Why not OpenBLAS: sgemv (one row) and sgemm (more) sum a row's products
 * in different orders, and sgemm's own order follows its blocking of the
 * call's shape, so a request's logits depended on the rows it was batched
 * with and on its prefill chunk (batch/bitwise_same_alone_and_batched_f32:
 * 8.6e-6 apart on cp-books-6m, under OPENBLAS_CORETYPE=Prescott too).
 * Here every output (i, j) is one fixed sequence of operations on x row i
 * and W row j -- gemm_bf16.c's dot kernels with f32 loads in place of the
 * widening: two chains over alternate vector steps, joined, one more
 * step, a masked (AVX-512) or scalar tail, a fixed lane reduction --
 * whatever n, the row's place in the batch or the thread that runs it.
 * The cost against sgemm on prefill-sized chunks is in docs/RESULTS.md
 * ("Batch invariance on every path"). */
#ifndef CP_GEMM_F32_H
#define CP_GEMM_F32_H

#include "gemm_bf16.h"

/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + x[i,:] . W^T, W f32
 * [out, in] row-major, x rows `in` apart; isa: generic, avx2 or one of the
 * AVX-512 ones (the kernels of the widest the CPU runs, as the bf16 dot
 * kernels'). */
void f32_gemm_dot(cpu_isa isa, float *y, int ldy, const float *x, const float *w, int n, int in, int out, int accumulate);

#endif
