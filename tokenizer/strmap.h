/* Open-addressing hash maps for the tokenizer: byte string -> int32 (the
 * vocabulary) and 64-bit pair key -> (rank, id) (the merges).  Both grow by
 * doubling; lookups are O(1) expected. */
#ifndef CP_STRMAP_H
#define CP_STRMAP_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/status.h"

typedef struct cp_strmap {
    struct cp_strmap_slot *slots;
    size_t cap, n; /* cap is a power of two */
} cp_strmap;

void cp_strmap_free(cp_strmap *m);
/* The same, each key passed to wipe(key, len) before it is freed (keys that
 * are a prompt's text) */
void cp_strmap_free_wiped(cp_strmap *m, void (*wipe)(void *p, size_t n));
/* Inserts (copies the key) or overwrites; CP_ENOMEM on failure. */
cp_status cp_strmap_put(cp_strmap *m, const char *key, size_t len, int32_t value, cp_error *err);
/* Returns 1 and sets *value when found. */
int cp_strmap_get(const cp_strmap *m, const char *key, size_t len, int32_t *value);

typedef struct cp_pairmap {
    struct cp_pair_slot *slots;
    size_t cap, n;
} cp_pairmap;

void cp_pairmap_free(cp_pairmap *m);
/* Keeps the first (lowest-rank) insertion of a key. */
cp_status cp_pairmap_put(cp_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id, cp_error *err);
int cp_pairmap_get(const cp_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id);

uint64_t cp_hash_bytes(const void *p, size_t n);

#endif
