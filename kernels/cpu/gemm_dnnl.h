/* bf16 compute through oneDNN matmul primitives (the CPU backend's amx
 * path, gemm_bf16.h): activations rounded to bf16, weights bf16 as loaded
 * (row-major [out, in], read by oneDNN as the "ba" layout of W^T), f32
 * accumulation and output.
 *
 * Batch-invariant: every call, whatever its row count, runs the rows in
 * blocks of CP_DNNL_ROWS through one primitive made once per weight shape
 * (the last block padded with zero rows), so a row's result is bit for
 * bit the same alone, at any place in a batch and in a prefill chunk of
 * any size.  A primitive made for the call's own row count (as before)
 * chooses its blocking -- M and K splits, the thread grid -- from that
 * count, and a row's sums then depended on what it was batched with
 * (47 of 48 rag-v1 answers equal at --concurrency 8 against 1 on AMX).
 * 16 rows: one AMX tile's height; decode pays for 15 padded rows, which
 * tiles compute in the time the weights take to stream. */
#define CP_DNNL_ROWS 16
#ifndef CP_GEMM_DNNL_H
#define CP_GEMM_DNNL_H

#include <oneapi/dnnl/dnnl_types.h>
#include <stddef.h>
#include <stdint.h>

#include "../status.h"

typedef struct cp_dnnl_mm cp_dnnl_mm;

cp_status cp_dnnl_mm_create(cp_dnnl_mm **out, cp_error *err);
void cp_dnnl_mm_destroy(cp_dnnl_mm *g);

/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + bf16(x[i,:]) . W^T */
cp_status cp_dnnl_mm_run(cp_dnnl_mm *g, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out,
                        int accumulate, cp_error *err);

/* Weights reordered once, at load, into the layout oneDNN's matmul prefers
 * (on avx512_core_bf16 brgemm: BA16a64b2a, blocks of 16 x 64 with pairs of
 * k interleaved; padded, so a small matrix may grow).  The layout is asked
 * of a primitive at CP_DNNL_REP_N rows with the weights' format "any";
 * the primitive of CP_DNNL_ROWS rows that every call runs is then made
 * with that fixed layout (oneDNN 2.6.3 on Zen 5 chose the same layout for
 * 1 .. 1024 rows of every 0.5B shape).
 * cp_dnnl_mm_packed_bytes gives the size (0 and a message when oneDNN has
 * no bf16 matmul for the shape); pack writes `bytes` bytes at dst from the
 * row-major W [out, in]; unpack is its inverse (exact: a permutation). */
#define CP_DNNL_REP_N 256
size_t cp_dnnl_mm_packed_bytes(cp_dnnl_mm *g, int in, int out, cp_error *err);
cp_status cp_dnnl_mm_pack(cp_dnnl_mm *g, void *dst, size_t bytes, const uint16_t *w, int in, int out, cp_error *err);
cp_status cp_dnnl_mm_unpack(cp_dnnl_mm *g, uint16_t *dst, const void *packed, int in, int out, cp_error *err);

/* cp_dnnl_mm_run over packed weights (any n >= 1). */
cp_status cp_dnnl_mm_run_packed(cp_dnnl_mm *g, float *y, int ldy, const float *x, const void *packed, int n, int in, int out,
                               int accumulate, cp_error *err);

/* How many primitives the cache holds now, and how many of them read packed
 * weights (tests: several batch sizes over one packed tensor, one primitive). */
void cp_dnnl_mm_cache_counts(const cp_dnnl_mm *g, int *prims, int *packed_prims);

/* The engine and stream, for the other bf16 kernels (attn_dnnl.c). */
dnnl_engine_t cp_dnnl_mm_engine(const cp_dnnl_mm *g);
dnnl_stream_t cp_dnnl_mm_stream(const cp_dnnl_mm *g);

/* oneDNN's effective ISA ("avx512_core_amx", ...) and the implementation
 * the last primitive created got ("brg:avx512_core_amx"; "" before any). */
const char *cp_dnnl_mm_isa(void);
const char *cp_dnnl_mm_last_impl(const cp_dnnl_mm *g);

#endif
