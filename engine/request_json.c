#include "request_json.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/utf8.h"
#include "json_fields.h"

/* One message's 'spans': [[start, end], ...] byte offsets into its text. */
static cp_status parse_spans(const cJSON *sp, const char *where, size_t text_len, cp_span *spans, size_t *used, size_t *n_marked,
                             cp_error *err)
{
    if (!sp || cJSON_IsNull(sp)) return CP_OK;
    if (!cJSON_IsArray(sp)) return cp_fail(err, CP_EFORMAT, "%s.spans must be an array of [start, end] byte offsets", where);
    int k = 0;
    for (const cJSON *x = sp->child; x; x = x->next, k++) {
        if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) != 2)
            return cp_fail(err, CP_EFORMAT, "%s.spans[%d] must be a pair [start, end]", where, k);
        long long a, b;
        char what[96];
        snprintf(what, sizeof what, "%s.spans[%d]", where, k);
        cp_error e = { 0 };
        if (cp_json_int_value(x->child, what, 0, (long long)text_len, &a, &e) ||
            cp_json_int_value(x->child->next, what, 0, (long long)text_len, &b, &e))
            return cp_fail(err, e.code, "%.400s (offsets are bytes of its %zu-byte content)", e.msg, text_len);
        if (a >= b) return cp_fail(err, CP_ERANGE, "%s.spans[%d] [%lld, %lld] is empty or reversed", where, k, a, b);
        spans[(*used)++] = (cp_span){ (uint32_t)a, (uint32_t)b, "marked", 1 };
        (*n_marked)++;
    }
    return CP_OK;
}

static cp_status parse_message(const cJSON *m, const char *where, const char *const *known, cp_request_msg *out, cp_span *spans,
                               size_t *used, cp_error *err)
{
    if (!cJSON_IsObject(m)) return cp_fail(err, CP_EFORMAT, "%s must be an object", where);
    if (cp_json_known_keys(m, where, known, err)) return CP_EFORMAT;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsString(role)) return cp_fail(err, CP_EFORMAT, "%s.role must be a string", where);
    if (!cJSON_IsString(c)) return cp_fail(err, CP_EFORMAT, "%s.content must be a string", where);
    if (cp_role_from_name(role->valuestring, &out->role, err)) return cp_fail_wrap(err, "%s.role", where);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name"); /* a participant's name: read by nothing, but a string */
    if (name && !cJSON_IsNull(name) && !cJSON_IsString(name)) return cp_fail(err, CP_EFORMAT, "%s.name must be a string", where);
    out->text = c->valuestring;
    out->len = strlen(c->valuestring);
    size_t bad = cp_utf8_validate(out->text, out->len);
    if (bad != out->len) return cp_fail(err, CP_EFORMAT, "%s.content is not valid UTF-8 (byte %zu)", where, bad);
    char at[160];
    snprintf(at, sizeof at, "%s: ", where);
    if (cp_json_no_null(m, "sensitive", at, err) || cp_json_no_null(m, "spans", at, err)) return CP_EFORMAT;
    if (cp_json_bool(m, "sensitive", 0, &out->sensitive, err)) return cp_fail_wrap(err, "%s", where);
    out->marked = spans + *used;
    return parse_spans(cJSON_GetObjectItemCaseSensitive(m, "spans"), where, out->len, spans, used, &out->n_marked, err);
}

cp_status cp_request_json_messages(const cJSON *ms, const char *field, const char *const *known, cp_request_msg **msgs_out,
                                   size_t *n_out, cp_span **spans_out, cp_error *err)
{
    *msgs_out = NULL, *spans_out = NULL, *n_out = 0;
    if (!cJSON_IsArray(ms)) return cp_fail(err, CP_EFORMAT, "'%s' must be an array of messages", field);
    int n = cJSON_GetArraySize(ms);
    if (n == 0) return cp_fail(err, CP_EFORMAT, "'%s' must not be empty", field);
    if (n > CP_REQUEST_MAX_MSGS) return cp_fail(err, CP_ERANGE, "'%s' has %d messages; at most %d", field, n, CP_REQUEST_MAX_MSGS);
    /* room for every span first, so the messages can point into one array */
    size_t n_spans = 0;
    for (const cJSON *m = ms->child; m; m = m->next) {
        const cJSON *sp = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "spans") : NULL;
        n_spans += cJSON_IsArray(sp) ? (size_t)cJSON_GetArraySize(sp) : 0;
    }
    cp_request_msg *msgs = cp_calloc((size_t)n, sizeof *msgs, "request messages", err);
    cp_span *spans = msgs ? cp_calloc(n_spans + 1, sizeof *spans, "request spans", err) : NULL;
    if (!msgs || !spans) {
        free(msgs);
        return CP_ENOMEM;
    }
    size_t used = 0;
    int i = 0;
    for (const cJSON *m = ms->child; m; m = m->next, i++) {
        char where[64];
        snprintf(where, sizeof where, "%.32s[%d]", field, i);
        cp_status rc = parse_message(m, where, known, &msgs[i], spans, &used, err);
        if (rc) {
            free(msgs), free(spans);
            return rc;
        }
    }
    *msgs_out = msgs, *spans_out = spans, *n_out = (size_t)n;
    return CP_OK;
}
