/* The CPU backend's GEMMs over bf16 weights, and the runtime choice of how
 * to run them.
 *
 * Chosen at backend creation from cpuid (never at compile time), or forced
 * with CP_CPU_ISA=generic|avx2|avx512|avx512vnni|avx512bf16|amx; each path
 * runs one kernel at every batch size, so it is batch-invariant (a row's
 * result is bit for bit its lone run):
 *   - f32 compute from bf16 weights (a CPU without bf16 products, or
 *     forced generic / avx2 / avx512): the weights are widened to
 *     f32 on the fly — bf16 -> f32 is exact (a 16-bit shift), so this is the
 *     f32 reference's arithmetic on the bf16-rounded weights.  Hand AVX-512 /
 *     AVX2 / scalar dot kernels that stream the bf16 rows once, at every n
 *     (bf16_gemm_blocked, sgemm on widened blocks, is faster on prefill
 *     chunks but sums in another order: the profiling benches only).
 *   - bf16 compute (AMX-BF16): the AMX tile kernels, or oneDNN matmul
 *     primitives (gemm_dnnl.c) in fixed blocks of CP_DNNL_ROWS rows:
 *     activations rounded to bf16, f32 accumulation and output;
 *   - bf16 compute on AVX512_BF16 without AMX: weights packed at load, one
 *     register-blocked vdpbf16ps kernel at every n, batch-invariant
 *     (gemm_bf16_packed.h). */
#ifndef CP_GEMM_BF16_H
#define CP_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "../status.h"

typedef enum cpu_isa {
    CPU_ISA_GENERIC = 0, /* scalar C */
    CPU_ISA_AVX2,        /* AVX2 + FMA */
    CPU_ISA_AVX512,      /* AVX-512 F + BW + VL */
    CPU_ISA_AMX,         /* bf16 compute through oneDNN (AMX-BF16 where present) */
    CPU_ISA_AVX512_VNNI, /* AVX-512 + VNNI: the int8 kernel (gemm_i8.h); bf16 runs the avx512 one */
    CPU_ISA_AVX512_BF16, /* AVX-512 BF16: bf16 compute (vdpbf16ps) in the small-batch kernels */
} cpu_isa;

typedef struct cpu_features {
    int avx2_fma, avx512, avx512_bf16, avx512_vnni, amx_bf16;
} cpu_features;

void cpu_features_detect(cpu_features *f);

/* How many of a GEMM's work items a thread claims at a time in its
 * parallel loop (schedule(dynamic, chunk)).  At decode sizes (n <=
 * CPU_CLAIM_ROWS rows), one: a thread that slept between parallel regions
 * wakes tens of microseconds into the next (a futex wake-up on a virtual
 * machine), and with fixed shares its peer then waited as long at the
 * region's end and fell asleep there too -- claimed items let the awake
 * thread take what the late one has not started.  Above, an even share a
 * thread: the static split's runs (each thread streams its W columns once).
 * Every item's arithmetic is the same on any thread. */
#define CPU_CLAIM_ROWS 16
static inline long cpu_claim_chunk(long items, int n, int threads)
{
    if (n <= CPU_CLAIM_ROWS || threads < 2) return 1;
    return (items + threads - 1) / threads;
}
/* The elementwise ops' chunk (vector RoPE, RMSNorm, SwiGLU): a sixteenth
 * of the rows (or blocks) at a time, for the same reason at every size --
 * each chunk is cheap, and a late thread's share is taken by the other. */
static inline long cpu_claim_sixteenth(long items) { return items / 16 > 1 ? items / 16 : 1; }
const char *cpu_isa_name(cpu_isa isa);

/* The path for bf16 weights: `forced` is CP_CPU_ISA's value (NULL or ""
 * for automatic).  Automatic: bf16 compute where the CPU multiplies bf16
 * natively -- amx where it has AMX-BF16 and oneDNN is there (have_dnnl),
 * else avx512bf16 (the own packed vdpbf16ps kernels) where it has
 * AVX512_BF16 -- and below that the widest f32 kernel it runs, exact f32
 * arithmetic from the bf16 weights.  Measured on AMD Zen 5 (bench_forward,
 * synth qwen2.5-0.5b, 512 tokens): avx512bf16 prefills 2.8-3.5x and
 * decodes 1.9x as fast as avx512's f32 compute, at a cost far inside
 * int8's (bf16 compute on cp-books-6m vs f32: NMSE 1.6e-6, KL 9.2e-6
 * nats, no top-1 flip in 256); CP_CPU_ISA=avx512 keeps the exact
 * arithmetic.  A forced ISA the CPU lacks is an error (amx only needs
 * oneDNN: on a CPU without AMX, oneDNN runs its bf16 kernels on
 * AVX-512-BF16 or refuses, which the matmul reports). */
cp_status cpu_isa_choose(const char *forced, const cpu_features *f, int have_dnnl, cpu_isa *out, cp_error *err);

/* The row count up to which the dot kernels beat sgemm on widened blocks
 * (bench_gemm_rows, docs/RESULTS.md, a serving step's mid-size GEMMs: 1.4-2.3x
 * faster at 17-48 rows, the crossover near 96-128).  The backend runs the
 * dot kernels at every n (batch invariance); the profiling benches compare
 * the two kernels around this size. */
#define BF16_SMALL_N 64
/* from this row length up (the MLP's down projection, 4864) a group of 4 x
 * rows (4 x in x 4 bytes) is past L1, and bf16_gemm_small runs the tile */
#define BF16_TILE_MIN_IN 2048

/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + x[i,:] . W^T for
 * n <= BF16_SMALL_N (any n works; it is just slower), W bf16 [out, in]:
 * bf16_gemm_tiled where in >= BF16_TILE_MIN_IN and n >= 2, else
 * bf16_gemm_dot.  Every output is computed by the same operations in the
 * same order whatever n, the kernel or the row's place in the batch. */
void bf16_gemm_small(cpu_isa isa, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out,
                     int accumulate);
/* one W row against up to 4 x rows at a time */
void bf16_gemm_dot(cpu_isa isa, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate);
/* a register tile of 2 W rows x 4 x rows (AVX-512; elsewhere the dot
 * kernels): each x vector loaded once for two W rows */
void bf16_gemm_tiled(cpu_isa isa, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate);

/* The same for any n, through sgemm on widened blocks of W.  scratch holds
 * bf16_gemm_blocked_scratch(in, out) floats. */
size_t bf16_gemm_blocked_scratch(int in, int out);
void bf16_gemm_blocked(float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate,
                       float *scratch);

/* bf16 compute for small n on AVX-512 BF16 (vdpbf16ps) over plain W (the
 * profiling benches' reference for the packed kernel; the backend's amx
 * path runs oneDNN's fixed row blocks at every n instead, since this
 * kernel's bits differ from oneDNN's): x rounded to bf16
 * (nearest even) into scratch, 32 products a instruction, f32
 * accumulation -- the oneDNN path's arithmetic, without its per-call
 * overhead at a few rows; every row the same two chains whatever n, so
 * batch-invariant.  Only where the CPU has AVX512_BF16; scratch holds
 * bf16_dp_scratch(n, in) bytes, 64-byte aligned. */
size_t bf16_dp_scratch(int n, int in);
void bf16_gemm_small_dp(float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate,
                        void *scratch);

/* bf16 -> f32 of n values (exact). */
void bf16_widen(float *dst, const uint16_t *src, size_t n);

#endif
