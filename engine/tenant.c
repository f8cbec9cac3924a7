/* Tenant table: open addressing over a keyed hash of the id bytes (SHA-256
 * of a per-table random key and the id: tenant ids come from clients, and a
 * guessable hash would let one client make every lookup a full scan). */
#include "tenant.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../kernels/sha256.h"
#include "../tokenizer/utf8.h"

cp_status cp_tenant_id_check(const char *s, size_t len, cp_error *err)
{
    if (!s || len == 0) return cp_fail(err, CP_EINVAL, "tenant id is empty");
    if (len > CP_TENANT_ID_MAX)
        return cp_fail(err, CP_EINVAL, "tenant id is %zu bytes; at most %d are allowed", len, CP_TENANT_ID_MAX);
    if (memchr(s, 0, len)) return cp_fail(err, CP_EINVAL, "tenant id holds a NUL byte (\\u0000)");
    size_t bad = cp_utf8_validate(s, len);
    if (bad != len) return cp_fail(err, CP_EINVAL, "tenant id is not valid UTF-8 (byte %zu)", bad);
    return CP_OK;
}

typedef struct slot {
    char *name; /* NULL = empty */
    size_t len;
    uint64_t hash;
    uint32_t id;
} slot;

struct cp_tenant_table {
    slot *slots;
    size_t cap, n; /* cap: a power of two, kept at most half full */
    uint8_t key[32];
};

static uint64_t keyed_hash(const cp_tenant_table *t, const char *s, size_t len)
{
    const void *parts[2] = { t->key, s };
    size_t lens[2] = { sizeof t->key, len };
    uint8_t d[32];
    cp_sha256(parts, lens, 2, d);
    uint64_t h;
    memcpy(&h, d, sizeof h);
    return h;
}

cp_status cp_tenant_table_create(cp_tenant_table **out, cp_error *err)
{
    *out = NULL;
    cp_tenant_table *t = cp_calloc(1, sizeof *t, "tenant table", err);
    if (!t) return CP_ENOMEM;
    t->cap = 64;
    if (!(t->slots = cp_calloc(t->cap, sizeof *t->slots, "tenant table", err))) {
        free(t);
        return CP_ENOMEM;
    }
    if (getrandom(t->key, sizeof t->key, 0) != (ssize_t)sizeof t->key) { /* no entropy: still distinct per process */
        uint64_t x = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)t;
        memcpy(t->key, &x, sizeof x);
    }
    *out = t;
    return CP_OK;
}

void cp_tenant_table_free(cp_tenant_table *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->cap; i++) free(t->slots[i].name);
    free(t->slots);
    free(t);
}

size_t cp_tenant_count(const cp_tenant_table *t) { return t ? t->n : 0; }

static slot *find(slot *v, size_t cap, uint64_t h, const char *s, size_t len)
{
    for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1))
        if (!v[i].name || (v[i].hash == h && v[i].len == len && memcmp(v[i].name, s, len) == 0)) return &v[i];
}

static cp_status grow(cp_tenant_table *t, cp_error *err)
{
    size_t cap = t->cap * 2;
    slot *v = cp_calloc(cap, sizeof *v, "tenant table", err);
    if (!v) return CP_ENOMEM;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].name) *find(v, cap, t->slots[i].hash, t->slots[i].name, t->slots[i].len) = t->slots[i];
    free(t->slots);
    t->slots = v, t->cap = cap;
    return CP_OK;
}

int cp_tenant_find(const cp_tenant_table *t, const char *s, size_t len, uint32_t *id)
{
    if (!t || cp_tenant_id_check(s, len, NULL) != CP_OK) return 0;
    const slot *e = find(t->slots, t->cap, keyed_hash(t, s, len), s, len);
    if (!e->name) return 0;
    *id = e->id;
    return 1;
}

cp_status cp_tenant_intern(cp_tenant_table *t, const char *s, size_t len, uint32_t *id, cp_error *err)
{
    cp_status rc = cp_tenant_id_check(s, len, err);
    if (rc) return rc;
    uint64_t h = keyed_hash(t, s, len);
    slot *e = find(t->slots, t->cap, h, s, len);
    if (e->name) return *id = e->id, CP_OK;
    if (t->n >= CP_TENANT_MAX_COUNT)
        return cp_fail(err, CP_ERANGE, "tenant table: more than %u distinct tenants", CP_TENANT_MAX_COUNT);
    if (2 * (t->n + 1) > t->cap) {
        if ((rc = grow(t, err))) return rc;
        e = find(t->slots, t->cap, h, s, len);
    }
    char *copy = cp_malloc(len, "tenant id", err);
    if (!copy) return CP_ENOMEM;
    memcpy(copy, s, len);
    *e = (slot){ copy, len, h, (uint32_t)t->n };
    *id = (uint32_t)t->n++;
    return CP_OK;
}

int cp_tenant_each(const cp_tenant_table *t, int (*f)(void *ctx, uint32_t id, const char *s, size_t len), void *ctx)
{
    for (size_t i = 0; t && i < t->cap; i++)
        if (t->slots[i].name) {
            int r = f(ctx, t->slots[i].id, t->slots[i].name, t->slots[i].len);
            if (r) return r;
        }
    return 0;
}
