/* External detectors: a shared object behind the C ABI of
 * detect_plugin_abi.h (trusted, in-process), and a child process speaking
 * line-delimited JSON, protocol v2 (isolated, with a timeout).  Every failure
 * is an error the chain turns into "wholly sensitive". */
#define _GNU_SOURCE /* MSG_NOSIGNAL, SOCK_CLOEXEC, posix_spawn_file_actions_addclosefrom_np */
#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <openssl/crypto.h>

#include "../../kernels/clock.h"
#include "detect.h"
#include "detect_plugin_abi.h"

/* ---- shared object ----------------------------------------------------------- */

typedef void *(*open_fn)(const char *);
typedef int (*detect_fn)(void *, const char *, size_t, const char *, cp_plugin_span *, size_t, size_t *);
typedef void (*close_fn)(void *);

typedef struct so_plugin {
    void *lib, *ctx;
    open_fn open;
    detect_fn detect;
    close_fn close;
    cp_plugin_span *buf;
} so_plugin;

static void so_destroy(cp_detector *d)
{
    so_plugin *p = d->impl;
    if (p) {
        if (p->ctx && p->close) p->close(p->ctx);
        if (p->lib) dlclose(p->lib);
        free(p->buf);
        free(p);
    }
    free(d);
}

static cp_status so_detect(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    so_plugin *p = d->impl;
    size_t n = 0;
    int rc = p->detect(p->ctx, text, len, cp_role_name(role), p->buf, CP_PLUGIN_MAX_SPANS, &n);
    if (rc != 0) return cp_fail(err, CP_EDEVICE, "plugin returned error %d", rc);
    if (n > CP_PLUGIN_MAX_SPANS) return cp_fail(err, CP_ERANGE, "plugin reported %zu spans, more than its buffer", n);
    for (size_t i = 0; i < n; i++) {
        cp_plugin_span *s = &p->buf[i];
        if (s->start > s->end || s->end > len) return cp_fail(err, CP_ERANGE, "plugin span %zu is outside the text", i);
        s->type[sizeof s->type - 1] = 0;
        cp_status st = cp_spans_add(out, s->start, s->end, s->type[0] ? s->type : "plugin", s->score, err);
        if (st) return st;
    }
    return CP_OK;
}

cp_status cp_detector_dlopen(const char *path, const char *config, cp_detector **out, cp_error *err)
{
    *out = NULL;
    cp_detector *d = cp_calloc(1, sizeof *d, "plugin", err);
    so_plugin *p = d ? cp_calloc(1, sizeof *p, "plugin", err) : NULL;
    if (!p) {
        free(d);
        return CP_ENOMEM;
    }
    d->name = "plugin";
    d->free_text = 1; /* a plugin's precision is unknown here */
    d->detect = so_detect;
    d->destroy = so_destroy;
    d->impl = p;
    cp_status rc = CP_OK;
    if (!(p->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
        const char *e = dlerror();
        rc = cp_fail(err, CP_EIO, "%s: cannot load plugin: %s", path, e ? e : "unknown error");
    } else {
        /* dlsym returns void*; the ABI fixes the function types */
        *(void **)&p->open = dlsym(p->lib, "cp_plugin_open");
        *(void **)&p->detect = dlsym(p->lib, "cp_plugin_detect");
        *(void **)&p->close = dlsym(p->lib, "cp_plugin_close");
        if (!p->open || !p->detect || !p->close)
            rc = cp_fail(err, CP_EFORMAT, "%s: plugin lacks cp_plugin_open/cp_plugin_detect/cp_plugin_close", path);
        else if (!(p->buf = cp_calloc(CP_PLUGIN_MAX_SPANS, sizeof *p->buf, "plugin spans", err)))
            rc = CP_ENOMEM;
        else if (!(p->ctx = p->open(config ? config : "")))
            rc = cp_fail(err, CP_EDEVICE, "%s: cp_plugin_open failed", path);
    }
    if (rc) {
        so_destroy(d);
        return rc;
    }
    *out = d;
    return CP_OK;
}

/* ---- child process -----------------------------------------------------------
 *
 * Protocol v2, one JSON object per line both ways:
 *   request  {"id":N,"text":"...","role":"user"}
 *   reply    {"id":N,"spans":[{"start":a,"end":b,"type":"t","score":s},...]}
 * N increases with every request (never reused, not even by a restarted
 * child).  A reply must echo its request's id and be the only thing the child
 * writes until the next request.  Anything else (another id, no id, a second
 * line, output between requests) means the child's answers can no longer be
 * matched to messages: that request fails (closed) and the child is killed,
 * so nothing stale reaches the next one, which gets a fresh child.
 *
 * The child leads its own process group; stopping it kills the group, so a
 * grandchild it forked cannot outlive it holding our socket or stderr.  (One
 * that leaves the group on purpose, setsid, is beyond what a group kill
 * reaches.) */

#define PROC_MAX_REPLY (1u << 20)

extern char **environ;

typedef struct proc_plugin {
    char **argv;
    int timeout_ms;
    /* the first answer of every child started (the first and each one
     * after a failure) may take this long: a runtime's start (node and its
     * library load in 1-3 s on a loaded machine) would otherwise time out
     * the message after a restart, and the next, and so on (0: timeout_ms) */
    int start_ms;
    int fresh; /* the child has not answered yet */
    pid_t pid;        /* the child, leader of its own process group (pgid == pid) */
    int fd;           /* our end of the socketpair: the child's stdin and stdout */
    uint64_t next_id; /* the id of the next request */
    char *buf;        /* bytes read from the child, empty between requests */
    size_t have;
} proc_plugin;

static void proc_stop(proc_plugin *p)
{
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    if (p->pid > 0) {
        /* The leader is not reaped yet, so its pid cannot have been reused:
         * -pid still names its group.  The direct kill covers a child that
         * left the group. */
        kill(-p->pid, SIGKILL);
        kill(p->pid, SIGKILL);
        while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
    p->pid = -1;
    p->have = 0;
}

/* fd, moved above the standard descriptors if it is one of them: the child
 * dup2s our socket onto 0 and 1, and dup2(fd, fd) would keep close-on-exec.
 * Returns -1 (fd closed) on failure. */
static int above_stdio(int fd)
{
    if (fd > 2) return fd;
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    return moved;
}

/* The child's setup, applied between fork and exec: stdin and stdout on the
 * socket, no other descriptor of ours, its own process group, default signal
 * handling and an empty signal mask whatever the engine uses. */
static int spawn_setup(posix_spawn_file_actions_t *fa, posix_spawnattr_t *at, int sock)
{
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    int e = posix_spawn_file_actions_adddup2(fa, sock, 0);
    if (!e) e = posix_spawn_file_actions_adddup2(fa, sock, 1);
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 34)
    /* descriptors the engine opened without close-on-exec (model files,
     * sockets) are none of the plugin's business */
    if (!e) e = posix_spawn_file_actions_addclosefrom_np(fa, 3);
#endif
    if (!e) e = posix_spawnattr_setflags(at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    if (!e) e = posix_spawnattr_setpgroup(at, 0);
    if (!e) e = posix_spawnattr_setsigmask(at, &none);
    if (!e) e = posix_spawnattr_setsigdefault(at, &all);
    return e;
}

/* posix_spawn (glibc >= 2.24, musl) returns the exec error itself, so a
 * missing or non-executable command is reported as such here rather than
 * as a broken connection at the first request. */
static cp_status proc_start(proc_plugin *p, cp_error *err)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return cp_fail(err, CP_EIO, "process plugin: socketpair: %s", strerror(errno));
    sv[0] = above_stdio(sv[0]);
    sv[1] = above_stdio(sv[1]);
    if (sv[0] < 0 || sv[1] < 0) {
        int e = errno;
        if (sv[0] >= 0) close(sv[0]);
        if (sv[1] >= 0) close(sv[1]);
        return cp_fail(err, CP_EIO, "process plugin: moving the socket above stdio: %s", strerror(e));
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int setup = posix_spawn_file_actions_init(&fa);
    if (setup == 0 && (setup = posix_spawnattr_init(&at)) != 0) posix_spawn_file_actions_destroy(&fa);
    int spawned = -1;
    pid_t pid = -1;
    if (setup == 0) {
        setup = spawn_setup(&fa, &at, sv[1]);
        if (setup == 0) spawned = posix_spawnp(&pid, p->argv[0], &fa, &at, p->argv, environ);
        posix_spawnattr_destroy(&at);
        posix_spawn_file_actions_destroy(&fa);
    }
    close(sv[1]);
    if (setup != 0 || spawned != 0) {
        close(sv[0]);
        if (setup != 0) return cp_fail(err, CP_EIO, "process plugin: preparing the child: %s", strerror(setup));
        return cp_fail(err, CP_EIO, "process plugin: cannot execute %s: %s", p->argv[0], strerror(spawned));
    }
    p->fd = sv[0];
    p->pid = pid;
    p->have = 0;
    p->fresh = 1;
    return CP_OK;
}

/* Between requests the child must be silent.  Whatever it wrote since its
 * last reply (a stray line, an answer to a request not yet sent) would
 * otherwise be read as the answer to this one. */
static cp_status check_quiet(proc_plugin *p, uint64_t id, cp_error *err)
{
    struct pollfd pf = { p->fd, POLLIN, 0 };
    int r = poll(&pf, 1, 0);
    if (r < 0) return cp_fail(err, CP_EDEVICE, "process plugin: poll: %s", strerror(errno));
    if (r == 0) return CP_OK;
    char c;
    ssize_t n = recv(p->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return cp_fail(err, CP_EFORMAT, "process plugin: wrote output nobody asked for before request %" PRIu64, id);
    if (n == 0) return cp_fail(err, CP_EDEVICE, "process plugin: exited before request %" PRIu64, id);
    return cp_fail(err, CP_EDEVICE, "process plugin: before request %" PRIu64 ": %s", id, strerror(errno));
}

static cp_status send_all(proc_plugin *p, const char *s, size_t n, const struct timespec *dl, cp_error *err)
{
    while (n) {
        struct pollfd pf = { p->fd, POLLOUT, 0 };
        long left = cp_ms_until(dl);
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0) return cp_fail(err, CP_EDEVICE, "process plugin: timed out writing");
        ssize_t w = send(p->fd, s, n, MSG_NOSIGNAL); /* no SIGPIPE if it died */
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return cp_fail(err, CP_EDEVICE, "process plugin: write failed: %s", strerror(errno));
        }
        s += w;
        n -= (size_t)w;
    }
    return CP_OK;
}

/* One reply line (without the newline) into p->buf.  Bytes after it stay in
 * p->buf for the caller to refuse. */
static cp_status recv_line(proc_plugin *p, size_t *line_len, const struct timespec *dl, cp_error *err)
{
    for (;;) {
        char *nl = p->have ? memchr(p->buf, '\n', p->have) : NULL;
        if (nl) {
            *line_len = (size_t)(nl - p->buf);
            return CP_OK;
        }
        if (p->have >= PROC_MAX_REPLY) return cp_fail(err, CP_EFORMAT, "process plugin: reply longer than %u bytes", PROC_MAX_REPLY);
        struct pollfd pf = { p->fd, POLLIN, 0 };
        long left = cp_ms_until(dl);
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0) return cp_fail(err, CP_EDEVICE, "process plugin: timed out after %d ms", p->timeout_ms);
        ssize_t r = recv(p->fd, p->buf + p->have, PROC_MAX_REPLY - p->have, 0);
        if (r == 0) return cp_fail(err, CP_EDEVICE, "process plugin: exited without a reply");
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return cp_fail(err, CP_EDEVICE, "process plugin: read failed: %s", strerror(errno));
        }
        p->have += (size_t)r;
    }
}

/* The reply must be an object whose "id" is the request's. */
static cp_status check_reply_id(const cJSON *j, uint64_t id, cp_error *err)
{
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (!j) return cp_fail(err, CP_EFORMAT, "process plugin: reply to request %" PRIu64 " is not JSON", id);
    if (!jid) return cp_fail(err, CP_EFORMAT, "process plugin: reply to request %" PRIu64 " has no \"id\" (protocol v2 echoes it)", id);
    if (!cJSON_IsNumber(jid)) return cp_fail(err, CP_EFORMAT, "process plugin: reply to request %" PRIu64 " has a non-numeric \"id\"", id);
    if (jid->valuedouble != (double)id)
        return cp_fail(err, CP_EFORMAT, "process plugin: reply carries id %.17g, not request %" PRIu64 "'s", jid->valuedouble, id);
    return CP_OK;
}

static cp_status parse_reply(const char *line, size_t n, uint64_t id, size_t len, cp_spans *out, cp_error *err)
{
    cJSON *j = cJSON_ParseWithLength(line, n);
    const cJSON *spans = cJSON_GetObjectItemCaseSensitive(j, "spans");
    cp_status rc = check_reply_id(j, id, err);
    if (rc == CP_OK && !cJSON_IsArray(spans)) rc = cp_fail(err, CP_EFORMAT, "process plugin: reply is not {\"id\": N, \"spans\": [...]}");
    size_t i = 0;
    for (const cJSON *s = rc ? NULL : spans->child; s && rc == CP_OK; s = s->next, i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, "start"), *b = cJSON_GetObjectItemCaseSensitive(s, "end");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type"), *sc = cJSON_GetObjectItemCaseSensitive(s, "score");
        if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valuedouble < 0 || a->valuedouble > b->valuedouble ||
            b->valuedouble > (double)len || a->valuedouble != (double)(uint32_t)a->valuedouble ||
            b->valuedouble != (double)(uint32_t)b->valuedouble)
            rc = cp_fail(err, CP_EFORMAT, "process plugin: span %zu has bad offsets", i);
        else
            rc = cp_spans_add(out, (uint32_t)a->valuedouble, (uint32_t)b->valuedouble,
                              cJSON_IsString(t) ? t->valuestring : "plugin", cJSON_IsNumber(sc) ? (float)sc->valuedouble : 1.0f,
                              err);
    }
    cJSON_Delete(j);
    return rc;
}

/* {"id":N,"text":...,"role":...} without the newline; cJSON escapes control
 * characters.  id comes first so a plugin can match it before the text. */
static cp_status build_request(uint64_t id, const char *text, size_t len, cp_role role, char **line, cp_error *err)
{
    *line = NULL;
    if (memchr(text, 0, len)) return cp_fail(err, CP_EFORMAT, "process plugin: text holds a NUL byte");
    char *tcopy = cp_malloc(len + 1, "plugin request", err);
    if (!tcopy) return CP_ENOMEM;
    memcpy(tcopy, text, len);
    tcopy[len] = 0;
    cJSON *req = cJSON_CreateObject(), *t = NULL;
    if (req && cJSON_AddNumberToObject(req, "id", (double)id) && (t = cJSON_AddStringToObject(req, "text", tcopy)) &&
        cJSON_AddStringToObject(req, "role", cp_role_name(role)))
        *line = cJSON_PrintUnformatted(req);
    /* the message's text, three times over: wiped before freed */
    if (t && t->valuestring) OPENSSL_cleanse(t->valuestring, strlen(t->valuestring));
    cJSON_Delete(req);
    OPENSSL_cleanse(tcopy, len);
    free(tcopy);
    if (!*line) return cp_fail(err, CP_ENOMEM, "process plugin: out of memory building a request");
    /* the line and its newline in one write: the child wakes once, with the
     * whole request (a second write woke it again for one byte) */
    size_t n = strlen(*line);
    char *nl = malloc(n + 2);
    if (nl) memcpy(nl, *line, n), nl[n] = '\n', nl[n + 1] = 0;
    OPENSSL_cleanse(*line, n);
    free(*line);
    *line = nl;
    return nl ? CP_OK : cp_fail(err, CP_ENOMEM, "process plugin: out of memory building a request");
}

/* A request line (with its newline) holds the message's text. */
static void wipe_line(char *line)
{
    if (line) OPENSSL_cleanse(line, strlen(line));
    free(line);
}

static cp_status proc_detect(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    proc_plugin *p = d->impl;
    uint64_t id = p->next_id++;
    char *line = NULL;
    cp_status rc = build_request(id, text, len, role, &line, err);
    if (rc) return rc; /* nothing was said to the child: it stays as it was */
    if (p->pid <= 0 && (rc = proc_start(p, err))) {
        wipe_line(line);
        return rc;
    }
    int wait_ms = p->fresh && p->start_ms > p->timeout_ms ? p->start_ms : p->timeout_ms;
    struct timespec dl = cp_deadline_ms(wait_ms);
    size_t ln = 0;
    rc = check_quiet(p, id, err);
    if (rc == CP_OK) rc = send_all(p, line, strlen(line), &dl, err);
    wipe_line(line);
    if (rc == CP_OK) rc = recv_line(p, &ln, &dl, err);
    if (rc == CP_OK && p->have != ln + 1)
        rc = cp_fail(err, CP_EFORMAT, "process plugin: %zu more bytes after the reply to request %" PRIu64, p->have - ln - 1, id);
    if (rc == CP_OK) {
        size_t before = out->n;
        rc = parse_reply(p->buf, ln, id, len, out, err);
        if (rc) out->n = before;
    }
    p->have = 0; /* nothing read for this request outlives it */
    if (rc == CP_OK) p->fresh = 0;
    if (rc) proc_stop(p); /* its next answer could be anyone's: a fresh child next time */
    return rc;
}

cp_status cp_detector_process_probe(cp_detector *d, int first_timeout_ms, cp_error *err)
{
    if (d->detect != proc_detect) return cp_fail(err, CP_EINVAL, "process plugin probe: not a process plugin");
    proc_plugin *p = d->impl;
    p->start_ms = first_timeout_ms; /* for this child, and for every one started after a failure */
    cp_spans s = { 0 };
    cp_status rc = proc_detect(d, "", 0, CP_ROLE_USER, &s, err);
    cp_spans_free(&s);
    return rc;
}

static void proc_destroy(cp_detector *d)
{
    proc_plugin *p = d->impl;
    if (p) {
        proc_stop(p);
        for (char **a = p->argv; a && *a; a++) free(*a);
        free(p->argv);
        free(p->buf);
        free(p);
    }
    free(d);
}

cp_status cp_detector_process(char *const argv[], int timeout_ms, cp_detector **out, cp_error *err)
{
    *out = NULL;
    if (!argv || !argv[0]) return cp_fail(err, CP_EINVAL, "process plugin: no command");
    cp_detector *d = cp_calloc(1, sizeof *d, "plugin", err);
    proc_plugin *p = d ? cp_calloc(1, sizeof *p, "plugin", err) : NULL;
    if (!p) {
        free(d);
        return CP_ENOMEM;
    }
    d->name = "process";
    d->free_text = 1;
    d->elsewhere = 1; /* the child keeps what it is sent */
    d->detect = proc_detect;
    d->destroy = proc_destroy;
    d->impl = p;
    p->fd = -1;
    p->pid = -1;
    p->next_id = 1;
    p->timeout_ms = timeout_ms > 0 ? timeout_ms : 2000;
    size_t n = 0;
    while (argv[n]) n++;
    p->argv = calloc(n + 1, sizeof *p->argv);
    p->buf = malloc(PROC_MAX_REPLY);
    cp_status rc = p->argv && p->buf ? CP_OK : cp_fail(err, CP_ENOMEM, "process plugin: out of memory");
    for (size_t i = 0; i < n && rc == CP_OK; i++)
        if (!(p->argv[i] = strdup(argv[i]))) rc = cp_fail(err, CP_ENOMEM, "process plugin: out of memory");
    if (rc == CP_OK) rc = proc_start(p, err);
    if (rc) {
        proc_destroy(d);
        return rc;
    }
    *out = d;
    return CP_OK;
}
