/* Strict readers for fields of JSON requests (cJSON): a field of the wrong
 * type, a number that is not finite, not integral where it must be, or out
 * of its range is an error naming the field — never a cast of whatever the
 * double held, never a silent default.  Shared by every entry point that
 * takes requests as JSON (`run`'s request log, the server). */
#ifndef CP_JSON_FIELDS_H
#define CP_JSON_FIELDS_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/status.h"

struct cJSON;

/* Makes every block cJSON frees zeroed first (cJSON_InitHooks: a free that
 * wipes the block's usable size).  A request's JSON holds its prompt, and
 * cJSON frees copies of it where no caller can wipe them: a tree it built
 * in part before a syntax error, the buffers it outgrows while printing.
 * Called once, before any thread parses (the process's one cJSON set-up). */
void cp_json_wipe_on_free(void);

/* Parses exactly text[0..len) as one JSON value: trailing non-blank bytes,
 * a raw NUL byte, or a string escape \u0000 anywhere (cJSON would cut the
 * string there) are errors; a syntax error names its byte offset. */
cp_status cp_json_parse_strict(const char *text, size_t len, struct cJSON **out, cp_error *err);
/* The file at path (at most max bytes) parsed as cp_json_parse_strict does. */
cp_status cp_json_read_strict(const char *path, size_t max, struct cJSON **out, cp_error *err);

/* Each reader: an absent (or null) field leaves *out = def and returns CP_OK;
 * anything else must be of the field's type and range, or CP_EFORMAT /
 * CP_ERANGE with "'NAME' must be ...". */
cp_status cp_json_int(const struct cJSON *obj, const char *name, long long lo, long long hi, long long def, long long *out,
                      cp_error *err);
cp_status cp_json_real(const struct cJSON *obj, const char *name, double lo, double hi, double def, double *out, cp_error *err);
cp_status cp_json_bool(const struct cJSON *obj, const char *name, int def, int *out, cp_error *err);
/* A field that decides privacy ("sensitive", "spans", "cache", "store") sent
 * as null is refused, not read as absent: a client that meant something by
 * it gets an error, never the default (which shares). */
cp_status cp_json_no_null(const struct cJSON *obj, const char *name, const char *where, cp_error *err);
/* An integer value (not a field): an array element, say. */
cp_status cp_json_int_value(const struct cJSON *v, const char *what, long long lo, long long hi, long long *out, cp_error *err);

/* CP_OK when every key of obj is one of the NULL-terminated list `known`;
 * otherwise names the first unknown key (a misspelt privacy field must not
 * be ignored); a key that appears twice is an error too. */
cp_status cp_json_known_keys(const struct cJSON *obj, const char *where, const char *const *known, cp_error *err);

#endif
