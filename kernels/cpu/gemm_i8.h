/* The CPU backend's GEMMs over int8 weight matrices (kernels/q8.h).
 *
 * Every batch, decode to prefill: each activation row is quantized
 * dynamically to int8 with its own scale (max |x| / 127), the dot products
 * run in integers, and y = acc * s_x[i] * s_w[j].  Kernels, chosen at run
 * time (gemm_bf16.h's cpu_isa / CP_CPU_ISA):
 *   vnni    AVX-512 VNNI vpdpbusd: u8 (x + 128) x s8 W, 64 bytes per op;
 *           the +128 taken back out with the matrix's row sums
 *   avx512  AVX-512 BW: W widened to s16, vpmaddwd against s16 x
 *   avx2    AVX2: the same 16 lanes at a time
 *   generic scalar C, the reference the others are tested against
 * All four compute the same integers, so they agree exactly.  Rows go in
 * chunks of Q8_ROW_CHUNK; within a chunk, output columns are split over the
 * OpenMP threads in blocks of Q8_COL_BLOCK and every group of rows (8 on
 * vnni while they fit L1 beside a W row, else 4) runs over a block before
 * the next, so W streams from memory once per chunk.
 * Why prefill too: on the 0.5B MLP shape the integer kernel ran 64 rows in
 * 3.4 ms against 42 ms for sgemm on dequantized blocks (make bench's
 * skinny table, loaded machine), the dequantizing being the cost. */
#ifndef CP_GEMM_I8_H
#define CP_GEMM_I8_H

#include <stddef.h>
#include <stdint.h>

#include "gemm_bf16.h"

typedef enum q8_isa { Q8_GENERIC = 0, Q8_AVX2, Q8_AVX512, Q8_VNNI } q8_isa;

const char *q8_isa_name(q8_isa k);
/* the int8 kernel for the bf16 path's ISA choice: forced generic / avx2 /
 * avx512 / avx512vnni run that kernel; automatic and amx the widest the CPU
 * has */
q8_isa q8_isa_for(cpu_isa isa, int forced, const cpu_features *f);

#define Q8_ROW_CHUNK 64
#define Q8_COL_BLOCK 16
/* rows of x per pass over a W row in the vnni kernel (the others: 4) */
#define Q8_VNNI_ROWS 8

/* Scratch bytes q8_gemm needs for n rows of in columns (at most a chunk's). */
size_t q8_scratch(int n, int in);
/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + x[i,:] . W^T, any
 * n, W a q8 blob of out x in (the caller checked cp_q8_matches). */
void q8_gemm(q8_isa k, float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate, void *scratch);

/* One activation row as the vnni kernel quantizes it (AVX-512 BW): u8
 * (x + 128) into dst[0:ld] (ld = cp_q8_ld(in), padding 128), returning the
 * row's scale (NaN for a row with a NaN or an Inf, quantized to zeros);
 * gemm_i8_prefill.c shares it so both kernels compute the same integers. */
float q8_quantize_row_u8(const float *x, int in, int ld, uint8_t *dst);

/* out[i,:] = dequantized row ids[i] of the q8 table */
void q8_embed(float *out, const void *table, const int32_t *ids, int n, int dim);

#endif
