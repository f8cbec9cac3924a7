#include "dtype.h"

#include <math.h>
#include <string.h>

static const struct {
    cp_dtype t;
    const char *name;
    size_t size;
} dtype_table[] = {
    { CP_F32, "F32", 4 }, { CP_F16, "F16", 2 }, { CP_BF16, "BF16", 2 },
    { CP_I32, "I32", 4 }, { CP_I64, "I64", 8 }, { CP_I8, "I8", 1 },
};

size_t cp_dtype_size(cp_dtype t)
{
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].t == t) return dtype_table[i].size;
    return 0;
}

const char *cp_dtype_name(cp_dtype t)
{
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].t == t) return dtype_table[i].name;
    return "INVALID";
}

cp_dtype cp_dtype_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (strcmp(dtype_table[i].name, name) == 0) return dtype_table[i].t;
    return CP_DTYPE_INVALID;
}

float cp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24 */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int cp_convert_to_f32(float *dst, const void *src, cp_dtype t, size_t n)
{
    const unsigned char *s = src;
    switch (t) {
    case CP_F32:
        memcpy(dst, src, n * sizeof(float));
        return 1;
    case CP_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = cp_bf16_to_f32(h);
        }
        return 1;
    case CP_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = cp_f16_to_f32(h);
        }
        return 1;
    default:
        return 0;
    }
}

int cp_convert_float(void *dst, cp_dtype dst_t, const void *src, cp_dtype src_t, size_t n)
{
    if (dst_t == CP_F32) return cp_convert_to_f32(dst, src, src_t, n);
    if (dst_t != CP_BF16) return 0;
    if (src_t == CP_BF16) {
        memcpy(dst, src, n * 2);
        return 1;
    }
    if (src_t != CP_F32 && src_t != CP_F16) return 0;
    uint16_t *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) {
        float f;
        if (src_t == CP_F32) {
            memcpy(&f, s + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            f = cp_f16_to_f32(h);
        }
        d[i] = cp_f32_to_bf16(f);
    }
    return 1;
}

/* A float is NaN or Inf exactly when its exponent bits are all ones.  Each
 * block is reduced branch-free (the compiler vectorises the OR of masked
 * exponents: `omp simd`, as -O2 alone leaves it scalar at 4x the time);
 * only a block that has one is walked again for its index. */
#define NF_BLOCK 4096

static size_t first_nonfinite_u32(const unsigned char *s, size_t n)
{
    for (size_t b = 0; b < n; b += NF_BLOCK) {
        size_t e = n - b < NF_BLOCK ? n - b : NF_BLOCK;
        uint32_t any = 0;
#pragma omp simd reduction(| : any)
        for (size_t i = 0; i < e; i++) {
            uint32_t u;
            memcpy(&u, s + 4 * (b + i), 4);
            any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
        if (any)
            for (size_t i = 0; i < e; i++) {
                uint32_t u;
                memcpy(&u, s + 4 * (b + i), 4);
                if ((u & 0x7f800000u) == 0x7f800000u) return b + i;
            }
    }
    return n;
}

static size_t first_nonfinite_u16(const unsigned char *s, size_t n, uint16_t exp_mask)
{
    for (size_t b = 0; b < n; b += NF_BLOCK) {
        size_t e = n - b < NF_BLOCK ? n - b : NF_BLOCK;
        uint32_t any = 0;
#pragma omp simd reduction(| : any)
        for (size_t i = 0; i < e; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * (b + i), 2);
            any |= (uint32_t)((h & exp_mask) == exp_mask);
        }
        if (any)
            for (size_t i = 0; i < e; i++) {
                uint16_t h;
                memcpy(&h, s + 2 * (b + i), 2);
                if ((h & exp_mask) == exp_mask) return b + i;
            }
    }
    return n;
}

size_t cp_first_nonfinite(const void *src, cp_dtype t, size_t n)
{
    switch (t) {
    case CP_F32: return first_nonfinite_u32(src, n);
    case CP_F16: return first_nonfinite_u16(src, n, 0x7c00u);
    case CP_BF16: return first_nonfinite_u16(src, n, 0x7f80u);
    default: return n; /* integers are always finite */
    }
}
