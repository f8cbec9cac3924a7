/* The KV layout shared by the pool and the engine, the model fingerprint
 * that is part of every pool key. */
#ifndef CP_KV_LAYOUT_H
#define CP_KV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/dtype.h"
#include "../kernels/sha256.h"
#include "../kernels/status.h"

#define CP_FINGERPRINT_BYTES 32

typedef struct cp_kv_layout {
    int n_layers, n_kv_heads, head_dim;
    cp_dtype dtype;   /* element type of stored K and V */
    int block_tokens; /* tokens per block (default 16) */
    uint8_t fingerprint[CP_FINGERPRINT_BYTES];
} cp_kv_layout;

/* Values in a token's K (or V) for one layer: n_kv_heads * head_dim. */
static inline size_t cp_kv_row(const cp_kv_layout *l) { return (size_t)l->n_kv_heads * l->head_dim; }
/* Bytes of one block: [layer][K, V][block_tokens][row] */
size_t cp_kv_block_bytes(const cp_kv_layout *l);
/* Offset in a block of token t's K (kv = 0) or V (kv = 1) row of a layer. */
size_t cp_kv_block_offset(const cp_kv_layout *l, int layer, int kv, int t);
cp_status cp_kv_layout_check(const cp_kv_layout *l, cp_error *err);

#endif
