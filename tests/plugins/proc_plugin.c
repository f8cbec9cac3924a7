/* A tiny process detector plugin for the tests, speaking protocol v2: reads
 * {"id":N,"text":...,"role":...} lines on stdin and answers
 * {"id":N,"spans":[...]} flagging every "secret".  argv[1] selects a
 * behaviour:
 *   ok            as above; a request whose id is missing or does not
 *                 increase is answered with a line that is not JSON
 *   crash         abort() at the first request
 *   hang          never answer (exit after 10 s)
 *   garbage       answer a line that is not JSON
 *   badspan       answer a span with start > end
 *   noid          answer a v1 reply, {"spans":[...]} without the id
 *   previous-id   answer with the id of the request before (an answer that
 *                 belongs to another message)
 *   stray         when the text holds "stray": the reply, then a second line
 *                 {"spans":[]}, both in one write
 *   early-answer  after the first reply, wait for the file argv[2]/go, then
 *                 write {"id":N+1,"spans":[]} (an answer to a request not
 *                 yet sent) and create argv[2]/done; once, not again in
 *                 the child started after it
 *   slow          when the text holds "slow": wait 1 s, then answer
 *   hold          when the text holds "hold": create argv[2]/held, wait for
 *                 the file argv[2]/go (10 s at most), then answer
 *   slow-start    as slow, and wait 0.7 s at every start before reading
 *   fds           answer as "ok" if no descriptor above 2 is open, else a
 *                 line that is not JSON
 *   grandchild    fork a child that sleeps 5 s (it shares our stdout and
 *                 stderr), write "PID GRANDCHILD_PID PGID\n" to argv[2],
 *                 then hang (exit after 10 s)
 * The offsets index the JSON-escaped text: the tests send plain ASCII
 * without escapes, where the two agree. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&t, NULL);
}

/* Never answer, yet exit in the end: a broken stop must fail a test, not
 * leave a process holding the suite's stderr. */
static void hang(void)
{
    sleep_ms(10000);
    exit(0);
}

static void touch(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
}

static int exists(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* the reply's spans for the text of one request line, into out */
static void spans_of(const char *line, char *out, size_t cap)
{
    const char *t = strstr(line, "\"text\":\"");
    size_t n = (size_t)snprintf(out, cap, "[");
    int first = 1;
    if (t) {
        t += 8;
        for (const char *p = t; (p = strstr(p, "secret")) && n < cap; p += 6) {
            n += (size_t)snprintf(out + n, cap - n, "%s{\"start\":%ld,\"end\":%ld,\"type\":\"proc_secret\",\"score\":0.7}",
                                  first ? "" : ",", (long)(p - t), (long)(p - t + 6));
            first = 0;
        }
    }
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* descriptors above stderr, not counting the one reading /proc/self/fd */
static int extra_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int fd = atoi(e->d_name);
        n += e->d_name[0] != '.' && fd > 2 && fd != dirfd(d);
    }
    closedir(d);
    return n;
}

static void grandchild(const char *pids_file)
{
    pid_t g = fork();
    if (g == 0) {
        sleep_ms(5000); /* long past the test's timeout, yet bounded should the group kill break */
        _exit(0);
    }
    FILE *f = fopen(pids_file, "w");
    if (f) {
        fprintf(f, "%ld %ld %ld\n", (long)getpid(), (long)g, (long)getpgrp());
        fclose(f);
    }
    hang();
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ok";
    const char *arg = argc > 2 ? argv[2] : ".";
    static char line[1 << 20], spans[1 << 16];
    long long last = 0;
    int answered = 0;
    if (strcmp(mode, "slow-start") == 0) sleep_ms(700);
    while (fgets(line, sizeof line, stdin)) {
        /* the id leads the request: {"id":N,... */
        char *end = NULL;
        long long id = strncmp(line, "{\"id\":", 6) == 0 ? strtoll(line + 6, &end, 10) : -1;
        if (!end || *end != ',') id = -1;
        if (strcmp(mode, "crash") == 0) abort();
        if (strcmp(mode, "hang") == 0) hang();
        if (strcmp(mode, "grandchild") == 0) grandchild(arg);
        if ((strcmp(mode, "slow") == 0 || strcmp(mode, "slow-start") == 0) && strstr(line, "slow")) sleep_ms(1000);
        if (strcmp(mode, "hold") == 0 && strstr(line, "hold")) {
            touch(arg, "held");
            for (int i = 0; i < 2000 && !exists(arg, "go"); i++) sleep_ms(5);
        }
        if (strcmp(mode, "garbage") == 0 || ((strcmp(mode, "ok") == 0 || strcmp(mode, "hold") == 0) && (id < 0 || id <= last)) ||
            (strcmp(mode, "fds") == 0 && extra_fds() != 0)) {
            printf("this is not json\n");
            fflush(stdout);
            continue;
        }
        last = id;
        spans_of(line, spans, sizeof spans);
        if (strcmp(mode, "badspan") == 0) strcpy(spans, "[{\"start\":5,\"end\":2,\"type\":\"x\"}]");
        if (strcmp(mode, "noid") == 0) printf("{\"spans\":%s}\n", spans);
        else printf("{\"id\":%lld,\"spans\":%s}\n", strcmp(mode, "previous-id") == 0 ? id - 1 : id, spans);
        if (strcmp(mode, "stray") == 0 && strstr(line, "stray")) printf("{\"spans\":[]}\n");
        fflush(stdout); /* one write: the reply and any stray line arrive together */
        if (strcmp(mode, "early-answer") == 0 && !answered && !exists(arg, "done")) {
            for (int i = 0; i < 1000 && !exists(arg, "go"); i++) sleep_ms(5);
            printf("{\"id\":%lld,\"spans\":[]}\n", id + 1);
            fflush(stdout);
            touch(arg, "done");
        }
        answered = 1;
    }
    return 0;
}
