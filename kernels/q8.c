#include "q8.h"

#include <math.h>
#include <string.h>

size_t cp_q8_bytes(int64_t rows, int64_t cols) { return cp_q8_bytes_in(rows, cols, CP_Q8_ROWS); }

size_t cp_q8_bytes_in(int64_t rows, int64_t cols, int layout)
{
    if (rows < 1 || rows > INT32_MAX / 8 || cols < 1 || cols > CP_Q8_MAX_COLS) return 0;
    if (layout != CP_Q8_ROWS && layout != CP_Q8_PANELS) return 0;
    size_t ld = (size_t)cp_q8_ld((int)cols), drows = (size_t)cp_q8_data_rows(rows, layout), data = drows * ld;
    if (data / ld != drows) return 0;
    size_t head = cp_q8_off_data((int)rows);
    if (data > SIZE_MAX - head) return 0;
    return head + data;
}

int cp_q8_matches(const void *blob, int rows, int cols)
{
    const cp_q8_head *h = blob;
    return h && h->magic == CP_Q8_MAGIC && h->rows == rows && h->cols == cols && h->ld == cp_q8_ld(cols) &&
           (h->layout == CP_Q8_ROWS || h->layout == CP_Q8_PANELS);
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

/* byte k of row j in the panel order (q8.h) */
static size_t panel_at(int j, int k, int ld)
{
    return (size_t)(j / CP_Q8_PANEL_COLS) * CP_Q8_PANEL_COLS * (size_t)ld + (size_t)(k / 4) * (CP_Q8_PANEL_COLS * 4) +
           (size_t)(j % CP_Q8_PANEL_COLS) * 4 + (size_t)(k % 4);
}

void cp_q8_dequant_row(const void *blob, int j, float *out)
{
    const cp_q8_head *h = blob;
    const int8_t *q = cp_q8_data(blob);
    float s = cp_q8_scales(blob)[j];
    if (h->layout == CP_Q8_PANELS)
        for (int k = 0; k < h->cols; k++) out[k] = s * q[panel_at(j, k, h->ld)];
    else if (h->layout == CP_Q8_ROWS)
        for (int k = 0; k < h->cols; k++) out[k] = s * q[(size_t)j * h->ld + k];
    else memset(out, 0, (size_t)h->cols * sizeof *out);
}

void cp_q8_panelize(int8_t *dst, const int8_t *src, int n, int ld)
{
    const int padded = (int)cp_q8_data_rows(n, CP_Q8_PANELS);
    for (int j = 0; j < padded; j++)
        for (int k = 0; k < ld; k += 4) { /* 4 bytes of a row stay together in the panel order */
            int8_t *d = dst + panel_at(j, k, ld);
            if (j < n) memcpy(d, src + (size_t)j * ld + k, 4);
            else memset(d, 0, 4);
        }
}

void cp_q8_unpanelize(int8_t *dst, const int8_t *src, int n, int ld)
{
    for (int j = 0; j < n; j++)
        for (int k = 0; k < ld; k += 4) memcpy(dst + (size_t)j * ld + k, src + panel_at(j, k, ld), 4);
}

int cp_q8_pack_blob(void *dst, const void *src)
{
    const cp_q8_head *h = src;
    if (!cp_q8_matches(src, h->rows, h->cols) || h->layout != CP_Q8_ROWS) return 0;
    const size_t meta = cp_q8_off_data(h->rows);
    memcpy(dst, src, meta);
    ((cp_q8_head *)dst)->layout = CP_Q8_PANELS;
    cp_q8_panelize((int8_t *)dst + meta, cp_q8_data(src), h->rows, h->ld);
    return 1;
}
