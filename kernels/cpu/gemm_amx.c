/* GEMMs on AMX tiles (gemm_amx.h says what and why).  Target attributes
 * only: the same binary runs on CPUs without AMX, where cp_amx_ready says
 * no and nothing here touches a tile. */
#define _DEFAULT_SOURCE /* syscall() for arch_prctl */
#include "gemm_amx.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../dtype.h"
#include "../q8.h"
#include "gemm_i8.h"
#include "exp_avx512.h"
#include "ops_cpu.h"
#include "peak_rate.h"

#define AMX_TARGET "amx-tile,amx-bf16,amx-int8,avx512f,avx512bw,avx512vl,avx512bf16"
#define AMX_FN __attribute__((target(AMX_TARGET)))

/* gcc 12's tile intrinsics are asm statements without memory operands:
 * without this the compiler may move a plain load of a tile's stored
 * bytes (or a plain store a tile load reads) across them */
#define AMX_MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

/* Linux's arch_prctl codes for dynamically enabled state components */
#define CP_ARCH_GET_XCOMP_PERM 0x1022
#define CP_ARCH_REQ_XCOMP_PERM 0x1023
#define CP_XFEATURE_XTILEDATA 18

/* Staged A rows per work unit past 16 rows: whole pairs of 16-row tiles
 * (the 2 x 2 and 2 x 1 kernels), zero rows past n; at most 16 rows are
 * one tile (1 x 2, 1 x 1).  A row's tile operations are the same in
 * either (see one_tile). */
#define ROW_PAIR 32
/* bytes of staged A a row block holds: with the B panel it stays in L2
 * while every column pair of the block runs over it */
#define A_BLOCK_BYTES (1u << 20)

/* ---- availability ------------------------------------------------------ */

int cp_amx_cpuid_allows(uint32_t leaf1_ecx, uint32_t leaf7_edx, uint64_t xcr0, const uint32_t palette[3], const char **why)
{
    if (!(leaf7_edx >> 24 & 1)) return *why = "cpuid: no AMX-TILE", 0;
    if (!(leaf7_edx >> 22 & 1)) return *why = "cpuid: no AMX-BF16", 0;
    if (!(leaf7_edx >> 25 & 1)) return *why = "cpuid: no AMX-INT8", 0;
    if (!(leaf1_ecx >> 27 & 1)) return *why = "cpuid: OSXSAVE off, the OS does not save extended state", 0;
    if ((xcr0 >> 17 & 3) != 3) return *why = "XCR0: the OS does not enable the tile state (XTILECFG, XTILEDATA)", 0;
    /* palette 1: eax bytes per tile (31:16), ebx max names (31:16) and
     * bytes per row (15:0), ecx max rows (15:0) */
    if ((palette[0] >> 16) < 1024 || (palette[1] >> 16) < 8 || (palette[1] & 0xffff) < 64 || (palette[2] & 0xffff) < 16)
        return *why = "cpuid leaf 0x1d: palette 1 is not 8 tiles of 16 rows x 64 bytes", 0;
    *why = "";
    return 1;
}

static void cpuid2(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

/* The one-time checks and Linux's permission for the tile data: a named,
 * process-wide singleton (the permission is the process's, asked once). */
static struct {
    pthread_once_t once;
    cp_status status;
    char why[160];
} amx_permission = { PTHREAD_ONCE_INIT, CP_EUNSUPPORTED, "not checked" };

static void amx_permission_init(void)
{
    uint32_t r0[4], r1[4], r7[4] = { 0 }, pal[3] = { 0 }, r[4];
    uint64_t xcr0 = 0;
    cpuid2(0, 0, r0);
    cpuid2(1, 0, r1);
    if (r0[0] >= 7) cpuid2(7, 0, r7);
    if (r0[0] >= 0x1d) {
        cpuid2(0x1d, 0, r);
        if (r[0] >= 1) cpuid2(0x1d, 1, r), pal[0] = r[0], pal[1] = r[1], pal[2] = r[2];
    }
    if (r1[2] >> 27 & 1) {
        uint32_t lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = (uint64_t)hi << 32 | lo;
    }
    const char *why;
    if (!cp_amx_cpuid_allows(r1[2], r7[3], xcr0, pal, &why)) {
        snprintf(amx_permission.why, sizeof amx_permission.why, "%s", why);
        return;
    }
    if (syscall(SYS_arch_prctl, CP_ARCH_REQ_XCOMP_PERM, CP_XFEATURE_XTILEDATA) != 0) {
        snprintf(amx_permission.why, sizeof amx_permission.why, "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused by the kernel");
        return;
    }
    unsigned long granted = 0;
    if (syscall(SYS_arch_prctl, CP_ARCH_GET_XCOMP_PERM, &granted) != 0 || !(granted >> CP_XFEATURE_XTILEDATA & 1)) {
        snprintf(amx_permission.why, sizeof amx_permission.why, "arch_prctl(ARCH_GET_XCOMP_PERM): XTILEDATA not granted");
        return;
    }
    amx_permission.why[0] = 0;
    amx_permission.status = CP_OK;
}

cp_status cp_amx_ready(cp_error *err)
{
    pthread_once(&amx_permission.once, amx_permission_init);
    if (amx_permission.status != CP_OK) return cp_fail(err, amx_permission.status, "AMX tiles unavailable: %s", amx_permission.why);
    return CP_OK;
}

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

AMX_FN static void tiles_on(void)
{
    AMX_MEMORY_BARRIER();
    _tile_loadconfig(&tile_config);
}

/* ---- bf16: layout ------------------------------------------------------ */

cp_status cp_amx_bf16_layout_of(int out, int in, cp_amx_bf16_layout *layout, cp_error *err)
{
    if (out < 1 || in < 1 || out > INT32_MAX - 15 || in > INT32_MAX - 31)
        return cp_fail(err, CP_EINVAL, "amx bf16 layout: matrix [%d x %d] out of range", out, in);
    cp_amx_bf16_layout L = { .out = out, .in = in, .out_pad = (out + 15) & ~15, .in_pad = (in + 31) & ~31 };
    size_t e;
    if (!cp_mul_size((size_t)L.out_pad, (size_t)L.in_pad, &e) || !cp_mul_size(e, 2, &L.bytes))
        return cp_fail(err, CP_EINVAL, "amx bf16 layout: matrix [%d x %d] too large", out, in);
    *layout = L;
    return CP_OK;
}

/* element (j, k) of W in the packed buffer, in bf16 elements */
static size_t packed_at(const cp_amx_bf16_layout *L, int j, int k)
{
    return ((size_t)(j / 16) * (size_t)(L->in_pad / 32) + (size_t)(k / 32)) * 512 + (size_t)((k % 32) / 2) * 32 + (size_t)(j % 16) * 2 +
           (size_t)(k % 2);
}

void cp_amx_bf16_pack_into(void *dst, const uint16_t *w, const cp_amx_bf16_layout *L)
{
    uint16_t *d = dst;
    memset(d, 0, L->bytes); /* the padding: columns past out, inputs past in */
    for (int j = 0; j < L->out; j++)
        for (int k = 0; k < L->in; k++) d[packed_at(L, j, k)] = w[(size_t)j * L->in + k];
}

cp_status cp_amx_bf16_pack(const uint16_t *w, int out, int in, void **packed, cp_amx_bf16_layout *layout, cp_error *err)
{
    cp_amx_bf16_layout L;
    cp_status s = cp_amx_bf16_layout_of(out, in, &L, err);
    if (s) return s;
    void *p = aligned_alloc(64, L.bytes); /* a multiple of 1 KB: aligned_alloc's size rule holds */
    if (!p) return cp_fail(err, CP_ENOMEM, "amx bf16 pack: %zu bytes for a [%d x %d] matrix", L.bytes, out, in);
    cp_amx_bf16_pack_into(p, w, &L);
    *packed = p, *layout = L;
    return CP_OK;
}

void cp_amx_bf16_unpack(uint16_t *dst, const void *packed, const cp_amx_bf16_layout *L)
{
    const uint16_t *s = packed;
    for (int j = 0; j < L->out; j++)
        for (int k = 0; k < L->in; k++) dst[(size_t)j * L->in + k] = s[packed_at(L, j, k)];
}

void cp_amx_bf16_rows(float *dst, const void *packed, const cp_amx_bf16_layout *L, const int32_t *ids, int n)
{
    const uint16_t *s = packed;
    for (int i = 0; i < n; i++) {
        float *o = dst + (size_t)i * L->in;
        for (int k = 0; k < L->in; k++) {
            const uint32_t u = (uint32_t)s[packed_at(L, ids[i], k)] << 16; /* bf16 -> f32: exact */
            memcpy(&o[k], &u, 4);
        }
    }
}

/* Rows are computed in units of one row pair (two 16-row tiles), or, for
 * a batch of at most 16 rows, one unit of one tile: half the tile
 * products where a decode step's few rows would leave 16 of 32 rows zero.
 * Each output's chain of tile operations is the same in both (one tile
 * product per K tile, in order), so the bits are too. */
static int one_tile(int n) { return n <= 16; }
static int rows_pad(int n) { return one_tile(n) ? 16 : (n + ROW_PAIR - 1) / ROW_PAIR * ROW_PAIR; }
static int row_units(int n) { return one_tile(n) ? 1 : rows_pad(n) / ROW_PAIR; }

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
    float *y;
    const float *sx, *sw; /* int8 epilogue */
    const int32_t *sum;
} amx_job;

static const char *col_block(const amx_job *J, int v)
{
    if (J->i8) return J->b + (size_t)(v / 3) * CP_Q8_PANEL_COLS * (size_t)J->ld + (size_t)(v % 3) * 64;
    return J->b + (size_t)v * (size_t)J->kt * 1024;
}

/* row pairs of a row block: the staged A of a block at most about
 * A_BLOCK_BYTES (at least one pair, at most MAX_BLOCK_PAIRS), then the
 * pairs spread evenly over that many blocks -- 32 pairs as 16 + 16, not
 * 18 + 14, so two threads' runs of items carry the same work */
static int block_pairs(size_t row_bytes, int pairs)
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
static size_t carry_bytes(int kt, int bp) { return kt > KC_TILES ? (size_t)bp * 4096 : 0; }

/* up to 3 lines of y row r (32 floats from pf) asked for writing */
#define PREFETCH_ROWS(t, nt)                                                                        \
    for (int r_ = (t); r_ < pfrows; r_ += (nt)) {                                                   \
        const char *p_ = pf + (size_t)r_ * ldpf;                                                    \
        __builtin_prefetch(p_, 1, 3), __builtin_prefetch(p_ + 64, 1, 3), __builtin_prefetch(p_ + 124, 1, 3); \
    }

/* Two row tiles x two column blocks (C in tmm0..3: row tile h, block v in
 * tmm(2h + v)), nt K tiles from zero (cin NULL) or from the 4 tiles at
 * cin; the result stored to cout (4 x 1 KB).  DP: the tile product. */
#define MICRO_2X2(NAME, DP)                                                                                               \
    AMX_FN static void NAME(const char *a0, const char *a1, int lda, size_t akt, const char *b0, const char *b1, int ldb,  \
                            size_t bkt, int nt, const char *cin, char *cout, const char *pf, size_t ldpf, int pfrows)       \
    {                                                                                                                     \
        if (cin) {                                                                                                        \
            _tile_loadd(0, cin, 64);                                                                                      \
            _tile_loadd(1, cin + 1024, 64);                                                                               \
            _tile_loadd(2, cin + 2048, 64);                                                                               \
            _tile_loadd(3, cin + 3072, 64);                                                                               \
        } else {                                                                                                          \
            _tile_zero(0);                                                                                                \
            _tile_zero(1);                                                                                                \
            _tile_zero(2);                                                                                                \
            _tile_zero(3);                                                                                                \
        }                                                                                                                 \
        for (int t = 0; t < nt; t++) {                                                                                    \
            PREFETCH_ROWS(t, nt)                                                                                          \
            _tile_stream_loadd(4, a0 + (size_t)t * akt, lda);                                                             \
            _tile_loadd(6, b0 + (size_t)t * bkt, ldb);                                                                    \
            _tile_loadd(7, b1 + (size_t)t * bkt, ldb);                                                                    \
            DP(0, 4, 6);                                                                                                  \
            DP(1, 4, 7);                                                                                                  \
            _tile_stream_loadd(5, a1 + (size_t)t * akt, lda);                                                             \
            DP(2, 5, 6);                                                                                                  \
            DP(3, 5, 7);                                                                                                  \
        }                                                                                                                 \
        _tile_stored(0, cout, 64);                                                                                        \
        _tile_stored(1, cout + 1024, 64);                                                                                 \
        _tile_stored(2, cout + 2048, 64);                                                                                 \
        _tile_stored(3, cout + 3072, 64);                                                                                 \
        AMX_MEMORY_BARRIER();                                                                                             \
    }

/* the same for one column block (the last of an odd count): tmm0, tmm2 */
#define MICRO_2X1(NAME, DP)                                                                                               \
    AMX_FN static void NAME(const char *a0, const char *a1, int lda, size_t akt, const char *b0, int ldb, size_t bkt,      \
                            int nt, const char *cin, char *cout, const char *pf, size_t ldpf, int pfrows)                   \
    {                                                                                                                     \
        if (cin) {                                                                                                        \
            _tile_loadd(0, cin, 64);                                                                                      \
            _tile_loadd(2, cin + 2048, 64);                                                                               \
        } else {                                                                                                          \
            _tile_zero(0);                                                                                                \
            _tile_zero(2);                                                                                                \
        }                                                                                                                 \
        for (int t = 0; t < nt; t++) {                                                                                    \
            PREFETCH_ROWS(t, nt)                                                                                          \
            _tile_stream_loadd(4, a0 + (size_t)t * akt, lda);                                                             \
            _tile_loadd(6, b0 + (size_t)t * bkt, ldb);                                                                    \
            DP(0, 4, 6);                                                                                                  \
            _tile_stream_loadd(5, a1 + (size_t)t * akt, lda);                                                             \
            DP(2, 5, 6);                                                                                                  \
        }                                                                                                                 \
        _tile_stored(0, cout, 64);                                                                                        \
        _tile_stored(2, cout + 2048, 64);                                                                                 \
        AMX_MEMORY_BARRIER();                                                                                             \
    }

/* one row tile (a batch of at most 16 rows) x two or one column blocks:
 * C in tmm0 (block 0) and tmm1 (block 1), at cout's first two tiles.  A's
 * tile is loaded into L1 here: it is the same few rows for every column
 * pair. */
#define MICRO_1X2(NAME, DP)                                                                                               \
    AMX_FN static void NAME(const char *a0, int lda, size_t akt, const char *b0, const char *b1, int ldb, size_t bkt, int nt, \
                            const char *cin, char *cout, const char *pf, size_t ldpf, int pfrows)                           \
    {                                                                                                                     \
        if (cin) {                                                                                                        \
            _tile_loadd(0, cin, 64);                                                                                      \
            _tile_loadd(1, cin + 1024, 64);                                                                               \
        } else {                                                                                                          \
            _tile_zero(0);                                                                                                \
            _tile_zero(1);                                                                                                \
        }                                                                                                                 \
        for (int t = 0; t < nt; t++) {                                                                                    \
            PREFETCH_ROWS(t, nt)                                                                                          \
            _tile_loadd(4, a0 + (size_t)t * akt, lda);                                                                    \
            _tile_loadd(6, b0 + (size_t)t * bkt, ldb);                                                                    \
            _tile_loadd(7, b1 + (size_t)t * bkt, ldb);                                                                    \
            DP(0, 4, 6);                                                                                                  \
            DP(1, 4, 7);                                                                                                  \
        }                                                                                                                 \
        _tile_stored(0, cout, 64);                                                                                        \
        _tile_stored(1, cout + 1024, 64);                                                                                 \
        AMX_MEMORY_BARRIER();                                                                                             \
    }

#define MICRO_1X1(NAME, DP)                                                                                               \
    AMX_FN static void NAME(const char *a0, int lda, size_t akt, const char *b0, int ldb, size_t bkt, int nt,              \
                            const char *cin, char *cout, const char *pf, size_t ldpf, int pfrows)                           \
    {                                                                                                                     \
        if (cin) _tile_loadd(0, cin, 64);                                                                                 \
        else _tile_zero(0);                                                                                               \
        for (int t = 0; t < nt; t++) {                                                                                    \
            PREFETCH_ROWS(t, nt)                                                                                          \
            _tile_loadd(4, a0 + (size_t)t * akt, lda);                                                                    \
            _tile_loadd(6, b0 + (size_t)t * bkt, ldb);                                                                    \
            DP(0, 4, 6);                                                                                                  \
        }                                                                                                                 \
        _tile_stored(0, cout, 64);                                                                                        \
        AMX_MEMORY_BARRIER();                                                                                             \
    }

#define DP_BF16(c, a, b) _tile_dpbf16ps(c, a, b)
#define DP_I8(c, a, b) _tile_dpbusd(c, a, b)
MICRO_2X2(bf16_2x2, DP_BF16)
MICRO_2X1(bf16_2x1, DP_BF16)
MICRO_2X2(i8_2x2, DP_I8)
MICRO_2X1(i8_2x1, DP_I8)
MICRO_1X2(bf16_1x2, DP_BF16)
MICRO_1X1(bf16_1x1, DP_BF16)
MICRO_1X2(i8_1x2, DP_I8)
MICRO_1X1(i8_1x1, DP_I8)

/* a C tile (16 x 16 f32 at c) into y's rows [0, rows) and columns
 * [0, cols): y = acc, or y + acc */
AMX_FN static void put_f32(float *y, int ldy, const float *c, int rows, int cols, int accumulate)
{
    const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    for (int r = 0; r < rows; r++) {
        float *yo = y + (size_t)r * ldy;
        __m512 v = _mm512_load_ps(c + 16 * r);
        if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), v);
        _mm512_mask_storeu_ps(yo, m, v);
    }
}

/* a C tile (16 x 16 s32) into y: (float)(acc - 128 sum_j) (s_x[i] s_w[j]),
 * + y when accumulating -- gemm_i8_prefill.c's expression, operation for
 * operation, so the bits are its */
AMX_FN static void put_i8(float *y, int ldy, const int32_t *c, int rows, int cols, const float *sx, const float *sw, const int32_t *sum,
                          int accumulate)
{
    const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    const __m512i bias = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, sum), 7);
    const __m512 swv = _mm512_maskz_loadu_ps(m, sw);
    for (int r = 0; r < rows; r++) {
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(c + 16 * r), bias)),
                                 _mm512_mul_ps(_mm512_set1_ps(sx[r]), swv));
        float *yo = y + (size_t)r * ldy;
        if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), v);
        _mm512_mask_storeu_ps(yo, m, v);
    }
}

/* thread t of nt: its run of work items; cb its C buffer */
AMX_FN static void run_items(const amx_job *J, int t, int nt, char *cb)
{
    const int pairs = row_units(J->n), one = one_tile(J->n), nmb = (pairs + J->bp - 1) / J->bp, ncp = (J->nblk + 1) / 2;
    const int nch = (J->kt + KC_TILES - 1) / KC_TILES;
    const long items = (long)nmb * ncp, i0 = items * t / nt, i1 = items * (t + 1) / nt;
    if (i0 >= i1) return;
    char c[4096] __attribute__((aligned(64)));
    tiles_on();
    AMX_MEMORY_BARRIER();
    for (long it = i0; it < i1; it++) {
        const int mb = (int)(it / ncp), v0 = 2 * (int)(it % ncp), two = v0 + 1 < J->nblk;
        const int p0 = mb * J->bp, p1 = p0 + J->bp < pairs ? p0 + J->bp : pairs;
        const char *b0 = col_block(J, v0), *b1 = two ? col_block(J, v0 + 1) : NULL;
        for (int ch = 0; ch < nch; ch++) {
            const int t0 = ch * KC_TILES, ntk = J->kt - t0 < KC_TILES ? J->kt - t0 : KC_TILES, last = ch == nch - 1;
            for (int p = p0; p < p1; p++) {
                const char *a0 = J->a + (size_t)(2 * p) * J->a_rt + (size_t)t0 * J->a_kt, *a1 = one ? a0 : a0 + J->a_rt;
                const char *bb0 = b0 + (size_t)t0 * J->b_kt, *bb1 = two ? b1 + (size_t)t0 * J->b_kt : NULL;
                const char *cin = ch ? cb + (size_t)(p - p0) * 4096 : NULL;
                char *cout = last ? c : cb + (size_t)(p - p0) * 4096;
                const int r0 = 32 * p, rows = J->n - r0 < 32 ? J->n - r0 : 32;
                const char *pf = last ? (const char *)(J->y + (size_t)r0 * J->ldy + 16 * v0) : NULL;
                const int pfrows = last ? rows : 0;
                const size_t ldpf = (size_t)J->ldy * 4;
                if (J->i8) {
                    if (one && two) i8_1x2(a0, J->lda, J->a_kt, bb0, bb1, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                    else if (one) i8_1x1(a0, J->lda, J->a_kt, bb0, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                    else if (two) i8_2x2(a0, a1, J->lda, J->a_kt, bb0, bb1, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                    else i8_2x1(a0, a1, J->lda, J->a_kt, bb0, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                } else {
                    if (one && two) bf16_1x2(a0, J->lda, J->a_kt, bb0, bb1, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                    else if (one) bf16_1x1(a0, J->lda, J->a_kt, bb0, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                    else if (two) bf16_2x2(a0, a1, J->lda, J->a_kt, bb0, bb1, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                    else bf16_2x1(a0, a1, J->lda, J->a_kt, bb0, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                }
                if (!last) continue;
                for (int h = 0; h < 2 && 16 * h < rows; h++) {
                    const int rr = rows - 16 * h < 16 ? rows - 16 * h : 16;
                    for (int v = 0; v < 1 + two; v++) {
                        const int j0 = 16 * (v0 + v), cols = J->out - j0 < 16 ? J->out - j0 : 16;
                        float *yo = J->y + (size_t)(r0 + 16 * h) * J->ldy + j0;
                        const char *ct = c + (size_t)(2 * h + v) * 1024;
                        if (J->i8)
                            put_i8(yo, J->ldy, (const int32_t *)(const void *)ct, rr, cols, J->sx + r0 + 16 * h, J->sw + j0, J->sum + j0,
                                   J->accumulate);
                        else put_f32(yo, J->ldy, (const float *)(const void *)ct, rr, cols, J->accumulate);
                    }
                }
            }
        }
    }
    _tile_release();
}

/* ---- bf16 -------------------------------------------------------------- */

/* staged A: [rows_pad / 16][in_pad / 32][16 rows][32 bf16], each (row
 * tile, K tile) one contiguous 1 KB A tile; then the threads' C buffers */
static size_t bf16_a_bytes(int n, const cp_amx_bf16_layout *L) { return (size_t)rows_pad(n) * (size_t)L->in_pad * 2; }
static int bf16_bp(int n, const cp_amx_bf16_layout *L) { return block_pairs((size_t)L->in_pad * 2, row_units(n)); }

size_t cp_amx_bf16_scratch(int n, const cp_amx_bf16_layout *L, int threads)
{
    return bf16_a_bytes(n, L) + (size_t)threads * carry_bytes(L->in_pad / 32, bf16_bp(n, L));
}

/* row i of x into the staged A: f32 rounded to bf16 (nearest even, as
 * bf16p's round_row) or bf16 copied, zeros past in and for rows past n */
AMX_FN static void stage_row(uint16_t *a, int i, int n, const float *xf, const uint16_t *xb, int ldx, int in, int kt)
{
    uint16_t *base = a + ((size_t)(i / 16) * (size_t)kt * 16 + (size_t)(i % 16)) * 32;
    for (int t = 0; t < kt; t++) {
        uint16_t *d = base + (size_t)t * 512;
        const int k = 32 * t, left = i < n ? in - k : 0;
        const __mmask32 m = left >= 32 ? ~(__mmask32)0 : left > 0 ? (__mmask32)((1u << left) - 1) : 0;
        if (xf) {
            const float *s = left > 0 ? xf + (size_t)i * ldx + k : xf;
            const __m256bh lo = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps((__mmask16)m, s));
            const __m256bh hi = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps((__mmask16)(m >> 16), s + 16));
            _mm256_store_si256((__m256i *)(void *)d, (__m256i)lo);
            _mm256_store_si256((__m256i *)(void *)(d + 16), (__m256i)hi);
        } else _mm512_store_si512(d, _mm512_maskz_loadu_epi16(m, left > 0 ? xb + (size_t)i * ldx + k : xb));
    }
}

AMX_FN static void bf16_run(float *y, int ldy, const float *xf, const uint16_t *xb, int ldx, const void *wp, const cp_amx_bf16_layout *L,
                            int n, int accumulate, void *scratch, int threads)
{
    uint16_t *a = scratch;
    const int kt = L->in_pad / 32, npad = rows_pad(n), bp = bf16_bp(n, L);
    char *carry = (char *)scratch + bf16_a_bytes(n, L);
    const amx_job J = { .i8 = 0, .a = scratch, .a_rt = (size_t)kt * 1024, .a_kt = 1024, .lda = 64, .b = wp, .b_kt = 1024, .ldb = 64,
                        .kt = kt, .nblk = L->out_pad / 16, .n = n, .out = L->out, .ldy = ldy, .accumulate = accumulate, .bp = bp, .y = y };
#pragma omp parallel num_threads(threads) if ((long)npad * L->out_pad * L->in_pad >= (1L << 21))
    {
#pragma omp for schedule(static)
        for (int i = 0; i < npad; i++) stage_row(a, i, n, xf, xb, ldx, L->in, kt);
        const int t = omp_get_thread_num();
        run_items(&J, t, omp_get_num_threads(), carry + (size_t)t * carry_bytes(kt, bp));
    }
}

static cp_status bf16_check(const cp_amx_bf16_layout *L, int n, int threads, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s) return s;
    if (!L || L->out < 1 || L->in < 1 || L->out_pad != ((L->out + 15) & ~15) || L->in_pad != ((L->in + 31) & ~31))
        return cp_fail(err, CP_EINVAL, "amx bf16 gemm: the layout is not one cp_amx_bf16_layout_of made");
    if (n < 1 || n > INT32_MAX - ROW_PAIR || threads < 1) return cp_fail(err, CP_EINVAL, "amx bf16 gemm: %d rows, %d threads", n, threads);
    return CP_OK;
}

cp_status cp_amx_bf16_gemm(float *y, int ldy, const float *x, const void *wp, const cp_amx_bf16_layout *L, int n, int accumulate,
                           void *scratch, int threads, cp_error *err)
{
    cp_status s = bf16_check(L, n, threads, err);
    if (s) return s;
    bf16_run(y, ldy, x, NULL, L->in, wp, L, n, accumulate, scratch, threads);
    return CP_OK;
}

cp_status cp_amx_bf16_gemm_bx(float *y, int ldy, const uint16_t *x, int ldx, const void *wp, const cp_amx_bf16_layout *L, int n,
                              int accumulate, void *scratch, int threads, cp_error *err)
{
    cp_status s = bf16_check(L, n, threads, err);
    if (s) return s;
    bf16_run(y, ldy, NULL, x, ldx, wp, L, n, accumulate, scratch, threads);
    return CP_OK;
}

/* ---- int8 ---------------------------------------------------------------
 * scratch: the row scales (rows_pad(n) floats, 64-aligned), then the
 * quantized rows, row-major, rows_pad(n) x ld bytes (rows past n zero):
 * the A tile of row tile r, K tile t is 16 rows of 64 bytes at
 * xq + 16 r ld + 64 t, stride ld; then the threads' C buffers.  B tiles
 * of the panel order: vector v (16 columns), K tile t at
 * data + v/3 48 ld + t 16 192 + (v % 3) 64, stride 192. */
#define I8_BSTRIDE (CP_Q8_PANEL_COLS * 4)

static size_t i8_head_bytes(int n, int in) { return cp_q8_round64((size_t)rows_pad(n) * 4) + (size_t)rows_pad(n) * (size_t)cp_q8_ld(in); }
static int i8_bp(int n, int in) { return block_pairs((size_t)cp_q8_ld(in), row_units(n)); }

size_t cp_amx_i8_scratch(int n, int in, int threads) { return i8_head_bytes(n, in) + (size_t)threads * carry_bytes(cp_q8_ld(in) / 64, i8_bp(n, in)); }

AMX_FN static void i8_run(float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate, void *scratch, int threads)
{
    const int ld = cp_q8_ld(in), kt = ld / 64, npad = rows_pad(n), bp = i8_bp(n, in);
    float *sx = scratch;
    uint8_t *xq = (uint8_t *)scratch + cp_q8_round64((size_t)npad * 4);
    char *carry = (char *)scratch + i8_head_bytes(n, in);
    const amx_job J = { .i8 = 1, .a = (const char *)xq, .a_rt = (size_t)16 * ld, .a_kt = 64, .lda = ld, .b = (const char *)cp_q8_data(w),
                        .b_kt = (size_t)16 * I8_BSTRIDE, .ldb = I8_BSTRIDE, .ld = ld, .kt = kt, .nblk = (out + 15) / 16, .n = n, .out = out,
                        .ldy = ldy, .accumulate = accumulate, .bp = bp, .y = y, .sx = sx, .sw = cp_q8_scales(w), .sum = cp_q8_sums(w) };
#pragma omp parallel num_threads(threads) if ((long)npad * out * ld >= (1L << 22))
    {
#pragma omp for schedule(static)
        for (int i = 0; i < npad; i++) {
            if (i < n) sx[i] = q8_quantize_row_u8(x + (size_t)i * in, in, ld, xq + (size_t)i * ld);
            else memset(xq + (size_t)i * ld, 0, (size_t)ld), sx[i] = 0;
        }
        const int t = omp_get_thread_num();
        run_items(&J, t, omp_get_num_threads(), carry + (size_t)t * carry_bytes(kt, bp));
    }
}

cp_status cp_amx_i8_gemm(float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate, void *scratch,
                         int threads, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s) return s;
    if (n < 1 || n > INT32_MAX - ROW_PAIR || threads < 1) return cp_fail(err, CP_EINVAL, "amx int8 gemm: %d rows, %d threads", n, threads);
    if (!cp_q8_matches(w, out, in))
        return cp_fail(err, CP_EINVAL, "amx int8 gemm: the weight is not a q8 blob of [%d x %d]", out, in);
    if (cp_q8_layout(w) != CP_Q8_PANELS)
        return cp_fail(err, CP_EINVAL, "amx int8 gemm: the [%d x %d] weight is row-major; the tiles read the panel layout (cp_q8_pack_blob)",
                       out, in);
    i8_run(y, ldy, x, w, n, in, out, accumulate, scratch, threads);
    return CP_OK;
}

/* ---- attention ----------------------------------------------------------
 * Per query block (q0, nq rows, key slots [klo, khi) some row sees, klo
 * taken down to a multiple of 32): scratch holds Q staged for every head
 * ([head][nq_pad / 16][hd / 32][16][32] bf16), K packed per KV head as
 * the B operand of Q K^T ([key block of 16][hd / 32][16 dim pairs][16
 * keys][2]), V packed per KV head as the B operand of P V ([dim block of
 * 16][key tile of 32][16 key pairs][16 dims][2]), then per thread the
 * scores (nq_pad x nk f32) and P staged as A tiles ([nq_pad / 16][nk_pad
 * / 32][16][32] bf16). */
static size_t attn_round64(size_t b) { return (b + 63) & ~(size_t)63; }

typedef struct attn_plan {
    int nq_pad, nk_max_pad; /* the largest block's */
    size_t q_bytes, k_bytes, v_bytes, s_bytes, p_bytes;
} attn_plan;

static void attn_plan_of(const cp_attn_args *a, attn_plan *P)
{
    const int hd = a->head_dim;
    P->nq_pad = ((a->n < CPU_ATTN_QBLOCK ? a->n : CPU_ATTN_QBLOCK) + 15) & ~15;
    P->nk_max_pad = ((a->n_keys + 31) & ~31) + 32; /* klo taken down to 32 adds up to 31 slots */
    P->q_bytes = attn_round64((size_t)a->n_heads * P->nq_pad * hd * 2);
    P->k_bytes = attn_round64((size_t)a->n_kv_heads * P->nk_max_pad * hd * 2);
    P->v_bytes = P->k_bytes;
    P->s_bytes = attn_round64((size_t)P->nq_pad * P->nk_max_pad * 4);
    P->p_bytes = attn_round64((size_t)P->nq_pad * P->nk_max_pad * 2);
}

size_t cp_amx_attn_scratch(const cp_attn_args *a, int threads)
{
    attn_plan P;
    attn_plan_of(a, &P);
    return P.q_bytes + P.k_bytes + P.v_bytes + (size_t)threads * (P.s_bytes + P.p_bytes);
}

/* 16 values of row `row` (f32 or bf16 source, element offset off, count
 * valid of them) rounded to bf16 into d */
AMX_FN static void bf16_16(uint16_t *d, const float *f, const uint16_t *h, size_t off, int valid)
{
    const __mmask16 m = valid >= 16 ? (__mmask16)0xffff : valid > 0 ? (__mmask16)((1u << valid) - 1) : 0;
    if (f) _mm256_storeu_si256((__m256i *)(void *)d, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, valid > 0 ? f + off : f)));
    else _mm256_storeu_si256((__m256i *)(void *)d, _mm256_maskz_loadu_epi16(m, valid > 0 ? h + off : h));
}

/* element (r, c) of a bf16 source matrix with row stride ld (f32 or bf16) */
static uint16_t src_bf16(const float *f, const uint16_t *h, size_t at) { return f ? cp_f32_to_bf16(f[at]) : h[at]; }

/* One row's probabilities over slots [klo, klo + nk) in place (S's row of
 * scaled scores): the f32 path's mask (a slot is visible when its position
 * is at most the query's and, with a window, within it) and softmax, with
 * the vector exponential (cp_exp16_nonpos, relative error ~2e-7, far
 * inside the bf16 rounding P gets next) and the sum in 16 f32 lanes by
 * slot modulo 16 -- klo is a multiple of 32, so a slot's lane is the same
 * in every block -- reduced in a fixed order: a row's probabilities do not
 * depend on its block.  No visible slot: zeros, as the f32 path. */
AMX_FN static void attn_softmax_row(const cp_attn_args *a, float *row, int32_t qp, int klo, int nk)
{
    const __m512i vq = _mm512_set1_epi32(qp), vw = _mm512_set1_epi32(qp - a->window);
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 m = nk - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512i kp = _mm512_maskz_loadu_epi32(m, a->k_pos + klo + j);
        __mmask16 vis = _mm512_mask_cmple_epi32_mask(m, kp, vq);
        if (a->window) vis = _mm512_mask_cmpgt_epi32_mask(vis, kp, vw);
        mx = _mm512_mask_max_ps(mx, vis, mx, _mm512_maskz_loadu_ps(m, row + j));
    }
    const float top = _mm512_reduce_max_ps(mx);
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 m = nk - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512i kp = _mm512_maskz_loadu_epi32(m, a->k_pos + klo + j);
        __mmask16 vis = _mm512_mask_cmple_epi32_mask(m, kp, vq);
        if (a->window) vis = _mm512_mask_cmpgt_epi32_mask(vis, kp, vw);
        const __m512 e = top == -INFINITY ? _mm512_setzero_ps()
                                          : _mm512_maskz_mov_ps(vis, cp_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), _mm512_set1_ps(top))));
        _mm512_mask_storeu_ps(row + j, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    const float total = _mm512_reduce_add_ps(sum), inv = total > 0 ? 1.0f / total : 0.0f;
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 m = nk - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - j)) - 1);
        _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), _mm512_set1_ps(inv)));
    }
}

AMX_FN static void attn_block(const cp_attn_args *a, const attn_plan *P, char *scratch, int threads, int q0, int nq)
{
    const int hd = a->head_dim, dt = hd / 32, group = a->n_heads / a->n_kv_heads;
    const int qld = a->n_heads * hd, kld = a->n_kv_heads * hd, nqp = (nq + 15) & ~15, nqt = nqp / 16;
    int klo, khi;
    cpu_attn_key_range(a, q0, nq, &klo, &khi);
    if (klo >= khi) { /* no key visible to any row: zeros, as the f32 path */
        for (int i = 0; i < nq; i++) memset(a->out + (size_t)(q0 + i) * qld, 0, (size_t)qld * sizeof(float));
        return;
    }
    klo &= ~31;
    const int nk = khi - klo, nkp = (nk + 31) & ~31, nkb = (nk + 15) / 16, nkt = nkp / 32; /* S: the blocks holding slots; P V: whole tiles */
    const float scale = 1.0f / sqrtf((float)hd);
    uint16_t *qs = (uint16_t *)(void *)scratch, *ks = (uint16_t *)(void *)(scratch + P->q_bytes),
             *vs = (uint16_t *)(void *)(scratch + P->q_bytes + P->k_bytes);
    char *per_thread = scratch + P->q_bytes + P->k_bytes + P->v_bytes;
    const float *kf = a->k16 ? NULL : a->k, *vf = a->k16 ? NULL : a->v;
#pragma omp parallel num_threads(threads)
    {
        /* Q: row i of head h, 32 dims a tile */
#pragma omp for schedule(static) collapse(2)
        for (int h = 0; h < a->n_heads; h++)
            for (int i = 0; i < nqp; i++)
                for (int t = 0; t < dt; t++) {
                    uint16_t *d = qs + ((((size_t)h * nqt + i / 16) * dt + t) * 16 + i % 16) * 32;
                    const size_t off = (size_t)(q0 + i) * qld + (size_t)h * hd + 32 * t;
                    bf16_16(d, a->q, NULL, off, i < nq ? 16 : 0);
                    bf16_16(d + 16, a->q, NULL, off + 16, i < nq ? 16 : 0);
                }
        /* K: key slot klo + j as column j % 16 of key block j / 16, its
         * dims in pairs down the tile; V: dim c as column c % 16 of dim
         * block c / 16, key slots in pairs down the tile (slots past khi
         * zero) */
#pragma omp for schedule(static) collapse(2)
        for (int g = 0; g < a->n_kv_heads; g++)
            for (int j = 0; j < nkp; j++) {
                const int have = j < nk;
                const size_t row = (size_t)(klo + j) * kld + (size_t)g * hd;
                uint16_t *kb = ks + (size_t)g * P->nk_max_pad * hd;
                uint16_t *vb = vs + (size_t)g * P->nk_max_pad * hd;
                for (int c = 0; c < hd; c++) {
                    kb[(((size_t)(j / 16) * dt + c / 32) * 16 + (c % 32) / 2) * 32 + (j % 16) * 2 + c % 2] =
                        have ? src_bf16(kf, a->k16, row + c) : 0;
                    vb[(((size_t)(c / 16) * nkt + j / 32) * 16 + (j % 32) / 2) * 32 + (c % 16) * 2 + j % 2] =
                        have ? src_bf16(vf, a->v16, row + c) : 0;
                }
            }
        const int tid = omp_get_thread_num();
        float *S = (float *)(void *)(per_thread + (size_t)tid * (P->s_bytes + P->p_bytes));
        uint16_t *pa = (uint16_t *)(void *)((char *)S + P->s_bytes);
        char c[1024] __attribute__((aligned(64)));
        int on = 0;
#pragma omp for schedule(static)
        for (int h = 0; h < a->n_heads; h++) {
            if (!on) tiles_on(), on = 1;
            AMX_MEMORY_BARRIER();
            const int g = h / group;
            const char *qa = (const char *)(qs + (size_t)h * nqt * dt * 512);
            const char *kb = (const char *)(ks + (size_t)g * P->nk_max_pad * hd), *vb = (const char *)(vs + (size_t)g * P->nk_max_pad * hd);
            /* S = scale Q K^T: rows of the block against its key slots */
            for (int rt = 0; rt < nqt; rt++)
                for (int b = 0; b < nkb; b++) {
                    bf16_1x1(qa + (size_t)rt * dt * 1024, 64, 1024, kb + (size_t)b * dt * 1024, 64, 1024, dt, NULL, c, NULL, 0, 0);
                    const int rows = nq - 16 * rt < 16 ? nq - 16 * rt : 16, cols = nk - 16 * b < 16 ? nk - 16 * b : 16;
                    for (int r = 0; r < rows; r++) {
                        const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
                        _mm512_mask_storeu_ps(S + (size_t)(16 * rt + r) * nk + 16 * b, m,
                                              _mm512_mul_ps(_mm512_load_ps((const float *)(const void *)c + 16 * r), _mm512_set1_ps(scale)));
                    }
                }
            for (int i = 0; i < nq; i++) attn_softmax_row(a, S + (size_t)i * nk, a->q_pos[q0 + i], klo, nk);
            /* P as A tiles: row i, key slot j (zeros past nk and for rows past nq) */
            for (int i = 0; i < nqp; i++)
                for (int t = 0; t < nkt; t++) {
                    uint16_t *d = pa + (((size_t)(i / 16) * nkt + t) * 16 + i % 16) * 32;
                    const int valid = i < nq ? nk - 32 * t : 0;
                    bf16_16(d, S, NULL, (size_t)i * nk + 32 * t, valid);
                    bf16_16(d + 16, S, NULL, (size_t)i * nk + 32 * t + 16, valid - 16);
                }
            AMX_MEMORY_BARRIER();
            /* O = P V: every key tile in slot order, from zero */
            for (int rt = 0; rt < nqt; rt++)
                for (int db = 0; db < hd / 16; db++) {
                    bf16_1x1((const char *)pa + (size_t)rt * nkt * 1024, 64, 1024, vb + (size_t)db * nkt * 1024, 64, 1024, nkt, NULL, c,
                             NULL, 0, 0);
                    const int rows = nq - 16 * rt < 16 ? nq - 16 * rt : 16;
                    put_f32(a->out + (size_t)(q0 + 16 * rt) * qld + (size_t)h * hd + 16 * db, qld, (const float *)(const void *)c, rows, 16,
                            0);
                }
        }
        if (on) _tile_release();
    }
}

cp_status cp_amx_attention(const cp_attn_args *a, void *scratch, int threads, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s) return s;
    if (a->n < 1 || a->n_keys < 1 || a->head_dim < 32 || a->head_dim % 32 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads ||
        threads < 1)
        return cp_fail(err, CP_EUNSUPPORTED, "amx attention: %d queries, %d keys, head_dim %d (a multiple of 32 wanted), %d / %d heads",
                       a->n, a->n_keys, a->head_dim, a->n_heads, a->n_kv_heads);
    if (a->export_a || a->sens_mass)
        return cp_fail(err, CP_EUNSUPPORTED, "amx attention: the attention export and the sensitive mass are the f32 path's");
    if (!(a->k && a->v) && !(a->k16 && a->v16)) return cp_fail(err, CP_EINVAL, "amx attention: no keys or values");
    attn_plan P;
    attn_plan_of(a, &P);
    for (int q0 = 0; q0 < a->n;) {
        const int nq = cpu_attn_block_rows(a, q0);
        attn_block(a, &P, scratch, threads, q0, nq);
        q0 += nq;
    }
    return CP_OK;
}

/* ---- ceilings ---------------------------------------------------------- */

/* The ceilings' tiles: configured, all eight zero (the tile numbers are
 * immediates, so each is named) */
AMX_FN static void peak_tiles_on(void)
{
    tiles_on();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
}

/* 6 accumulators (tmm0..5) against tmm6 x tmm7, no loads: the tile
 * multiply unit's throughput.  Zero inputs: the unit's timing does not
 * depend on the values. */
AMX_FN __attribute__((noinline)) static double bf16_peak_loop(long iters)
{
    peak_tiles_on();
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 6, 7);
        _tile_dpbf16ps(1, 6, 7);
        _tile_dpbf16ps(2, 6, 7);
        _tile_dpbf16ps(3, 6, 7);
        _tile_dpbf16ps(4, 6, 7);
        _tile_dpbf16ps(5, 6, 7);
    }
    _tile_release();
    return (double)iters * 6 * 16 * 16 * 32 * 2;
}

AMX_FN __attribute__((noinline)) static double i8_peak_loop(long iters)
{
    peak_tiles_on();
    for (long i = 0; i < iters; i++) {
        _tile_dpbusd(0, 6, 7);
        _tile_dpbusd(1, 6, 7);
        _tile_dpbusd(2, 6, 7);
        _tile_dpbusd(3, 6, 7);
        _tile_dpbusd(4, 6, 7);
        _tile_dpbusd(5, 6, 7);
    }
    _tile_release();
    return (double)iters * 6 * 16 * 16 * 64 * 2;
}

cp_status cp_amx_peak(int threads, double seconds, cp_amx_ceiling *out, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s) return s;
    if (threads < 1) return cp_fail(err, CP_EINVAL, "amx peak: %d threads", threads);
    out->bf16_flops = cpu_peak_rate(bf16_peak_loop, threads, seconds, 1 << 14, &out->bf16_flops_cpu);
    out->i8_ops = cpu_peak_rate(i8_peak_loop, threads, seconds, 1 << 14, &out->i8_ops_cpu);
    return CP_OK;
}
