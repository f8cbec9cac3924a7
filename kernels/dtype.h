/* Element types of tensors on disk and in memory, and scalar conversions. */
#ifndef CP_DTYPE_H
#define CP_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum cp_dtype {
    CP_DTYPE_INVALID = 0,
    CP_F32,
    CP_F16,
    CP_BF16,
    CP_I32,
    CP_I64,
    CP_I8, /* as a matrix dtype: a q8 blob (kernels/q8.h), not a plain array */
} cp_dtype;

size_t cp_dtype_size(cp_dtype t);
const char *cp_dtype_name(cp_dtype t);            /* safetensors spelling: "F32" ... */
cp_dtype cp_dtype_from_name(const char *name);    /* CP_DTYPE_INVALID when unknown */

static inline float cp_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays NaN (quiet bit forced). */
static inline uint16_t cp_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float cp_f16_to_f32(uint16_t h);

/* Converts n elements of a float type (F32/F16/BF16) at src (any alignment)
 * to f32.  Returns 0 if t is not a float type. */
int cp_convert_to_f32(float *dst, const void *src, cp_dtype t, size_t n);



/* The index of the first NaN or Inf among n elements of type t at src (any
 * alignment), read from the raw bits before any conversion; n when all are
 * finite (and for integer types). */
size_t cp_first_nonfinite(const void *src, cp_dtype t, size_t n);

/* Converts n elements between float types (F32/F16/BF16 -> F32/BF16).
 * Returns 0 for an unsupported pair. */
int cp_convert_float(void *dst, cp_dtype dst_t, const void *src, cp_dtype src_t, size_t n);
#endif
