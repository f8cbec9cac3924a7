/* The AMX micro-kernels, as macros a file instantiates for the tile
 * products it runs (gemm_amx_tiles.c: all eight; gemm_amx_attn.c: bf16
 * 1 x 1), and the f32 epilogue both use.  Internal to gemm_amx*.c. */
#ifndef CP_GEMM_AMX_MICRO_H
#define CP_GEMM_AMX_MICRO_H

#include "gemm_amx_internal.h"

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

/* a C tile (16 x 16 f32 at c) into y's rows [0, rows) and columns
 * [0, cols): y = acc, or y + acc */
AMX_FN static inline void put_f32(float *y, int ldy, const float *c, int rows, int cols, int accumulate)
{
    const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    for (int r = 0; r < rows; r++) {
        float *yo = y + (size_t)r * ldy;
        __m512 v = _mm512_load_ps(c + 16 * r);
        if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), v);
        _mm512_mask_storeu_ps(yo, m, v);
    }
}

#endif
