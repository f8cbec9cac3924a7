/* Polynomial rolling hashes of token sequences modulo 2^61 - 1, with a base
 * drawn at random per hash (each pool draws its own: nobody can precompute colliding inputs).  A
 * test-only weak modulus forces collisions so verification is exercised. */
#ifndef CP_ROLLHASH_H
#define CP_ROLLHASH_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/status.h"

typedef struct cp_rollhash {
    uint64_t mod, base;
    uint64_t *pow; /* base^i, i <= cap */
    size_t cap;
} cp_rollhash;

#define CP_ROLLHASH_MOD ((1ull << 61) - 1)

/* base 0 draws one from the OS; weak_mod 0 uses 2^61 - 1. */
cp_status cp_rollhash_init(cp_rollhash *h, uint64_t base, uint64_t weak_mod, cp_error *err);
void cp_rollhash_free(cp_rollhash *h);
/* Makes sure powers up to n exist. */
cp_status cp_rollhash_reserve(cp_rollhash *h, size_t n, cp_error *err);
/* pre[0] = 0, pre[i] = hash of t[0..i). */
void cp_rollhash_prefix(const cp_rollhash *h, const int32_t *t, size_t n, uint64_t *pre);
/* hash of t[a..b) from prefix hashes (b - a <= cap) */
uint64_t cp_rollhash_range(const cp_rollhash *h, const uint64_t *pre, size_t a, size_t b);

#endif
