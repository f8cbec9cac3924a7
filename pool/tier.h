/* The shared segment tier: pool segments written through to one Redis (or
 * Valkey) endpoint and looked up there when the local pool misses, so
 * several engine processes share what each computed.  Layered under the
 * engine, beside the pool: it reads and fills a cp_pool and knows nothing
 * of requests.
 *
 * Keys (PREFIX from --tier-prefix, FP the first 8 bytes of the model
 * fingerprint in hex, TK the tenant key: 16 bytes of SHA-256 over a label
 * and the tenant's id bytes, never the id itself):
 *   PREFIX:s:FP:v:SHA           a shared segment's value
 *   PREFIX:s:FP:i:W:H           shared index: a hash, field SHA -> length
 *   PREFIX:p:TK:FP:v:SHA        a private segment of tenant TK
 *   PREFIX:p:TK:FP:i:W:H        its index
 *   PREFIX:e:TK                 the tenant's purge epoch (no TTL)
 * H: 8 bytes of SHA-256(fingerprint, W, the segment's first W tokens) in
 * hex: the same in every process (the pool's rolling hash has a random base
 * per process and cannot be a key here).  A private key space is only ever
 * read for its own tenant, and a purge deletes PREFIX:p:TK:*.  Values and
 * index keys carry a TTL (run Redis with maxmemory-policy volatile-lru), so
 * Redis's eviction is the tier's budget; every index hit is checked against
 * its value (a value gone: a miss, and the field is deleted).
 *
 * What never reaches Redis: a segment holding a sensitive token (private
 * ones stay in the local pool; shared ones the pool already refuses), a
 * segment without its sensitive mask, a private segment of a tenant whose
 * id bytes were not bound (cp_tier_bind_tenant).
 *
 * Authenticity: every value carries an HMAC-SHA-256 under the key the
 * replicas share (--tier-key-file) over its Redis key name and its bytes;
 * whoever can write Redis but lacks the key cannot forge, re-scope or move
 * a value.  An authentic value is still range-checked (finite K/V within a
 * bound, token ids inside the vocabulary, positions inside the context)
 * before it is used.
 *
 * Purges across replicas: a purge increments the tenant's epoch in Redis
 * before it deletes the keys; every replica reads the epoch before a
 * request of the tenant looks anything up (cp_tier_epoch_sync) and drops
 * the tenant's local private segments when it moved or cannot be read, and
 * a private value carries the epoch it was written under: one from an
 * earlier epoch is never used.  An epoch, unlike a published message, is
 * still there for a replica that was down, slow or cut off when the purge
 * ran.
 *
 * Faults: every call has a timeout; a failed call drops the connection and
 * opens the circuit breaker for cooldown_s, during which every call is a
 * miss at once (a warning when it opens and when it closes); then one
 * reconnect is tried.  A value failing any check (length, checksum,
 * fingerprint, layout, scope, owner, token ids) is never used: dropped
 * from Redis and counted.
 *
 * Threads: lookups (cp_tier_fill) and purges on the caller's connection
 * under a mutex; writes on a writer thread of its own with its own
 * connection, from a bounded queue (a full queue drops the write, counted).
 * Purges go through the writer's queue too, after the writes queued before
 * them, so no write queued earlier lands after its tenant's purge. */
#ifndef CP_TIER_H
#define CP_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

#define CP_TIER_HOST_MAX 253
#define CP_TIER_PASSWORD_MAX 512

typedef struct cp_tier_url {
    char host[CP_TIER_HOST_MAX + 1];
    int port; /* 1..65535 */
    int db;   /* 0 when not given */
} cp_tier_url;

/* redis://HOST:PORT[/DB], strictly: the scheme in lower case, a host of
 * letters, digits, '.' and '-', a decimal port 1..65535, an optional
 * decimal DB 0..65535 after one '/'; nothing else (no user or password in
 * the URL, no query, no rediss:// since the client has no TLS). */
cp_status cp_tier_url_parse(const char *url, cp_tier_url *out, cp_error *err);

/* The password file: its bytes less one trailing newline (LF or CRLF);
 * refused when empty, longer than CP_TIER_PASSWORD_MAX, or holding a NUL,
 * CR or LF inside.  pw has CP_TIER_PASSWORD_MAX + 1 bytes. */
cp_status cp_tier_password_read(const char *path, char *pw, size_t *len, cp_error *err);

/* The key file (--tier-key-file): its bytes less one trailing newline, at
 * least CP_TIER_VALUE_KEY_MIN of them (e.g. `openssl rand -hex 32`), at
 * most CP_TIER_PASSWORD_MAX, no NUL, CR or LF inside.  key has
 * CP_TIER_PASSWORD_MAX + 1 bytes. */
#define CP_TIER_VALUE_KEY_MIN 32
cp_status cp_tier_key_read(const char *path, char *key, size_t *len, cp_error *err);

/* ---- the value: one binary per segment (tier_value.c) ----
 * A fixed little-endian header (magic "CPTV", version, header size, flags,
 * layout, length, origin position, purge epoch, owner key, fingerprint,
 * segment SHA-256, HMAC-SHA-256 of the key name and the whole value with
 * this field zeroed), then token ids (int32), recompute flags (a bit per
 * token), then K and V rows as the pool holds them ([layer][K, V][token]
 * [row], the pool's dtype). */
#define CP_TIER_VALUE_VERSION 2
#define CP_TIER_KEY_BYTES 16
/* the largest |K| or |V| a value may hold: the largest finite f16 (nothing
 * this engine computes comes near it; past it an f16 cache overflows) */
#define CP_TIER_KV_BOUND 65504.0f

typedef struct cp_tier_seg {
    int shared;
    uint8_t owner[CP_TIER_KEY_BYTES]; /* private: its tenant key; shared: zero */
    uint8_t sha[32];                  /* SHA-256(fingerprint || token ids), as the pool's */
    uint32_t len;
    int32_t start_pos;
    uint32_t epoch;          /* private: the owner's purge epoch when written; shared: 0 */
    const int32_t *tokens;   /* len */
    const uint8_t *recompute; /* bitset, (len + 7) / 8 bytes */
    const uint8_t *kv;       /* [layer][K, V][len][row] elements of the layout's dtype */
} cp_tier_seg;

/* What a value is sealed with and checked against. */
typedef struct cp_tier_check {
    const uint8_t *key;   /* the key every replica on the tier shares */
    size_t key_len;
    const char *name;     /* the Redis key the value is stored under */
    size_t name_len;
    uint32_t max_len;     /* tokens in one value */
    uint32_t vocab;       /* token ids in [0, vocab) */
    uint32_t max_pos;     /* start_pos + len <= max_pos: the model's context */
    float kv_bound;       /* every K/V element finite, |x| <= kv_bound */
} cp_tier_check;

size_t cp_tier_value_bytes(const cp_kv_layout *l, uint32_t len);
/* Writes seg's value into buf (cp_tier_value_bytes of it), sealed under
 * k's key for the key name k->name. */
cp_status cp_tier_value_encode(const cp_kv_layout *l, const cp_tier_check *k, const cp_tier_seg *seg, uint8_t *buf, cp_error *err);
/* Checks a value read back and points seg into it: the exact length its
 * header implies, magic, version, layout equal to l's, len in [1,
 * max_len] (CP_EFORMAT); its MAC under k's key and key name, compared in
 * constant time (CP_EPERM); fingerprint, flags, the SHA-256 of its token
 * ids (CP_EFORMAT); positions inside max_pos, token ids inside vocab, K/V
 * finite and within kv_bound (CP_ERANGE).  The message names the first
 * failed check. */
cp_status cp_tier_value_decode(const cp_kv_layout *l, const cp_tier_check *k, const uint8_t *buf, size_t n, cp_tier_seg *seg,
                               cp_error *err);
/* The segment SHA of tokens under l's fingerprint (the pool's definition). */
void cp_tier_segment_sha(const cp_kv_layout *l, const int32_t *tokens, uint32_t len, uint8_t sha[32]);
/* The tenant key of id bytes name[0..len). */
void cp_tier_tenant_key(const char *name, size_t len, uint8_t key[CP_TIER_KEY_BYTES]);

/* ---- the client ---- */
typedef struct cp_tier_opts {
    cp_tier_url url;
    const char *prefix;        /* "cacheprune" */
    const char *password;      /* NULL: no AUTH */
    size_t password_len;
    const char *key;           /* the value key the replicas share: required */
    size_t key_len;            /* >= CP_TIER_VALUE_KEY_MIN */
    uint32_t vocab;            /* the model's vocabulary and context, for the values' range checks */
    uint32_t max_pos;
    double timeout_s;          /* per call (connect included): 0.25 */
    double cooldown_s;         /* circuit breaker open time: 1 */
    double ttl_s;              /* values and index keys: 86400 */
    size_t queue_cap;          /* pending writes: 256 */
    size_t queue_bytes;        /* and their bytes: 256 MiB */
    double drain_s;            /* cp_tier_free waits this long for pending writes: 5 */
    /* per-tenant insert quotas across every replica on this Redis (0 = none):
     * counters PREFIX:q:TK:W:{bytes,segs} per window W of quota_window_s,
     * without TTL (volatile-lru never evicts them; the previous window's
     * are deleted when a new one starts) */
    size_t quota_bytes;
    uint32_t quota_segments;
    double quota_window_s;     /* 60 */
} cp_tier_opts;

void cp_tier_opts_default(cp_tier_opts *o);

typedef struct cp_tier_stats {
    uint64_t lookups;            /* cp_tier_fill calls that asked Redis */
    uint64_t hits, misses;       /* segments fetched and placed in the pool / fills that found none */
    uint64_t bytes_read, bytes_written;
    uint64_t writes, write_drops; /* values written; writes dropped (queue full, breaker open, error) */
    uint64_t kept_local;         /* segments never written: a sensitive token, no mask, an unbound tenant */
    uint64_t errors;             /* failed Redis calls (timeouts, refused connections, error replies) */
    uint64_t bad_values;         /* values that failed a check: dropped (every cause below included) */
    uint64_t bad_auth;           /* of them: the MAC did not verify (forged, re-scoped, moved, another key) */
    uint64_t bad_range;          /* of them: authentic but out of range (K/V, token ids, positions) */
    uint64_t stale;              /* private values written before their tenant's last purge: dropped */
    uint64_t epoch_purges;       /* purges through another replica seen in a tenant's epoch (its local segments dropped) */
    uint64_t dangling;           /* index fields whose value was gone: deleted */
    uint64_t breaker_opens, reconnects;
    uint64_t purged_keys;
    uint64_t quota_refusals;     /* local inserts refused by the cross-replica quota */
    double lookup_ms_sum;        /* time in cp_tier_fill's Redis calls */
    uint64_t lookup_ms_n;
} cp_tier_stats;

typedef struct cp_tier cp_tier;

/* Connects lazily: an unreachable Redis is not an error here (the first
 * call opens the breaker); a malformed option is. */
cp_status cp_tier_create(const cp_tier_opts *o, const cp_kv_layout *l, cp_backend *be, cp_tier **out, cp_error *err);
/* Waits up to drain_s for pending writes, then stops the writer. */
void cp_tier_free(cp_tier *t);
/* Waits up to max_s for the write queue to empty; 1 when it did. */
int cp_tier_drain(cp_tier *t, double max_s);

/* The id bytes of pool tenant number id, for its private key space (tenant
 * numbers are per process; the id bytes are the same everywhere).  A
 * tenant never bound has no private tier. */
cp_status cp_tier_bind_tenant(cp_tier *t, uint32_t id, const char *name, size_t len, cp_error *err);

/* Write-through of a segment just stored in the local pool: copied now
 * (kv in backend memory, as for cp_pool_insert), written later by the
 * writer thread.  1 when queued; 0 when kept local or dropped (counted). */
typedef struct cp_tier_write {
    uint32_t tenant;
    cp_scope scope;
    const int32_t *tokens;
    uint32_t len;
    int32_t start_pos;
    const uint8_t *recompute; /* per token 0/1, or NULL */
    const uint8_t *sensitive; /* per token; NULL: never written */
    const cp_kv_source *kv;
} cp_tier_write;
int cp_tier_put(cp_tier *t, const cp_tier_write *w);

/* On a local miss: probes the tier at every request position p with skip[p
 * .. p + W) all 0 (the engine sets skip over tokens already covered and
 * over sensitive ones: no window holding a sensitive token is ever asked
 * for), the tenant's private space when want_private, the shared space when
 * want_shared; fetches the best candidates, checks each, and inserts them
 * into the pool (private ones owned by tenant, shared ones shared).
 * Returns how many segments it inserted (0 when Redis is down: a miss). */
size_t cp_tier_fill(cp_tier *t, cp_pool *pool, uint32_t tenant, const int32_t *tokens, size_t n, const uint8_t *skip,
                    int want_private, int want_shared);

/* Increments the tenant's purge epoch, then deletes every key of its
 * private space (after the writes queued before it): the number of
 * segment values deleted, or -1 when Redis could not be reached or the
 * wait passed max_s (the keys then stay until their TTL, and the other
 * replicas learn of the purge at the next epoch increment that reaches
 * Redis). */
long cp_tier_purge(cp_tier *t, uint32_t tenant, double max_s);

/* Before a request of tenant looks anything up: reads the tenant's purge
 * epoch.  1 when the caller must drop the tenant's local private segments
 * (and admission records) first: the epoch moved since this replica last
 * read it, was never read here, or cannot be read now (a replica cut off
 * from Redis cannot learn of a purge, so it keeps nothing of the tenant's
 * past that it could have missed).  0 for a tenant never bound. */
int cp_tier_epoch_sync(cp_tier *t, uint32_t tenant);

/* The cross-replica quota, around a local insert of `bytes`: allow says
 * whether the tenant's counters in Redis leave room (1 too when no quota is
 * set, or Redis is down: the local pool's quota still holds); charge adds
 * an insert that stored something.  Check-then-charge: replicas racing in
 * one window may overshoot by the inserts in flight. */
int cp_tier_quota_allow(cp_tier *t, uint32_t tenant, size_t bytes);
void cp_tier_quota_charge(cp_tier *t, uint32_t tenant, size_t bytes);

void cp_tier_stats_get(cp_tier *t, cp_tier_stats *out);

#endif
