/* The process detector plugin (protocol v2, engine/detect/detect_plugin.c) against
 * tests/plugins/proc_plugin.c: every answer is matched to its request by id,
 * anything else fails closed and restarts the child, a timeout leaves no
 * process of the child's group behind, and an exec failure says so. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../engine/detect/detect.h"
#include "helpers.h"

static char *plugin_bin(void)
{
    static char path[600];
    const char *dir = getenv("CP_PLUGINS");
    snprintf(path, sizeof path, "%s/cp_test_proc_plugin", dir && *dir ? dir : "build/tests");
    return path;
}

static cp_detector *start(const char *mode, const char *arg, int timeout_ms)
{
    char *argv[] = { plugin_bin(), (char *)mode, (char *)arg, NULL };
    cp_detector *d = NULL;
    cp_error err = { 0 };
    cr_assert_eq(cp_detector_process(argv, timeout_ms, &d, &err), CP_OK, "%s: %s", mode, err.msg);
    return d;
}

/* One request straight to the detector (not through the chain): the error,
 * if any, in err; spans in s (freed and reset first). */
static cp_status ask(cp_detector *d, const char *text, cp_spans *s, cp_error *err)
{
    cp_spans_free(s);
    memset(s, 0, sizeof *s);
    memset(err, 0, sizeof *err);
    return d->detect(d, text, strlen(text), CP_ROLE_USER, s, err);
}

/* "the secret word" answered right: one span on "secret" */
static void expect_secret_word(cp_detector *d, const char *when)
{
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_eq(ask(d, "the secret word", &s, &err), CP_OK, "%s: %s", when, err.msg);
    cr_assert(s.n == 1 && s.v[0].start == 4 && s.v[0].end == 10 && strcmp(s.v[0].type, "proc_secret") == 0,
              "%s: %zu spans, the first [%u,%u)", when, s.n, s.n ? s.v[0].start : 0, s.n ? s.v[0].end : 0);
    cp_spans_free(&s);
}

static void sleep_ms(long ms)
{
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&t, NULL);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* pid is running or stopped (not gone, not a zombie waiting for its reaper) */
static int alive(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* how many live processes have process group pgid */
static int live_in_group(long pgid)
{
    DIR *dir = opendir("/proc");
    cr_assert(dir);
    int live = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char state;
        long ppid, pgrp;
        const char *rp = strrchr(buf, ')');
        if (rp && sscanf(rp + 1, " %c %ld %ld", &state, &ppid, &pgrp) == 3 && pgrp == pgid && state != 'Z' && state != 'X')
            live++;
    }
    closedir(dir);
    return live;
}

Test(plugin, answers_carry_the_request_id)
{
    /* "ok" answers garbage to a request whose id is missing or does not
     * increase: five good answers mean five increasing ids */
    cp_detector *d = start("ok", NULL, 2000);
    for (int i = 0; i < 5; i++) expect_secret_word(d, "ok");
    d->destroy(d);
}

Test(plugin, a_reply_for_another_request_fails_closed)
{
    const char *modes[] = { "previous-id", "noid" };
    for (int m = 0; m < 2; m++) {
        cp_detector *d = start(modes[m], NULL, 2000);
        cp_spans s = { 0 };
        cp_error err = { 0 };
        for (int i = 0; i < 2; i++) { /* the first child and its replacement */
            cr_assert_neq(ask(d, "the secret word", &s, &err), CP_OK, "%s: request %d was accepted", modes[m], i + 1);
            cr_assert(strstr(err.msg, "id"), "%s: %s", modes[m], err.msg);
            cr_assert_eq(s.n, 0);
        }
        cp_spans_free(&s);
        d->destroy(d);
    }
}

Test(plugin, a_stray_line_fails_closed_and_shifts_nothing)
{
    cp_detector *d = start("stray", NULL, 2000);
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_neq(ask(d, "a stray secret", &s, &err), CP_OK, "a reply followed by a stray line was accepted");
    cr_assert(strstr(err.msg, "after the reply"), "%s", err.msg);
    cr_assert_eq(s.n, 0);
    /* the stray {"spans":[]} must not become this message's answer */
    expect_secret_word(d, "the request after the stray line");
    expect_secret_word(d, "the one after that");
    cp_spans_free(&s);
    d->destroy(d);
}

Test(plugin, an_answer_before_the_question_fails_closed)
{
    char dir[512], path[600];
    test_tmpdir(dir, sizeof dir, "plugin-early");
    cp_detector *d = start("early-answer", dir, 2000);
    expect_secret_word(d, "first request");
    /* let the plugin write {"id":2,"spans":[]} and wait until it has */
    snprintf(path, sizeof path, "%s/go", dir);
    cr_assert(write_bytes(path, "", 0));
    snprintf(path, sizeof path, "%s/done", dir);
    for (double t0 = now_s(); access(path, F_OK) != 0;) {
        cr_assert_lt(now_s() - t0, 5.0, "the plugin never wrote its early answer");
        sleep_ms(2);
    }
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_neq(ask(d, "the secret word", &s, &err), CP_OK, "an answer written before the request was accepted");
    cr_assert(strstr(err.msg, "nobody asked for"), "%s", err.msg);
    cr_assert_eq(s.n, 0);
    expect_secret_word(d, "the fresh child");
    cp_spans_free(&s);
    d->destroy(d);
}

Test(plugin, a_late_answer_is_never_read)
{
    cp_detector *d = start("slow", NULL, 300);
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_neq(ask(d, "slow secret", &s, &err), CP_OK);
    cr_assert(strstr(err.msg, "timed out"), "%s", err.msg);
    sleep_ms(300); /* past the moment the old child would have answered */
    expect_secret_word(d, "after a timeout");
    cp_spans_free(&s);
    d->destroy(d);
}

Test(plugin, a_timeout_kills_the_whole_group)
{
    char dir[512], pids[600];
    test_tmpdir(dir, sizeof dir, "plugin-group");
    snprintf(pids, sizeof pids, "%s/pids", dir);
    unlink(pids);
    cp_detector *d = start("grandchild", pids, 300);
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_neq(ask(d, "x", &s, &err), CP_OK);
    cr_assert(strstr(err.msg, "timed out"), "%s", err.msg);
    size_t n = 0;
    char *text = read_text(pids, &n);
    cr_assert(text, "the plugin wrote no pids to %s", pids);
    long child = 0, grandchild = 0, pgid = 0;
    cr_assert_eq(sscanf(text, "%ld %ld %ld", &child, &grandchild, &pgid), 3, "%s", text);
    free(text);
    cr_assert_gt(grandchild, 0);
    int own_group = pgid == child;
    /* SIGKILL went to the group; give the kernel a moment to deliver it */
    for (double t0 = now_s(); (alive(grandchild) || (own_group && live_in_group(pgid))) && now_s() - t0 < 1.0;) sleep_ms(2);
    int survived = alive(grandchild), left = own_group ? live_in_group(pgid) : -1;
    /* a broken promise must not leave them holding the suite's stderr */
    if (survived) kill((pid_t)grandchild, SIGKILL);
    if (alive(child)) kill((pid_t)child, SIGKILL);
    cr_assert(own_group, "the plugin runs in the engine's group %ld, not its own", pgid);
    cr_assert(!survived, "grandchild %ld outlived the timeout", grandchild);
    cr_assert_eq(left, 0, "%d processes of group %ld outlived the timeout", left, pgid);
    /* the child itself was reaped, not left a zombie */
    errno = 0;
    cr_assert(waitpid((pid_t)child, NULL, WNOHANG) == -1 && errno == ECHILD, "child %ld was not reaped", child);
    cp_spans_free(&s);
    d->destroy(d);
}

Test(plugin, an_exec_failure_says_cannot_execute)
{
    cp_detector *d = NULL;
    cp_error err = { 0 };
    char *missing[] = { "/nonexistent/detector", NULL };
    cr_assert_neq(cp_detector_process(missing, 300, &d, &err), CP_OK);
    cr_assert(strstr(err.msg, "cannot execute /nonexistent/detector: No such file or directory"), "%s", err.msg);
    cr_assert_null(d);
    char dir[512], path[600];
    test_tmpdir(dir, sizeof dir, "plugin-noexec");
    snprintf(path, sizeof path, "%s/not-executable", dir);
    cr_assert(write_bytes(path, "#!/bin/sh\n", 10));
    cr_assert_eq(chmod(path, 0644), 0);
    char *noexec[] = { path, NULL };
    cr_assert_neq(cp_detector_process(noexec, 300, &d, &err), CP_OK);
    cr_assert(strstr(err.msg, "cannot execute") && strstr(err.msg, "Permission denied"), "%s", err.msg);
}

Test(plugin, the_child_inherits_no_descriptor_of_ours)
{
    int fd = open("/dev/null", O_RDONLY); /* deliberately without O_CLOEXEC */
    cr_assert_geq(fd, 0);
    cp_detector *d = start("fds", NULL, 2000);
    expect_secret_word(d, "a child holding only stdin, stdout and stderr");
    d->destroy(d);
    close(fd);
}
