/* Chat messages of a JSON request into the engine's messages, failing
 * closed on everything that decides what is private: a 'sensitive' that is
 * not a boolean, 'spans' that are not in-range integer pairs [start, end)
 * of byte offsets into the message, an unknown (misspelt) or repeated field
 * of a message.  Shared by the entry points that take JSON requests (the
 * server; `run`'s request log can call it too).  Every message text is
 * checked to be well-formed UTF-8. */
#ifndef CP_REQUEST_JSON_H
#define CP_REQUEST_JSON_H

#include <stddef.h>

#include "request.h"

struct cJSON;

#define CP_REQUEST_MAX_MSGS 4096

/* The messages of `ms` (a JSON array, named `field` in errors, e.g.
 * "messages") into *msgs (n of them; the texts point into ms) and their
 * marked spans into *spans (msgs[i].marked points there); free both with
 * free().  `known` lists the keys a message may have (NULL-terminated; it
 * must include role, content, sensitive and spans).  On error nothing is
 * allocated and err says which message and field, e.g.
 * "messages[1].spans[0]: ...". */
cp_status cp_request_json_messages(const struct cJSON *ms, const char *field, const char *const *known, cp_request_msg **msgs,
                                   size_t *n, cp_span **spans, cp_error *err);

#endif
