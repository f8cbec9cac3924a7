/* The lines of `run`'s inputs, each checked failing closed: a request line
 * of the request log (JSONL) and a replay plan line (--plan-in). */
#ifndef CP_RUN_LINES_H
#define CP_RUN_LINES_H

#include <stddef.h>
#include <stdint.h>

#include "request.h"
#include "tenant.h"

struct cJSON;

/* A parsed request line j into r (its strings point into j); the messages
 * and their marked spans are malloc'd into *msgs / *spans (free both).
 * Returns 0 with the reason in why (cap bytes) on error: a tenant that is
 * not an exact string, a 'sensitive' that is not a boolean, 'spans' that
 * are not in-range integer pairs, an unknown (misspelt) field. */
int cp_run_request_parse(const struct cJSON *j, cp_tenant_table *ten, int default_max, cp_request *r, cp_request_msg **msgs,
                         cp_span **spans, char *why, size_t cap);

/* A replay plan line {"ids": [...], "plan": "FRC..."} (plan_len bytes) and
 * its request line (for max_tokens): ids and per-token codes (0 fresh, 1
 * reused, 2 recomputed), malloc'd, *n of each.  An id that is not an
 * integer in [0, 2^31) or a letter other than F, R, C is an error. */
cp_status cp_run_plan_parse(const char *plan_text, size_t plan_len, const char *req_text, size_t req_len, int default_max,
                            int32_t **ids, uint8_t **codes, int *n, int *max_tokens, cp_error *err);

#endif
