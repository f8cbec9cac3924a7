/* `run`'s request log fails closed: a tenant id is its exact bytes (never a
 * number coerced to text, never cut at a NUL, never longer than 256 bytes),
 * and every field that decides what is private is an error when mistyped —
 * the request is refused in place, never run with its marking dropped. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../engine/json_fields.h"
#include "../engine/tenant.h"
#include "helpers.h"


/* Runs the log (lines joined by '\n') through `run --report-reuse
 * --user-text private` on cp-books-6m (user text is then reusable by its
 * owner only, so any reuse across tenants is a leak); returns the result
 * lines as parsed JSON (n_out of them). */
static cJSON **run_log(const char *name, const char *log_text, int *n_out)
{
    char dir[512], log[600], out[600], model[512];
    test_tmpdir(dir, sizeof dir, name);
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    cr_assert(write_bytes(log, log_text, strlen(log_text)), "cannot write %s", log);
    const char *b = getenv("CP_BIN");
    /* 1 when some line failed (each such test checks which, in the result lines) */
    int rc = test_sh("%s run --quiet-progress --report-reuse --user-text private --model %s --requests %s --out %s > /dev/null 2>&1",
                     b && *b ? b : "build/cacheprune", model, log, out);
    cr_assert(rc == 0 || rc == 1, "run exited %d", rc);
    char *text = read_text(out, NULL);
    cr_assert(text, "no results in %s", out);
    cJSON **v = calloc(256, sizeof *v);
    int n = 0;
    for (char *p = strtok(text, "\n"); p && n < 256; p = strtok(NULL, "\n")) {
        v[n] = cJSON_Parse(p);
        cr_assert(v[n], "result line %d is not JSON", n + 1);
        n++;
    }
    free(text);
    *n_out = n;
    return v;
}

static const char *error_of(cJSON *r)
{
    const cJSON *e = cJSON_GetObjectItem(r, "error");
    return cJSON_IsString(e) ? e->valuestring : NULL;
}

static int reused_of(cJSON *r)
{
    const cJSON *x = cJSON_GetObjectItem(r, "reused");
    cr_assert(cJSON_IsNumber(x), "no 'reused' in a result (error: %s)", error_of(r) ? error_of(r) : "none");
    return (int)x->valuedouble;
}

static void free_results(cJSON **v, int n)
{
    for (int i = 0; i < n; i++) cJSON_Delete(v[i]);
    free(v);
}

#define SECRET_Q "Please remember the plan we agreed on for the harbour festival next spring, with the boats, the music and the lanterns along the old stone pier, and tell me what comes next"

/* acme's private prompt, then tenants whose ids a lossy parse would merge
 * with acme's (cut at a NUL, numbers printed with %.0f, over-long ids
 * truncated):
 * each must be refused, or (a distinct valid id) reuse nothing; acme itself
 * asking again is the positive control that private reuse works at all. */
Test(run_input, tenant_ids_never_merge, .timeout = TEST_TIMEOUT(120))
{
    char overlong[300];
    memset(overlong, 'a', sizeof overlong - 1);
    overlong[sizeof overlong - 1] = 0;
    char log[8192];
    const char *msg = "\"messages\":[{\"role\":\"user\",\"content\":\"" SECRET_Q "\"}],\"max_tokens\":1";
    snprintf(log, sizeof log,
             "{\"tenant\":\"acme\",%s}\n"
             "{\"tenant\":\"acme\\u0000attacker\",%s}\n"       /* cut at the NUL, this would be acme */
             "{\"tenant\":1234567890123456789,%s}\n"           /* %%.0f makes both of these the same text */
             "{\"tenant\":1234567890123456790,%s}\n"
             "{\"tenant\":\"%s\",%s}\n"                          /* overlong */
             "{\"tenant\":\"acme \",%s}\n"                       /* distinct bytes: a different tenant */
             "{\"tenant\":\"Acme\",%s}\n"
             "{\"tenant\":\"\",%s}\n"
             "{\"tenant\":\"acme\",%s}\n",                       /* acme again: reuses its own KV */
             msg, msg, msg, msg, overlong, msg, msg, msg, msg, msg);
    int n;
    cJSON **r = run_log("tenant_ids", log, &n);
    cr_assert_eq(n, 9);
    cr_assert_null(error_of(r[0]), "%s", error_of(r[0]));
    cr_assert_eq(reused_of(r[0]), 0);
    for (int i = 1; i <= 4; i++) cr_assert(error_of(r[i]), "line %d must be refused", i + 1);
    cr_assert(strstr(error_of(r[1]), "\\u0000"), "%s", error_of(r[1]));
    cr_assert(strstr(error_of(r[2]), "'tenant' must be a string"), "%s", error_of(r[2]));
    cr_assert(strstr(error_of(r[4]), "at most 256"), "%s", error_of(r[4]));
    cr_assert_eq(reused_of(r[5]), 0, "'acme ' reused acme's private KV");
    cr_assert_eq(reused_of(r[6]), 0, "'Acme' reused acme's private KV");
    cr_assert(error_of(r[7]), "an empty tenant id must be refused");
    cr_assert_gt(reused_of(r[8]), 20, "positive control: acme reuses its own private KV");
    free_results(r, n);
}

/* Every mistyped field that decides what is private is an error naming the
 * field and the physical line (blank lines counted); none is run. */
Test(run_input, privacy_fields_fail_closed, .timeout = TEST_TIMEOUT(120))
{
    static const struct {
        const char *msg_extra, *top_extra, *want;
    } bad[] = {
        { ",\"sensitive\":\"true\"", "", "'sensitive' must be true or false" },
        { ",\"sensitive\":1", "", "'sensitive' must be true or false" },
        { ",\"spans\":{\"a\":1}", "", "spans must be an array" },
        { ",\"spans\":\"150-194\"", "", "spans must be an array" },
        { ",\"spans\":[[1e20,1e21]]", "", "must be in [0, 14]" },
        { ",\"spans\":[[11,14.5]]", "", "must be an integer" },
        { ",\"spans\":[[14,11]]", "", "empty or reversed" },
        { ",\"spans\":[[11,15]]", "", "must be in [0, 14]" },
        { ",\"spans\":[[11]]", "", "must be a pair" },
        { ",\"spans\":[[-1,3]]", "", "must be in [0, 14]" },
        { ",\"sensitve\":true", "", "unknown field 'sensitve'" },
        { ",\"sensitive\":false,\"sensitive\":true", "", "appears twice" },
        { "", ",\"max_tokens\":1e30", "'max_tokens' must be in" },
        { "", ",\"max_tokens\":2.5", "'max_tokens' must be an integer" },
        { "", ",\"max_tokens\":\"5\"", "'max_tokens' must be an integer" },
        { "", ",\"seed\":-3", "'seed' must be in" },
        { "", ",\"temperature\":\"hot\"", "'temperature' must be a number" },
        { "", ",\"top_p\":7", "'top_p' must be in" },
        { "", "} trailing", "after the JSON value" },
    };
    const int nb = (int)(sizeof bad / sizeof bad[0]);
    size_t cap = 65536, len = 0;
    char *log = malloc(cap);
    for (int i = 0; i < nb; i++) {
        len += (size_t)snprintf(log + len, cap - len,
                                "\n{\"tenant\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"my name is Bob\"%s}]%s%s\n",
                                bad[i].msg_extra, bad[i].top_extra, strstr(bad[i].top_extra, "}") ? "" : "}");
    }
    /* the same message with valid fields runs (and must not be refused) */
    len += (size_t)snprintf(log + len, cap - len,
                            "{\"tenant\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"my name is Bob\",\"sensitive\":false,"
                            "\"spans\":[[11,14]]}],\"max_tokens\":1,\"seed\":5,\"temperature\":0,\"top_p\":1}\n");
    int n;
    cJSON **r = run_log("privacy_fields", log, &n);
    free(log);
    cr_assert_eq(n, nb + 1);
    for (int i = 0; i < nb; i++) {
        const char *e = error_of(r[i]);
        cr_assert(e, "case %d (%s%s) was run instead of refused", i, bad[i].msg_extra, bad[i].top_extra);
        cr_assert(strstr(e, bad[i].want), "case %d: error '%s' does not say '%s'", i, e, bad[i].want);
        char where[64];
        snprintf(where, sizeof where, "request line %d:", 2 * i + 2); /* a blank line before each */
        cr_assert(strstr(e, where), "case %d: error '%s' does not name physical line %d", i, e, 2 * i + 2);
        cr_assert_eq((int)cJSON_GetObjectItem(r[i], "line")->valuedouble, 2 * i + 2);
    }
    cr_assert_null(error_of(r[nb]), "the valid request was refused: %s", error_of(r[nb]));
    free_results(r, n);
}

Test(run_input, tenant_table_is_exact_and_scales)
{
    cp_tenant_table *t;
    cp_error err = { 0 };
    cr_assert_eq(cp_tenant_table_create(&t, &err), CP_OK);
    uint32_t a, b, c;
    cr_assert_eq(cp_tenant_intern(t, "acme", 4, &a, &err), CP_OK);
    cr_assert_neq(cp_tenant_intern(t, "acme\0x", 6, &b, &err), CP_OK, "an id holding NUL must be refused");
    cr_assert_neq(cp_tenant_intern(t, "\xff", 1, &b, &err), CP_OK, "invalid UTF-8 must be refused");
    cr_assert_eq(cp_tenant_intern(t, "acm", 3, &b, &err), CP_OK);
    cr_assert_neq(a, b);
    /* 120k tenants: distinct numbers, stable on a second lookup */
    char name[32];
    for (uint32_t i = 0; i < 120000; i++) {
        snprintf(name, sizeof name, "tenant-%u", i);
        cr_assert_eq(cp_tenant_intern(t, name, strlen(name), &c, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(c, i + 2, "tenant %u got number %u", i, c);
    }
    for (uint32_t i = 0; i < 120000; i += 997) {
        snprintf(name, sizeof name, "tenant-%u", i);
        cr_assert_eq(cp_tenant_intern(t, name, strlen(name), &c, &err), CP_OK);
        cr_assert_eq(c, i + 2);
    }
    cr_assert_eq(cp_tenant_intern(t, "acme", 4, &c, &err), CP_OK);
    cr_assert_eq(c, a);
    cr_assert_eq(cp_tenant_count(t), 120002);
    cp_tenant_table_free(t);
}
