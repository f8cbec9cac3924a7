#include "json_fields.h"

#include <cjson/cJSON.h>
#include <malloc.h>
#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/fileio.h"
#include "../tokenizer/utf8.h"

/* What RFC 8259 or this project refuses inside a string literal that
 * cJSON takes: \u0000 (NUL: every C string after it would be cut there)
 * and a raw control byte (below 0x20: a tab, a newline or an escape
 * sequence written as itself).  The offset of the first such byte, or -1;
 * *nul says which.  A backslash that is itself escaped starts no escape. */
static long string_fault(const char *s, size_t n, int *nul)
{
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in_str) {
            in_str = s[i] == '"';
            continue;
        }
        if (s[i] == '"') in_str = 0;
        else if ((unsigned char)s[i] < 0x20) return *nul = 0, (long)i;
        else if (s[i] == '\\' && i + 1 < n) {
            if (s[i + 1] == 'u' && i + 5 < n && memcmp(s + i + 2, "0000", 4) == 0) return *nul = 1, (long)i;
            i++; /* the escaped character */
        }
    }
    return -1;
}

/* Every key in v well-formed UTF-8, as JSON text must be (RFC 8259 8.1):
 * a key is compared, named in errors and echoed like any string (values
 * are checked by the readers of the fields, which name them).  The depth
 * is cJSON's nesting limit, which the parse has already enforced. */
static int keys_utf8(const cJSON *v, int depth)
{
    for (const cJSON *c = v; c; c = depth ? c->next : NULL) {
        if (c->string && cp_utf8_validate(c->string, strlen(c->string)) != strlen(c->string)) return 0;
        if (c->child && !keys_utf8(c->child, depth + 1)) return 0;
    }
    return 1;
}

static void wiping_free(void *p)
{
    if (!p) return;
    OPENSSL_cleanse(p, malloc_usable_size(p));
    free(p);
}

void cp_json_wipe_on_free(void)
{
    cJSON_Hooks h = { .malloc_fn = malloc, .free_fn = wiping_free };
    cJSON_InitHooks(&h);
}

cp_status cp_json_parse_strict(const char *text, size_t len, cJSON **out, cp_error *err)
{
    *out = NULL;
    if (memchr(text, 0, len)) return cp_fail(err, CP_EFORMAT, "a NUL byte at offset %zu", (size_t)((const char *)memchr(text, 0, len) - text));
    int nul = 0;
    long bad = string_fault(text, len, &nul);
    if (bad >= 0 && nul) return cp_fail(err, CP_EFORMAT, "a string holds \\u0000 (NUL), which is not allowed");
    if (bad >= 0) return cp_fail(err, CP_EFORMAT, "a raw control byte in a string at byte %ld (write it escaped, e.g. \\n or \\t)", bad);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        return cp_fail(err, CP_EFORMAT, "invalid JSON at byte %zu", at);
    }
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(j);
            return cp_fail(err, CP_EFORMAT, "unexpected bytes after the JSON value at byte %zu", (size_t)(p - text));
        }
    if (!keys_utf8(j, 0)) {
        cJSON_Delete(j);
        return cp_fail(err, CP_EFORMAT, "a key is not valid UTF-8 (raw bytes, or a lone \\uD800-\\uDFFF escape)");
    }
    *out = j;
    return CP_OK;
}

cp_status cp_json_read_strict(const char *path, size_t max, cJSON **out, cp_error *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    cp_status rc = cp_read_file(path, max, &text, &len, err);
    if (rc == CP_OK) rc = cp_json_parse_strict(text, len, out, err);
    free(text);
    return rc;
}

/* d in the fewest digits that read back as d: an out-of-range 2.0000001
 * is not reported as "got 2" (%g's six digits) */
static const char *shortest(char buf[32], double d)
{
    for (int p = 6; p < 17; p++) {
        snprintf(buf, 32, "%.*g", p, d);
        if (strtod(buf, NULL) == d) return buf;
    }
    snprintf(buf, 32, "%.17g", d);
    return buf;
}

static const char *type_name(const cJSON *v)
{
    return cJSON_IsString(v) ? "a string" : cJSON_IsBool(v) ? "a boolean" : cJSON_IsArray(v) ? "an array"
         : cJSON_IsObject(v) ? "an object" : cJSON_IsNumber(v) ? "a number" : "something else";
}

cp_status cp_json_int_value(const cJSON *v, const char *what, long long lo, long long hi, long long *out, cp_error *err)
{
    if (!cJSON_IsNumber(v)) return cp_fail(err, CP_EFORMAT, "'%s' must be an integer, not %s", what, type_name(v));
    double d = v->valuedouble;
    /* bounds as doubles before any cast: a cast of an out-of-range double is undefined */
    char got[32];
    if (!isfinite(d) || d != floor(d)) return cp_fail(err, CP_EFORMAT, "'%s' must be an integer, got %s", what, shortest(got, d));
    if (d < (double)lo || d > (double)hi) return cp_fail(err, CP_ERANGE, "'%s' must be in [%lld, %lld], got %.17g", what, lo, hi, d);
    *out = (long long)d;
    return CP_OK;
}

static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

cp_status cp_json_int(const cJSON *obj, const char *name, long long lo, long long hi, long long def, long long *out, cp_error *err)
{
    const cJSON *v = field(obj, name);
    if (!v) return *out = def, CP_OK;
    return cp_json_int_value(v, name, lo, hi, out, err);
}

cp_status cp_json_real(const cJSON *obj, const char *name, double lo, double hi, double def, double *out, cp_error *err)
{
    const cJSON *v = field(obj, name);
    if (!v) return *out = def, CP_OK;
    if (!cJSON_IsNumber(v)) return cp_fail(err, CP_EFORMAT, "'%s' must be a number, not %s", name, type_name(v));
    double d = v->valuedouble;
    char got[32];
    if (!isfinite(d) || d < lo || d > hi) return cp_fail(err, CP_ERANGE, "'%s' must be in [%g, %g], got %s", name, lo, hi, shortest(got, d));
    *out = d;
    return CP_OK;
}

cp_status cp_json_bool(const cJSON *obj, const char *name, int def, int *out, cp_error *err)
{
    const cJSON *v = field(obj, name);
    if (!v) return *out = def, CP_OK;
    if (!cJSON_IsBool(v)) return cp_fail(err, CP_EFORMAT, "'%s' must be true or false, not %s", name, type_name(v));
    *out = cJSON_IsTrue(v);
    return CP_OK;
}

cp_status cp_json_no_null(const cJSON *obj, const char *name, const char *where, cp_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (v && cJSON_IsNull(v))
        return cp_fail(err, CP_EFORMAT, "%s'%s' is null: this field decides what is shared; send a value or leave it out", where, name);
    return CP_OK;
}

cp_status cp_json_known_keys(const cJSON *obj, const char *where, const char *const *known, cp_error *err)
{
    for (const cJSON *c = obj ? obj->child : NULL; c; c = c->next) {
        /* a repeated key: readers that keep the first and readers that keep
         * the last would disagree about, say, "sensitive" */
        for (const cJSON *d = obj->child; d != c; d = d->next)
            if (d->string && c->string && strcmp(d->string, c->string) == 0)
                return cp_fail(err, CP_EFORMAT, "%s: field '%.64s' appears twice", where, c->string);
        int ok = 0;
        for (const char *const *k = known; *k && !ok; k++) ok = c->string && strcmp(c->string, *k) == 0;
        if (!ok) {
            char list[256] = "";
            for (const char *const *k = known; *k; k++)
                strncat(list, *k, sizeof list - strlen(list) - 3), strncat(list, k[1] ? ", " : "", sizeof list - strlen(list) - 1);
            return cp_fail(err, CP_EFORMAT, "%s: unknown field '%.64s' (known: %s)", where, c->string ? c->string : "", list);
        }
    }
    return CP_OK;
}
