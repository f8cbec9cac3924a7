/* The tier's value: one binary per segment (layout in tier.h), written by
 * one process and read by another through a store other parties may write,
 * so nothing in it is believed before its MAC is checked under the key the
 * replicas share, and nothing is used before its range is checked. */
#include <math.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <string.h>

#include "tier.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the tier's value stores token ids and KV rows in host order: little-endian only"
#endif

#define TV_MAGIC "CPTV"
#define TV_HEADER 152u
#define TV_OFF_EPOCH 36u
#define TV_OFF_MAC 120u
#define TV_FLAG_SHARED 1u

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t kv_bytes(const cp_kv_layout *l, uint32_t len)
{
    return (size_t)l->n_layers * 2 * len * cp_kv_row(l) * cp_dtype_size(l->dtype);
}

size_t cp_tier_value_bytes(const cp_kv_layout *l, uint32_t len)
{
    return TV_HEADER + (size_t)len * 4 + ((size_t)len + 7) / 8 + kv_bytes(l, len);
}

void cp_tier_segment_sha(const cp_kv_layout *l, const int32_t *tokens, uint32_t len, uint8_t sha[32])
{
    const void *parts[2] = { l->fingerprint, tokens };
    size_t lens[2] = { CP_FINGERPRINT_BYTES, (size_t)len * sizeof *tokens };
    cp_sha256(parts, lens, 2, sha);
}

void cp_tier_tenant_key(const char *name, size_t len, uint8_t key[CP_TIER_KEY_BYTES])
{
    static const char label[] = "cacheprune tier tenant v1";
    const void *parts[2] = { label, name };
    size_t lens[2] = { sizeof label, len }; /* the label's NUL separates it from the id */
    uint8_t h[32];
    cp_sha256(parts, lens, 2, h);
    memcpy(key, h, CP_TIER_KEY_BYTES);
}

/* HMAC-SHA-256 under the replicas' key over a label, the Redis key's name
 * (its length first, so name and value cannot trade bytes) and the value
 * with its MAC field taken as zero: a value is authentic only under the
 * one key name it was written for, so moving it to another tenant's space
 * or between the shared and private spaces breaks it. */
static cp_status value_mac(const cp_tier_check *k, const uint8_t *buf, size_t n, uint8_t out[32], cp_error *err)
{
    static const char label[] = "cacheprune tier value v2";
    static const uint8_t zero[32];
    uint8_t nl[4];
    put_u32(nl, (uint32_t)k->name_len);
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *c = mac ? EVP_MAC_CTX_new(mac) : NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[2] = { OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end() };
    size_t got = 0;
    int ok = c && EVP_MAC_init(c, k->key, k->key_len, params) == 1 && EVP_MAC_update(c, (const uint8_t *)label, sizeof label) == 1 &&
             EVP_MAC_update(c, nl, 4) == 1 && EVP_MAC_update(c, (const uint8_t *)k->name, k->name_len) == 1 &&
             EVP_MAC_update(c, buf, TV_OFF_MAC) == 1 && EVP_MAC_update(c, zero, 32) == 1 &&
             EVP_MAC_update(c, buf + TV_OFF_MAC + 32, n - TV_OFF_MAC - 32) == 1 && EVP_MAC_final(c, out, &got, 32) == 1 && got == 32;
    EVP_MAC_CTX_free(c);
    EVP_MAC_free(mac);
    return ok ? CP_OK : cp_fail(err, CP_ENOMEM, "tier value: HMAC-SHA-256 failed (OpenSSL)");
}

cp_status cp_tier_value_encode(const cp_kv_layout *l, const cp_tier_check *k, const cp_tier_seg *s, uint8_t *buf, cp_error *err)
{
    size_t n = cp_tier_value_bytes(l, s->len);
    memset(buf, 0, TV_HEADER);
    memcpy(buf, TV_MAGIC, 4);
    buf[4] = CP_TIER_VALUE_VERSION, buf[5] = 0;
    buf[6] = (uint8_t)TV_HEADER, buf[7] = (uint8_t)(TV_HEADER >> 8);
    put_u32(buf + 8, s->shared ? TV_FLAG_SHARED : 0);
    put_u32(buf + 12, (uint32_t)l->n_layers);
    put_u32(buf + 16, (uint32_t)l->n_kv_heads);
    put_u32(buf + 20, (uint32_t)l->head_dim);
    put_u32(buf + 24, (uint32_t)l->dtype);
    put_u32(buf + 28, s->len);
    put_u32(buf + 32, (uint32_t)s->start_pos);
    put_u32(buf + TV_OFF_EPOCH, s->epoch);
    memcpy(buf + 40, s->owner, CP_TIER_KEY_BYTES);
    memcpy(buf + 56, l->fingerprint, CP_FINGERPRINT_BYTES);
    memcpy(buf + 88, s->sha, 32);
    uint8_t *p = buf + TV_HEADER;
    memcpy(p, s->tokens, (size_t)s->len * 4);
    p += (size_t)s->len * 4;
    memcpy(p, s->recompute, ((size_t)s->len + 7) / 8);
    p += ((size_t)s->len + 7) / 8;
    memcpy(p, s->kv, kv_bytes(l, s->len));
    return value_mac(k, buf, n, buf + TV_OFF_MAC, err);
}

/* element i of a K/V row block as a float */
static float kv_at(cp_dtype t, const uint8_t *kv, size_t i)
{
    if (t == CP_F32) {
        float f;
        memcpy(&f, kv + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, kv + 2 * i, 2);
    return t == CP_BF16 ? cp_bf16_to_f32(h) : cp_f16_to_f32(h);
}

/* every K/V element finite and within the bound: a NaN or a huge row
 * would poison every reader's attention */
static cp_status kv_in_range(const cp_kv_layout *l, const cp_tier_check *k, const uint8_t *kv, uint32_t len, cp_error *err)
{
    if (l->dtype != CP_F32 && l->dtype != CP_BF16 && l->dtype != CP_F16)
        return cp_fail(err, CP_EUNSUPPORTED, "tier value: K/V dtype %s has no range check", cp_dtype_name(l->dtype));
    size_t m = kv_bytes(l, len) / cp_dtype_size(l->dtype);
    for (size_t i = 0; i < m; i++) {
        float x = kv_at(l->dtype, kv, i);
        if (!isfinite(x) || fabsf(x) > k->kv_bound)
            return cp_fail(err, CP_ERANGE, "tier value: K/V element %zu is %s (bound %g)", i, isfinite(x) ? "out of range" : "not finite",
                           (double)k->kv_bound);
    }
    return CP_OK;
}

cp_status cp_tier_value_decode(const cp_kv_layout *l, const cp_tier_check *k, const uint8_t *buf, size_t n, cp_tier_seg *s,
                               cp_error *err)
{
    memset(s, 0, sizeof *s);
    if (n < TV_HEADER) return cp_fail(err, CP_EFORMAT, "tier value: %zu bytes, shorter than its header", n);
    if (memcmp(buf, TV_MAGIC, 4) != 0) return cp_fail(err, CP_EFORMAT, "tier value: bad magic");
    if (buf[4] != CP_TIER_VALUE_VERSION || buf[5] != 0)
        return cp_fail(err, CP_EFORMAT, "tier value: version %u, this build reads %d", (unsigned)buf[4] | (unsigned)buf[5] << 8,
                       CP_TIER_VALUE_VERSION);
    if (((unsigned)buf[6] | (unsigned)buf[7] << 8) != TV_HEADER) return cp_fail(err, CP_EFORMAT, "tier value: bad header size");
    uint32_t len = get_u32(buf + 28);
    if (len == 0 || len > k->max_len) return cp_fail(err, CP_EFORMAT, "tier value: length %u outside [1, %u]", len, k->max_len);
    if (get_u32(buf + 12) != (uint32_t)l->n_layers || get_u32(buf + 16) != (uint32_t)l->n_kv_heads ||
        get_u32(buf + 20) != (uint32_t)l->head_dim || get_u32(buf + 24) != (uint32_t)l->dtype)
        return cp_fail(err, CP_EFORMAT, "tier value: KV layout is not this pool's");
    /* before the MAC, so the MAC never reads past the buffer */
    if (n != cp_tier_value_bytes(l, len))
        return cp_fail(err, CP_EFORMAT, "tier value: %zu bytes where its header implies %zu", n, cp_tier_value_bytes(l, len));
    uint8_t mac[32];
    cp_status rc = value_mac(k, buf, n, mac, err);
    if (rc) return rc;
    if (CRYPTO_memcmp(mac, buf + TV_OFF_MAC, 32) != 0)
        return cp_fail(err, CP_EPERM, "tier value: its MAC does not verify under this tier's key and key name");
    if (memcmp(buf + 56, l->fingerprint, CP_FINGERPRINT_BYTES) != 0)
        return cp_fail(err, CP_EFORMAT, "tier value: another model's fingerprint");
    uint32_t flags = get_u32(buf + 8);
    if (flags & ~TV_FLAG_SHARED) return cp_fail(err, CP_EFORMAT, "tier value: unknown flags 0x%x", flags);
    s->shared = (flags & TV_FLAG_SHARED) != 0;
    memcpy(s->owner, buf + 40, CP_TIER_KEY_BYTES);
    memcpy(s->sha, buf + 88, 32);
    s->len = len;
    s->epoch = get_u32(buf + TV_OFF_EPOCH);
    s->tokens = (const int32_t *)(const void *)(buf + TV_HEADER);
    s->recompute = buf + TV_HEADER + (size_t)len * 4;
    s->kv = s->recompute + ((size_t)len + 7) / 8;
    uint8_t sha[32];
    cp_tier_segment_sha(l, s->tokens, len, sha);
    if (memcmp(sha, s->sha, 32) != 0) return cp_fail(err, CP_EFORMAT, "tier value: token ids do not match its SHA-256");
    /* authentic is not the same as sane: a replica's bug or a key holder's
     * value is still checked against what this model can use */
    uint32_t start = get_u32(buf + 32);
    if (start >= k->max_pos || len > k->max_pos - start)
        return cp_fail(err, CP_ERANGE, "tier value: positions [%u, %llu) outside the context (%u)", start,
                       (unsigned long long)start + len, k->max_pos);
    s->start_pos = (int32_t)start;
    for (uint32_t i = 0; i < len; i++)
        if (s->tokens[i] < 0 || (uint32_t)s->tokens[i] >= k->vocab)
            return cp_fail(err, CP_ERANGE, "tier value: token %u's id is outside the vocabulary (%u)", i, k->vocab);
    return kv_in_range(l, k, s->kv, len, err);
}
