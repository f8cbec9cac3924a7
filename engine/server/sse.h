/* Server-sent events for a streamed generation: `data: {chunk}` events as
 * the job's visible text grows (chunks end only at whole UTF-8 characters:
 * the engine's streaming decoder and the stop hold-back both cut there),
 * the finishing chunk, the usage chunk when asked, `data: [DONE]`.
 *
 * The response is produced by a libmicrohttpd content reader that runs on
 * the connection's own thread and waits there for the engine, so the engine
 * thread never waits for a client. */
#ifndef CP_SRV_SSE_H
#define CP_SRV_SSE_H

#include <stddef.h>

#include "job.h"
#include "openai.h"

struct MHD_Response;
struct srv_sched;

/* A quiet stream gets an SSE comment (": keep-alive") this often: a client
 * (or a proxy) sees the stream alive, and a client gone away fails the
 * write.  A streamed request still waiting for its first token after this
 * long (queued behind others) gets its 200 and these comments meanwhile. */
#define SRV_SSE_KEEPALIVE_MS 1000

/* The framing of one event: "data: " payload "\n\n" (malloc'd). */
char *srv_sse_event(const char *payload, size_t *len);

/* A streaming response over the job (it takes one reference, released
 * when the response is done or the client is gone: then the job is
 * cancelled through sched).  fd: the connection's socket (-1: unknown),
 * watched while the job waits for its first token; waiting: the job has
 * no token yet (the stream opens with keep-alive comments until it has).
 * r's strings are copied.  NULL when out of memory. */
struct MHD_Response *srv_sse_response(srv_job *j, const srv_result *r, int include_usage, struct srv_sched *sched, int fd,
                                      int waiting);

#endif
