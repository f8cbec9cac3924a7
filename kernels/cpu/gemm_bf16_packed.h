/* bf16 compute on AVX-512 BF16 (vdpbf16ps) over bf16 weights packed once
 * at load, batch-invariant at every n.
 *
 * Layout (bf16p_*): W [out, in] row-major becomes [out/16][in/2][16
 * columns][2 bf16] -- one 64-byte vector holds columns 16b..16b+15 at the
 * input pair (2p, 2p + 1), which is exactly vdpbf16ps's operand: lane c
 * gains w[j][2p] x[2p] + w[j][2p+1] x[2p+1].  out is padded to a multiple
 * of 16 and in to a multiple of 2 with zeros (the padded columns are never
 * stored, a padded input multiplies x's zero pad).  Same bytes as the
 * plain matrix up to that padding: no second copy.
 *
 * Kernel (bf16p_gemm): x rounded to bf16 (nearest even) once per call, a
 * register tile of up to BF16P_R rows x BF16P_V vectors of 16 columns,
 * each step loading V W vectors and broadcasting one x pair (4 bytes) per
 * row: an outer product, no horizontal sums.  Batch invariance: output
 * (i, j) is ONE sequential chain acc = dp(acc, W[j][pair p], x[i][pair p])
 * for p = 0 .. in/2 - 1 from acc = 0, then y = acc (or y + acc) -- the
 * same chain whatever n, the tile's row count or column count, the row's
 * place in the batch, or the thread that runs it -- so a row's result is
 * bit for bit its lone run at every n (tests/test_bf16_packed.c). */
#ifndef CP_GEMM_BF16_PACKED_H
#define CP_GEMM_BF16_PACKED_H

#include <stddef.h>
#include <stdint.h>

#define BF16P_R 8 /* x rows a tile: 8 x 3 accumulators + 3 W vectors + 1 broadcast of 32 zmm */
#define BF16P_V 3 /* 16-column vectors a tile */

/* bytes of the packed form of a [out, in] matrix */
size_t bf16p_bytes(int out, int in);
/* w (row-major [out, in]) into dst (bf16p_bytes(out, in) bytes, 64-byte
 * aligned); plain C, once at load */
void bf16p_pack(void *dst, const uint16_t *w, int out, int in);
/* the inverse: the row-major matrix back, bit for bit */
void bf16p_unpack(uint16_t *dst, const void *src, int out, int in);

/* rows ids[0..n) of a packed [out, in] matrix as f32 (exact), n x in at
 * dst: the embedding lookup of a tied table packed as the LM head (the
 * ids are the caller's to check, as for a plain table) */
void bf16p_rows(float *dst, const void *src, const int32_t *ids, int n, int out, int in);

/* bytes of scratch bf16p_gemm needs for n rows of length in */
size_t bf16p_scratch(int n, int in);
/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + round_bf16(x[i,:])
 * . W^T, W packed by bf16p_pack; only where the CPU has AVX512_BF16.
 * scratch: bf16p_scratch(n, in) bytes, 64-byte aligned. */
void bf16p_gemm(float *y, int ldy, const float *x, const void *wp, int n, int in, int out, int accumulate, void *scratch);

/* The same bits for a plain row-major W [out, in] (the tied embedding as
 * the LM head: embed reads its rows, so it is never packed): x's rows go
 * into the vector lanes (16 rows a vector, pair-interleaved, once per
 * call) and each W pair is broadcast, so W streams row by row as stored;
 * output (i, j) is the same chain of vdpbf16ps over the pairs in order as
 * in bf16p_gemm (each lane adds the same two exact products), so the
 * result is bit for bit bf16p_gemm's on the packed W at every n.  Rows
 * are computed 16 at a time (n = 1 wastes 15 lanes: the LM head is bound
 * by W's bytes there, not by the arithmetic).  scratch:
 * bf16p_plain_scratch(n, in) bytes, 64-byte aligned. */
size_t bf16p_plain_scratch(int n, int in);
void bf16p_gemm_plain(float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate, void *scratch);

#endif
