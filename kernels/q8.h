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
 * (x + 128) and subtract 128 * sum afterwards. */
#ifndef CP_Q8_H
#define CP_Q8_H

#include <stddef.h>
#include <stdint.h>

#define CP_Q8_MAGIC 0x38515043u /* "CPQ8" */
/* the VNNI kernel's int32 accumulator holds 255 * 127 * cols: below 2^31
 * for cols up to 65535 */
#define CP_Q8_MAX_COLS 65535

typedef struct cp_q8_head {
    uint32_t magic;
    int32_t rows, cols, ld;
} cp_q8_head;

/* bytes of the blob for rows x cols; 0 when cols is outside 1..CP_Q8_MAX_COLS
 * or rows < 1 or the size overflows */
size_t cp_q8_bytes(int64_t rows, int64_t cols);
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

/* 1 when blob's header says rows x cols (the ops' check on what they are given) */
int cp_q8_matches(const void *blob, int rows, int cols);

/* Quantizes n rows of cols f32 values at src (row stride cols) into q (row
 * stride ld = cp_q8_ld(cols), padding zeroed), scale[i] and sum[i]. */
void cp_q8_quantize_rows(int8_t *q, float *scale, int32_t *sum, const float *src, int n, int cols);

/* Row j dequantized: out[k] = s[j] * q[j, k], k < cols. */
void cp_q8_dequant_row(const void *blob, int j, float *out);

#endif
