/* The lines of `run`'s inputs: a request line of the request log and a
 * replay plan line (see run_lines.h).  Apart from the CLI so the fuzzers
 * reach them without an engine. */
#include "run_lines.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_fields.h"
#include "request_json.h"

/* One JSON line into a request (strings point into j).  0 and a message on
 * error.  Everything that decides what is private fails closed: a tenant
 * that is not an exact string, a 'sensitive' that is not a boolean, 'spans'
 * that are not in-range integer pairs, an unknown (misspelt) field. */
static const char *const request_keys[] = { "tenant", "messages", "prompt", "max_tokens", "temperature", "top_p", "seed", NULL };
static const char *const message_keys[] = { "role", "content", "sensitive", "spans", NULL };

int cp_run_request_parse(const cJSON *j, cp_tenant_table *ten, int default_max, cp_request *r, cp_request_msg **msgs_out,
                         cp_span **spans_out, char *why, size_t cap)
{
    *msgs_out = NULL;
    *spans_out = NULL;
    memset(r, 0, sizeof *r);
    cp_error e;
    if (!cJSON_IsObject(j)) return snprintf(why, cap, "not a JSON object"), 0;
    if (cp_json_known_keys(j, "request", request_keys, &e)) return snprintf(why, cap, "%s", e.msg), 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tenant");
    if (!t) return snprintf(why, cap, "missing 'tenant'"), 0;
    if (!cJSON_IsString(t)) return snprintf(why, cap, "'tenant' must be a string (a number is not a tenant id)"), 0;
    if (cp_tenant_intern(ten, t->valuestring, strlen(t->valuestring), &r->tenant, &e)) return snprintf(why, cap, "%s", e.msg), 0;
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "messages"), *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (ms && pr) return snprintf(why, cap, "give 'messages' or 'prompt', not both"), 0;
    if (pr && !cJSON_IsString(pr)) return snprintf(why, cap, "'prompt' must be a string"), 0;
    if (ms && !cJSON_IsArray(ms)) return snprintf(why, cap, "'messages' must be an array"), 0;
    cp_request_msg *msgs = NULL;
    cp_span *spans = NULL;
    size_t n = 1;
    if (ms) {
        if (cp_request_json_messages(ms, "messages", message_keys, &msgs, &n, &spans, &e)) return snprintf(why, cap, "%s", e.msg), 0;
    } else if (!pr) {
        return snprintf(why, cap, "missing 'messages' (a non-empty array) or 'prompt'"), 0;
    } else if (!(msgs = calloc(1, sizeof *msgs))) {
        return snprintf(why, cap, "out of memory"), 0;
    } else {
        msgs[0] = (cp_request_msg){ CP_ROLE_USER, pr->valuestring, strlen(pr->valuestring), 0, NULL, 0 };
    }
    *msgs_out = msgs, *spans_out = spans;
    r->msgs = msgs;
    r->n_msgs = n;
    long long mt, sd;
    double tp, pp;
    if (cp_json_int(j, "max_tokens", 0, 1 << 20, default_max, &mt, &e) || cp_json_real(j, "temperature", 0, 100, 0, &tp, &e) ||
        cp_json_real(j, "top_p", 0, 1, 1, &pp, &e) || cp_json_int(j, "seed", 0, 1LL << 53, 0, &sd, &e))
        return snprintf(why, cap, "%s", e.msg), 0;
    r->max_tokens = (int)mt;
    r->sampling.temperature = (float)tp;
    r->sampling.top_p = (float)pp;
    r->sampling.seed = (uint64_t)sd;
    return 1;
}

/* The optional "segs" of a plan line: per token '.' (fresh), 'S' (a reused
 * segment's first token), '-' (a reused segment's later token) or 'X'
 * (reused, exact: KV computed in this very context), into the codes' flags.
 * It must agree with the plan: '.' exactly where the plan has F, 'X' only
 * where it has R. */
static cp_status segs_parse(const cJSON *pj, const char *plan, int n, uint8_t *p, cp_error *err)
{
    const cJSON *sg = cJSON_GetObjectItemCaseSensitive(pj, "segs");
    if (!sg) return CP_OK;
    if (!cJSON_IsString(sg) || strlen(sg->valuestring) != (size_t)n)
        return cp_fail(err, CP_EFORMAT, "'segs' must be a string as long as the plan");
    for (int i = 0; i < n; i++) {
        char c = sg->valuestring[i];
        int ok = c == '.' ? plan[i] == 'F' : (c == 'S' || c == '-') ? plan[i] != 'F' : c == 'X' && plan[i] == 'R';
        if (!ok) return cp_fail(err, CP_EFORMAT, "'segs' %d is '%c' where the plan has '%c'", i, c, plan[i]);
        p[i] |= c == 'S' ? CP_PLAN_SEG_START : c == 'X' ? CP_PLAN_EXACT : 0;
    }
    return CP_OK;
}

/* A replay plan line: {"ids": [...], "plan": "FRC...", "segs": ".S--X..."
 * (optional)} -> ids and per-token plan codes (cp_response's: 0 fresh, 1
 * reused, 2 recomputed, with the segment flags). */
cp_status cp_run_plan_parse(const char *plan_text, size_t plan_len, const char *req_text, size_t req_len, int default_max, int32_t **ids_out, uint8_t **plan_out, int *n_out,
                            int *max_tokens, cp_error *err)
{
    cJSON *pj = NULL, *rj = NULL;
    int32_t *v = NULL;
    uint8_t *p = NULL;
    int n = 0;
    long long mt = default_max;
    cp_status rc = cp_json_parse_strict(plan_text, plan_len, &pj, err);
    if (rc) {
        cp_fail_wrap(err, "plan");
        goto done;
    }
    if ((rc = cp_json_parse_strict(req_text, req_len, &rj, err)) == CP_OK)
        rc = cJSON_IsObject(rj) ? cp_json_int(rj, "max_tokens", 0, 1 << 20, default_max, &mt, err)
                                : cp_fail(err, CP_EFORMAT, "not a JSON object");
    if (rc) {
        cp_fail_wrap(err, "request");
        goto done;
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(pj, "ids"), *pls = cJSON_GetObjectItemCaseSensitive(pj, "plan");
    n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
    if (!n || !cJSON_IsString(pls) || strlen(pls->valuestring) != (size_t)n) {
        rc = cp_fail(err, CP_EFORMAT, "needs 'ids' (a non-empty array) and a 'plan' string of the same length");
        goto done;
    }
    v = cp_malloc((size_t)n * sizeof *v, "plan ids", err);
    p = cp_malloc((size_t)n, "plan", err);
    if (!v || !p) {
        rc = CP_ENOMEM;
        goto done;
    }
    int k = 0;
    for (const cJSON *x = ids->child; x && rc == CP_OK; x = x->next, k++) {
        long long id;
        if ((rc = cp_json_int_value(x, "ids[]", 0, INT32_MAX, &id, err)) == CP_OK) v[k] = (int32_t)id;
    }
    for (int i = 0; rc == CP_OK && i < n; i++) {
        char c = pls->valuestring[i];
        if (c != 'F' && c != 'R' && c != 'C') rc = cp_fail(err, CP_EFORMAT, "code %d is '%c', not F, R or C", i, c);
        p[i] = c == 'R' ? 1 : c == 'C' ? 2 : 0;
    }
    if (rc == CP_OK) rc = segs_parse(pj, pls->valuestring, n, p, err);
    if (rc) cp_fail_wrap(err, "plan");
done:
    cJSON_Delete(pj), cJSON_Delete(rj);
    if (rc) free(v), free(p), v = NULL, p = NULL, n = 0;
    *ids_out = v, *plan_out = p, *n_out = n;
    *max_tokens = (int)mt;
    return rc;
}
