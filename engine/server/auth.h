/* API keys: who a request is.  A tenant comes from its key and from nothing
 * else a client sends (no `user`, `tenant` or `cache_salt` field changes
 * it).
 *
 * Keys file: one `KEY TENANT [operator]` a line, blank lines and `#`
 * comment lines allowed.  A key is 16-512 visible ASCII characters and
 * appears once; TENANT is a tenant id (cp_tenant_id_check); `operator` lets
 * the key read /metrics.  Errors name file:line and never echo a key.
 *
 * Only SHA-256 digests of the keys are kept, and a presented key is
 * compared with every one of them in constant time (CRYPTO_memcmp over
 * fixed-length digests, no early exit), so response timing says nothing
 * about how much of a guess was right. */
#ifndef CP_SRV_AUTH_H
#define CP_SRV_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/status.h"
#include "../tenant.h"

#define SRV_KEY_MIN 16
#define SRV_KEY_MAX 512

typedef struct srv_keys srv_keys;

typedef struct srv_principal {
    uint32_t tenant;
    int operator_;
} srv_principal;

/* text[0..len) in the keys-file format; `where` names it in errors.  Tenant
 * names are mapped to numbers through ten. */
cp_status srv_keys_parse(const char *text, size_t len, const char *where, cp_tenant_table *ten, srv_keys **out, cp_error *err);
cp_status srv_keys_load(const char *path, cp_tenant_table *ten, srv_keys **out, cp_error *err);
void srv_keys_free(srv_keys *k);
size_t srv_keys_count(const srv_keys *k);

typedef enum srv_auth_result { SRV_AUTH_OK = 0, SRV_AUTH_MISSING, SRV_AUTH_MALFORMED, SRV_AUTH_UNKNOWN } srv_auth_result;

/* The principal of an Authorization header value ("Bearer KEY"; NULL when
 * the header is absent). */
srv_auth_result srv_authenticate(const srv_keys *k, const char *authorization, srv_principal *out);

#endif
