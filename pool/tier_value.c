/* The tier's value: one binary per segment (layout in tier.h), written by
 * one process and read by another, so every field read back is checked
 * before anything points into it. */
#include <string.h>

#include "tier.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the tier's value stores token ids and KV rows in host order: little-endian only"
#endif

#define TV_MAGIC "CPTV"
#define TV_HEADER 152u
#define TV_OFF_CHECKSUM 120u
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

/* SHA-256 of the value with its checksum field taken as zero */
static void value_checksum(const uint8_t *buf, size_t n, uint8_t out[32])
{
    static const uint8_t zero[32];
    const void *parts[3] = { buf, zero, buf + TV_OFF_CHECKSUM + 32 };
    size_t lens[3] = { TV_OFF_CHECKSUM, 32, n - TV_OFF_CHECKSUM - 32 };
    cp_sha256(parts, lens, 3, out);
}

void cp_tier_value_encode(const cp_kv_layout *l, const cp_tier_seg *s, uint8_t *buf)
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
    memcpy(buf + 40, s->owner, CP_TIER_KEY_BYTES);
    memcpy(buf + 56, l->fingerprint, CP_FINGERPRINT_BYTES);
    memcpy(buf + 88, s->sha, 32);
    uint8_t *p = buf + TV_HEADER;
    memcpy(p, s->tokens, (size_t)s->len * 4);
    p += (size_t)s->len * 4;
    memcpy(p, s->recompute, ((size_t)s->len + 7) / 8);
    p += ((size_t)s->len + 7) / 8;
    memcpy(p, s->kv, kv_bytes(l, s->len));
    value_checksum(buf, n, buf + TV_OFF_CHECKSUM);
}

cp_status cp_tier_value_decode(const cp_kv_layout *l, const uint8_t *buf, size_t n, uint32_t max_len, cp_tier_seg *s,
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
    if (len == 0 || len > max_len) return cp_fail(err, CP_EFORMAT, "tier value: length %u outside [1, %u]", len, max_len);
    if (get_u32(buf + 12) != (uint32_t)l->n_layers || get_u32(buf + 16) != (uint32_t)l->n_kv_heads ||
        get_u32(buf + 20) != (uint32_t)l->head_dim || get_u32(buf + 24) != (uint32_t)l->dtype)
        return cp_fail(err, CP_EFORMAT, "tier value: KV layout is not this pool's");
    /* before the checksum, so the checksum never reads past the buffer */
    if (n != cp_tier_value_bytes(l, len))
        return cp_fail(err, CP_EFORMAT, "tier value: %zu bytes where its header implies %zu", n, cp_tier_value_bytes(l, len));
    uint8_t sum[32];
    value_checksum(buf, n, sum);
    if (memcmp(sum, buf + TV_OFF_CHECKSUM, 32) != 0) return cp_fail(err, CP_EFORMAT, "tier value: checksum mismatch");
    if (memcmp(buf + 56, l->fingerprint, CP_FINGERPRINT_BYTES) != 0)
        return cp_fail(err, CP_EFORMAT, "tier value: another model's fingerprint");
    uint32_t flags = get_u32(buf + 8);
    if (flags & ~TV_FLAG_SHARED) return cp_fail(err, CP_EFORMAT, "tier value: unknown flags 0x%x", flags);
    int32_t start = (int32_t)get_u32(buf + 32);
    if (start < 0) return cp_fail(err, CP_EFORMAT, "tier value: origin position %d", (int)start);
    s->shared = (flags & TV_FLAG_SHARED) != 0;
    memcpy(s->owner, buf + 40, CP_TIER_KEY_BYTES);
    memcpy(s->sha, buf + 88, 32);
    s->len = len;
    s->start_pos = start;
    s->tokens = (const int32_t *)(const void *)(buf + TV_HEADER);
    s->recompute = buf + TV_HEADER + (size_t)len * 4;
    s->kv = s->recompute + ((size_t)len + 7) / 8;
    uint8_t sha[32];
    cp_tier_segment_sha(l, s->tokens, len, sha);
    if (memcmp(sha, s->sha, 32) != 0) return cp_fail(err, CP_EFORMAT, "tier value: token ids do not match its SHA-256");
    return CP_OK;
}
