#include "kv_layout.h"

size_t cp_kv_block_bytes(const cp_kv_layout *l)
{
    return (size_t)l->n_layers * 2 * (size_t)l->block_tokens * cp_kv_row(l) * cp_dtype_size(l->dtype);
}

size_t cp_kv_block_offset(const cp_kv_layout *l, int layer, int kv, int t)
{
    size_t rows = ((size_t)layer * 2 + (size_t)kv) * (size_t)l->block_tokens + (size_t)t;
    return rows * cp_kv_row(l) * cp_dtype_size(l->dtype);
}

cp_status cp_kv_layout_check(const cp_kv_layout *l, cp_error *err)
{
    if (l->n_layers < 1 || l->n_layers > 1024 || l->n_kv_heads < 1 || l->n_kv_heads > 1024 || l->head_dim < 1 ||
        l->head_dim > 1024 || l->block_tokens < 1 || l->block_tokens > 4096 ||
        (l->dtype != CP_F32 && l->dtype != CP_BF16 && l->dtype != CP_F16))
        return cp_fail(err, CP_EINVAL, "kv layout: %d layers x %d kv heads x %d head_dim, %d tokens per block, dtype %s is not valid",
                       l->n_layers, l->n_kv_heads, l->head_dim, l->block_tokens, cp_dtype_name(l->dtype));
    return CP_OK;
}

