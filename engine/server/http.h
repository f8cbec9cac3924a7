/* HTTP and routing (libmicrohttpd, one thread per connection): every
 * request is authenticated from its API key before anything else is looked
 * at (only /health is open), bodies are bounded, generation requests are
 * parsed here and queued to the scheduler; the connection's thread waits
 * for its job and writes the answer or the stream.
 *
 *   POST /v1/chat/completions   POST /v1/completions   GET /v1/models
 *   GET /health (no key)         GET /metrics (operator keys; tenants 403)
 *   POST /v1/cacheprune/purge    (a tenant erases its own KV; an operator any tenant's)
 *
 * Slow clients cannot hold the server: a connection that has not sent its
 * request's headers within the header deadline, or its body within the
 * body deadline, is closed by a watchdog (libmicrohttpd's own timeout is an
 * idle one, which a byte every few seconds defeats), and one address holds
 * at most max_per_address connections (libmicrohttpd's per-IP limit).
 *
 * Unknown paths 404, wrong methods 405 (with Allow), a missing or unknown
 * key 401, a body over the limit 413, a full queue 429 with Retry-After, a
 * server shutting down or with every connection slot taken 503 with
 * Retry-After; errors are OpenAI error objects. */
#ifndef CP_SRV_HTTP_H
#define CP_SRV_HTTP_H

#include <stddef.h>

#include "auth.h"
#include "metrics.h"
#include "sched.h"

typedef struct srv_http_opts {
    const char *served_name; /* /v1/models lists it; responses echo the client's `model` */
    size_t max_body;         /* bytes */
    int max_tokens_cap;
    unsigned max_connections;
    /* slow and idle clients: connections from one address at once (0: no
     * cap), and the deadlines of a request's headers (from the connection's
     * start, or the end of its previous request) and of its body (from its
     * headers), in seconds (0: the defaults below).  A connection past one
     * is closed: the slot is the next client's.  send_timeout_s: an answer
     * none of whose bytes could be written for that long (a client that
     * stopped reading) closes its connection. */
    unsigned max_per_address;
    double header_timeout_s, body_timeout_s, send_timeout_s;
    const cp_tenant_table *tenants; /* the keys' tenants: an operator purges one by name */
} srv_http_opts;

/* serve's default cap per address is a quarter of max_connections: three
 * quarters of the slots stay out of any one address's reach */
#define SRV_MAX_PER_ADDRESS_UNSET ((unsigned)-1)
#define SRV_PER_TENANT_QUEUE_UNSET ((size_t)-1)
#define SRV_HEADER_TIMEOUT_DEFAULT 10.0
#define SRV_BODY_TIMEOUT_DEFAULT 60.0
#define SRV_SEND_TIMEOUT_DEFAULT 30.0

typedef struct srv_http srv_http;

/* Serves on listen_fd (bound and listening; the server owns it until
 * srv_http_quiesce gives it back). */
cp_status srv_http_start(int listen_fd, const srv_http_opts *o, const srv_keys *keys, srv_sched *sched, srv_metrics *metrics,
                         srv_http **out, cp_error *err);
/* Stops accepting connections (returns the listening socket, or -1),
 * closes those whose request is still arriving (headers or body: never
 * accepted) and answers new requests on open connections with 503. */
int srv_http_quiesce(srv_http *h);
/* Requests received and not yet answered completely. */
size_t srv_http_active(srv_http *h);
/* Closes every connection and frees the server. */
void srv_http_stop(srv_http *h);

#endif
