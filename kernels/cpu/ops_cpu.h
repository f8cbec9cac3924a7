/* CPU reference kernels: plain C + OpenMP + BLAS, f32.  These are what the
 * CUDA kernels are checked against. */
#ifndef CP_OPS_CPU_H
#define CP_OPS_CPU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#include "../backend.h"

/* Elementwise ops (bias adds, norms, RoPE, the vector SwiGLU) over at most
 * this many elements run on the calling thread.  Why: with
 * OMP_WAIT_POLICY=passive (make test, bench-serve) waking the other
 * threads costs ~30-60 us a region on the 2-core Zen 5, more than a
 * 16-row norm (~4 us) or RoPE (~5 us) takes on one core, and a batched
 * step ran ~100 such regions a step (docs/RESULTS.md, "A serving step's
 * small ops").  Each row's arithmetic is the same on any thread, so the
 * results are bitwise those of the threaded loops. */
#define CPU_SERIAL_ELEMS (1L << 16)
/* the scalar-expf SwiGLU (~4.5 ns an element) pays for a region sooner */
#define CPU_SERIAL_SWIGLU (1L << 13)

void cpu_embed(float *out, const float *table, const int32_t *ids, int n, int dim);
/* the same from a bf16 table (widened exactly) */
void cpu_embed_bf16(float *out, const uint16_t *table, const int32_t *ids, int n, int dim);
/* y[i, 0:out] += bias (row stride ldy) */
void cpu_add_bias(float *y, int ldy, const float *bias, int n, int out);
void cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);
void cpu_matmul(float *y, int ldy, const float *x, const float *w, const float *bias, int n, int in, int out,
                int accumulate);
void cpu_rope(float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim);
void cpu_swiglu(float *out, const float *gate, const float *up, size_t count);
void cpu_place_kv(float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n, const float *cos,
                  const float *sin, int n_kv_heads, int head_dim);
#if defined(__x86_64__) && !defined(CP_NO_BLAS)
/* The same two on AVX-512 lanes (a CPU with AVX-512 F), bit for bit theirs */
void cpu_rope_avx512(float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim);
void cpu_place_kv_avx512(float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n,
                         const float *cos, const float *sin, int n_kv_heads, int head_dim);
#endif
/* the backend's sample op (backend.h), in double: the device's reference */
int32_t cpu_sample(const float *logits, int n, float temperature, float top_p, float u);

/* Which vector kernels attention's pair and softmax loops run
 * (cpu_attn_pair_kernel): CPU_ATTN_AUTO, the widest the CPU has; the
 * backend passes its compute path's (CP_CPU_ISA=avx2 on an AVX-512 CPU
 * runs the AVX2 kernels, generic the portable loops -- what a CPU with only
 * those runs); tests force one. */
typedef enum { CPU_ATTN_AUTO, CPU_ATTN_PORTABLE, CPU_ATTN_AVX512, CPU_ATTN_AVX2 } cpu_attn_kernel;

/* Attention with a caller-provided score scratch of at least
 * cpu_attention_scratch_floats(a) floats.  Returns nothing: shapes are the
 * caller's responsibility (model/ checks them once at load).  _with: by
 * the kernels asked for (cpu_attention: CPU_ATTN_AUTO). */
size_t cpu_attention_scratch_floats(const cp_attn_args *a);
void cpu_attention(const cp_attn_args *a, float *scratch);
void cpu_attention_with(const cp_attn_args *a, float *scratch, cpu_attn_kernel kernel);
/* cpu_attention's path for any row count, export and sensitive mass:
 * query blocks, two BLAS products a head (double-precision loops in the
 * libc-only build); what a prefill runs, and decode's reference in tests.
 * a->out may be NULL when a call wants only the export or the sensitive
 * mass: then no PV product runs, and the heads' softmax rows go in one
 * pass (cpu_attn_export_rows; the export's bits are the same). */
size_t cpu_attention_general_scratch_floats(const cp_attn_args *a);
void cpu_attention_general(const cp_attn_args *a, float *scratch);
/* bf16 KV (kernels/backend.h: kv_store_bf16, place_kv_bf16) */
void cpu_kv_store_bf16(uint16_t *dst, float *src, size_t count);
void cpu_place_kv_bf16(uint16_t *k, uint16_t *k_pre, uint16_t *v, const uint16_t *src_k, const uint16_t *src_v, size_t src_ld, int n,
                       const float *cos, const float *sin, int n_kv_heads, int head_dim);

/* e^x for the softmax's x = score - max <= 0 (clamped to [-87, 0]: no
 * overflow, no subnormal scale): Cody-Waite reduction by ln 2 and a
 * degree-6 Taylor polynomial, relative error ~2e-7, four orders under the
 * bf16 rounding the probabilities then get (attn_dnnl.c; the bf16 cache's
 * direct attention).  Plain C the compiler
 * vectorizes (the f32 attention's scalar expf is most of its time). */
static inline float cpu_exp_nonpos(float x)
{
    /* fmaxf / fminf and floorf in the forms the vectorizer takes (written
     * as calls, gcc calls libm's fmaxf per element): the same value as those
     * for every float but NaN (checked over all 2^32; a NaN gives e^0,
     * where an fmaxf / fminf pair's answer depends on how the compiler
     * lowers fmaxf), and
     * trunc-then-correct is floor for |y| < 2^31 (y is in [-125, 0.5]) */
    x = x <= 0.0f ? x : 0.0f;
    x = x >= -87.0f ? x : -87.0f;
    const float y = x * 1.44269504f + 0.5f, t = (float)(int32_t)y;
    const float n = t - (t > y ? 1.0f : 0.0f); /* a select of constants: no FP op under a condition */
    float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Attention over a bf16 cache (k16/v16) read in place, for decode (and
 * batched steps: cpu_attention_decode_fits; an export or sensitive
 * mass the caller keeps on the widened path): cpu_attention_decode
 * below, bf16 rows widened a block at a time as the kernel reads them,
 * never into an f32 copy of the whole cache -- decode's bytes are the
 * cache's own, half of f32's.  Scratch of
 * cpu_attention_kv16_scratch_floats(a). */
size_t cpu_attention_kv16_scratch_floats(const cp_attn_args *a);
void cpu_attention_kv16(const cp_attn_args *a, float *scratch);

/* Decode attention: a few query rows (n <= CPU_ATTN_DECODE_N) over an f32
 * (k/v) or bf16 (k16/v16) cache, without export or sensitive mass --
 * what cpu_attention (BLAS builds) and cpu_attention_kv16 run for them.
 * Work goes over the threads by (row, KV head) pair; a pair's group of
 * query heads shares one pass over its keys; scores and softmax in f32
 * (e^x by cpu_exp_nonpos / cp_exp16_nonpos), results within f32 rounding
 * of the double-precision definition (tests/test_attn_decode.c).  Each
 * pair is computed the same way whatever else is in the call, so a row's
 * output is bit for bit its lone run's.  kernel: CPU_ATTN_AUTO (in the
 * BLAS builds, with head_dim % 16 == 0: AVX-512 where the CPU has it, else
 * AVX2 + FMA where it has those; else the portable loops), or one asked
 * for -- the backend's compute path's, a test's (AVX-512 or AVX2 only
 * where the CPU has it; CPU_ATTN_AVX2 also where it has AVX-512). */
#define CPU_ATTN_DECODE_N 16 /* up to this many query rows (decode, batched steps); more: the general path (over a bf16 cache: widened, then BLAS) */
#define CPU_ATTN_DECODE_TILE 64 /* bf16 value rows widened at a time (16 KB at head_dim 64: stays in L1) */
/* floats a (row, KV head) pair works in: scores (rows padded to whole
 * 16-key blocks), two floats a head, the widening tile */
#define CPU_ATTN_DECODE_PER(group, nk, hd) ((size_t)(group) * ((size_t)(nk) + 16) + 2 * (size_t)(group) + CPU_ATTN_DECODE_TILE * (size_t)(hd))
static inline int cpu_attention_decode_fits(const cp_attn_args *a)
{
    return a->n <= CPU_ATTN_DECODE_N && a->out; /* an export-only call: the general kernels (no output rows to write) */
}
size_t cpu_attention_decode_scratch_floats(const cp_attn_args *a);
void cpu_attention_decode(const cp_attn_args *a, float *scratch, cpu_attn_kernel kernel);
/* Decode attention of count calls (each cpu_attention_decode_fits) in one
 * parallel region over all their (call, row, KV head) pairs -- an
 * exporting call's (export or sensitive mass) rows whole, their KV heads
 * in order, as they add into one export row -- each pair's output bit for
 * bit cpu_attention_decode's.  _plan lays the work items out:
 * first[c] call c's first item (first[count] all of them: count + 1 ints),
 * off[c] its scratch's offset in floats (count); returns the scratch's
 * floats. */
size_t cpu_attention_decode_many_plan(const cp_attn_args *a, int count, int *first, size_t *off);
void cpu_attention_decode_many(const cp_attn_args *a, int count, const int *first, const size_t *off, float *scratch,
                               cpu_attn_kernel kernel);
/* Attention for any row count through the decode kernel's (row, KV head)
 * pairs, without export or sensitive mass: what the CPU backend runs for
 * every such call (BLAS builds), prefills included, so that a row's output
 * is bit for bit the same alone, at any place in a batch and in a prefill
 * chunk of any size.  A pair reads only its row's query, position and the
 * keys its row sees (cpu_attn_key_range of that row alone), never the
 * call's row count, key count or other rows; the BLAS / oneDNN products
 * of cpu_attention_general and attn_dnnl.c reduce over blocks whose edges
 * move with the chunk, and are not.  On the AVX2 kernel over an f32 cache
 * the rows go CPU_ATTN_ROW_BLOCK at a time (cpu_attn_rows_block_avx2: the
 * same bits as their pairs, each key and value block read once for a run
 * of rows).  Scratch: one pair's floats per thread (CPU_ATTN_ROW_BLOCK
 * pairs' where the rows go in blocks), cpu_attention_rows_scratch_floats(a,
 * threads, kernel) for up to `threads` OpenMP threads (omp_get_max_threads()
 * of the caller), asked with the call's own arguments and kernel. */
#ifndef CP_NO_BLAS
size_t cpu_attention_rows_scratch_floats(const cp_attn_args *a, int threads, cpu_attn_kernel kernel);
void cpu_attention_rows(const cp_attn_args *a, float *scratch, int threads, cpu_attn_kernel kernel);
#endif
/* one (row i, KV head g) pair: the portable loops (S: the pair's scratch,
 * w its last CPU_ATTN_DECODE_TILE * head_dim floats), the AVX-512 kernel
 * (attn_decode.c) and the AVX2 + FMA one (attn_decode_avx2.c) -- BLAS
 * builds on x86-64, head_dim % 16 == 0 */
void cpu_attn_decode_pair_c(const cp_attn_args *a, int i, int g, float *S, float *w);
void cpu_attn_decode_pair_avx512(const cp_attn_args *a, int i, int g, float *S, float *tile);
void cpu_attn_decode_pair_avx2(const cp_attn_args *a, int i, int g, float *S, float *tile);
/* Rows [i0, i0 + nr) (nr <= CPU_ATTN_ROW_BLOCK) of a call against KV head
 * g on an f32 cache (group <= 16 query heads a KV head), AVX2 + FMA: each
 * row's output, export and mass bit for bit its pair's
 * (cpu_attn_decode_pair_avx2) -- a key's score is its own sum, each row's
 * softmax and weighted sum run over its own range in its own order -- with
 * every block of keys and values read once for all the rows seeing the
 * same first slot (each pair streamed its KV head's whole range from L2).
 * S: CPU_ATTN_ROW_BLOCK pairs' scratch, tile its last
 * CPU_ATTN_DECODE_TILE * head_dim floats. */
#define CPU_ATTN_ROW_BLOCK 8
#define CPU_ATTN_ROW_SLACK 64
void cpu_attn_rows_block_avx2(const cp_attn_args *a, int i0, int nr, int g, float *S, float *tile);
/* The same on AVX-512, bit for bit cpu_attn_decode_pair_avx512's rows:
 * 16-key blocks of K read once for a run, each value row once for up to 8
 * (row, head) vectors. */
void cpu_attn_rows_block_avx512(const cp_attn_args *a, int i0, int nr, int g, float *S, float *tile);
/* A block kernel's run (ops_cpu.c finds them): rows [i0, i0 + m) against
 * KV head g, every one seeing slots from kl, row t up to khi[t] (> kl) --
 * the AVX2 kernel (attn_decode_avx2.c) and the AVX-512 one (attn_decode.c) */
void cpu_attn_rows_together_avx2(const cp_attn_args *a, int i0, int m, const int *khi, int kl, int g, float *S, float *tile);
void cpu_attn_rows_together_avx512(const cp_attn_args *a, int i0, int m, const int *khi, int kl, int g, float *S, float *tile);
/* The pair kernel a call at head_dim runs when k is asked for, in a BLAS
 * build on x86-64 with head_dim whole 16-lane vectors: AVX-512 where asked
 * for (or automatic) and the CPU has it, else AVX2 + FMA where asked for
 * (or automatic) and the CPU has those; otherwise the portable loops.
 * _name: how the compute line names it. */
cpu_attn_kernel cpu_attn_pair_kernel(int head_dim, cpu_attn_kernel k);
const char *cpu_attn_kernel_name(cpu_attn_kernel k);
/* The AVX-512 pair kernel's softmax, shared with the tile kernel
 * (gemm_amx_attn.c) so that both make a row's probabilities the same way:
 * row[0, nk) (scores of slots kp[0, nk)) becomes e^(s - max) over the
 * slots visible to a query at qp (k <= qp, k > lo), 0 elsewhere, summed in
 * 16 lanes in slot order; returns 1 / the sum (the range must hold a
 * visible slot). */
float cpu_attn_softmax_row16(float *row, const int32_t *kp, int nk, int32_t qp, int32_t lo);

/* Its parts, shared with the bf16 attention (attn_dnnl.c).  Query rows go
 * in blocks so the score matrix stays bounded (CPU_ATTN_QBLOCK x n_keys)
 * for long prompts.  key_range: the slots [klo, khi) some query of rows
 * [q0, q0 + nq) can see (klo >= khi: none).  softmax_rows: S [nq, nk]
 * holds the scaled scores of those rows against slots [klo, klo + nk);
 * they become probabilities (the mask applied, in f32), added to the
 * export and the sensitive mass where asked. */
#define CPU_ATTN_QBLOCK 256
/* The rows of the block that starts at query q0: at most CPU_ATTN_QBLOCK,
 * and none past a position CPU_ATTN_QBLOCK beyond q0's -- a reuse prefill's
 * computed tokens are scattered over the prompt, and one block of them all
 * would score every query against the whole cache (the causal mask then
 * throws most away); a plain prefill's contiguous rows give the same
 * blocks as before. */
int cpu_attn_block_rows(const cp_attn_args *a, int q0);
/* the export and mass row query row i adds into (cp_attn_args.export_rows;
 * negative: none) */
static inline int cpu_attn_export_dst(const cp_attn_args *a, int i) { return a->export_rows ? a->export_rows[i] : i; }
void cpu_attn_key_range(const cp_attn_args *a, int q0, int nq, int *klo, int *khi);
/* Rows [q0, q0 + nq) of one head's scores S[nq][nk] (keys klo..) become
 * probabilities over the keys each row sees (0 elsewhere), with the export
 * and the sensitive mass of cp_attn_args added; e^x by cpu_exp_nonpos /
 * cp_exp16_nonpos.  kernel: CPU_ATTN_AUTO (AVX-512 where the CPU has it),
 * or one forced for tests. */
void cpu_attn_softmax_rows(const cp_attn_args *a, float *S, int q0, int nq, int klo, int nk);
void cpu_attn_softmax_rows_kernel(const cp_attn_args *a, float *S, int q0, int nq, int klo, int nk, cpu_attn_kernel kernel);
/* The same for nh consecutive heads at once, for a call that wants only
 * the export and the sensitive mass: S[h][i][j] (nh x nq x nk) holds the
 * range's head h's scaled scores; each row's heads are added to the export
 * in head order, so calls for consecutive head ranges in order give the
 * export and the mass bit for bit as cpu_attn_softmax_rows called head
 * after head over the same block (the rows may be any consecutive part
 * of it: klo and nk are the block's).  S does not hold the probabilities
 * afterwards. */
void cpu_attn_export_rows(const cp_attn_args *a, float *S, int nh, int q0, int nq, int klo, int nk);
/* how many heads' scores of one query block an export pass takes (the
 * scratch of a call without output rows holds that many blocks) */
int cpu_attn_export_heads(const cp_attn_args *a);
void cpu_attn_export_rows_kernel(const cp_attn_args *a, float *S, int nh, int q0, int nq, int klo, int nk, cpu_attn_kernel kernel);

#endif
