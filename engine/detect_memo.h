/* What the detector chain found in a tenant's own earlier messages, kept
 * so that a chat history re-sent every turn is not scanned again.  The
 * detectors -- the NER plugin above all, ~2.5 ms a short message -- are
 * the largest fixed cost of a first token that is not the model's own
 * compute (chat-v1 on cp-books-6m: 38 % of every mode's TTFT), and a
 * conversation's turn k sends the k - 1 turns before it again.
 *
 * Keyed by SHA-256 over (tenant, role, text): a hit needs the same tenant,
 * so no tenant learns from its own timing whether another sent a text.
 * Bounded per tenant: at most `capacity` messages of each tenant, its own
 * least recently used out -- one tenant's messages never push out
 * another's, so no tenant learns from its timing that another sent
 * anything (a single list let a tenant time its own oldest entry's
 * eviction: median 64 against 46 ms).  It holds digests and spans
 * (offsets, types, scores), never text, and a message of more than
 * CP_DETECT_MEMO_SPANS spans is not kept.  The
 * caller keeps only clean outcomes (no detector failed: a failure stays
 * transient), and a tenant's erasure drops its entries.  Each call holds
 * the memo's lock: `serve` detects on its preparing thread while a purge
 * drops a tenant's entries on the engine thread. */
#ifndef CP_DETECT_MEMO_H
#define CP_DETECT_MEMO_H

#include <stddef.h>
#include <stdint.h>

#include "detect/detect.h"

#define CP_DETECT_MEMO_SPANS 256

typedef struct cp_detect_memo cp_detect_memo;

cp_status cp_detect_memo_create(int capacity, cp_detect_memo **out, cp_error *err);
void cp_detect_memo_free(cp_detect_memo *m); /* wipes what it held; NULL is fine */

/* The key of one message of `tenant`. */
void cp_detect_memo_key(uint32_t tenant, cp_role role, const char *text, size_t len, uint8_t key[32]);

/* A hit appends the kept spans to *out (empty on entry), sets its wholly
 * flag and returns 1 (0: a miss; -1 with *err: out of memory). */
int cp_detect_memo_get(cp_detect_memo *m, const uint8_t key[32], cp_spans *out, cp_error *err);

/* Whether key is held (no entry moves in the recency order). */
int cp_detect_memo_has(cp_detect_memo *m, const uint8_t key[32]);

/* Keeps s under key for tenant (a copy; evicts the tenant's least recently
 * used entry when the tenant holds `capacity`).  Out of memory or too many spans: nothing kept. */
void cp_detect_memo_put(cp_detect_memo *m, const uint8_t key[32], uint32_t tenant, const cp_spans *s);

/* Drops every entry of tenant; returns how many. */
size_t cp_detect_memo_purge(cp_detect_memo *m, uint32_t tenant);

/* Entries held (tests, metrics). */
size_t cp_detect_memo_size(cp_detect_memo *m);

#endif
