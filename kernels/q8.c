#include "q8.h"

#include <math.h>
#include <string.h>

size_t cp_q8_bytes(int64_t rows, int64_t cols)
{
    if (rows < 1 || rows > INT32_MAX / 8 || cols < 1 || cols > CP_Q8_MAX_COLS) return 0;
    size_t ld = (size_t)cp_q8_ld((int)cols), data = (size_t)rows * ld;
    if (data / ld != (size_t)rows) return 0;
    size_t head = cp_q8_off_data((int)rows);
    if (data > SIZE_MAX - head) return 0;
    return head + data;
}

int cp_q8_matches(const void *blob, int rows, int cols)
{
    const cp_q8_head *h = blob;
    return h && h->magic == CP_Q8_MAGIC && h->rows == rows && h->cols == cols && h->ld == cp_q8_ld(cols);
}

void cp_q8_quantize_rows(int8_t *q, float *scale, int32_t *sum, const float *src, int n, int cols)
{
    const int ld = cp_q8_ld(cols);
    for (int i = 0; i < n; i++) {
        const float *x = src + (size_t)i * cols;
        int8_t *qi = q + (size_t)i * ld;
        float mx = 0;
        for (int k = 0; k < cols; k++) mx = fmaxf(mx, fabsf(x[k]));
        /* the loader refused non-finite weights, so mx is finite */
        float s = mx / 127.0f, inv = mx > 0 ? 127.0f / mx : 0.0f;
        int32_t acc = 0;
        for (int k = 0; k < cols; k++) {
            float v = nearbyintf(x[k] * inv);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v == v ? v : 0.0f; /* NaN never reaches the int cast */
            qi[k] = (int8_t)v;
            acc += qi[k];
        }
        memset(qi + cols, 0, (size_t)(ld - cols));
        scale[i] = s;
        sum[i] = acc;
    }
}

void cp_q8_dequant_row(const void *blob, int j, float *out)
{
    const cp_q8_head *h = blob;
    const int8_t *q = cp_q8_data(blob) + (size_t)j * h->ld;
    float s = cp_q8_scales(blob)[j];
    for (int k = 0; k < h->cols; k++) out[k] = s * q[k];
}
