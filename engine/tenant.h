/* Tenant identity: the exact bytes a client names itself by, mapped to the
 * dense number the engine and the pool key private KV by.
 *
 * Two requests are the same tenant exactly when their id bytes are equal:
 * nothing is coerced (a JSON number is not a tenant id), nothing is cut (an
 * id holding NUL is refused, not truncated), nothing falls back (a failed
 * allocation is an error, never tenant 0).  Every entry point that accepts a
 * tenant id — the request log of `run`, the server — checks it with
 * cp_tenant_id_check and maps it with cp_tenant_intern. */
#ifndef CP_TENANT_H
#define CP_TENANT_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/status.h"

#define CP_TENANT_ID_MAX 256          /* bytes */
#define CP_TENANT_MAX_COUNT (1u << 24) /* distinct tenants one table holds */

/* CP_OK when s[0..len) is 1..CP_TENANT_ID_MAX bytes of well-formed UTF-8
 * without NUL; otherwise CP_EINVAL with a message that never echoes the id. */
cp_status cp_tenant_id_check(const char *s, size_t len, cp_error *err);

typedef struct cp_tenant_table cp_tenant_table;

cp_status cp_tenant_table_create(cp_tenant_table **out, cp_error *err);
void cp_tenant_table_free(cp_tenant_table *t);

/* The number of the tenant named s[0..len): the same number for the same
 * bytes, the next free one (0, 1, 2, ...) for a new id.  The id is checked
 * first.  O(1) expected; the hash is keyed per table, so clients cannot
 * choose ids that collide. */
cp_status cp_tenant_intern(cp_tenant_table *t, const char *s, size_t len, uint32_t *id, cp_error *err);

size_t cp_tenant_count(const cp_tenant_table *t);

/* 1 and *id when s[0..len) is a tenant the table holds, else 0 (adds nothing). */
int cp_tenant_find(const cp_tenant_table *t, const char *s, size_t len, uint32_t *id);

/* Calls f once per tenant with its number and id bytes (the shared tier
 * keys private segments by the bytes: numbers are per process); stops at
 * and returns f's first non-zero. */
int cp_tenant_each(const cp_tenant_table *t, int (*f)(void *ctx, uint32_t id, const char *s, size_t len), void *ctx);

#endif
