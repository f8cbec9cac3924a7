/* What the AMX kernels' files share (kernels/cpu/gemm_amx*.c; gemm_amx.h
 * is their interface): the target attribute, the one tile configuration,
 * the row units both GEMMs stage their rows in, and the work-item driver
 * they run (gemm_amx_tiles.c).  Not for callers outside those files. */
#ifndef CP_GEMM_AMX_INTERNAL_H
#define CP_GEMM_AMX_INTERNAL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm_amx.h"

#define AMX_TARGET "amx-tile,amx-bf16,amx-int8,avx512f,avx512bw,avx512vl,avx512bf16"
#define AMX_FN __attribute__((target(AMX_TARGET)))

/* gcc 12's tile intrinsics are asm statements without memory operands:
 * without this the compiler may move a plain load of a tile's stored
 * bytes (or a plain store a tile load reads) across them */
#define AMX_MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

/* Staged A rows per work unit past 16 rows: whole pairs of 16-row tiles
 * (the 2 x 2 and 2 x 1 kernels), zero rows past n; at most 16 rows are
 * one tile (1 x 2, 1 x 1).  A row's tile operations are the same in
 * either (see one_tile). */
#define ROW_PAIR 32
/* bytes of staged A a row block holds: with the B panel it stays in L2
 * while every column pair of the block runs over it */
#define A_BLOCK_BYTES (1u << 20)

/* palette 1, all 8 tiles 16 rows x 64 bytes: the only shape used */
typedef struct __attribute__((aligned(64))) amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* a constant in memory: gcc 12's _tile_loadconfig names only the first 8
 * bytes as its operand, so a configuration built on the stack could lose
 * the stores to the rest */
static const amx_config tile_config = {
    .palette = 1,
    .colsb = { 64, 64, 64, 64, 64, 64, 64, 64 },
    .rows = { 16, 16, 16, 16, 16, 16, 16, 16 },
};

AMX_FN static inline void tiles_on(void)
{
    AMX_MEMORY_BARRIER();
    _tile_loadconfig(&tile_config);
}

/* Rows are computed in units of one row pair (two 16-row tiles), or, for
 * a batch of at most 16 rows, one unit of one tile: half the tile
 * products where a decode step's few rows would leave 16 of 32 rows zero.
 * Each output's chain of tile operations is the same in both (one tile
 * product per K tile, in order), so the bits are too. */
static inline int one_tile(int n) { return n <= 16; }
static inline int rows_pad(int n) { return one_tile(n) ? 16 : (n + ROW_PAIR - 1) / ROW_PAIR * ROW_PAIR; }
static inline int row_units(int n) { return one_tile(n) ? 1 : rows_pad(n) / ROW_PAIR; }

/* ---- the driver both kernels share --------------------------------------
 * Work items: (row block, column pair), row-block-major, split into one
 * contiguous run per thread.  A row block's staged A (about A_BLOCK_BYTES)
 * stays in L2 while the column pairs' B panels stream past it.  K goes in
 * chunks of KC_TILES K tiles: a chunk of a column pair's B (2 x 16 KB)
 * stays in L1 while every row pair of the block runs over it, the C tiles
 * carried from chunk to chunk in a per-thread buffer (f32 or s32 stored
 * and loaded exactly: each output's chain of tile operations is the same
 * sequence whatever the chunking).  During the last chunk the y lines the
 * tiles go to are prefetched for writing, so the epilogue's stores do not
 * wait on their reads for ownership.  A's tiles are loaded with the T1
 * hint (into L2, not L1): each is read once per chunk, and in L1 they
 * would push out the B chunk every row pair reads. */
#define KC_TILES 16
#define MAX_BLOCK_PAIRS 32

typedef struct amx_job {
    int i8;             /* 0: bf16 (f32 out), 1: int8 (u8 x s8, s32 out) */
    const char *a;      /* A tile (row tile r, K tile t): a + r a_rt + t a_kt, row stride lda */
    size_t a_rt, a_kt;
    int lda;
    const char *b;      /* B tile (column block v, K tile t): col_block(v) + t b_kt, row stride ldb */
    size_t b_kt;
    int ldb, ld;        /* ld: int8 row bytes (the panel addressing) */
    int kt, nblk, n, out, ldy, accumulate, bp;
    int claim;          /* 1: the threads claim items one at a time (decode-sized, memory-bound), 0: fixed runs */
    float *y;
    const float *bias;  /* added to each finished output (cpu_add_bias's y + b), or NULL */
    const float *sx, *sw; /* int8 epilogue */
    const int32_t *sum;
    /* bf16 SwiGLU (h != NULL): an item is one column block v of W (gate)
     * beside the same block of b_up (up), and its epilogue writes
     * silu(gate) x up, rounded to bf16, into h as the next product's A
     * tiles (row tile r, K tile v / 2, lanes 16 (v % 2) on: h + r h_rt +
     * (v / 2) 1024 + (v % 2) 32, rows 64 bytes apart) -- neither gate nor
     * up is stored.  y is not written. */
    const char *b_up;
    char *h;
    size_t h_rt;
    /* K in segments (kseg K tiles, a multiple of KC_TILES; 0: whole K):
     * see KSEG_TILES.  Fixed runs only, the job alone in its call. */
    int kseg;
} amx_job;


/* row pairs of a row block: the staged A of a block at most about
 * A_BLOCK_BYTES (at least one pair, at most MAX_BLOCK_PAIRS), then the
 * pairs spread evenly over that many blocks -- 32 pairs as 16 + 16, not
 * 18 + 14, so two threads' runs of items carry the same work */
static inline int block_pairs(size_t row_bytes, int pairs)
{
    size_t p = A_BLOCK_BYTES / (row_bytes * ROW_PAIR);
    if (p < 1) p = 1;
    if (p > MAX_BLOCK_PAIRS) p = MAX_BLOCK_PAIRS;
    if (p > (size_t)pairs) p = (size_t)pairs;
    const size_t blocks = ((size_t)pairs + p - 1) / p;
    return (int)(((size_t)pairs + blocks - 1) / blocks);
}

/* per-thread C buffer bytes: 4 tiles per row pair of a block, where K
 * takes more than one chunk */
static inline size_t carry_bytes(int kt, int bp) { return kt > KC_TILES ? (size_t)bp * 4096 : 0; }

/* A long K (down's 4864 inputs) keeps few rows in an A block of
 * A_BLOCK_BYTES (3 row pairs), so B -- the whole weight -- streams past
 * once every 96 rows.  In segments of KSEG_TILES K tiles, the block is
 * the rows' segment: more rows a block, B read fewer times.  Each thread
 * then takes a run of the column pairs, for every row block and segment
 * (for each row block: each segment: each of its column pairs), and
 * carries each pair's C tiles from one segment to the next in its own
 * buffer: every output's chain of tile operations is still one sequence
 * in K order, so the bits are whole K's. */
#define KSEG_TILES 64
static inline int kseg_of(int kt) { return kt > KSEG_TILES ? KSEG_TILES : 0; }
/* row pairs a row block holds in K segments of kseg tiles (64 bytes a row a tile) */
static inline int kseg_bp(int kseg, int pairs) { return block_pairs((size_t)kseg * 64, pairs); }
/* a thread's C buffer in K segments: its column pairs' row pairs, 4 tiles
 * each -- sized for every pair, as one thread takes them all when the
 * region runs on one */
static inline size_t kseg_carry_bytes(int nblk, int bp) { return (size_t)((nblk + 1) / 2) * (size_t)bp * 4096; }

/* thread t of nt: its run of the work items of count jobs one after
 * another (a fused GEMM's outputs: one staged A, each job its own W and
 * y), or (J->claim, called from inside a parallel region) the items it
 * claims; cb its C buffer (gemm_amx_tiles.c) */
AMX_FN void cpu_amx_run_jobs(const amx_job *J, int count, int t, int nt, char *cb);
/* CP_EINVAL, naming `what`, unless count is 1..Q8P_MAX_OUTS and src has
 * the rows its kind reads (the fused forms' shared argument check) */
cp_status cpu_amx_check_source(const q8p_src *src, int count, const char *what, cp_error *err);

#endif
