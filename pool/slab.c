#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "slab.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <stdlib.h>
#include <string.h>

cp_status cp_slab_init(cp_slab *s, cp_backend *be, size_t block_bytes, size_t budget_bytes, cp_error *err)
{
    memset(s, 0, sizeof *s);
    if (block_bytes == 0) return cp_fail(err, CP_EINVAL, "slab: block size is 0");
    size_t n = budget_bytes / block_bytes;
    if (n == 0) return cp_fail(err, CP_EINVAL, "slab: a budget of %zu bytes holds no %zu-byte block", budget_bytes, block_bytes);
    if (n > UINT32_MAX - 1) n = UINT32_MAX - 1;
    s->be = be;
    s->block_bytes = block_bytes;
    s->n_blocks = (uint32_t)n;
    s->free_ids = cp_malloc(n * sizeof *s->free_ids, "slab free list", err);
    s->in_use = cp_calloc(n, 1, "slab block flags", err);
    if (!s->free_ids || !s->in_use) {
        cp_slab_free_all(s);
        return CP_ENOMEM;
    }
    cp_status rc = be->alloc(be, n * block_bytes, (void **)&s->base, err);
    if (rc) {
        cp_slab_free_all(s);
        return cp_fail_wrap(err, "slab of %zu blocks", n);
    }
    /* host memory: on 2 MB pages where the kernel offers them (transparent
     * huge pages, "madvise" or "always").  A filling pool touched each
     * fresh 4 KB page once -- ~25 000 faults a 60-request rag-v1 run, 40 %
     * of the store stage in a virtual machine; the slab lives as long as the
     * pool, so what a huge page costs at its fault (zeroing, compaction) is
     * paid once.  Advice only: without huge pages nothing changes. */
    if (be->flags & CP_BE_HOST_MEMORY) {
        const long pg = sysconf(_SC_PAGESIZE); /* madvise takes a page-aligned start */
        const uintptr_t lo = (uintptr_t)s->base, hi = lo + n * block_bytes;
        const uintptr_t a = pg > 0 ? (lo + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1) : hi;
        if (a < hi) (void)madvise((void *)a, hi - a, MADV_HUGEPAGE);
    }
    /* hand out low ids first */
    for (size_t i = 0; i < n; i++) s->free_ids[i] = (uint32_t)(n - 1 - i);
    s->n_free = (uint32_t)n;
    return CP_OK;
}

void cp_slab_free_all(cp_slab *s)
{
    if (s->base) s->be->free(s->be, s->base);
    free(s->free_ids);
    free(s->in_use);
    memset(s, 0, sizeof *s);
}

int cp_slab_alloc(cp_slab *s, uint32_t *id)
{
    if (s->n_free == 0) return 0;
    *id = s->free_ids[--s->n_free];
    s->in_use[*id] = 1;
    return 1;
}

int cp_slab_release(cp_slab *s, uint32_t id)
{
    if (id >= s->n_blocks || !s->in_use[id]) return 0;
    s->in_use[id] = 0;
    s->free_ids[s->n_free++] = id;
    return 1;
}
