#define _DEFAULT_SOURCE /* getrandom */
#include "rollhash.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m)
{
    unsigned __int128 p = (unsigned __int128)a * b;
    if (m == CP_ROLLHASH_MOD) { /* Mersenne reduction */
        uint64_t r = (uint64_t)(p & m) + (uint64_t)(p >> 61);
        return r >= m ? r - m : r;
    }
    return (uint64_t)(p % m);
}

static uint64_t addmod(uint64_t a, uint64_t b, uint64_t m)
{
    uint64_t r = a + b;
    return r >= m ? r - m : r;
}

/* tokens are mapped to [1, mod) so that a 0 id still changes the hash */
static uint64_t tok(int32_t t, uint64_t m) { return ((uint64_t)(uint32_t)t % (m - 1)) + 1; }

cp_status cp_rollhash_init(cp_rollhash *h, uint64_t base, uint64_t weak_mod, cp_error *err)
{
    h->mod = weak_mod ? weak_mod : CP_ROLLHASH_MOD;
    if (!base) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) return cp_fail(err, CP_EIO, "rolling hash: getrandom failed");
        base = r;
    }
    h->base = base % (h->mod - 256) + 256; /* well away from 0 and 1 */
    h->pow = NULL;
    h->cap = 0;
    return cp_rollhash_reserve(h, 1024, err);
}

void cp_rollhash_free(cp_rollhash *h)
{
    free(h->pow);
    h->pow = NULL;
    h->cap = 0;
}

cp_status cp_rollhash_reserve(cp_rollhash *h, size_t n, cp_error *err)
{
    if (n <= h->cap && h->pow) return CP_OK;
    size_t cap = h->cap ? h->cap : 1024;
    while (cap < n) cap *= 2;
    uint64_t *p = realloc(h->pow, (cap + 1) * sizeof *p);
    if (!p) return cp_fail(err, CP_ENOMEM, "rolling hash: out of memory for %zu powers", cap);
    size_t from = h->pow ? h->cap + 1 : 1;
    p[0] = 1;
    for (size_t i = from; i <= cap; i++) p[i] = mulmod(p[i - 1], h->base, h->mod);
    h->pow = p;
    h->cap = cap;
    return CP_OK;
}

void cp_rollhash_prefix(const cp_rollhash *h, const int32_t *t, size_t n, uint64_t *pre)
{
    pre[0] = 0;
    for (size_t i = 0; i < n; i++) pre[i + 1] = addmod(mulmod(pre[i], h->base, h->mod), tok(t[i], h->mod), h->mod);
}

uint64_t cp_rollhash_range(const cp_rollhash *h, const uint64_t *pre, size_t a, size_t b)
{
    uint64_t sub = mulmod(pre[a], h->pow[b - a], h->mod);
    return addmod(pre[b], h->mod - sub, h->mod);
}
