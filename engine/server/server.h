/* `cacheprune serve`: the server's life.  Listen (loopback unless told
 * otherwise), start the engine thread and the HTTP side, print
 * "listening on HOST:PORT", wait for SIGTERM or SIGINT; then stop accepting,
 * let every accepted request finish (queued ones included), and return.
 * A second signal abandons the wait. */
#ifndef CP_SRV_SERVER_H
#define CP_SRV_SERVER_H

#include <stdio.h>

#include "http.h"
#include "sched.h"

typedef struct srv_opts {
    const char *host;  /* "127.0.0.1" */
    int port;          /* 0: any free port (printed) */
    size_t max_queue;
    size_t per_tenant_queue; /* 0 = no cap; SRV_PER_TENANT_QUEUE_UNSET: a quarter of max_queue */
    uint32_t n_tenants;      /* the keys' tenants */
    double drain_s;    /* the longest wait for requests in flight at shutdown */
    srv_http_opts http;
    struct cp_tier *tier; /* --tier: its figures on /metrics; NULL without */
} srv_opts;

/* Blocks SIGTERM, SIGINT (srv_serve waits for them) and ignores SIGPIPE in
 * the calling thread: call it before any thread is created (OpenMP's
 * included), so that every thread inherits the mask. */
cp_status srv_block_signals(cp_error *err);

/* A listening TCP socket on host:port (numeric or resolvable host); *bound
 * gets the port (useful with port 0). */
cp_status srv_listen(const char *host, int port, int *fd, int *bound, cp_error *err);

/* Serves until a signal; CP_OK after a clean drain.  `announce` gets the
 * "listening on" line. */
cp_status srv_serve(const srv_opts *o, const srv_engine *eng, const srv_keys *keys, FILE *announce, cp_error *err);

#endif
