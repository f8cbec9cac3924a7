/* The int8 GEMM for prefill-sized batches (more than Q8P_MIN_ROWS rows) on
 * AVX-512 VNNI: a register-blocked outer-product kernel.
 *
 * Why not gemm_i8.c's dot kernels: those take a W row against up to 8 x
 * rows, one vpdpbusd per 64 products of one output, and reduce 16 lanes to
 * one sum per output at the end — for a decode batch that streams W once,
 * which is what decode needs.  For hundreds of rows the reduction and the
 * 9 loads per 8 vpdpbusd bound it well under the VNNI peak.  Here each
 * vpdpbusd computes 16 outputs (16 columns of one row, 4 products each),
 * the activations broadcast 4 bytes at a time: Q8P_MR rows x Q8P_NV
 * vectors of 16 columns = 24 accumulators in registers, 3 + 8 loads per 24
 * vpdpbusd, no horizontal sums.
 *
 * The arithmetic is gemm_i8.h's, integer for integer: each activation row
 * quantized to u8 (x + 128) with its own scale by the same routine, W's
 * per-output-channel int8, acc - 128 * rowsum(W) exact in int32, then
 * y = (float)acc * (s_x[i] * s_w[j]) — so the outputs are bit-equal to
 * q8_gemm's on every path (the tests hold it to that).
 *
 * W's layout: where the CPU's int8 kernel is vnni the loader packs every
 * matrix once in the panel order this kernel reads (q8.h's CP_Q8_PANELS:
 * 48 output channels x [k/4][16 columns][4 bytes] per vector, one
 * contiguous stream per panel), and the kernel runs straight on it at
 * every n -- decode's one row included: one W vector feeds R rows, no
 * horizontal sums, no repack (docs/RESULTS.md "int8 pre-packed VNNI
 * panels").  A row-major blob (tests, benchmarks, a forced ISA's load) is
 * still taken past Q8P_MIN_ROWS rows: each thread repacks one panel at a
 * time into a buffer that stays in L2 while every row runs over it. */
#ifndef CP_GEMM_I8_PREFILL_H
#define CP_GEMM_I8_PREFILL_H

#include <stddef.h>

#include "gemm_i8.h"

/* Batches of more rows than this take the kernel; the dot kernels keep
 * the rest.  Measured (bench_forward --prefill-i8 T, one layer's seven
 * matrices, 2 threads, a machine at load 28, so roughly): 32 rows 0.68x /
 * 0.93x of the dot kernels (the panel repack is paid per call), 48 rows
 * 2.3x, 64 rows 0.96x / 3.5x, 1024 rows 1.7-2.0x; docs/RESULTS.md's
 * "Prefill, int8 VNNI". */
#define Q8P_MIN_ROWS 32
#define Q8P_MR 8 /* rows per micro-tile */
#define Q8P_NV 3 /* vectors of 16 output columns per micro-tile */
#define Q8P_PANEL (Q8P_NV * 16)

/* 1 when this kernel runs n rows on the int8 path k (vnni only, n past
 * the decode kernels' range): the backend's dispatch */
int q8p_takes(q8_isa k, int n);
/* the same for one weight w (a q8 blob the caller checked): one packed at
 * load (CP_Q8_PANELS) at every n -- decode included, no repack -- a
 * row-major one as q8p_takes says */
int q8p_takes_w(q8_isa k, int n, const void *w);

/* Scratch bytes for n rows of in columns with `threads` OpenMP threads. */
size_t q8p_scratch(int n, int in, int threads);

/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + x[i,:] . W^T for
 * any n >= 1, W a q8 blob of out x in (the caller checked cp_q8_matches),
 * on a CPU with AVX-512 VNNI; scratch holds q8p_scratch(n, in, threads)
 * bytes (64-byte aligned) for at least as many threads as the region
 * gets. */
void q8p_gemm(float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate, void *scratch, int threads);

/* The fused form: up to Q8P_MAX_OUTS products of one row source (each
 * quantized row read by all of them, one parallel region), each y_o
 * (row stride ldy) = (accumulate ? y_o : 0) + src . W_o^T (+ bias_o),
 * bit-equal to q8p_gemm on the rows the source makes, then
 * cpu_add_bias.  Sources: x itself, rmsnorm(x; norm_w, eps) as
 * q8p_rmsnorm makes it, or swiglu(x, up) as q8p_swiglu makes it -- the
 * f32 rows never stored (the int8 prefill's norm + Q/K/V, norm +
 * gate/up, SwiGLU + down; docs/RESULTS.md, the int8 prefill's fused
 * norm / SwiGLU). */
#define Q8P_MAX_OUTS 4
typedef enum q8p_src_kind { Q8P_SRC_PLAIN = 0, Q8P_SRC_NORM, Q8P_SRC_SWIGLU } q8p_src_kind;
typedef struct q8p_src {
    q8p_src_kind kind;
    const float *x;      /* n x in (the gate for SWIGLU) */
    const float *up;     /* SWIGLU: n x in */
    const float *norm_w; /* NORM: in weights */
    float eps;           /* NORM */
} q8p_src;
typedef struct q8p_out {
    float *y;
    int ldy;
    const void *w; /* a q8 blob of out x in (the caller checked cp_q8_matches) */
    const float *bias; /* or NULL */
    int out, accumulate;
} q8p_out;
/* count in 1..Q8P_MAX_OUTS; scratch as for q8p_gemm (q8p_scratch). */
void q8p_run(const q8p_src *src, const q8p_out *outs, int count, int n, int in, void *scratch, int threads);
/* Row i of src (rows of in values): x's own row for a plain source, else
 * the RMSNorm or SwiGLU row made into buf (in floats) -- what the fused
 * forms quantize or round, here and on the AMX tiles (gemm_amx.h).
 * AVX-512 F. */
const float *q8p_source_row(const q8p_src *src, int i, int in, float *buf);

/* out = silu(gate) * up, cpu_swiglu's expression (g / (1 + e^-g) * u)
 * with a vectorized e^x (relative error ~2e-7, far inside int8's) in
 * place of the scalar expf that was 7-9 % of an int8 prefill (prof_batch
 * --prefill); AVX-512 F, on the int8 vnni path. */
void q8p_swiglu(float *out, const float *gate, const float *up, size_t count);
/* the same on one thread (q8p_swiglu's per-element values) */
void q8p_swiglu_span(float *out, const float *gate, const float *up, size_t count);

/* cpu_rmsnorm on the int8 vnni path (AVX-512 F): the squares summed in
 * double in 8 lanes, not one by one (cpu_rmsnorm's scalar double sum was
 * ~3 % of an int8 prefill), so the factor can differ from cpu_rmsnorm's in
 * its last bit; the rest is its expression x * r * w.  The _row form is
 * one row on one thread. */
void q8p_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);
void q8p_rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps);

/* The in-run ceiling: int8 multiply-adds per second (x 2 = ops) of
 * vpdpbusd on registers alone, `threads` threads, about `seconds` long. */
double q8p_peak_ops(int threads, double seconds);

#endif
