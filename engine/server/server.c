#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../kernels/log.h"

static void stop_signals(sigset_t *s)
{
    sigemptyset(s);
    sigaddset(s, SIGTERM);
    sigaddset(s, SIGINT);
}

cp_status srv_block_signals(cp_error *err)
{
    sigset_t s;
    stop_signals(&s);
    if (pthread_sigmask(SIG_BLOCK, &s, NULL)) return cp_fail(err, CP_EINVAL, "serve: cannot block SIGTERM/SIGINT");
    /* a client that hangs up mid-write must not kill the server */
    struct sigaction ign = { .sa_handler = SIG_IGN };
    sigemptyset(&ign.sa_mask);
    if (sigaction(SIGPIPE, &ign, NULL)) return cp_fail(err, CP_EINVAL, "serve: cannot ignore SIGPIPE");
    return CP_OK;
}

cp_status srv_listen(const char *host, int port, int *fd_out, int *bound, cp_error *err)
{
    *fd_out = -1;
    if (port < 0 || port > 65535) return cp_fail(err, CP_ERANGE, "serve: port %d is outside [0, 65535]", port);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *ai;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g) return cp_fail(err, CP_EINVAL, "serve: cannot resolve --host %.200s: %s", host, gai_strerror(g));
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol), one = 1;
    cp_status rc = CP_OK;
    if (fd < 0) rc = cp_fail(err, CP_EIO, "serve: socket: %s", strerror(errno));
    else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(fd, ai->ai_addr, ai->ai_addrlen) ||
             listen(fd, 128))
        rc = cp_fail(err, CP_EIO, "serve: cannot listen on %.200s:%d: %s", host, port, strerror(errno));
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (rc == CP_OK && getsockname(fd, (struct sockaddr *)&sa, &sl))
        rc = cp_fail(err, CP_EIO, "serve: getsockname: %s", strerror(errno));
    if (rc == CP_OK && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
        rc = cp_fail(err, CP_EIO, "serve: cannot make the listening socket non-blocking: %s", strerror(errno));
    if (rc) {
        if (fd >= 0) close(fd);
        return rc;
    }
    *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    *fd_out = fd;
    return CP_OK;
}

/* Waits up to ms for a stop signal; 1 when one came. */
static int signalled(int ms)
{
    sigset_t s;
    stop_signals(&s);
    struct timespec t = { ms / 1000, (long)(ms % 1000) * 1000000L };
    return sigtimedwait(&s, NULL, &t) > 0;
}

/* Every accepted request finishes, up to drain_s; 0 if a second signal or
 * the time limit cut it short. */
static int drain(srv_http *h, srv_sched *s, double drain_s)
{
    int fd = srv_http_quiesce(h);
    if (fd >= 0) close(fd); /* quiesced, the kernel would still queue connections on it */
    srv_sched_close(s);
    for (double waited = 0; waited < drain_s * 1000; waited += 20) {
        if (srv_sched_pending(s) == 0 && srv_http_active(h) == 0) return 1;
        if (signalled(20)) {
            cp_warn("serve: second signal: not waiting for requests in flight");
            return 0;
        }
    }
    cp_warn("serve: requests still in flight after %.0f s: stopping anyway", drain_s);
    return 0;
}

cp_status srv_serve(const srv_opts *o, const srv_engine *eng, const srv_keys *keys, FILE *announce, cp_error *err)
{
    srv_metrics metrics;
    cp_status rc = srv_metrics_init(&metrics, err);
    if (rc) return rc;
    metrics.tier = o->tier;
    int fd = -1, port = 0;
    srv_sched *sched = NULL;
    srv_http *http = NULL;
    if ((rc = srv_listen(o->host, o->port, &fd, &port, err)) == CP_OK && (rc = srv_sched_start(eng, o->max_queue, o->per_tenant_queue, o->n_tenants, &metrics, &sched, err)) == CP_OK)
        rc = srv_http_start(fd, &o->http, keys, sched, &metrics, &http, err);
    if (rc) {
        if (fd >= 0) close(fd);
        srv_sched_stop(sched);
        srv_metrics_destroy(&metrics);
        return rc;
    }
    int v6 = strchr(o->host, ':') != NULL;
    fprintf(announce, "listening on %s%s%s:%d\n", v6 ? "[" : "", o->host, v6 ? "]" : "", port);
    fflush(announce);
    while (!signalled(1000)) {
    }
    cp_info("serve: stopping: finishing the requests in flight");
    int clean = drain(http, sched, o->drain_s);
    srv_http_stop(http);
    srv_sched_stop(sched);
    srv_metrics_destroy(&metrics);
    return clean ? CP_OK : cp_fail(err, CP_EIO, "serve: stopped with requests unfinished");
}
