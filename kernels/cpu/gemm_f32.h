/* f32 weights, f32 compute, batch-invariant: the CPU backend's matmul for
 * f32 matrices (BLAS builds) at every row count -- f32p_gemm on those
 * packed at load (the AVX-512 paths), f32_gemm_dot on plain ones (the tied
 * LM head, which embed reads by rows; every matrix on avx2 and generic).
 *
 * Why not OpenBLAS: sgemv (one row) and sgemm (more) sum a row's products
 * in different orders, and sgemm's own order follows its blocking of the
 * call's shape, so a request's logits depended on the rows it was batched
 * with and on its prefill chunk (batch/bitwise_same_alone_and_batched_f32:
 * 8.6e-6 apart on cp-books-6m, under OPENBLAS_CORETYPE=Prescott too).
 * In f32_gemm_dot every output (i, j) is one fixed sequence of operations
 * on x row i and W row j -- gemm_bf16.c's dot kernels with f32 loads in
 * place of the widening: two chains over alternate vector steps, joined,
 * one more step, a masked (AVX-512) or scalar tail, a fixed lane reduction --
 * whatever n, the row's place in the batch or the thread that runs it.
 * The dot kernels' cost against sgemm on prefill-sized chunks is in
 * docs/RESULTS.md ("Batch invariance on every path"); f32p's, beside
 * both, from profiling/bench_f32p.c. */
#ifndef CP_GEMM_F32_H
#define CP_GEMM_F32_H

#include "gemm_bf16.h"

#include <stddef.h>

/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + x[i,:] . W^T, W f32
 * [out, in] row-major, x rows `in` apart; isa: generic, avx2 or one of the
 * AVX-512 ones (the kernels of the widest the CPU runs, as the bf16 dot
 * kernels'). */
void f32_gemm_dot(cpu_isa isa, float *y, int ldy, const float *x, const float *w, int n, int in, int out, int accumulate);

/* f32 weights packed once at load, register-blocked, batch-invariant at
 * every n (AVX-512: the CPU backend packs its f32 matrices this way where
 * f32p_takes(dot_isa)).
 *
 * Layout (f32p_*): W [out, in] row-major becomes [out/16][in][16 columns]
 * -- one 64-byte vector holds columns 16b..16b+15 at input k; out is
 * padded to a multiple of 16 with zero columns, never stored.
 *
 * Kernel (f32p_gemm): a register tile of up to F32P_R rows x F32P_V
 * vectors of 16 columns; each step loads V W vectors and broadcasts one x
 * element per row (an outer product, no horizontal sums).  Batch
 * invariance: output (i, j) is ONE chain acc = fma(W[j][k], x[i][k], acc)
 * for k = 0 .. in - 1 from acc = 0, then y = acc (or y + acc) -- the same
 * chain whatever n, the tile's row or column count, the row's place in the
 * batch or the thread that runs it, so a row's result is bit for bit its
 * lone run (n = 1, decode) at every n (tests/test_f32_packed.c).  Error:
 * a sequential sum of in exact-then-rounded fma steps, |y - exact| <=
 * in 2^-24 / (1 - in 2^-24) sum_k |W[j][k] x[i][k]|. */
#define F32P_R 8 /* x rows a tile: 8 x 3 accumulators + 3 W vectors + a broadcast of 32 zmm */
#define F32P_V 3 /* 16-column vectors a tile */

/* 1 where isa runs f32p_gemm (the AVX-512 ones) */
int f32p_takes(cpu_isa isa);
/* bytes of the packed form of a [out, in] matrix */
size_t f32p_bytes(int out, int in);
/* w (row-major [out, in]) into dst (f32p_bytes(out, in) bytes, 64-byte
 * aligned); once at load */
void f32p_pack(float *dst, const float *w, int out, int in);
/* the inverse: the row-major matrix back, bit for bit */
void f32p_unpack(float *dst, const float *src, int out, int in);
/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + x[i,:] . W^T, x
 * rows `in` apart, W packed by f32p_pack; only where f32p_takes. */
void f32p_gemm(float *y, int ldy, const float *x, const float *wp, int n, int in, int out, int accumulate);

#endif
