/* int8 weight matrices (--dtype int8): per-output-channel symmetric
 * quantization, made at load from the f32 / bf16 checkpoint.
 *
 * Row j of W [rows, cols] is stored as q[j, k] = round(W[j, k] / s[j]) in
 * [-127, 127] with s[j] = max_k |W[j, k]| / 127 (s = 0 for an all-zero
 * row), so W ~ s[j] * q[j, k].  One blob in backend memory, self-describing
 * so the matmul and embed ops can check it against the shapes they are
 * given:
 *
 *   [64-byte header][rows f32 scales][rows i32 row sums][rows x ld int8]
 *
 * each part 64-byte aligned, rows padded with zeros to ld = cols rounded up
 * to 64, so the kernels read whole vectors and never need a tail.  The row
 * sums (sum_k q[j, k]) let the VNNI kernel take unsigned activations
 * (x + 128) and subtract 128 * sum afterwards.
 *
 * The data part has one of two layouts, named in the header (layout):
 *   CP_Q8_ROWS    rows x ld, row-major (every kernel reads it)
 *   CP_Q8_PANELS  the VNNI panel order the register-blocked kernel
 *                 (gemm_i8_prefill.h) reads straight: panels of
 *                 CP_Q8_PANEL_COLS = 48 output rows, panel p holding
 *                 [ld / 4][48][4] bytes -- k-group g's 64-byte vectors are
 *                 16 rows x 4 consecutive bytes, the three of a group
 *                 adjacent -- byte k of row j at
 *                 (j / 48) * 48 * ld + (k / 4) * 192 + (j % 48) * 4 + k % 4;
 *                 rows padded with zeros to a multiple of 48 (their scales
 *                 and sums are never read: the kernel masks them off).
 * Why 48-row panels and not 16: one tile of the kernel covers 3 vectors of
 * 16 outputs, so a panel is one contiguous stream of 48 * ld bytes, the
 * decode step's only traffic; at most 47 zero rows a matrix (4.6 MB over
 * the 0.5B model's 169 matrices, +0.9 % of its int8 bytes). */
#ifndef CP_Q8_H
#define CP_Q8_H

#include <stddef.h>
#include <stdint.h>

#define CP_Q8_MAGIC 0x38515043u /* "CPQ8" */
/* the VNNI kernel's int32 accumulator holds 255 * 127 * cols: below 2^31
 * for cols up to 65535 */
#define CP_Q8_MAX_COLS 65535

/* the data part's layout (cp_q8_head.layout); 0 is the row-major one, so a
 * header written before layouts existed (zeroed spare bytes) reads as it */
enum { CP_Q8_ROWS = 0, CP_Q8_PANELS = 1 };
#define CP_Q8_PANEL_COLS 48

typedef struct cp_q8_head {
    uint32_t magic;
    int32_t rows, cols, ld;
    int32_t layout; /* CP_Q8_ROWS or CP_Q8_PANELS; anything else is refused */
} cp_q8_head;

/* bytes of the blob for rows x cols in the row-major layout / in `layout`;
 * 0 when cols is outside 1..CP_Q8_MAX_COLS or rows < 1 or the layout is
 * unknown or the size overflows */
size_t cp_q8_bytes(int64_t rows, int64_t cols);
size_t cp_q8_bytes_in(int64_t rows, int64_t cols, int layout);
/* rows the data part holds: rows, or rows rounded up to whole panels */
static inline int64_t cp_q8_data_rows(int64_t rows, int layout)
{
    return layout == CP_Q8_PANELS ? (rows + CP_Q8_PANEL_COLS - 1) / CP_Q8_PANEL_COLS * CP_Q8_PANEL_COLS : rows;
}
static inline int cp_q8_ld(int cols) { return (cols + 63) & ~63; }
static inline size_t cp_q8_round64(size_t n) { return (n + 63) & ~(size_t)63; }
static inline const float *cp_q8_scales(const void *blob) { return (const float *)(const void *)((const char *)blob + 64); }
static inline const int32_t *cp_q8_sums(const void *blob)
{
    const cp_q8_head *h = blob;
    return (const int32_t *)(const void *)((const char *)blob + 64 + cp_q8_round64((size_t)h->rows * 4));
}
static inline const int8_t *cp_q8_data(const void *blob)
{
    const cp_q8_head *h = blob;
    return (const int8_t *)blob + 64 + 2 * cp_q8_round64((size_t)h->rows * 4);
}
/* byte offsets of the parts, for a loader that uploads them separately */
static inline size_t cp_q8_off_scales(void) { return 64; }
static inline size_t cp_q8_off_sums(int rows) { return 64 + cp_q8_round64((size_t)rows * 4); }
static inline size_t cp_q8_off_data(int rows) { return 64 + 2 * cp_q8_round64((size_t)rows * 4); }

/* 1 when blob's header says rows x cols in a known layout (the ops' check
 * on what they are given; then cp_q8_layout says which) */
int cp_q8_matches(const void *blob, int rows, int cols);
static inline int cp_q8_layout(const void *blob) { return ((const cp_q8_head *)blob)->layout; }

/* Quantizes n rows of cols f32 values at src (row stride cols) into q (row
 * stride ld = cp_q8_ld(cols), padding zeroed), scale[i] and sum[i]. */
void cp_q8_quantize_rows(int8_t *q, float *scale, int32_t *sum, const float *src, int n, int cols);

/* Row j dequantized: out[k] = s[j] * q[j, k], k < cols, in either layout
 * (a header with another layout: zeros, never bytes read as if they were
 * rows -- cp_q8_matches refuses such a blob before any op reads it). */
void cp_q8_dequant_row(const void *blob, int j, float *out);

/* n row-major int8 rows at src (stride ld, a multiple of 64) into dst in
 * the panel order: ceil(n / 48) panels, rows n.. of the last zero.  The
 * loader packs chunks of 48-row multiples, each at dst + row0 * ld. */
void cp_q8_panelize(int8_t *dst, const int8_t *src, int n, int ld);
/* The inverse for rows [0, n): dst row-major (stride ld). */
void cp_q8_unpanelize(int8_t *dst, const int8_t *src, int n, int ld);
/* A whole row-major blob src copied into dst (cp_q8_bytes_in(rows, cols,
 * CP_Q8_PANELS) bytes) in the panel layout; 0 when src is not a row-major
 * q8 blob (dst untouched). */
int cp_q8_pack_blob(void *dst, const void *src);

#endif
