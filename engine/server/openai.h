/* OpenAI's request and response shapes <-> the engine's request.
 *
 * Requests: unknown top-level fields are ignored, as OpenAI-compatible
 * servers do — in particular `user`, `tenant` and `cache_salt` are never
 * read: the tenant comes from the API key alone.  Every field that is read
 * is checked strictly (json_fields.h): a wrong type, a number out of range,
 * bad UTF-8 is an error naming the field (OpenAI's `param`).  The privacy
 * extensions of a message (`sensitive`, `spans`) fail closed exactly as in
 * `run` (request_json.h); a message field that is not known is an error, so
 * a misspelt extension is never silently dropped. */
#ifndef CP_SRV_OPENAI_H
#define CP_SRV_OPENAI_H

#include <stddef.h>

#include "../request.h"
#include "textout.h"

struct cJSON;

typedef enum srv_kind { SRV_CHAT = 0, SRV_COMPLETION } srv_kind;

#define SRV_MODEL_NAME_MAX 256
#define SRV_COMPLETION_DEFAULT_MAX 16 /* OpenAI's default for /v1/completions */

/* One parsed generation request.  Strings point into root. */
typedef struct srv_gen {
    srv_kind kind;
    struct cJSON *root;
    cp_request_msg *msgs;
    size_t n_msgs;
    cp_span *spans;
    int max_tokens;
    int max_tokens_given; /* the client sent max_tokens (or max_completion_tokens) */
    cp_sampler_opts sampling;
    const char *stops[SRV_MAX_STOPS];
    int n_stops;
    int stream, include_usage;
    const char *model; /* as the client named it; NULL when absent */
    int no_store;      /* "cache": "no-store", or "store": false */
} srv_gen;

/* body[0..len) of a POST to /v1/chat/completions (SRV_CHAT) or
 * /v1/completions.  max_tokens above cap is lowered to cap; absent, it is
 * cap (chat) or min(16, cap) (completions), and srv_sched_check lowers it
 * to what the context leaves after the prompt.  On error, param (param_cap
 * bytes) names the top-level field at fault ("" for the body as a whole). */
cp_status srv_gen_parse(const char *body, size_t len, srv_kind kind, int max_tokens_cap, srv_gen *out, char *param,
                        size_t param_cap, cp_error *err);
void srv_gen_free(srv_gen *g);

/* What a finished (or streaming) generation reports. */
typedef struct srv_result {
    srv_kind kind;
    const char *id;
    long long created;
    const char *model;
    const char *finish; /* "stop" | "length" */
    int prompt_tokens, completion_tokens, cached_tokens;
} srv_result;

/* Each returns malloc'd JSON text, or NULL when out of memory. */
char *srv_json_response(const srv_result *r, const char *text, size_t len);
/* A streamed chunk: a text delta (chat: role_too adds "role": "assistant"),
 * or with finish set the last chunk of the choice.  with_usage: the chunk
 * carries "usage": null (the client asked for usage at the end). */
char *srv_json_chunk(const srv_result *r, const char *text, size_t len, int role_too, const char *finish, int with_usage);
/* The usage chunk that ends a stream when asked: no choices, the usage. */
char *srv_json_usage_chunk(const srv_result *r);
char *srv_json_error(const char *message, const char *type, const char *param, const char *code);
char *srv_json_models(const char *name, long long created);

#endif
