/* GEMMs on AMX tiles, bf16 (_tile_dpbf16ps) and int8 (_tile_dpbusd),
 * batch-invariant at every row count, and a prefill's attention with both
 * of its products on bf16 tiles.
 *
 * Availability (cp_amx_ready): cpuid leaf 7 says AMX-TILE, AMX-BF16 and
 * AMX-INT8, leaf 1 and XCR0 say the OS saves tile state, leaf 0x1d's
 * palette 1 is the 8 tiles of 16 rows x 64 bytes the kernels configure,
 * and Linux granted this process XTILEDATA (arch_prctl
 * ARCH_REQ_XCOMP_PERM, asked once per process: the amx_permission
 * singleton).  Where any of that fails every kernel returns
 * CP_EUNSUPPORTED with the reason, and the caller keeps its other path.
 *
 * Tiles: every tile the kernels use is 16 rows x 64 bytes -- A: 16 rows x
 * 32 bf16 (or 64 u8), B: 16 k-pairs (k-quads) x 16 columns, C: 16 x 16
 * f32 (or s32) -- one configuration for the whole kernel.  Rows go two
 * tiles at a time (n padded to 32), or one tile for n <= 16; rows past n
 * are zero in the staged A and never stored, columns past out are padding
 * in B and never stored.
 *
 * Batch invariance.  bf16: output (i, j) is zero, then one _tile_dpbf16ps
 * per 32-element K tile t = 0 .. in_pad / 32 - 1 in that order, always in
 * a full 16 x 16 tile (a lone row sits in a tile with 15 zero rows), the
 * accumulator carried in the tile register, or stored and loaded back
 * exactly between K chunks; then y = acc (or y + acc).
 * Nothing in that chain depends on n, the row's place in the batch, its
 * tile or the thread that ran it, so a row's result is bit for bit its
 * lone run (tests/test_amx.c holds it to that at n = 1, 16, 37, 256).  int8:
 * the sums are exact integers (255 x 127 x 65535 < 2^31: no overflow,
 * no order), and the epilogue is gemm_i8_prefill.c's expression, so the
 * outputs are bit-equal to q8p_gemm's and q8_gemm's at every n. */
#ifndef CP_GEMM_AMX_H
#define CP_GEMM_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h"
#include "../status.h"
#include "gemm_i8_prefill.h"

/* CP_OK when this process can run the AMX kernels (bf16 and int8); else
 * CP_EUNSUPPORTED and err says which check failed.  Thread-safe; the
 * checks and the permission request run once per process. */
cp_status cp_amx_ready(cp_error *err);

/* The checks on cpuid's words alone (no permission request): 1 when they
 * allow the kernels, else 0 and *why names the missing piece.  leaf1_ecx:
 * cpuid(1).ecx; leaf7_edx: cpuid(7, 0).edx; xcr0: xgetbv(0) (read only
 * when OSXSAVE is set); palette: cpuid(0x1d, 1) eax, ebx, ecx.  Exposed
 * for the tests, which feed it words a CPU without AMX would give. */
int cp_amx_cpuid_allows(uint32_t leaf1_ecx, uint32_t leaf7_edx, uint64_t xcr0, const uint32_t palette[3], const char **why);

/* ---- bf16 ---------------------------------------------------------------
 * Packed layout of a row-major W [out, in] (bf16): in padded with zeros to
 * a multiple of 32 (in_pad), out to a multiple of 16 (out_pad); then
 * [out_pad / 16 column blocks][in_pad / 32 K tiles][16 pairs][16 columns]
 * [2 bf16] -- each (block, K tile) is one contiguous 1 KB B tile: element
 * (j, k) at ((j / 16) (in_pad / 32) + k / 32) 512 + ((k % 32) / 2) 32 +
 * (j % 16) 2 + k % 2.  Where in is a multiple of 32 these are the bytes of
 * bf16p_pack's layout (gemm_bf16_packed.h), which pads in to 2 only. */
typedef struct cp_amx_bf16_layout {
    int out, in;          /* the matrix */
    int out_pad, in_pad;  /* padded to 16 and 32 */
    size_t bytes;         /* of the packed buffer */
} cp_amx_bf16_layout;

/* The layout of an [out, in] matrix; CP_EINVAL for out or in < 1 or a
 * size that overflows. */
cp_status cp_amx_bf16_layout_of(int out, int in, cp_amx_bf16_layout *layout, cp_error *err);
/* w into dst (layout->bytes bytes, 64-byte aligned), zero padding
 * included; plain C, once at load. */
void cp_amx_bf16_pack_into(void *dst, const uint16_t *w, const cp_amx_bf16_layout *layout);
/* The same into a new buffer (*packed, 64-byte aligned; free() it),
 * *layout its layout. */
cp_status cp_amx_bf16_pack(const uint16_t *w, int out, int in, void **packed, cp_amx_bf16_layout *layout, cp_error *err);
/* The inverse: the row-major [out, in] matrix back, bit for bit. */
void cp_amx_bf16_unpack(uint16_t *dst, const void *packed, const cp_amx_bf16_layout *layout);

/* Rows ids[0..n) of the packed matrix as f32 (exact), n x in at dst: the
 * embedding lookup of a tied table packed as the LM head (the ids are the
 * caller's to check, as for a plain table). */
void cp_amx_bf16_rows(float *dst, const void *packed, const cp_amx_bf16_layout *layout, const int32_t *ids, int n);

/* Scratch bytes for n rows on up to `threads` OpenMP threads (staged A:
 * rows padded to 32, or 16 for n <= 16, of in_pad bf16; a C buffer per
 * thread where in_pad is past one K chunk). */
size_t cp_amx_bf16_scratch(int n, const cp_amx_bf16_layout *layout, int threads);

/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + bf16(x[i,:]) . W^T
 * for n >= 1, x f32 (row stride in) rounded to bf16 to nearest even, W
 * packed by cp_amx_bf16_pack; scratch: cp_amx_bf16_scratch(n, layout,
 * threads) bytes, 64-byte aligned; at most `threads` OpenMP threads. */
cp_status cp_amx_bf16_gemm(float *y, int ldy, const float *x, const void *wp, const cp_amx_bf16_layout *layout, int n,
                           int accumulate, void *scratch, int threads, cp_error *err);
/* The same with x already bf16 (row stride ldx elements). */
cp_status cp_amx_bf16_gemm_bx(float *y, int ldy, const uint16_t *x, int ldx, const void *wp, const cp_amx_bf16_layout *layout,
                              int n, int accumulate, void *scratch, int threads, cp_error *err);

/* The fused form (the backend's norm_matmuls and swiglu_matmul on the amx
 * path): one parallel region makes each source row (the vnni fused form's
 * q8p_src: x itself, rmsnorm(x; norm_w, eps) or silu(gate) x up, made by
 * q8p_source_row) -- rounds it to bf16 once into the staged A, and
 * runs every output's column pairs over it: y_j = (accumulate_j ? y_j : 0)
 * + rows . W_j^T (+ bias_j), for j < count (1..Q8P_MAX_OUTS), every W_j
 * [out_j x in].  The bits of the plain ops in turn (the norm or SwiGLU into
 * a buffer, cp_amx_bf16_gemm, cpu_add_bias) with one fork and join where
 * they took up to five; x and gate / up are n x in, contiguous. */
typedef struct cp_amx_bf16_out {
    float *y;
    int ldy;
    const void *wp;                  /* packed by cp_amx_bf16_pack */
    const cp_amx_bf16_layout *layout; /* in: the source's row length */
    const float *bias;               /* or NULL */
    int accumulate;
} cp_amx_bf16_out;
size_t cp_amx_bf16_fused_scratch(int n, int in, int threads);
cp_status cp_amx_bf16_fused(const q8p_src *src, const cp_amx_bf16_out *outs, int count, int n, int in, void *scratch, int threads,
                            cp_error *err);

/* A gated MLP's three products in one parallel region: y = (accumulate ?
 * y : 0) + (silu(src . Wg^T) x (src . Wu^T)) . Wd^T, src made per row as
 * for the fused form (q8p_src; rmsnorm(x) in the forward).  The gate and
 * up products run side by side over each column block, and their
 * epilogue writes silu(gate) x up, rounded to bf16, straight into the down
 * product's staged A: the bits of cp_amx_bf16_fused (gate and up) then
 * the swiglu source's fused down, without storing gate or up (2 x n x
 * inter f32 written and read back).  Wg, Wu [inter x in], Wd [out x
 * inter], packed by cp_amx_bf16_pack; scratch cp_amx_bf16_mlp_scratch(n,
 * in, inter, threads) bytes, 64-byte aligned. */
typedef struct cp_amx_bf16_mlp_w {
    const void *gate, *up, *down;
    const cp_amx_bf16_layout *gate_l, *up_l, *down_l;
} cp_amx_bf16_mlp_w;
size_t cp_amx_bf16_mlp_scratch(int n, int in, int inter, int threads);
cp_status cp_amx_bf16_mlp(const q8p_src *src, const cp_amx_bf16_mlp_w *w, float *y, int ldy, int accumulate, int n, void *scratch,
                          int threads, cp_error *err);

/* ---- int8 ---------------------------------------------------------------
 * W is a q8 blob (kernels/q8.h) in the CP_Q8_PANELS layout -- what the
 * loader makes wherever the int8 kernel is vnni, which every AMX CPU has:
 * a panel's k-group g holds 3 vectors of 16 columns x 4 bytes, so the B
 * tile of vector v, K tile t (16 k-groups) is 16 rows of 64 bytes at a
 * stride of 192 bytes, read in place: no second copy, no repack.
 * Activations: each row quantized to u8 (x + 128) with its own scale by
 * q8_quantize_row_u8 (the vnni kernels' routine), then y = (float)(acc -
 * 128 rowsum(W)) (s_x s_w), + y when accumulating. */
size_t cp_amx_i8_scratch(int n, int in, int threads);
/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + x[i,:] . W^T for
 * n >= 1, x f32 (row stride in); w a CP_Q8_PANELS blob of out x in
 * (CP_EINVAL otherwise: a row-major blob goes through cp_q8_pack_blob
 * first); scratch: cp_amx_i8_scratch(n, in, threads) bytes, 64-byte
 * aligned; at most `threads` OpenMP threads. */
cp_status cp_amx_i8_gemm(float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate, void *scratch,
                         int threads, cp_error *err);
/* The fused form over int8 weights (the backend's norm_matmuls and
 * swiglu_matmul past 16 rows): each source row made as for the bf16 one,
 * quantized once, every output's column pairs over it, each output's bias
 * added after its product: the bits of the vnni kernels' fused form
 * (q8p_run, whose arguments these are).  W_j q8 blobs in the panel layout. */
cp_status cp_amx_i8_fused(const q8p_src *src, const q8p_out *outs, int count, int n, int in, void *scratch, int threads,
                          cp_error *err);

/* ---- attention ----------------------------------------------------------
 * A call's attention with both products on tiles (backend.h's
 * cp_attn_args: q, k, v as f32, or k16 / v16 as a bf16 cache; GQA, the
 * causal mask and a sliding window by positions; an export and a
 * sensitive mass, export_rows naming each row's).  K and V of the slots
 * some row sees are rounded to bf16 (nearest even) into tile order once a
 * call; per 16 rows and head, Q is rounded the same way, S = Q K^T into
 * f32 (one tile product per 32 head dimensions), scaled by
 * 1 / sqrt(head_dim), the f32 path's mask and softmax with the vector
 * exponential (the sum in lanes fixed by slot) make the probabilities --
 * the export and the mass are added from them in f32 -- and P, rounded to
 * bf16, gives O = P V on tiles (one tile product per 32 key slots, f32
 * accumulation).  Batch-invariant: a row's scores and probabilities do
 * not depend on the other rows, and its P V chain runs over key slots in
 * tiles aligned to absolute multiples of 32 -- slots outside the row's
 * view have probability exactly 0 and add exact zeros -- so a query's
 * output, export and mass are bit for bit the same alone, among any rows
 * and in any prefill chunk (the CPU backend runs every call with output
 * rows of its amx path here, decode steps included).  head_dim a
 * multiple of 32; n_heads a multiple of n_kv_heads; output rows wanted
 * (an export alone is the general kernels'). */
size_t cp_amx_attn_scratch(const cp_attn_args *a, int threads);
cp_status cp_amx_attention(const cp_attn_args *a, void *scratch, int threads, cp_error *err);

/* ---- in-run ceilings ----------------------------------------------------
 * Tile multiply throughput on tile registers alone (no loads: 6
 * independent accumulators against 2 source tiles), `threads` OpenMP
 * threads, best of 8 runs of about seconds / 8: bf16 FLOP/s and int8 OP/s
 * (2 per multiply-add) by wall time, and the same per second of the
 * process's CPU time -- a core's rate while it runs, which a busy machine
 * that takes the cores away part of the time does not lower. */
typedef struct cp_amx_ceiling {
    double bf16_flops, i8_ops;         /* per wall second, all threads */
    double bf16_flops_cpu, i8_ops_cpu; /* per CPU second (one core's rate) */
} cp_amx_ceiling;
cp_status cp_amx_peak(int threads, double seconds, cp_amx_ceiling *out, cp_error *err);

#endif
