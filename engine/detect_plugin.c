/* External detectors: a shared object behind the C ABI of
 * detect_plugin_abi.h (trusted, in-process), and a child process speaking
 * line-delimited JSON (isolated, with a timeout).  Every failure is an error
 * the chain turns into "wholly sensitive". */
#define _GNU_SOURCE /* MSG_NOSIGNAL, pipe2-free socketpair flags */
#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* ---- child process ----------------------------------------------------------- */

#define PROC_MAX_REPLY (1u << 20)

typedef struct proc_plugin {
    char **argv;
    int timeout_ms;
    pid_t pid;
    int fd; /* our end of the socketpair: the child's stdin and stdout */
    char *buf;
    size_t have;
} proc_plugin;

static void proc_stop(proc_plugin *p)
{
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
    }
    p->pid = -1;
    p->have = 0;
}

static cp_status proc_start(proc_plugin *p, cp_error *err)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return cp_fail(err, CP_EIO, "process plugin: socketpair: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return cp_fail(err, CP_EIO, "process plugin: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        dup2(sv[1], 0);
        dup2(sv[1], 1);
        execvp(p->argv[0], p->argv);
        _exit(127);
    }
    close(sv[1]);
    p->fd = sv[0];
    p->pid = pid;
    p->have = 0;
    return CP_OK;
}

static long ms_left(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (deadline->tv_sec - now.tv_sec) * 1000 + (deadline->tv_nsec - now.tv_nsec) / 1000000;
}

static cp_status send_all(proc_plugin *p, const char *s, size_t n, const struct timespec *dl, cp_error *err)
{
    while (n) {
        struct pollfd pf = { p->fd, POLLOUT, 0 };
        long left = ms_left(dl);
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

/* One reply line (without the newline) into p->buf. */
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
        long left = ms_left(dl);
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

static cp_status parse_reply(const char *line, size_t n, size_t len, cp_spans *out, cp_error *err)
{
    cJSON *j = cJSON_ParseWithLength(line, n);
    const cJSON *spans = cJSON_GetObjectItemCaseSensitive(j, "spans");
    cp_status rc = CP_OK;
    if (!cJSON_IsArray(spans)) rc = cp_fail(err, CP_EFORMAT, "process plugin: reply is not {\"spans\": [...]}");
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

static cp_status proc_detect(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    proc_plugin *p = d->impl;
    cp_status rc = CP_OK;
    if (p->pid <= 0 && (rc = proc_start(p, err))) return rc;
    /* {"text": ..., "role": ...}\n; cJSON escapes control characters */
    char *tcopy = cp_malloc(len + 1, "plugin request", err);
    if (!tcopy) return CP_ENOMEM;
    memcpy(tcopy, text, len);
    tcopy[len] = 0;
    cJSON *req = cJSON_CreateObject();
    if (req && memchr(text, 0, len)) rc = cp_fail(err, CP_EFORMAT, "process plugin: text holds a NUL byte");
    char *line = NULL;
    if (req && rc == CP_OK) {
        cJSON_AddStringToObject(req, "text", tcopy);
        cJSON_AddStringToObject(req, "role", cp_role_name(role));
        line = cJSON_PrintUnformatted(req);
    }
    cJSON_Delete(req);
    free(tcopy);
    if (rc == CP_OK && !line) rc = cp_fail(err, CP_ENOMEM, "process plugin: out of memory");
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += p->timeout_ms / 1000;
    dl.tv_nsec += (long)(p->timeout_ms % 1000) * 1000000;
    if (dl.tv_nsec >= 1000000000) dl.tv_sec++, dl.tv_nsec -= 1000000000;
    size_t ln = 0;
    if (rc == CP_OK) rc = send_all(p, line, strlen(line), &dl, err);
    if (rc == CP_OK) rc = send_all(p, "\n", 1, &dl, err);
    free(line);
    if (rc == CP_OK) rc = recv_line(p, &ln, &dl, err);
    if (rc == CP_OK) {
        size_t before = out->n;
        rc = parse_reply(p->buf, ln, len, out, err);
        if (rc) out->n = before;
        memmove(p->buf, p->buf + ln + 1, p->have - ln - 1);
        p->have -= ln + 1;
    }
    if (rc && rc != CP_ENOMEM) proc_stop(p); /* a fresh child next time */
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
    d->detect = proc_detect;
    d->destroy = proc_destroy;
    d->impl = p;
    p->fd = -1;
    p->pid = -1;
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
