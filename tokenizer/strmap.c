#include "strmap.h"

#include <stdlib.h>
#include <string.h>

struct cp_strmap_slot {
    char *key; /* NULL = empty */
    uint32_t len;
    int32_t value;
    uint64_t hash;
};

struct cp_pair_slot {
    uint64_t key; /* UINT64_MAX = empty */
    int32_t rank, id;
};

uint64_t cp_hash_bytes(const void *p, size_t n)
{
    /* FNV-1a, then a final mix so low bits are usable for masking */
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

void cp_strmap_free(cp_strmap *m) { cp_strmap_free_wiped(m, NULL); }

void cp_strmap_free_wiped(cp_strmap *m, void (*wipe)(void *p, size_t n))
{
    for (size_t i = 0; i < m->cap; i++) {
        if (wipe && m->slots[i].key) wipe(m->slots[i].key, m->slots[i].len);
        free(m->slots[i].key);
    }
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

static struct cp_strmap_slot *str_find(const cp_strmap *m, const char *key, size_t len, uint64_t h)
{
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        struct cp_strmap_slot *s = &m->slots[i];
        if (!s->key || (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0)) return s;
    }
}

static cp_status str_grow(cp_strmap *m, cp_error *err)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    struct cp_strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory growing a hash map to %zu slots", cap);
    cp_strmap old = *m;
    m->slots = slots;
    m->cap = cap;
    for (size_t i = 0; i < old.cap; i++)
        if (old.slots[i].key) *str_find(m, old.slots[i].key, old.slots[i].len, old.slots[i].hash) = old.slots[i];
    free(old.slots);
    return CP_OK;
}

cp_status cp_strmap_put(cp_strmap *m, const char *key, size_t len, int32_t value, cp_error *err)
{
    if (len > UINT32_MAX) return cp_fail(err, CP_ERANGE, "tokenizer: key of %zu bytes", len);
    if ((m->n + 1) * 2 > m->cap) {
        cp_status rc = str_grow(m, err);
        if (rc) return rc;
    }
    uint64_t h = cp_hash_bytes(key, len);
    struct cp_strmap_slot *s = str_find(m, key, len, h);
    if (!s->key) {
        s->key = malloc(len + 1);
        if (!s->key) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory");
        memcpy(s->key, key, len);
        s->key[len] = 0;
        s->len = (uint32_t)len;
        s->hash = h;
        m->n++;
    }
    s->value = value;
    return CP_OK;
}

int cp_strmap_get(const cp_strmap *m, const char *key, size_t len, int32_t *value)
{
    if (!m->cap) return 0;
    struct cp_strmap_slot *s = str_find(m, key, len, cp_hash_bytes(key, len));
    if (!s->key) return 0;
    *value = s->value;
    return 1;
}

void cp_pairmap_free(cp_pairmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static struct cp_pair_slot *pair_find(const cp_pairmap *m, uint64_t key)
{
    size_t mask = m->cap - 1;
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    for (size_t i = (h >> 20) & mask;; i = (i + 1) & mask)
        if (m->slots[i].key == UINT64_MAX || m->slots[i].key == key) return &m->slots[i];
}

cp_status cp_pairmap_put(cp_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id, cp_error *err)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        struct cp_pair_slot *slots = malloc(cap * sizeof *slots);
        if (!slots) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory growing the merge table");
        for (size_t i = 0; i < cap; i++) slots[i].key = UINT64_MAX;
        cp_pairmap old = *m;
        m->slots = slots;
        m->cap = cap;
        for (size_t i = 0; i < old.cap; i++)
            if (old.slots[i].key != UINT64_MAX) *pair_find(m, old.slots[i].key) = old.slots[i];
        free(old.slots);
    }
    struct cp_pair_slot *s = pair_find(m, pair_key(a, b));
    if (s->key == UINT64_MAX) {
        *s = (struct cp_pair_slot){ pair_key(a, b), rank, id };
        m->n++;
    }
    return CP_OK;
}

int cp_pairmap_get(const cp_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id)
{
    if (!m->cap) return 0;
    struct cp_pair_slot *s = pair_find(m, pair_key(a, b));
    if (s->key == UINT64_MAX) return 0;
    *rank = s->rank;
    *id = s->id;
    return 1;
}
