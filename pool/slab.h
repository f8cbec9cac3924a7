/* One reservation of backend memory (host for CPU, device for CUDA) split
 * into fixed-size blocks; O(1) alloc and free from a free list, no malloc
 * per block, exact accounting. */
#ifndef CP_SLAB_H
#define CP_SLAB_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/backend.h"

typedef struct cp_slab {
    cp_backend *be;
    char *base;        /* backend memory */
    size_t block_bytes;
    uint32_t n_blocks;
    uint32_t *free_ids; /* a stack of free block ids */
    uint32_t n_free;
    uint8_t *in_use;    /* per block: for the invariant checks */
} cp_slab;

/* Reserves floor(budget / block_bytes) blocks (at least one). */
cp_status cp_slab_init(cp_slab *s, cp_backend *be, size_t block_bytes, size_t budget_bytes, cp_error *err);
void cp_slab_free_all(cp_slab *s);
/* 1 and a block id, or 0 when the slab is full. */
int cp_slab_alloc(cp_slab *s, uint32_t *id);
/* Returns 0 (and does nothing) for an id that is not in use: never a double free. */
int cp_slab_release(cp_slab *s, uint32_t id);
static inline void *cp_slab_block(const cp_slab *s, uint32_t id) { return s->base + (size_t)id * s->block_bytes; }
static inline size_t cp_slab_used_bytes(const cp_slab *s) { return (size_t)(s->n_blocks - s->n_free) * s->block_bytes; }

#endif
