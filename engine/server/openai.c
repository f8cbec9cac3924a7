#include "openai.h"

#include <float.h>
#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../../tokenizer/utf8.h"
#include "../json_fields.h"
#include "../request_json.h"

/* what a message may hold: OpenAI's `name` is accepted and unused */
#define SRV_MAX_FIELDS 256

static const char *const message_keys[] = { "role", "content", "name", "sensitive", "spans", NULL };

static cp_status field_error(char *param, size_t cap, const char *name, cp_status rc)
{
    snprintf(param, cap, "%s", name);
    return rc;
}

/* A string field that must be well-formed UTF-8 of at most max bytes. */
static cp_status utf8_string(const cJSON *j, const char *name, size_t max, const char **out, cp_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return CP_OK;
    if (!cJSON_IsString(v)) return cp_fail(err, CP_EFORMAT, "'%s' must be a string", name);
    size_t n = strlen(v->valuestring), bad = cp_utf8_validate(v->valuestring, n);
    if (bad != n) return cp_fail(err, CP_EFORMAT, "'%s' is not valid UTF-8 (byte %zu)", name, bad);
    if (n > max) return cp_fail(err, CP_ERANGE, "'%s' is %zu bytes; at most %zu", name, n, max);
    *out = v->valuestring;
    return CP_OK;
}

/* `stop`: a string or an array of at most 4 non-empty strings */
static cp_status parse_stop(const cJSON *j, srv_gen *g, cp_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (!v || cJSON_IsNull(v)) return CP_OK;
    const cJSON *one[1] = { v };
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0) return cp_fail(err, CP_EFORMAT, "'stop' must be a string or an array of strings");
    if (n > SRV_MAX_STOPS) return cp_fail(err, CP_ERANGE, "'stop' has %d strings; at most %d", n, SRV_MAX_STOPS);
    const cJSON *s = cJSON_IsString(v) ? one[0] : v->child;
    for (int i = 0; i < n; i++, s = s->next) {
        if (!cJSON_IsString(s)) return cp_fail(err, CP_EFORMAT, "'stop[%d]' must be a string", i);
        size_t len = strlen(s->valuestring), bad = cp_utf8_validate(s->valuestring, len);
        if (len == 0) return cp_fail(err, CP_EFORMAT, "'stop[%d]' is empty", i);
        if (bad != len) return cp_fail(err, CP_EFORMAT, "'stop[%d]' is not valid UTF-8 (byte %zu)", i, bad);
        if (len > SRV_STOP_MAX_BYTES) return cp_fail(err, CP_ERANGE, "'stop[%d]' is %zu bytes; at most %d", i, len, SRV_STOP_MAX_BYTES);
        g->stops[g->n_stops++] = s->valuestring;
    }
    return CP_OK;
}

static cp_status parse_sampling(const cJSON *j, srv_gen *g, char *param, size_t pcap, cp_error *err)
{
    double t, p;
    long long seed;
    if (cp_json_real(j, "temperature", 0, 2, 1, &t, err)) return field_error(param, pcap, "temperature", CP_EFORMAT);
    if (cp_json_real(j, "top_p", 0, 1, 1, &p, err)) return field_error(param, pcap, "top_p", CP_EFORMAT);
    /* top_p 0 keeps no token at all (OpenAI refuses it too): the request's
     * fault, named, rather than the sampler's refusal at the engine */
    if (!((float)p > 0)) /* the sampler's float: 1e-300 is 0 there */
        return cp_fail(err, CP_ERANGE, "'top_p' must be above 0 (at least %g) and at most 1", (double)FLT_TRUE_MIN),
               field_error(param, pcap, "top_p", CP_ERANGE);
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(j, "seed");
    if (sv && !cJSON_IsNull(sv)) {
        if (cp_json_int(j, "seed", -(1LL << 53), 1LL << 53, 0, &seed, err)) return field_error(param, pcap, "seed", CP_EFORMAT);
        g->sampling.seed = (uint64_t)seed;
    } else if (RAND_bytes((unsigned char *)&g->sampling.seed, sizeof g->sampling.seed) != 1) {
        return cp_fail(err, CP_EIO, "server: no random seed available");
    }
    g->sampling.temperature = (float)t;
    g->sampling.top_p = (float)p;
    return CP_OK;
}

static cp_status parse_limits(const cJSON *j, srv_gen *g, int cap, char *param, size_t pcap, cp_error *err)
{
    long long mt, n;
    /* max_completion_tokens is the newer name of the same limit */
    const cJSON *mct = cJSON_GetObjectItemCaseSensitive(j, "max_completion_tokens");
    const char *name = mct && !cJSON_IsNull(mct) ? "max_completion_tokens" : "max_tokens"; /* null: absent */
    long long def = g->kind == SRV_CHAT ? cap : cap < SRV_COMPLETION_DEFAULT_MAX ? cap : SRV_COMPLETION_DEFAULT_MAX;
    if (cp_json_int(j, name, 1, 1LL << 40, def, &mt, err)) return field_error(param, pcap, name, CP_EFORMAT); /* 0: nothing to answer */
    const cJSON *old = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
    if (mct && !cJSON_IsNull(mct) && old && !cJSON_IsNull(old)) { /* both: they must say the same */
        long long mt_old;
        if (cp_json_int(j, "max_tokens", 1, 1LL << 40, def, &mt_old, err)) return field_error(param, pcap, "max_tokens", CP_EFORMAT);
        if (mt_old != mt)
            return cp_fail(err, CP_EFORMAT, "'max_tokens' (%lld) and 'max_completion_tokens' (%lld) disagree: send one", mt_old, mt),
                   field_error(param, pcap, "max_tokens", CP_EFORMAT);
    }
    g->max_tokens = (int)(mt > cap ? cap : mt);
    g->max_tokens_given = (mct && !cJSON_IsNull(mct)) || (old && !cJSON_IsNull(old));
    if (cp_json_int(j, "n", -(1LL << 53), 1LL << 53, 1, &n, err)) return field_error(param, pcap, "n", CP_EFORMAT);
    if (n != 1) return cp_fail(err, CP_EUNSUPPORTED, "'n' must be 1: one choice per request is supported"), field_error(param, pcap, "n", CP_EUNSUPPORTED);
    return CP_OK;
}

static cp_status parse_stream(const cJSON *j, srv_gen *g, char *param, size_t pcap, cp_error *err)
{
    if (cp_json_bool(j, "stream", 0, &g->stream, err)) return field_error(param, pcap, "stream", CP_EFORMAT);
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return cp_fail(err, CP_EFORMAT, "'stream_options' must be an object"), field_error(param, pcap, "stream_options", CP_EFORMAT);
        if (!g->stream) /* as OpenAI's API answers it: options of a stream not asked for are a mistake, not ignored */
            return cp_fail(err, CP_EINVAL, "'stream_options' is only allowed with \"stream\": true"), field_error(param, pcap, "stream_options", CP_EINVAL);
        if (cp_json_bool(so, "include_usage", 0, &g->include_usage, err))
            return cp_fail_wrap(err, "stream_options"), field_error(param, pcap, "stream_options", CP_EFORMAT);
    }
    return CP_OK;
}

static cp_status parse_input(const cJSON *j, srv_gen *g, char *param, size_t pcap, cp_error *err)
{
    /* the privacy extensions belong to messages: at the top level they would
     * be ignored, and an ignored 'sensitive' must not pass for a kept one */
    static const char *const misplaced[] = { "sensitive", "spans" };
    for (int i = 0; i < 2; i++)
        if (cJSON_GetObjectItemCaseSensitive(j, misplaced[i]))
            return cp_fail(err, CP_EFORMAT, "'%s' belongs to a message of /v1/chat/completions, not to the request", misplaced[i]),
                   field_error(param, pcap, misplaced[i], CP_EFORMAT);
    if (g->kind == SRV_CHAT) {
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "messages");
        if (!ms) return cp_fail(err, CP_EFORMAT, "'messages' is required"), field_error(param, pcap, "messages", CP_EFORMAT);
        cp_status rc = cp_request_json_messages(ms, "messages", message_keys, &g->msgs, &g->n_msgs, &g->spans, err);
        return rc ? field_error(param, pcap, "messages", rc) : CP_OK;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (!p) return cp_fail(err, CP_EFORMAT, "'prompt' is required"), field_error(param, pcap, "prompt", CP_EFORMAT);
    if (!cJSON_IsString(p))
        return cp_fail(err, CP_EFORMAT, "'prompt' must be a string (arrays of prompts or of token ids are not supported)"),
               field_error(param, pcap, "prompt", CP_EFORMAT);
    const char *text;
    if (utf8_string(j, "prompt", (size_t)1 << 30, &text, err)) return field_error(param, pcap, "prompt", CP_EFORMAT);
    g->msgs = cp_calloc(1, sizeof *g->msgs, "request", err);
    g->spans = cp_calloc(1, sizeof *g->spans, "request", err);
    if (!g->msgs || !g->spans) return CP_ENOMEM;
    /* the prompt is one user message, as `run` reads "prompt" */
    g->msgs[0] = (cp_request_msg){ CP_ROLE_USER, text, strlen(text), 0, NULL, 0 };
    g->n_msgs = 1;
    return CP_OK;
}

/* "cache": "no-store" keeps the request out of the pool; absent or "default"
 * stores as usual; anything else is refused (a misspelt no-store must not
 * pass for one).  OpenAI's own "store": false means the same (true or
 * absent: as usual); either one asking for no-store is enough. */
static cp_status parse_cache(const cJSON *j, srv_gen *g, char *param, size_t pcap, cp_error *err)
{
    if (cp_json_no_null(j, "cache", "", err)) return field_error(param, pcap, "cache", CP_EFORMAT);
    if (cp_json_no_null(j, "store", "", err)) return field_error(param, pcap, "store", CP_EFORMAT);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "cache");
    if (c) {
        if (cJSON_IsString(c) && strcmp(c->valuestring, "no-store") == 0) g->no_store = 1;
        else if (!cJSON_IsString(c) || strcmp(c->valuestring, "default") != 0)
            return cp_fail(err, CP_EFORMAT, "'cache' must be \"no-store\" or \"default\""), field_error(param, pcap, "cache", CP_EFORMAT);
    }
    int store;
    if (cp_json_bool(j, "store", 1, &store, err)) return field_error(param, pcap, "store", CP_EFORMAT);
    if (!store) g->no_store = 1;
    return CP_OK;
}

/* The top-level fields that decide privacy, as they are spelt: one sent in
 * another case ("Cache", "STORE") would be an unknown field, ignored like
 * `user` — and a no-store the client believes it asked for would store.
 * Such a field is refused, named as sent. */
static const char *const privacy_fields[] = { "cache", "store", "sensitive", "spans" };

static cp_status privacy_field_case(const cJSON *root, char *param, size_t pcap, cp_error *err)
{
    for (const cJSON *c = root->child; c; c = c->next)
        for (size_t i = 0; i < sizeof privacy_fields / sizeof *privacy_fields; i++)
            if (strcasecmp(c->string, privacy_fields[i]) == 0 && strcmp(c->string, privacy_fields[i]) != 0)
                return cp_fail(err, CP_EFORMAT, "field '%.64s' is not '%s': field names are case-sensitive, and this one decides "
                               "what is stored", c->string, privacy_fields[i]),
                       field_error(param, pcap, c->string, CP_EFORMAT);
    return CP_OK;
}

/* whether field `name` holds what every answer already is */
static int at_default(const char *name, const cJSON *f)
{
    if (cJSON_IsNull(f)) return 1;
    if (strcmp(name, "logit_bias") == 0) return cJSON_IsObject(f) && cJSON_GetArraySize(f) == 0; /* a map: only the empty one */
    if (cJSON_IsFalse(f)) return 1;
    if (cJSON_IsNumber(f)) return f->valuedouble == 0 || (strcmp(name, "best_of") == 0 && f->valuedouble == 1);
    if (cJSON_IsString(f)) return f->valuestring[0] == 0 || strcmp(f->valuestring, "none") == 0;
    if (cJSON_IsArray(f)) return cJSON_GetArraySize(f) == 0;
    if (cJSON_IsBool(f)) return strcmp(name, "parallel_tool_calls") == 0; /* no tools: nothing to run in parallel */
    const cJSON *t = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "type") : NULL;
    return t && cJSON_IsString(t) && strcmp(t->valuestring, "text") == 0 && cJSON_GetArraySize(f) == 1;
}

/* OpenAI fields asking for what this server does not give (log
 * probabilities, tool calls, echoing the prompt, several candidates, an
 * insertion suffix, a JSON-only answer, token biases and repetition
 * penalties): refused, not silently answered without it.  Each at its
 * default value (false, null, 0, 1, "", "none", [], {"type": "text"};
 * logit_bias: null or {}) is what every answer already is, and passes. */
static cp_status unsupported_field(const cJSON *root, char *param, size_t pcap, cp_error *err)
{
    static const char *const names[] = { "logprobs", "top_logprobs", "tools", "tool_choice", "functions", "function_call",
                                         "echo", "best_of", "suffix", "response_format", "parallel_tool_calls",
                                         "logit_bias", "presence_penalty", "frequency_penalty" };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, names[i]);
        if (!f || at_default(names[i], f)) continue;
        return cp_fail(err, CP_EINVAL, "'%s' is not served here (no log probabilities, tool calls, echo, several candidates, suffix, "
                       "JSON mode, logit bias or penalties): leave it out or at its default", names[i]),
               field_error(param, pcap, names[i], CP_EINVAL);
    }
    return CP_OK;
}

cp_status srv_gen_parse(const char *body, size_t len, srv_kind kind, int cap, srv_gen *g, char *param, size_t pcap, cp_error *err)
{
    memset(g, 0, sizeof *g);
    g->kind = kind;
    param[0] = 0;
    cp_status rc = cp_json_parse_strict(body, len, &g->root, err);
    if (rc) return cp_fail_wrap(err, "the request body is not valid JSON");
    if (!cJSON_IsObject(g->root)) return cp_fail(err, CP_EFORMAT, "the request body must be a JSON object");
    /* a repeated top-level key: readers keeping the first and the last
     * would disagree about the request (the count bounds this check) */
    if (cJSON_GetArraySize(g->root) > SRV_MAX_FIELDS)
        return cp_fail(err, CP_ERANGE, "the request has more than %d fields", SRV_MAX_FIELDS), field_error(param, pcap, "", CP_ERANGE);
    for (const cJSON *c = g->root->child; c; c = c->next)
        for (const cJSON *d = g->root->child; d != c; d = d->next)
            if (strcmp(d->string, c->string) == 0)
                return cp_fail(err, CP_EFORMAT, "field '%.64s' appears twice", c->string), field_error(param, pcap, "", CP_EFORMAT);
    if ((rc = privacy_field_case(g->root, param, pcap, err))) return rc;
    if ((rc = unsupported_field(g->root, param, pcap, err))) return rc;
    if ((rc = utf8_string(g->root, "model", SRV_MODEL_NAME_MAX, &g->model, err))) return field_error(param, pcap, "model", rc);
    if ((rc = parse_input(g->root, g, param, pcap, err))) return rc;
    if ((rc = parse_limits(g->root, g, cap, param, pcap, err))) return rc;
    if ((rc = parse_sampling(g->root, g, param, pcap, err))) return rc;
    if ((rc = parse_stop(g->root, g, err))) return field_error(param, pcap, "stop", rc);
    if ((rc = parse_cache(g->root, g, param, pcap, err))) return rc;
    return parse_stream(g->root, g, param, pcap, err);
}

/* the request's strings are its prompt: wiped before the tree is freed */
static void wipe_tree(cJSON *j)
{
    for (; j; j = j->next) {
        if (j->valuestring) OPENSSL_cleanse(j->valuestring, strlen(j->valuestring));
        wipe_tree(j->child);
    }
}

void srv_gen_free(srv_gen *g)
{
    wipe_tree(g->root);
    cJSON_Delete(g->root);
    free(g->msgs), free(g->spans);
    memset(g, 0, sizeof *g);
}

/* ---- responses ------------------------------------------------------------------- */

/* cJSON's blocks are wiped when freed (cp_json_wipe_on_free): the tree's
 * copies of generated text or of a refused value, and the buffers cJSON
 * outgrows while printing, with them */
static char *print_and_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* cJSON takes NUL-terminated strings; generated text is a slice */
static cJSON *string_of(const char *text, size_t len)
{
    char *c = malloc(len + 1);
    if (!c) return NULL;
    memcpy(c, text, len);
    c[len] = 0;
    cJSON *s = cJSON_CreateString(c);
    free(c);
    return s;
}

static cJSON *head(const srv_result *r, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

static cJSON *usage(const srv_result *r)
{
    cJSON *u = cJSON_CreateObject(), *d = cJSON_CreateObject();
    if (!u || !d) {
        cJSON_Delete(u), cJSON_Delete(d);
        return NULL;
    }
    cJSON_AddNumberToObject(u, "prompt_tokens", r->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", r->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", r->prompt_tokens + r->completion_tokens);
    cJSON_AddNumberToObject(d, "cached_tokens", r->cached_tokens);
    cJSON_AddItemToObject(u, "prompt_tokens_details", d);
    return u;
}

/* one choice: a chat message or delta, or a completion's text */
static cJSON *choice(const srv_result *r, const char *text, size_t len, int delta, int role_too, const char *finish)
{
    cJSON *c = cJSON_CreateObject(), *t = text ? string_of(text, len) : NULL;
    if (!c || (text && !t)) {
        cJSON_Delete(c), cJSON_Delete(t);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->kind == SRV_CHAT) {
        cJSON *m = cJSON_CreateObject();
        if (!m) {
            cJSON_Delete(c), cJSON_Delete(t);
            return NULL;
        }
        if (!delta || role_too) cJSON_AddStringToObject(m, "role", "assistant");
        if (t) cJSON_AddItemToObject(m, "content", t);
        cJSON_AddItemToObject(c, delta ? "delta" : "message", m);
    } else {
        cJSON_AddItemToObject(c, "text", t ? t : cJSON_CreateString(""));
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

static char *with_choice(cJSON *o, cJSON *c)
{
    cJSON *arr = cJSON_CreateArray();
    if (!o || !c || !arr) {
        cJSON_Delete(o), cJSON_Delete(c), cJSON_Delete(arr);
        return NULL;
    }
    cJSON_AddItemToArray(arr, c);
    cJSON_AddItemToObject(o, "choices", arr);
    return print_and_free(o);
}

char *srv_json_response(const srv_result *r, const char *text, size_t len)
{
    cJSON *o = head(r, r->kind == SRV_CHAT ? "chat.completion" : "text_completion");
    cJSON *u = usage(r);
    if (o && u) cJSON_AddItemToObject(o, "usage", u);
    else cJSON_Delete(u), u = NULL;
    if (!u) {
        cJSON_Delete(o);
        return NULL;
    }
    return with_choice(o, choice(r, text ? text : "", len, 0, 0, r->finish));
}

char *srv_json_chunk(const srv_result *r, const char *text, size_t len, int role_too, const char *finish, int with_usage)
{
    cJSON *o = head(r, r->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    if (o && with_usage) cJSON_AddNullToObject(o, "usage");
    /* the last chat chunk has an empty delta; a completion's has "" */
    return with_choice(o, choice(r, text, len, 1, role_too, finish));
}

char *srv_json_usage_chunk(const srv_result *r)
{
    cJSON *o = head(r, r->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON *arr = cJSON_CreateArray(), *u = usage(r);
    if (!o || !arr || !u) {
        cJSON_Delete(o), cJSON_Delete(arr), cJSON_Delete(u);
        return NULL;
    }
    cJSON_AddItemToObject(o, "choices", arr);
    cJSON_AddItemToObject(o, "usage", u);
    return print_and_free(o);
}

char *srv_json_error(const char *message, const char *type, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_CreateObject();
    if (!o || !e) {
        cJSON_Delete(o), cJSON_Delete(e);
        return NULL;
    }
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param && *param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    cJSON_AddItemToObject(o, "error", e);
    return print_and_free(o);
}

char *srv_json_models(const char *name, long long created)
{
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray(), *m = cJSON_CreateObject();
    if (!o || !arr || !m) {
        cJSON_Delete(o), cJSON_Delete(arr), cJSON_Delete(m);
        return NULL;
    }
    cJSON_AddStringToObject(m, "id", name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "cacheprune");
    cJSON_AddItemToArray(arr, m);
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", arr);
    return print_and_free(o);
}
