/* The tier's key space (shared and per-tenant private spaces, index,
 * value and epoch keys) and the tenants bound to their keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier_internal.h"

/* ---- keys ------------------------------------------------------------------------------ */

/* the key space: "PREFIX:s:FP" or "PREFIX:p:TK:FP" */
static void space_of(const cp_tier *t, const uint8_t *tk, char *out, size_t cap)
{
    if (!tk) {
        snprintf(out, cap, "%s:s:%s", t->prefix, t->fp);
        return;
    }
    char h[2 * CP_TIER_KEY_BYTES + 1];
    tier_hex(tk, CP_TIER_KEY_BYTES, h);
    snprintf(out, cap, "%s:p:%s:%s", t->prefix, h, t->fp);
}

static void window_hash(const cp_tier *t, const int32_t *tokens, char out[17])
{
    uint8_t w[4] = { TIER_WINDOW, 0, 0, 0 }, h[32];
    const void *parts[3] = { t->l.fingerprint, w, tokens };
    size_t lens[3] = { CP_FINGERPRINT_BYTES, 4, TIER_WINDOW * sizeof *tokens };
    cp_sha256(parts, lens, 3, h);
    tier_hex(h, 8, out);
}

void tier_index_key(const cp_tier *t, const uint8_t *tk, const int32_t *tokens, char *out, size_t cap)
{
    char sp[128], h[17];
    space_of(t, tk, sp, sizeof sp);
    window_hash(t, tokens, h);
    snprintf(out, cap, "%s:i:%d:%s", sp, TIER_WINDOW, h);
}

void tier_value_key(const cp_tier *t, const uint8_t *tk, const char *sha_hex, char *out, size_t cap)
{
    char sp[128];
    space_of(t, tk, sp, sizeof sp);
    snprintf(out, cap, "%s:v:%s", sp, sha_hex);
}

/* what a value under key name `name` is sealed with and checked against */
cp_tier_check tier_check_of(const cp_tier *t, const char *name)
{
    return (cp_tier_check){ .key = t->key, .key_len = t->o.key_len, .name = name, .name_len = strlen(name), .max_len = 1u << 20,
                            .vocab = t->o.vocab, .max_pos = t->o.max_pos, .kv_bound = CP_TIER_KV_BOUND };
}

void tier_epoch_key(const cp_tier *t, const uint8_t *tk, char *out, size_t cap)
{
    char h[2 * CP_TIER_KEY_BYTES + 1];
    tier_hex(tk, CP_TIER_KEY_BYTES, h);
    snprintf(out, cap, "%s:e:%s", t->prefix, h);
}

/* the tenant's key; 0 when it was never bound */
int tier_tenant_key_get(cp_tier *t, uint32_t id, uint8_t key[CP_TIER_KEY_BYTES])
{
    pthread_mutex_lock(&t->ten_lock);
    int ok = id < t->ten_cap && t->ten[id].bound;
    if (ok) memcpy(key, t->ten[id].key, CP_TIER_KEY_BYTES);
    pthread_mutex_unlock(&t->ten_lock);
    return ok;
}

/* the tenant's key and the epoch this replica last read; 0 when never
 * bound or the epoch is not known (then nothing private of it is written
 * to or taken from the tier) */
int tier_tenant_epoch_get(cp_tier *t, uint32_t id, uint8_t key[CP_TIER_KEY_BYTES], uint32_t *epoch)
{
    pthread_mutex_lock(&t->ten_lock);
    int ok = id < t->ten_cap && t->ten[id].bound && t->ten[id].epoch_known;
    if (ok) memcpy(key, t->ten[id].key, CP_TIER_KEY_BYTES), *epoch = t->ten[id].epoch;
    pthread_mutex_unlock(&t->ten_lock);
    return ok;
}

cp_status cp_tier_bind_tenant(cp_tier *t, uint32_t id, const char *name, size_t len, cp_error *err)
{
    if (id >= (1u << 24)) return cp_fail(err, CP_ERANGE, "tier: tenant number %u out of range", id);
    pthread_mutex_lock(&t->ten_lock);
    if (id >= t->ten_cap) {
        size_t cap = t->ten_cap ? t->ten_cap : 64;
        while (cap <= id) cap *= 2;
        tier_tenant *v = realloc(t->ten, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&t->ten_lock);
            return cp_fail(err, CP_ENOMEM, "tier: out of memory binding tenant %u", id);
        }
        memset(v + t->ten_cap, 0, (cap - t->ten_cap) * sizeof *v);
        t->ten = v, t->ten_cap = cap;
    }
    uint8_t key[CP_TIER_KEY_BYTES];
    cp_tier_tenant_key(name, len, key);
    if (!t->ten[id].bound || memcmp(key, t->ten[id].key, sizeof key) != 0) t->ten[id].epoch_known = 0;
    memcpy(t->ten[id].key, key, sizeof key);
    t->ten[id].bound = 1;
    pthread_mutex_unlock(&t->ten_lock);
    return CP_OK;
}
