/* cacheprune serve: its parts (keys file, constant-time key lookup, stop
 * strings, OpenAI request parsing) and the server itself as a subprocess on
 * 127.0.0.1 with an ephemeral port, spoken to over real sockets: every
 * endpoint and error class with its body, the same greedy text as `run`
 * (streamed or not), tenants from keys alone, the tenant view of
 * cached_tokens, a full queue, a drain at SIGTERM, startup errors. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../engine/server/auth.h"
#include "../engine/server/job.h"
#include "../engine/server/openai.h"
#include "../engine/server/textout.h"
#include "../engine/tenant.h"
#include "../tokenizer/utf8.h"
#include "helpers.h"

#define KEY_A "sk-alice-0123456789abcdef"
#define KEY_B "sk-bob-0123456789abcdefgh"
#define KEY_OP "sk-ops-0123456789abcdefgh"
#define KEY_C "sk-carol-0123456789abcdef"
#define KEY_D "sk-dave-0123456789abcdefg"

/* ---- keys file and key lookup ------------------------------------------------------ */

static cp_status parse_keys(const char *text, srv_keys **k, cp_tenant_table **t, cp_error *err)
{
    cr_assert_eq(cp_tenant_table_create(t, err), CP_OK);
    return srv_keys_parse(text, strlen(text), "keys.txt", *t, k, err);
}

Test(server, keys_file_errors_name_the_line_never_the_key)
{
    static const struct {
        const char *text, *where, *what;
    } bad[] = {
        { "# ok\nshort-key alice\n", "keys.txt:2", "16 to 512" },
        { KEY_A " alice\n" KEY_A " bob\n", "keys.txt:2", "duplicate key (already on line 1)" },
        /* the first line in the file that repeats an earlier one, and that one */
        { KEY_A " alice\n" KEY_B " bob\n" KEY_C " carol\n" KEY_B " bob\n" KEY_A " alice\n", "keys.txt:4", "duplicate key (already on line 2)" },
        { KEY_C " carol\n" KEY_A " alice\n" KEY_A " alice\n" KEY_A " alice\n" KEY_C " carol\n", "keys.txt:3", "duplicate key (already on line 2)" },
        { KEY_A " alice admin\n", "keys.txt:1", "'operator'" },
        { KEY_A " alice operator extra\n", "keys.txt:1", "too many fields" },
        { "\n" KEY_A "\n", "keys.txt:2", "KEY TENANT" },
        { KEY_A " al\xff" "ce\n", "keys.txt:1", "UTF-8" },
        { "sk-\xc3\xa9-0123456789abcdef alice\n", "keys.txt:1", "visible ASCII" },
        { "# nothing\n\n", "keys.txt", "no keys" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        srv_keys *k = NULL;
        cp_tenant_table *t;
        cp_error err = { 0 };
        cr_assert_neq(parse_keys(bad[i].text, &k, &t, &err), CP_OK, "case %zu was accepted", i);
        cr_assert_null(k);
        cr_assert(strstr(err.msg, bad[i].where), "case %zu: '%s' does not name %s", i, err.msg, bad[i].where);
        cr_assert(strstr(err.msg, bad[i].what), "case %zu: '%s' does not say '%s'", i, err.msg, bad[i].what);
        cr_assert_null(strstr(err.msg, "0123456789"), "case %zu: the message echoes a key: %s", i, err.msg);
        cp_tenant_table_free(t);
    }
}

Test(server, keys_map_to_tenants_and_compare_whole_keys)
{
    srv_keys *k;
    cp_tenant_table *t;
    cp_error err = { 0 };
    cr_assert_eq(parse_keys("# tenants\n" KEY_A " alice\n\n  " KEY_B "\tbob  \n" KEY_OP " ops operator\nsk-alice-rotated-key-000 alice\n",
                            &k, &t, &err),
                 CP_OK, "%s", err.msg);
    cr_assert_eq(srv_keys_count(k), 4);
    uint32_t alice, bob, ops;
    cr_assert_eq(cp_tenant_intern(t, "alice", 5, &alice, &err), CP_OK);
    cr_assert_eq(cp_tenant_intern(t, "bob", 3, &bob, &err), CP_OK);
    cr_assert_eq(cp_tenant_intern(t, "ops", 3, &ops, &err), CP_OK);
    cr_assert_eq(cp_tenant_count(t), 3, "two keys of alice are one tenant");
    srv_principal p;
    cr_assert_eq(srv_authenticate(k, "Bearer " KEY_A, &p), SRV_AUTH_OK);
    cr_assert(p.tenant == alice && !p.operator_);
    cr_assert_eq(srv_authenticate(k, "bearer   sk-alice-rotated-key-000 ", &p), SRV_AUTH_OK);
    cr_assert(p.tenant == alice);
    cr_assert_eq(srv_authenticate(k, "Bearer " KEY_B, &p), SRV_AUTH_OK);
    cr_assert(p.tenant == bob && !p.operator_);
    cr_assert_eq(srv_authenticate(k, "Bearer " KEY_OP, &p), SRV_AUTH_OK);
    cr_assert(p.tenant == ops && p.operator_);
    /* near misses are unknown keys, whatever they share with a real one */
    const char *miss[] = { "Bearer sk-alice-0123456789abcdeF", "Bearer sk-alice-0123456789abcde", "Bearer sk-alice-0123456789abcdef0",
                           "Bearer sk-bob-0123456789abcdef", "Bearer alice" };
    for (size_t i = 0; i < sizeof miss / sizeof *miss; i++) {
        cr_assert_eq(srv_authenticate(k, miss[i], &p), SRV_AUTH_UNKNOWN, "'%s' was let in", miss[i]);
        cr_assert(p.tenant == 0 && !p.operator_);
    }
    cr_assert_eq(srv_authenticate(k, NULL, &p), SRV_AUTH_MISSING);
    cr_assert_eq(srv_authenticate(k, "Bearer ", &p), SRV_AUTH_MISSING);
    cr_assert_eq(srv_authenticate(k, "Basic " KEY_A, &p), SRV_AUTH_MALFORMED);
    cr_assert_eq(srv_authenticate(k, KEY_A, &p), SRV_AUTH_MALFORMED);
    srv_keys_free(k);
    cp_tenant_table_free(t);
}

/* ---- stop strings ---------------------------------------------------------------- */

/* The text for `whole` fed in pieces cut at `cuts`, with what was visible
 * after each piece never shrinking nor exceeding the final text. */
static char *feed(const char *whole, const size_t *cuts, int n_cuts, const char *const *stops, int n_stops, int *stopped)
{
    srv_text t;
    srv_text_init(&t, stops, n_stops);
    cp_error err;
    size_t at = 0, vis = 0, L = strlen(whole);
    char shown[512] = "";
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : L;
        cr_assert_eq(srv_text_push(&t, whole + at, end - at, &err), CP_OK);
        cr_assert_geq(t.visible, vis, "the visible text shrank");
        cr_assert_leq(t.visible, t.len);
        if (t.visible) memcpy(shown, t.buf, t.visible);
        shown[t.visible] = 0;
        vis = t.visible;
        at = end;
    }
    cr_assert_eq(srv_text_finish(&t, t.stopped ? NULL : whole, &err), CP_OK);
    cr_assert_eq(strncmp(shown, t.buf, strlen(shown)), 0, "text shown before the end was taken back");
    *stopped = t.stopped;
    char *out = strdup(t.buf ? t.buf : "");
    srv_text_free(&t);
    return out;
}

Test(server, stop_strings_cut_and_hold_back)
{
    const char *stops[] = { "\n\n", "END" };
    int st;
    /* every way of cutting the text into three pieces gives the same text:
     * what a stream shows concatenates to the non-streamed answer */
    const char *whole = "one line\nsecond ENDING\n\nafter";
    size_t L = strlen(whole);
    for (size_t a = 0; a <= L; a++)
        for (size_t b = a; b <= L; b++) {
            size_t cuts[2] = { a, b };
            char *s = feed(whole, cuts, 2, stops, 2, &st);
            cr_assert_str_eq(s, "one line\nsecond ", "cuts %zu,%zu", a, b);
            cr_assert(st);
            free(s);
        }
    /* the earliest stop wins; a partial stop at the very end is text */
    size_t c1[1] = { 3 };
    char *s = feed("ab\n\nEND", c1, 1, stops, 2, &st);
    cr_assert_str_eq(s, "ab");
    free(s);
    s = feed("tail E", c1, 1, stops, 2, &st);
    cr_assert_str_eq(s, "tail E");
    cr_assert(!st);
    free(s);
    s = feed("no stops here", c1, 1, NULL, 0, &st);
    cr_assert_str_eq(s, "no stops here");
    free(s);
    /* a held-back tail is visible only once it cannot become a stop */
    srv_text t;
    cp_error err;
    srv_text_init(&t, stops, 2);
    cr_assert_eq(srv_text_push(&t, "abE", 3, &err), CP_OK);
    cr_assert_eq(t.visible, 2);
    cr_assert_eq(srv_text_push(&t, "N", 1, &err), CP_OK);
    cr_assert_eq(t.visible, 2);
    cr_assert_eq(srv_text_push(&t, "x", 1, &err), CP_OK);
    cr_assert_eq(t.visible, 5);
    srv_text_free(&t);
}

/* ---- OpenAI request parsing ---------------------------------------------------------- */

static cp_status gen_of(const char *body, srv_kind kind, srv_gen *g, char *param, cp_error *err)
{
    return srv_gen_parse(body, strlen(body), kind, 256, g, param, 64, err);
}

Test(server, request_fields_fail_closed_naming_the_field)
{
    static const struct {
        srv_kind kind;
        const char *body, *param, *what;
    } bad[] = {
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": \"hot\"}", "temperature", "number" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2.5}", "max_tokens", "integer" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 2}", "n", "one choice" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": 1}", "stream", "true or false" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", "at most 4" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": [\"\"]}", "stop", "empty" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"sensitive\": \"yes\"}]}", "messages", "sensitive" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"sensitve\": true}]}", "messages", "unknown field 'sensitve'" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"spans\": [[0, 3]]}]}", "messages", "messages[0].spans[0]" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"spans\": [[1, 1]]}]}", "messages", "empty" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"sensitive\": true, \"sensitive\": false}]}", "messages", "twice" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"h\xc3\"}]}", "messages", "messages[0].content is not valid UTF-8" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}", "messages", "messages[0].role" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"sensitive\": true}", "sensitive", "belongs to a message" },
        { SRV_CHAT, "{\"messages\": []}", "messages", "empty" },
        { SRV_CHAT, "{\"prompt\": \"hi\"}", "messages", "required" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"model\": 7}", "model", "string" },
        { SRV_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt", "must be a string" },
        { SRV_COMPLETION, "{\"prompt\": \"a\", \"stop\": \"\xff\"}", "stop", "UTF-8" },
        { SRV_COMPLETION, "{\"prompt\": \"a\"} x", "", "JSON" },
        { SRV_COMPLETION, "[1]", "", "object" },
        { SRV_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 1, \"max_tokens\": 500}", "", "'max_tokens' appears twice" },
        { SRV_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 2, \"max_completion_tokens\": 100}", "max_tokens", "disagree" },
        /* a privacy field sent as null fails closed, never reads as absent (which shares) */
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"sensitive\": null}]}", "messages", "'sensitive' is null" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"spans\": null}]}", "messages", "'spans' is null" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"store\": null}", "store", "'store' is null" },
        { SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"cache\": null}", "cache", "'cache' is null" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        srv_gen g;
        char param[64];
        cp_error err = { 0 };
        cr_assert_neq(gen_of(bad[i].body, bad[i].kind, &g, param, &err), CP_OK, "case %zu was accepted", i);
        cr_assert_str_eq(param, bad[i].param, "case %zu: param '%s', want '%s' (%s)", i, param, bad[i].param, err.msg);
        cr_assert(strstr(err.msg, bad[i].what), "case %zu: '%s' does not say '%s'", i, err.msg, bad[i].what);
        srv_gen_free(&g);
    }
}

Test(server, request_parsing_keeps_privacy_fields_and_ignores_identity_fields)
{
    srv_gen a, b;
    char param[64];
    cp_error err = { 0 };
    const char *plain = "{\"model\": \"m\", \"messages\": [{\"role\": \"document\", \"content\": \"card 4111\"}, {\"role\": \"user\", "
                        "\"content\": \"hello there\", \"sensitive\": true, \"spans\": [[0, 5], [6, 11]]}], \"max_tokens\": 9999, "
                        "\"temperature\": 0, \"seed\": 5, \"stop\": \"\\n\"}";
    const char *extra = "{\"user\": \"bob\", \"tenant\": \"bob\", \"cache_salt\": \"s3cr3t\", \"logprobs\": false, \"model\": \"m\", "
                        "\"messages\": [{\"role\": \"document\", \"content\": \"card 4111\", \"name\": \"x\"}, {\"role\": \"user\", "
                        "\"content\": \"hello there\", \"sensitive\": true, \"spans\": [[0, 5], [6, 11]]}], \"max_tokens\": 9999, "
                        "\"temperature\": 0, \"seed\": 5, \"stop\": [\"\\n\"]}";
    cr_assert_eq(gen_of(plain, SRV_CHAT, &a, param, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(gen_of(extra, SRV_CHAT, &b, param, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(a.max_tokens, 256, "max_tokens is capped");
    cr_assert_eq(a.n_msgs, 2);
    cr_assert_eq(a.msgs[0].role, CP_ROLE_DOCUMENT);
    cr_assert(a.msgs[1].sensitive && a.msgs[1].n_marked == 2);
    cr_assert(a.msgs[1].marked[1].start == 6 && a.msgs[1].marked[1].end == 11);
    cr_assert(a.n_stops == 1 && strcmp(a.stops[0], "\n") == 0);
    /* the same request, field for field */
    cr_assert(a.n_msgs == b.n_msgs && a.max_tokens == b.max_tokens && a.n_stops == b.n_stops && !strcmp(a.stops[0], b.stops[0]));
    cr_assert(memcmp(&a.sampling, &b.sampling, sizeof a.sampling) == 0);
    for (size_t i = 0; i < a.n_msgs; i++) {
        cr_assert(a.msgs[i].role == b.msgs[i].role && a.msgs[i].sensitive == b.msgs[i].sensitive);
        cr_assert_str_eq(a.msgs[i].text, b.msgs[i].text);
        cr_assert_eq(a.msgs[i].n_marked, b.msgs[i].n_marked);
        cr_assert(memcmp(a.msgs[i].marked, b.msgs[i].marked, a.msgs[i].n_marked * sizeof(cp_span)) == 0);
    }
    srv_gen_free(&a), srv_gen_free(&b);
    cr_assert_eq(gen_of("{\"prompt\": \"Once\"}", SRV_COMPLETION, &a, param, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(a.max_tokens, SRV_COMPLETION_DEFAULT_MAX);
    cr_assert(a.n_msgs == 1 && a.msgs[0].role == CP_ROLE_USER && !a.stream && a.sampling.temperature == 1);
    srv_gen_free(&a);
}

/* ---- the server as a subprocess ------------------------------------------------------ */

static const char *bin(void)
{
    const char *b = getenv("CP_BIN");
    return b && *b ? b : "build/cacheprune";
}

/* the kit's model at rel (default cp-books-6m), or the test skips */
static void model_at_or_skip(char *model, size_t cap, const char *rel)
{
    char cfg[600];
    if (rel[0] == '/') snprintf(model, cap, "%s", rel); /* one the test made */
    else shared_path(model, cap, rel);
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    if (access(cfg, R_OK) != 0) cr_skip_test("no %s (the reference kit)", model);
}

static void model_or_skip(char *model, size_t cap) { model_at_or_skip(model, cap, "models/cp-books-6m"); }

typedef struct server {
    pid_t pid;
    int port, out_fd;
    char dir[512], errlog[600], keys[600];
} server;

static void write_keys(server *s)
{
    snprintf(s->keys, sizeof s->keys, "%s/keys", s->dir);
    const char *k = "# test tenants\n" KEY_A " alice\n" KEY_B " bob\n" KEY_C " carol\n" KEY_D " dave\n" KEY_OP " ops operator\n";
    cr_assert(write_bytes(s->keys, k, strlen(k)));
    chmod(s->keys, 0600);
}

/* Spawns `serve` with extra args (NULL-terminated); returns the exit code
 * when it exits before listening (startup errors), else -1 with s->port. */
static int spawn_server_on(server *s, const char *model_rel, const char *name, const char *const *extra, int keep_keys)
{
    char model[512];
    model_at_or_skip(model, sizeof model, model_rel);
    memset(s, 0, sizeof *s);
    test_tmpdir(s->dir, sizeof s->dir, name);
    snprintf(s->errlog, sizeof s->errlog, "%s/stderr", s->dir);
    if (!keep_keys) write_keys(s);
    else snprintf(s->keys, sizeof s->keys, "%s/keys", s->dir);
    const char *argv[48] = { bin(), "serve", "--model", model, "--keys", s->keys, "--port", "0" };
    int n = 8;
    for (int i = 0; extra && extra[i] && n < 46; i++) argv[n++] = extra[i];
    int p[2];
    cr_assert_eq(pipe(p), 0);
    s->pid = fork();
    cr_assert_geq(s->pid, 0);
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test leaves no server behind */
        dup2(p[1], 1);
        int e = open(s->errlog, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (e >= 0) dup2(e, 2);
        close(p[0]);
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    s->out_fd = p[0];
    char line[256];
    size_t len = 0;
    struct pollfd pf = { p[0], POLLIN, 0 };
    while (len + 1 < sizeof line && poll(&pf, 1, 30000) > 0) {
        ssize_t k = read(p[0], line + len, 1);
        if (k <= 0) break;
        if (line[len++] == '\n') break;
    }
    line[len] = 0;
    if (sscanf(line, "listening on 127.0.0.1:%d", &s->port) == 1 && s->port > 0) return -1;
    int st;
    waitpid(s->pid, &st, 0);
    close(p[0]);
    s->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int spawn_server(server *s, const char *name, const char *const *extra, int keep_keys)
{
    return spawn_server_on(s, "models/cp-books-6m", name, extra, keep_keys);
}

/* `serve` on the kit's model at model_rel, listening */
static void start_on(server *s, const char *model_rel, const char *name, const char *const *extra)
{
    int rc = spawn_server_on(s, model_rel, name, extra, 0);
    if (rc != -1) {
        char *e = read_text(s->errlog, NULL);
        cr_assert_fail("serve exited with %d before listening: %s", rc, e ? e : "");
    }
}

static void start(server *s, const char *name, const char *const *extra) { start_on(s, "models/cp-books-6m", name, extra); }

/* A server on a model slow enough that a request outlasts a test's seconds
 * of waiting on any machine: the 0.5B shape with random weights (only its
 * speed matters; ~20 tokens/s on two cores), made under dir_out (absolute,
 * PATH_MAX bytes), which slow_model_remove deletes. */
static void start_slow(server *s, const char *name, const char *const *extra, char *dir_out)
{
    char dir[512], model[PATH_MAX + 8], cmd[PATH_MAX + 600];
    const char *given = getenv("CP_SLOW_MODEL"); /* tsan-test: under TSan cp-books-6m is slow enough */
    if (given && *given) {
        dir_out[0] = 0;
        start_on(s, given, name, extra);
        return;
    }
    test_tmpdir(dir, sizeof dir, "srv_slow_model");
    cr_assert(realpath(dir, dir_out), "%s", dir);
    snprintf(model, sizeof model, "%s/m", dir_out);
    snprintf(cmd, sizeof cmd, "%s synth --shape qwen2.5-0.5b --out %s --quiet-progress > /dev/null", bin(), model);
    cr_assert_eq(system(cmd), 0, "synth of the 0.5B shape failed");
    start_on(s, model, name, extra);
}

static void slow_model_remove(const char *dir)
{
    if (*dir) test_sh("rm -rf '%s'", dir); /* a GB of random weights */
}

/* SIGTERM, then the exit status (-1 if it had to be killed). */
static int stop(server *s)
{
    if (!s->pid) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 2000; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            close(s->out_fd);
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return -1;
}

/* ---- a small HTTP/1.1 client ---------------------------------------------------------- */

typedef struct http_resp {
    int status;
    char *head; /* status line and headers */
    char *body; /* de-chunked */
    size_t body_len;
} http_resp;

static void resp_free(http_resp *r)
{
    free(r->head), free(r->body);
    memset(r, 0, sizeof *r);
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001) };
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return; /* the server may close early (413, 401): what it said is still read */
        p += k, n -= (size_t)k;
    }
}

static void send_request(int fd, const char *method, const char *path, const char *key, const char *body, size_t blen)
{
    char head[1024];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
    if (key) n += snprintf(head + n, sizeof head - (size_t)n, "Authorization: Bearer %s\r\n", key);
    if (body) n += snprintf(head + n, sizeof head - (size_t)n, "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    send_all(fd, head, (size_t)n);
    if (body) send_all(fd, body, blen);
}

static const char *header(const http_resp *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n"))
        if (strncasecmp(p + 2, name, nl) == 0 && p[2 + nl] == ':') {
            const char *v = p + 3 + nl, *e = strstr(v, "\r\n");
            while (*v == ' ') v++;
            snprintf(out, cap, "%.*s", (int)(e ? e - v : (long)strlen(v)), v);
            return out;
        }
    return NULL;
}

/* Reads until the server closes (Connection: close) or, with until, until
 * that text has arrived; closes fd.  NUL-terminated, malloc'd (NULL when
 * out of memory); no assertion: client threads call it. */
static char *read_raw(int fd, const char *until, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 4096 > cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
            if (!buf) break;
        }
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
        if (until && strstr(buf, until)) break;
    }
    if (buf) buf[n] = 0;
    close(fd);
    *len = n;
    return buf;
}

/* The status, headers and de-chunked body of a whole response in buf. */
static void parse_response(char *buf, size_t n, http_resp *r)
{
    cr_assert(buf, "out of memory reading a response");
    char *sep = strstr(buf, "\r\n\r\n");
    cr_assert(sep, "no HTTP header in %zu bytes", n);
    r->head = strndup(buf, (size_t)(sep - buf) + 2);
    cr_assert_eq(sscanf(buf, "HTTP/1.%*d %d", &r->status), 1);
    const char *b = sep + 4;
    size_t bl = n - (size_t)(b - buf);
    char te[64];
    r->body = malloc(bl + 1);
    if (header(r, "Transfer-Encoding", te, sizeof te) && strstr(te, "chunked")) {
        size_t out = 0;
        const char *p = b;
        while (p < buf + n) {
            char *end;
            unsigned long len = strtoul(p, &end, 16);
            const char *data = strstr(end, "\r\n");
            if (!data || len == 0) break;
            data += 2;
            cr_assert_leq(data + len, buf + n, "a chunk past the end of the response");
            memcpy(r->body + out, data, len);
            out += len;
            p = data + len + 2;
        }
        r->body_len = out;
    } else {
        memcpy(r->body, b, bl);
        r->body_len = bl;
    }
    r->body[r->body_len] = 0;
}

/* Reads the whole response (the server closes: Connection: close). */
static void read_response(int fd, http_resp *r)
{
    size_t n;
    char *buf = read_raw(fd, NULL, &n);
    parse_response(buf, n, r);
    free(buf);
}

static http_resp http(int port, const char *method, const char *path, const char *key, const char *body)
{
    http_resp r = { 0 };
    int fd = connect_to(port);
    cr_assert_geq(fd, 0, "cannot connect to port %d", port);
    send_request(fd, method, path, key, body, body ? strlen(body) : 0);
    read_response(fd, &r);
    return r;
}

/* dotted path into JSON: "error.type", "choices.0.message.content" */
static const cJSON *at(const cJSON *j, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *t = strtok(buf, "."); t && j; t = strtok(NULL, "."))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(t)) : cJSON_GetObjectItemCaseSensitive(j, t);
    return j;
}

static const char *str_at(const cJSON *j, const char *path)
{
    const cJSON *v = at(j, path);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double num_at(const cJSON *j, const char *path)
{
    const cJSON *v = at(j, path);
    cr_assert(cJSON_IsNumber(v), "no number at %s", path);
    return v->valuedouble;
}

static cJSON *json_of(const http_resp *r)
{
    cJSON *j = cJSON_Parse(r->body);
    cr_assert(j, "the body is not JSON: %.300s", r->body);
    return j;
}

/* status, error.type, error.param (NULL: JSON null) and error.code of an
 * error answer */
static void expect_error(int port, const char *method, const char *path, const char *key, const char *body, int status,
                         const char *type, const char *param, const char *code, const char *msg_part)
{
    http_resp r = http(port, method, path, key, body);
    cr_assert_eq(r.status, status, "%s %s: status %d, want %d: %s", method, path, r.status, status, r.body);
    char ct[128];
    cr_assert(header(&r, "Content-Type", ct, sizeof ct) && strstr(ct, "application/json"));
    cJSON *j = json_of(&r);
    cr_assert_str_eq(str_at(j, "error.type"), type, "%s", r.body);
    if (param) cr_assert_str_eq(str_at(j, "error.param") ? str_at(j, "error.param") : "(null)", param, "%s", r.body);
    else cr_assert(cJSON_IsNull(at(j, "error.param")), "%s", r.body);
    if (code) cr_assert_str_eq(str_at(j, "error.code") ? str_at(j, "error.code") : "(null)", code, "%s", r.body);
    cr_assert(str_at(j, "error.message") && strstr(str_at(j, "error.message"), msg_part), "'%s' lacks '%s'", r.body, msg_part);
    if (status == 401) cr_assert(header(&r, "WWW-Authenticate", ct, sizeof ct) && strcmp(ct, "Bearer") == 0);
    cJSON_Delete(j);
    resp_free(&r);
}

#define CHAT "/v1/chat/completions"
#define USER_MSG(text) "{\"messages\": [{\"role\": \"user\", \"content\": \"" text "\"}], \"max_tokens\": 8, \"temperature\": 0}"

Test(server, auth_routes_and_methods, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--served-model-name", "books", NULL };
    start(&s, "srv-routes", extra);
    int p = s.port;
    http_resp r = http(p, "GET", "/health", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.body, "{\"status\":\"ok\"}");
    resp_free(&r);
    expect_error(p, "POST", "/health", NULL, "{}", 405, "invalid_request_error", NULL, "method_not_allowed", "GET");
    /* HEAD wherever GET is: the status and headers, no body */
    const char *heads[] = { "HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                            "HEAD /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer " KEY_A "\r\n\r\n" };
    for (int k = 0; k < 2; k++) {
        int fd = connect_to(p);
        cr_assert_geq(fd, 0);
        send_all(fd, heads[k], strlen(heads[k]));
        char got[2048];
        size_t n = 0;
        for (ssize_t m; n < sizeof got - 1 && (m = recv(fd, got + n, sizeof got - 1 - n, 0)) > 0;) n += (size_t)m;
        got[n] = 0;
        close(fd);
        cr_assert(strncmp(got, "HTTP/1.1 200", 12) == 0, "HEAD %d: %s", k, got);
        const char *end = strstr(got, "\r\n\r\n");
        cr_assert(end && end[4] == 0, "HEAD %d sent a body: %s", k, got);
    }
    /* nothing but /health without a valid key, not even a 404 */
    expect_error(p, "GET", "/v1/models", NULL, NULL, 401, "authentication_error", NULL, "invalid_api_key", "missing API key");
    expect_error(p, "GET", "/nowhere", NULL, NULL, 401, "authentication_error", NULL, "invalid_api_key", "missing API key");
    expect_error(p, "POST", CHAT, "sk-alice-0123456789abcdeX", USER_MSG("hi"), 401, "authentication_error", NULL, "invalid_api_key",
                 "invalid API key");
    expect_error(p, "GET", "/metrics", "sk-nobody-000000000000000", NULL, 401, "authentication_error", NULL, "invalid_api_key",
                 "invalid API key");
    /* with a key */
    r = http(p, "GET", "/v1/models", KEY_A, NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cJSON *j = json_of(&r);
    cr_assert_str_eq(str_at(j, "object"), "list");
    cr_assert_str_eq(str_at(j, "data.0.id"), "books");
    cr_assert_str_eq(str_at(j, "data.0.object"), "model");
    cr_assert_null(at(j, "data.1"));
    cJSON_Delete(j), resp_free(&r);
    expect_error(p, "GET", "/nowhere", KEY_A, NULL, 404, "invalid_request_error", NULL, "not_found", "unknown path");
    expect_error(p, "GET", "/v1/chat/completions/", KEY_A, NULL, 404, "invalid_request_error", NULL, "not_found", "unknown path");
    /* paths are matched as sent, not after percent-decoding: a proxy's
     * rules for /v1/cacheprune/purge or /metrics see what is served */
    expect_error(p, "POST", "/v1/cacheprune%2fpurge", KEY_A, "{}", 404, "invalid_request_error", NULL, "not_found", "unknown path");
    expect_error(p, "POST", "/v1/cacheprune/purge%00x", KEY_A, "{}", 404, "invalid_request_error", NULL, "not_found", "unknown path");
    expect_error(p, "GET", "/%761/models", KEY_A, NULL, 404, "invalid_request_error", NULL, "not_found", "unknown path");
    expect_error(p, "GET", "/metrics%00.css", KEY_A, NULL, 404, "invalid_request_error", NULL, "not_found", "unknown path");
    expect_error(p, "GET", CHAT, KEY_A, NULL, 405, "invalid_request_error", NULL, "method_not_allowed", "POST");
    expect_error(p, "DELETE", "/v1/completions", KEY_A, NULL, 405, "invalid_request_error", NULL, "method_not_allowed", "POST");
    expect_error(p, "POST", "/v1/models", KEY_A, "{}", 405, "invalid_request_error", NULL, "method_not_allowed", "GET");
    r = http(p, "GET", CHAT, KEY_A, NULL);
    char allow[64];
    cr_assert(header(&r, "Allow", allow, sizeof allow) && strcmp(allow, "POST") == 0);
    resp_free(&r);
    /* metrics: operators only */
    expect_error(p, "GET", "/metrics", KEY_A, NULL, 403, "permission_error", NULL, "forbidden", "operator key");
    r = http(p, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(r.status, 200);
    char ct[128];
    cr_assert(header(&r, "Content-Type", ct, sizeof ct) && strstr(ct, "text/plain"));
    cr_assert(strstr(r.body, "cacheprune_requests_total{outcome=\"unauthorized\"} 4\n"), "%s", r.body);
    cr_assert(strstr(r.body, "cacheprune_requests_total{outcome=\"forbidden\"} 1\n"), "%s", r.body);
    cr_assert(strstr(r.body, "cacheprune_requests_total{outcome=\"not_found\"} 6\n"), "%s", r.body);
    cr_assert(strstr(r.body, "cacheprune_requests_total{outcome=\"method_not_allowed\"} 5\n"), "%s", r.body);
    cr_assert(strstr(r.body, "# TYPE cacheprune_ttft_seconds histogram\n"));
    cr_assert(strstr(r.body, "cacheprune_queue_depth 0\n"));
    cr_assert(strstr(r.body, "cacheprune_detector_failures_total 0\n"));
    resp_free(&r);
    cr_assert_eq(stop(&s), 0);
}

static double metric_now(int port, const char *name);

/* the value of a metric line: "name value", or "name{labels} value" named with its labels */
static double metric(const char *text, const char *name)
{
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(text, key);
    cr_assert(p, "no metric %s", name);
    return atof(p + strlen(key));
}

Test(server, metrics_count_tokens_and_detector_failures, .timeout = TEST_TIMEOUT(60))
{
    char plugin[600];
    const char *dir = getenv("CP_PLUGINS");
    snprintf(plugin, sizeof plugin, "%s/cp_test_proc_plugin", dir && *dir ? dir : "build/tests");
    if (access(plugin, X_OK) != 0) cr_skip_test("no %s (make build/tests/cp_test_proc_plugin)", plugin);
    strncat(plugin, " garbage", sizeof plugin - strlen(plugin) - 1); /* answers with no JSON: the chain fails closed */
    server s;
    const char *extra[] = { "--plugin-cmd", plugin, NULL };
    start(&s, "srv-metrics", extra);
    http_resp r = http(s.port, "POST", CHAT, KEY_A, USER_MSG("Once upon a time"));
    cr_assert_eq(r.status, 200, "%s", r.body);
    cJSON *j = json_of(&r);
    double pt = num_at(j, "usage.prompt_tokens"), ct = num_at(j, "usage.completion_tokens");
    cJSON_Delete(j), resp_free(&r);
    r = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(metric(r.body, "cacheprune_prompt_tokens_total"), pt);
    cr_assert_eq(metric(r.body, "cacheprune_computed_tokens_total"), pt, "a cold pool computes every prompt token");
    cr_assert_eq(metric(r.body, "cacheprune_reused_tokens_total"), 0);
    cr_assert_eq(metric(r.body, "cacheprune_generated_tokens_total"), ct);
    cr_assert_eq(metric(r.body, "cacheprune_ttft_seconds_count"), 1);
    cr_assert_gt(metric(r.body, "cacheprune_ttft_seconds_sum"), 0);
    cr_assert(strstr(r.body, "cacheprune_ttft_seconds_bucket{le=\"+Inf\"} 1\n"));
    cr_assert_geq(metric(r.body, "cacheprune_detector_failures_total"), 1, "the failed detector was not counted");
    cr_assert_geq(metric(r.body, "cacheprune_detector_messages_total"), 1);
    cr_assert_gt(metric(r.body, "cacheprune_pool_budget_bytes"), 0);
    cr_assert_eq(metric(r.body, "cacheprune_inter_token_seconds_count"), ct - 1, "one gap between each two generated tokens");
    cr_assert_gt(metric(r.body, "cacheprune_inter_token_seconds_sum"), 0);
    cr_assert_eq(metric(r.body, "cacheprune_running_requests"), 0);
    resp_free(&r);
    cr_assert_eq(stop(&s), 0);
}

Test(server, bad_requests_are_400_naming_the_field, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--max-body", "4K", "--max-tokens-cap", "2000", NULL };
    start(&s, "srv-bad", extra);
    int p = s.port;
    expect_error(p, "POST", CHAT, KEY_A, "{\"messages\": [", 400, "invalid_request_error", NULL, NULL, "not valid JSON");
    expect_error(p, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": \"ten\"}", 400,
                 "invalid_request_error", "max_tokens", NULL, "'max_tokens' must be an integer");
    expect_error(p, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 2}", 400,
                 "invalid_request_error", "n", NULL, "'n' must be 1");
    expect_error(p, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"caf\xc3\x28\"}]}", 400,
                 "invalid_request_error", "messages", NULL, "not valid UTF-8");
    expect_error(p, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"sensitive\": 1}]}", 400,
                 "invalid_request_error", "messages", NULL, "'sensitive' must be true or false");
    expect_error(p, "POST", "/v1/completions", KEY_A, "{\"prompt\": 42}", 400, "invalid_request_error", "prompt", NULL,
                 "'prompt' must be a string");
    /* nothing to generate, a participant's name that is not a string, keys that are not UTF-8 */
    expect_error(p, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 0}", 400,
                 "invalid_request_error", "max_tokens", NULL, "'max_tokens' must be in [1,");
    expect_error(p, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"name\": 5}]}", 400,
                 "invalid_request_error", "messages", NULL, "name must be a string");
    expect_error(p, "POST", CHAT, KEY_A, "{\"\xff\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 400,
                 "invalid_request_error", NULL, NULL, "not valid UTF-8");
    expect_error(p, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"caf\xc3\x28\": 1}]}", 400,
                 "invalid_request_error", NULL, NULL, "a key is not valid UTF-8");
    /* past the context (1024 for cp-books-6m): plain or streamed, a 400 before any event */
    const char *longreq = "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], \"max_tokens\": 1020}";
    expect_error(p, "POST", CHAT, KEY_A, longreq, 400, "invalid_request_error", "messages", "context_length_exceeded",
                 "exceed the context of 1024");
    expect_error(p, "POST", "/v1/completions", KEY_A, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1020, \"stream\": true}", 400,
                 "invalid_request_error", "prompt", "context_length_exceeded", "exceed the context of 1024");
    /* no max_tokens: what the context leaves after the prompt (a cap of 2000, a context of 1024, a
     * prompt of ~1000 tokens: 990 times " a") */
    char longer[2200];
    int ln = snprintf(longer, sizeof longer, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
    for (int i = 0; i < 990; i++) ln += snprintf(longer + ln, sizeof longer - (size_t)ln, "a ");
    snprintf(longer + ln, sizeof longer - (size_t)ln, "\"}]}");
    http_resp fit = http(p, "POST", CHAT, KEY_A, longer);
    cr_assert_eq(fit.status, 200, "a request without max_tokens was refused for a default it never asked for: %s", fit.body);
    cJSON *fj = json_of(&fit);
    cr_assert_gt(num_at(fj, "usage.prompt_tokens"), 990, "%s", fit.body);
    cr_assert_leq(num_at(fj, "usage.prompt_tokens") + num_at(fj, "usage.completion_tokens"), 1024, "%s", fit.body);
    cJSON_Delete(fj), resp_free(&fit);
    /* over --max-body, refused from Content-Length */
    char *big = malloc(5000);
    memset(big, ' ', 4999), big[4999] = 0;
    memcpy(big, "{\"prompt\": \"a\"}", 15);
    expect_error(p, "POST", "/v1/completions", KEY_A, big, 413, "invalid_request_error", NULL, "request_too_large", "4096 bytes");
    /* and without a Content-Length (chunked), once the body is in */
    int fd = connect_to(p);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer " KEY_A
                       "\r\nTransfer-Encoding: chunked\r\n\r\n";
    send_all(fd, head, strlen(head));
    for (int k = 0; k < 5; k++) {
        char chunk[1100];
        int n = snprintf(chunk, sizeof chunk, "%x\r\n", 1000);
        memset(chunk + n, 'a', 1000);
        memcpy(chunk + n + 1000, "\r\n", 2);
        send_all(fd, chunk, (size_t)n + 1002);
    }
    send_all(fd, "0\r\n\r\n", 5);
    http_resp cr = { 0 };
    read_response(fd, &cr);
    cr_assert_eq(cr.status, 413, "%s", cr.body);
    cJSON *cj = json_of(&cr);
    cr_assert_str_eq(str_at(cj, "error.code"), "request_too_large");
    cJSON_Delete(cj), resp_free(&cr);
    free(big);
    /* a chunked body far past the limit is not read to its end: the
     * connection is closed (before, 4 GB went in until --body-timeout) */
    fd = connect_to(p);
    send_all(fd, head, strlen(head));
    static char blob[65536 + 16];
    int bn = snprintf(blob, sizeof blob, "%x\r\n", 65536);
    memset(blob + bn, 'a', 65536);
    memcpy(blob + bn + 65536, "\r\n", 2);
    size_t sent = 0;
    for (int k = 0; k < 1024; k++) { /* 64 MB at most */
        ssize_t w = send(fd, blob, (size_t)bn + 65538, MSG_NOSIGNAL);
        if (w <= 0) break;
        sent += (size_t)w;
    }
    cr_assert_lt(sent, (size_t)64 << 20, "the server read a 64 MB chunked body over a 4096-byte --max-body");
    close(fd);
    /* an HTTP/1.1 request without Host (RFC 9112 3.2) */
    fd = connect_to(p);
    const char *hostless = "GET /v1/models HTTP/1.1\r\nConnection: close\r\nAuthorization: Bearer " KEY_A "\r\n\r\n";
    send_all(fd, hostless, strlen(hostless));
    read_response(fd, &cr);
    cr_assert_eq(cr.status, 400, "%s", cr.body);
    cr_assert(cr.body && strstr(cr.body, "Host header"), "%s", cr.body);
    resp_free(&cr);
    fd = connect_to(p);
    const char *twohosts = "GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\nAuthorization: Bearer " KEY_A "\r\n\r\n";
    send_all(fd, twohosts, strlen(twohosts));
    read_response(fd, &cr);
    cr_assert_eq(cr.status, 400, "two Host headers: %s", cr.body);
    resp_free(&cr);
    /* the engine keeps serving */
    http_resp r = http(p, "POST", CHAT, KEY_A, USER_MSG("Once upon a time"));
    cr_assert_eq(r.status, 200, "%s", r.body);
    resp_free(&r);
    cr_assert_eq(stop(&s), 0);
}

/* One request of a sequence, as run's JSONL line and as an HTTP body. */
typedef struct seq_req {
    const char *key, *tenant;
    int completion;
    const char *msgs; /* JSON array, or a prompt string literal for completions */
} seq_req;

#define DOC "\"The quick brown fox jumps over the lazy dog near the river bank every single morning before breakfast, and the old miller watches from his window.\""
static const seq_req seq[] = {
    { KEY_A, "alice", 0, "[{\"role\": \"document\", \"content\": " DOC "}, {\"role\": \"user\", \"content\": \"What does the fox do?\"}]" },
    { KEY_B, "bob", 0, "[{\"role\": \"document\", \"content\": " DOC "}, {\"role\": \"user\", \"content\": \"Who watches the fox?\"}]" },
    { KEY_A, "alice", 1, "\"Once upon a time there was a \\u00e9l\\u00e8ve who\"" },
    { KEY_B, "bob", 0, "[{\"role\": \"system\", \"content\": \"Answer briefly.\"}, {\"role\": \"user\", \"content\": \"My card is 4111 1111 1111 1111, the caf\\u00e9 charged it.\", \"sensitive\": true}]" },
    { KEY_B, "bob", 0, "[{\"role\": \"document\", \"content\": " DOC "}, {\"role\": \"user\", \"content\": \"Who watches the fox?\"}]" },
};
#define N_SEQ (sizeof seq / sizeof *seq)

static void body_of(const seq_req *q, int stream, const char *extra, char *out, size_t cap)
{
    snprintf(out, cap, "{%s\"%s\": %s, \"max_tokens\": 24, \"temperature\": 0%s%s}", extra ? extra : "",
             q->completion ? "prompt" : "messages", q->msgs, stream ? ", \"stream\": true, \"stream_options\": {\"include_usage\": true}" : "",
             "");
}

/* The text of an SSE body, its finish_reason and its usage chunk; checks
 * the framing: data lines only, JSON chunks, [DONE] last. */
static char *sse_text(const char *body, int chat, char *finish, size_t fcap, cJSON **usage)
{
    size_t cap = strlen(body) + 1, n = 0;
    char *text = calloc(cap, 1);
    int done = 0, role_seen = 0;
    *usage = NULL;
    finish[0] = 0;
    for (const char *p = body; *p;) {
        const char *e = strstr(p, "\n\n");
        cr_assert(e, "an event without its blank line: %.80s", p);
        cr_assert(!done, "an event after [DONE]");
        if (*p == ':') { /* a comment (the server's keep-alive) */
            p = e + 2;
            continue;
        }
        cr_assert_eq(strncmp(p, "data: ", 6), 0, "not a data line: %.40s", p);
        char *payload = strndup(p + 6, (size_t)(e - p - 6));
        if (strcmp(payload, "[DONE]") == 0) done = 1;
        else {
            cJSON *j = cJSON_Parse(payload);
            cr_assert(j, "a chunk is not JSON: %s", payload);
            cr_assert_str_eq(str_at(j, "object"), chat ? "chat.completion.chunk" : "text_completion");
            const cJSON *u = at(j, "usage");
            if (cJSON_IsObject(u)) {
                cr_assert_null(*usage, "two usage chunks");
                *usage = cJSON_Duplicate(u, 1);
                cr_assert_eq(cJSON_GetArraySize(at(j, "choices")), 0, "the usage chunk has choices");
            } else {
                cr_assert_null(*usage, "a chunk after the usage chunk");
                const char *t = str_at(j, chat ? "choices.0.delta.content" : "choices.0.text");
                role_seen |= str_at(j, "choices.0.delta.role") != NULL;
                if (t) {
                    size_t k = strlen(t);
                    cr_assert_eq(cp_utf8_validate(t, k), k, "a chunk ends inside a UTF-8 character");
                    memcpy(text + n, t, k), n += k;
                }
                if (str_at(j, "choices.0.finish_reason")) snprintf(finish, fcap, "%s", str_at(j, "choices.0.finish_reason"));
            }
            cJSON_Delete(j);
        }
        free(payload);
        p = e + 2;
    }
    cr_assert(done, "no data: [DONE]");
    cr_assert(!chat || role_seen, "no assistant role chunk");
    return text;
}

/* Runs the sequence through `run`, one request at a time (cp_engine_run,
 * not the batcher), with extra options; texts[i] gets each result's text. */
static void run_texts_with(const char *extra, char texts[][1024])
{
    char dir[512], log[600], out[600], model[512], cmd[2048];
    model_or_skip(model, sizeof model);
    test_tmpdir(dir, sizeof dir, "srv-run");
    snprintf(log, sizeof log, "%s/req.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    FILE *f = fopen(log, "w");
    for (size_t i = 0; i < N_SEQ; i++)
        fprintf(f, "{\"tenant\": \"%s\", \"%s\": %s, \"max_tokens\": 24}\n", seq[i].tenant, seq[i].completion ? "prompt" : "messages",
                seq[i].msgs);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s run --quiet-progress --model %s --requests %s --out %s %s > /dev/null 2>&1", bin(), model, log, out,
             extra);
    cr_assert_eq(system(cmd), 0);
    char *all = read_text(out, NULL);
    char *save = NULL;
    size_t i = 0;
    for (char *line = strtok_r(all, "\n", &save); line && i < N_SEQ; line = strtok_r(NULL, "\n", &save), i++) {
        cJSON *j = cJSON_Parse(line);
        cr_assert(cJSON_IsNull(at(j, "error")), "run: %s", line);
        snprintf(texts[i], 1024, "%s", str_at(j, "text"));
        cJSON_Delete(j);
    }
    cr_assert_eq(i, N_SEQ);
    free(all);
}

static void run_texts(char texts[][1024]) { run_texts_with("", texts); }

Test(server, same_greedy_text_as_run_streamed_or_not, .timeout = TEST_TIMEOUT(90))
{
    static char want[N_SEQ][1024];
    run_texts(want);
    server plain, streamed;
    start(&plain, "srv-plain", NULL);
    start(&streamed, "srv-stream", NULL);
    int nonempty = 0;
    for (size_t i = 0; i < N_SEQ; i++) {
        char body[4096];
        const char *path = seq[i].completion ? "/v1/completions" : CHAT;
        body_of(&seq[i], 0, NULL, body, sizeof body);
        http_resp r = http(plain.port, "POST", path, seq[i].key, body);
        cr_assert_eq(r.status, 200, "%s", r.body);
        cJSON *j = json_of(&r);
        cr_assert_str_eq(str_at(j, "object"), seq[i].completion ? "text_completion" : "chat.completion");
        const char *text = str_at(j, seq[i].completion ? "choices.0.text" : "choices.0.message.content");
        cr_assert(text, "%s", r.body);
        if (!seq[i].completion) cr_assert_str_eq(str_at(j, "choices.0.message.role"), "assistant");
        cr_assert_str_eq(text, want[i], "request %zu: the server says\n%s\nrun says\n%s", i, text, want[i]);
        nonempty += *text != 0;
        double pt = num_at(j, "usage.prompt_tokens"), ct = num_at(j, "usage.completion_tokens");
        cr_assert_eq(num_at(j, "usage.total_tokens"), pt + ct);
        cr_assert(ct >= 1 && ct <= 24);
        const char *fin = str_at(j, "choices.0.finish_reason");
        /* fewer tokens than asked: the model ended it (EOS) */
        cr_assert(fin && (strcmp(fin, "stop") == 0 || (ct == 24 && strcmp(fin, "length") == 0)), "%s", r.body);
        const char *id = str_at(j, "id");
        cr_assert(id && strncmp(id, seq[i].completion ? "cmpl-" : "chatcmpl-", seq[i].completion ? 5 : 9) == 0, "%s", r.body);
        /* the same request streamed on a server that saw the same requests */
        body_of(&seq[i], 1, NULL, body, sizeof body);
        http_resp sr = http(streamed.port, "POST", path, seq[i].key, body);
        cr_assert_eq(sr.status, 200, "%s", sr.body);
        char ctype[64], finish[16];
        cr_assert(header(&sr, "Content-Type", ctype, sizeof ctype) && strcmp(ctype, "text/event-stream") == 0);
        cJSON *usage;
        char *st = sse_text(sr.body, !seq[i].completion, finish, sizeof finish, &usage);
        cr_assert_str_eq(st, text, "request %zu: the stream concatenates to\n%s\nnot\n%s", i, st, text);
        cr_assert_str_eq(finish, fin);
        cr_assert(usage, "no usage chunk though include_usage was asked");
        cr_assert(cJSON_Compare(usage, at(j, "usage"), 1), "request %zu: streamed usage differs", i);
        cJSON_Delete(usage), free(st);
        cJSON_Delete(j), resp_free(&r), resp_free(&sr);
    }
    cr_assert_geq(nonempty, 3, "the model said nothing: the comparison would be empty");
    cr_assert_eq(stop(&plain), 0);
    cr_assert_eq(stop(&streamed), 0);
}

/* usage.prompt_tokens_details.cached_tokens of one request */
static int cached_of(int port, const seq_req *q, const char *extra, char *text, size_t cap)
{
    char body[4096];
    body_of(q, 0, extra, body, sizeof body);
    http_resp r = http(port, "POST", q->completion ? "/v1/completions" : CHAT, q->key, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cJSON *j = json_of(&r);
    int c = (int)num_at(j, "usage.prompt_tokens_details.cached_tokens");
    cr_assert(c >= 0 && c <= num_at(j, "usage.prompt_tokens"));
    if (text) snprintf(text, cap, "%s", str_at(j, q->completion ? "choices.0.text" : "choices.0.message.content"));
    cJSON_Delete(j), resp_free(&r);
    return c;
}

Test(server, cached_tokens_follow_the_tenant_view, .timeout = TEST_TIMEOUT(60))
{
    server def, rep;
    start(&def, "srv-view", NULL);
    const char *extra[] = { "--report-reuse", NULL };
    start(&rep, "srv-report", extra);
    /* alice stores the document; bob's first request hits it (shared) */
    for (int k = 0; k < 2; k++) {
        int port = k ? rep.port : def.port;
        cr_assert_eq(cached_of(port, &seq[0], NULL, NULL, 0), 0, "a cold pool");
        int bob_first = cached_of(port, &seq[1], NULL, NULL, 0);
        int bob_again = cached_of(port, &seq[1], NULL, NULL, 0);
        if (k == 0) {
            cr_assert_eq(bob_first, 0, "bob's cached_tokens counts alice's shared segment (%d)", bob_first);
            cr_assert_gt(bob_again, 0, "bob's own repeated prompt shows no private reuse");
        } else {
            cr_assert_gt(bob_first, 0, "--report-reuse shows no shared hit: the default-view check above proves nothing");
        }
    }
    cr_assert_eq(stop(&def), 0);
    cr_assert_eq(stop(&rep), 0);
}

/* One chat request of documents and user turns (roles[i] for texts[i]);
 * the server's own counts of what it cost: out[0..2] the computed, reused
 * and recomputed tokens /metrics gained over it; out[3] the cached_tokens
 * the tenant was told. */
static void cost_of(int port, const char *key, const char *const *roles, const char *const *texts, int n, int no_store, int out[4])
{
    static const char *const names[3] = { "cacheprune_computed_tokens_total", "cacheprune_reused_tokens_total",
                                          "cacheprune_recomputed_tokens_total" };
    double before[3];
    for (int i = 0; i < 3; i++) before[i] = metric_now(port, names[i]);
    cJSON *o = cJSON_CreateObject(), *ms = cJSON_AddArrayToObject(o, "messages");
    for (int i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", roles[i]);
        cJSON_AddStringToObject(m, "content", texts[i]);
        cJSON_AddItemToArray(ms, m);
    }
    cJSON_AddNumberToObject(o, "max_tokens", 1);
    cJSON_AddNumberToObject(o, "temperature", 0);
    if (no_store) cJSON_AddStringToObject(o, "cache", "no-store");
    char *body = cJSON_PrintUnformatted(o);
    cr_assert(body);
    http_resp r = http(port, "POST", CHAT, key, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cJSON *j = json_of(&r);
    out[3] = (int)num_at(j, "usage.prompt_tokens_details.cached_tokens");
    cJSON_Delete(j), resp_free(&r), free(body), cJSON_Delete(o);
    for (int i = 0; i < 3; i++) out[i] = (int)(metric_now(port, names[i]) - before[i]);
}

/* The chain proof as an oracle, tried through the API: alice sends
 * [P1][a short sentence no detector marks][P2][q]; bob sends [P1][guess],
 * then the whole layout with his guess, no-store.  What bob's last request
 * costs the server (and so its timing) is the same whether his guess is
 * alice's sentence or not. */
Test(server, the_chain_proof_tells_no_tenant_another_s_unstored_sentence, .timeout = TEST_TIMEOUT(90))
{
    char *p1 = test_passage(1, 500, 3, 997), *p2 = test_passage(0, 900, 3, 997);
    const char *secret = "our meeting word is purple elephant", *guesses[2] = { secret, "our meeting word is orange elephant" };
    const char *roles[4] = { "document", "user", "document", "user" };
    int cost[2][4];
    for (int g = 0; g < 2; g++) {
        server s;
        start(&s, g ? "srv-oracle-wrong" : "srv-oracle-true", NULL);
        int ignore[4];
        const char *a[4] = { p1, secret, p2, "What happened next?" }, *b[4] = { p1, guesses[g], p2, "What happened next?" };
        cost_of(s.port, KEY_A, roles, a, 4, 0, ignore);
        cost_of(s.port, KEY_B, roles, b, 2, 0, ignore);
        cost_of(s.port, KEY_B, roles, b, 4, 1, cost[g]);
        cr_assert_gt(cost[g][1], 150, "bob reused %d tokens: P2 was not hit, nothing to test", cost[g][1]);
        cr_assert_eq(stop(&s), 0);
    }
    cr_assert(memcmp(cost[0], cost[1], sizeof cost[0]) == 0, "the true guess costs computed %d reused %d recomputed %d, a wrong one %d %d %d",
              cost[0][0], cost[0][1], cost[0][2], cost[1][0], cost[1][1], cost[1][2]);
    free(p1), free(p2);
}

/* --admit-k 2: bob sends a document X, then X after one of his own (X at
 * another place).  Whether alice had sent X first, so that bob's copy
 * admitted it as shared, shows neither in bob's cached_tokens nor in what
 * his second request costs. */
Test(server, admission_never_shows_in_the_producers_own_view, .timeout = TEST_TIMEOUT(90))
{
    char *x = test_passage(1, 900, 3, 997), *y = test_passage(0, 500, 3, 997);
    const char *roles[3] = { "document", "document", "user" };
    const char *first[2] = { x, "A first question." }, *second[3] = { y, x, "A second question." };
    int seen[2][4];
    for (int way = 0; way < 2; way++) { /* 0: bob alone; 1: alice sent X first */
        server s;
        const char *extra[] = { "--admit-k", "2", NULL };
        start(&s, way ? "srv-admit-after" : "srv-admit-alone", extra);
        int ignore[4];
        if (way) cost_of(s.port, KEY_A, roles + 1, first, 2, 0, ignore);
        cost_of(s.port, KEY_B, roles + 1, first, 2, 0, ignore);
        cost_of(s.port, KEY_B, roles, second, 3, 0, seen[way]);
        cr_assert_gt(seen[way][1] + seen[way][2], 100, "bob hit %d tokens: X was not hit at its new place, nothing to test",
                     seen[way][1] + seen[way][2]);
        cr_assert_eq(stop(&s), 0);
    }
    cr_assert(memcmp(seen[0], seen[1], sizeof seen[0]) == 0,
              "bob alone: cached_tokens %d (computed %d reused %d recomputed %d); after alice sent X: %d (%d %d %d)", seen[0][3], seen[0][0],
              seen[0][1], seen[0][2], seen[1][3], seen[1][0], seen[1][1], seen[1][2]);
    free(x), free(y);
}

/* the answer to prompt with extra fields: its text and finish_reason */
static char *answer(int port, const char *fields, int stream, char *finish, size_t fcap, int *tokens)
{
    char body[2048];
    snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"temperature\": 0%s%s}", fields,
             stream ? ", \"stream\": true, \"stream_options\": {\"include_usage\": true}" : "");
    http_resp r = http(port, "POST", "/v1/completions", KEY_A, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    char *text;
    cJSON *j = NULL, *usage = NULL;
    if (stream) {
        text = sse_text(r.body, 0, finish, fcap, &usage);
        j = usage;
        *tokens = (int)num_at(usage, "completion_tokens");
    } else {
        j = json_of(&r);
        text = strdup(str_at(j, "choices.0.text"));
        snprintf(finish, fcap, "%s", str_at(j, "choices.0.finish_reason"));
        *tokens = (int)num_at(j, "usage.completion_tokens");
    }
    cJSON_Delete(j), resp_free(&r);
    return text;
}

Test(server, stop_strings_and_the_token_cap, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--sharing", "none", "--max-tokens-cap", "24", NULL };
    start(&s, "srv-stopcap", extra);
    char finish[16];
    int n;
    char *full = answer(s.port, ", \"max_tokens\": 100000", 0, finish, sizeof finish, &n);
    cr_assert_leq(n, 24, "max_tokens was not capped");
    cr_assert(n == 24 || strcmp(finish, "stop") == 0);
    size_t L = strlen(full);
    cr_assert_geq(L, 8, "too little text to cut: '%s'", full);
    /* a stop string from the middle of the answer: the answer ends before
     * its first occurrence, streamed or not */
    char stop_s[8], fields[128], want[1024];
    snprintf(stop_s, sizeof stop_s, "%.3s", full + L / 2);
    cr_assert_null(strpbrk(stop_s, "\"\\\n"), "pick another prompt: the stop needs escaping");
    snprintf(want, sizeof want, "%.*s", (int)(strstr(full, stop_s) - full), full);
    snprintf(fields, sizeof fields, ", \"max_tokens\": 24, \"stop\": [\"zzzz\", \"%s\"]", stop_s);
    for (int stream = 0; stream < 2; stream++) {
        char *t = answer(s.port, fields, stream, finish, sizeof finish, &n);
        cr_assert_str_eq(t, want, "stream %d: '%s', want '%s' (stop '%s')", stream, t, want, stop_s);
        cr_assert_str_eq(finish, "stop");
        cr_assert_lt(n, 24, "generation went on after the stop");
        free(t);
    }
    free(full);
    cr_assert_eq(stop(&s), 0);
}

Test(server, client_identity_fields_change_nothing, .timeout = TEST_TIMEOUT(60))
{
    server a, b;
    start(&a, "srv-ida", NULL);
    start(&b, "srv-idb", NULL);
    /* b's requests all claim alice's identity and a salt; only keys count */
    const char *claims = "\"user\": \"alice\", \"tenant\": \"alice\", \"cache_salt\": \"alice-salt\", ";
    for (size_t i = 0; i < N_SEQ; i++) {
        char ta[1024], tb[1024];
        int ca = cached_of(a.port, &seq[i], NULL, ta, sizeof ta), cb = cached_of(b.port, &seq[i], claims, tb, sizeof tb);
        cr_assert_eq(ca, cb, "request %zu: cached_tokens %d vs %d", i, ca, cb);
        cr_assert_str_eq(ta, tb, "request %zu", i);
    }
    cr_assert_eq(stop(&a), 0);
    cr_assert_eq(stop(&b), 0);
}

Test(server, full_queue_is_429_with_retry_after, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--max-queue", "1", "--per-tenant-queue", "0", NULL }; /* the queue's own bound, not one tenant's */
    start(&s, "srv-queue", extra);
    enum { N = 16 };
    int fds[N];
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], \"max_tokens\": 48, \"temperature\": 0}";
    /* all at once: one runs, one waits, the rest find the queue full */
    for (int i = 0; i < N; i++) {
        fds[i] = connect_to(s.port);
        cr_assert_geq(fds[i], 0);
    }
    for (int i = 0; i < N; i++) send_request(fds[i], "POST", CHAT, KEY_A, body, strlen(body));
    int ok = 0, full = 0;
    for (int i = 0; i < N; i++) {
        http_resp r = { 0 };
        read_response(fds[i], &r);
        cr_assert(r.status == 200 || r.status == 429, "status %d: %s", r.status, r.body);
        if (r.status == 429) {
            char ra[16];
            cr_assert(header(&r, "Retry-After", ra, sizeof ra) && atoi(ra) >= 1);
            cJSON *j = json_of(&r);
            cr_assert_str_eq(str_at(j, "error.type"), "rate_limit_error");
            cr_assert_str_eq(str_at(j, "error.code"), "queue_full");
            cJSON_Delete(j);
        }
        ok += r.status == 200, full += r.status == 429;
        resp_free(&r);
    }
    cr_assert_geq(ok, 1);
    cr_assert_geq(full, 1, "16 simultaneous requests never filled a queue of 1");
    http_resp m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    char line[96];
    snprintf(line, sizeof line, "cacheprune_requests_total{outcome=\"queue_full\"} %d\n", full);
    cr_assert(strstr(m.body, line), "metrics lack '%s'", line);
    resp_free(&m);
    cr_assert_eq(stop(&s), 0);
}

/* polls /metrics until the queue holds `depth` requests; 0 on timeout */
static int wait_queue_depth(int port, int depth)
{
    char want[64];
    snprintf(want, sizeof want, "cacheprune_queue_depth %d\n", depth);
    for (int i = 0; i < 500; i++) {
        http_resp m = http(port, "GET", "/metrics", KEY_OP, NULL);
        int hit = m.body && strstr(m.body, want) != NULL;
        resp_free(&m);
        if (hit) return 1;
        usleep(5000);
    }
    return 0;
}

Test(server, queue_is_fifo_whatever_hits, .timeout = TEST_TIMEOUT(60))
{
    server s;
    /* one in flight: the others, all one tenant's, queue behind it (no per-tenant cap) */
    const char *extra[] = { "--concurrency", "1", "--max-tokens-cap", "1000", "--max-queue", "8", "--per-tenant-queue", "0", NULL };
    start(&s, "srv-fifo", extra);
    const char *hot = "{\"prompt\": \"The king said to his daughter that the ship would sail in the morning\", \"max_tokens\": 40, "
                      "\"temperature\": 0}";
    http_resp r = http(s.port, "POST", "/v1/completions", KEY_A, hot); /* now in the pool */
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    /* a long stream holds the engine while four requests queue behind it */
    const char *hold = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1000, \"temperature\": 0, \"stream\": true}";
    int h = connect_to(s.port);
    send_request(h, "POST", "/v1/completions", KEY_A, hold, strlen(hold));
    struct pollfd hp = { h, POLLIN, 0 };
    cr_assert_gt(poll(&hp, 1, 20000), 0);
    const char *cold[2] = { "{\"prompt\": \"In the morning the ship\", \"max_tokens\": 40, \"temperature\": 0}",
                            "{\"prompt\": \"She opened the door and\", \"max_tokens\": 40, \"temperature\": 0}" };
    /* cold, hit, cold, hit: a scheduler that served hits first would
     * answer 1 and 3 before 0 and 2 */
    const char *order[4] = { cold[0], hot, cold[1], hot };
    struct pollfd fds[4];
    for (int k = 0; k < 4; k++) {
        fds[k] = (struct pollfd){ connect_to(s.port), POLLIN, 0 };
        send_request(fds[k].fd, "POST", "/v1/completions", KEY_A, order[k], strlen(order[k]));
        cr_assert(wait_queue_depth(s.port, k + 1), "request %d never queued (the holding stream ended too soon?)", k);
    }
    /* the holding client goes away: its generation stops, the queue moves */
    close(h);
    int done_order[4], n_done = 0;
    while (n_done < 4) {
        cr_assert_gt(poll(fds, 4, 20000), 0, "no answer within 20 s");
        for (int k = 0; k < 4; k++)
            if (fds[k].fd >= 0 && fds[k].revents) {
                http_resp q = { 0 };
                read_response(fds[k].fd, &q);
                cr_assert_eq(q.status, 200, "%s", q.body);
                resp_free(&q);
                fds[k].fd = -1;
                done_order[n_done++] = k;
            }
    }
    for (int k = 0; k < 4; k++) cr_assert_eq(done_order[k], k, "answer %d was request %d: not the order they came in", k, done_order[k]);
    http_resp m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    const char *key = "\ncacheprune_generated_tokens_total ", *g = strstr(m.body, key);
    cr_assert(g, "%s", m.body);
    long generated = atol(g + strlen(key));
    cr_assert(generated > 5 && generated < 1000, "%ld tokens: the abandoned stream was generated to its end", generated);
    resp_free(&m);
    cr_assert_eq(stop(&s), 0);
}

/* 180 s: the synth 0.5B model decodes its 100 tokens at a few per second
 * under ASan on a loaded machine (it timed out at 60 s, load 25); nothing
 * here asserts on time */
Test(server, sigterm_finishes_requests_in_flight, .timeout = TEST_TIMEOUT(180))
{
    server s;
    /* serve's drain (60 s by default) scaled as the test's own limit: the
     * slow model's 100 tokens outlast it under a sanitizer */
    char drain[16];
    snprintf(drain, sizeof drain, "%d", TEST_TIMEOUT(60));
    const char *extra[] = { "--max-tokens-cap", "1000", "--drain-seconds", drain, NULL };
    /* the stream must still be generating while the test tries to connect */
    char abs[PATH_MAX];
    start_slow(&s, "srv-term", extra, abs);
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], \"max_tokens\": 100, \"temperature\": 0, "
                       "\"stream\": true, \"stream_options\": {\"include_usage\": true}}";
    int fd = connect_to(s.port);
    send_request(fd, "POST", CHAT, KEY_A, body, strlen(body));
    /* the stream has started (its first byte is here): then the signal */
    struct pollfd pf = { fd, POLLIN, 0 };
    cr_assert_gt(poll(&pf, 1, 20000), 0);
    kill(s.pid, SIGTERM);
    /* no new connection while the stream is still being generated */
    int refused = 0;
    for (int i = 0; i < 100 && !refused; i++) {
        int c = connect_to(s.port);
        refused = c < 0;
        if (c >= 0) close(c), usleep(5000);
    }
    cr_assert(refused, "new connections still accepted after SIGTERM");
    http_resp r = { 0 };
    read_response(fd, &r);
    cr_assert_eq(r.status, 200);
    char finish[16];
    cJSON *usage;
    char *t = sse_text(r.body, 1, finish, sizeof finish, &usage);
    cr_assert(finish[0], "the stream was cut before its last chunk");
    cr_assert(usage && num_at(usage, "completion_tokens") >= 100, "the request in flight was not finished");
    cJSON_Delete(usage), free(t), resp_free(&r);
    int st = 0;
    for (int i = 0; i < 2000 && waitpid(s.pid, &st, WNOHANG) != s.pid; i++) usleep(10000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "serve did not exit 0 after SIGTERM");
    s.pid = 0;
    close(s.out_fd);
    cr_assert_lt(connect_to(s.port), 0, "still accepting after SIGTERM");
    slow_model_remove(abs);
}

/* the first line of serve's stderr after its compute line, and how many
 * lines follow that */
static int lines_in(const char *path, char *first, size_t cap)
{
    char *t = read_text(path, NULL);
    cr_assert(t);
    /* the compute path, serve's first line once the model is loaded, is
     * no part of the error */
    char *e = strncmp(t, "compute: ", 9) == 0 && strchr(t, '\n') ? strchr(t, '\n') + 1 : t;
    int n = 0;
    for (char *p = e; *p; p++) n += *p == '\n';
    snprintf(first, cap, "%.*s", (int)strcspn(e, "\n"), e);
    free(t);
    return n;
}

Test(server, startup_errors_are_one_line_and_nonzero, .timeout = TEST_TIMEOUT(60))
{
    server s;
    char first[512];
    /* a port already taken */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(0x7f000001) };
    socklen_t al = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, 1), 0);
    getsockname(fd, (struct sockaddr *)&a, &al);
    char port[16];
    snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
    const char *taken[] = { "--port", port, NULL };
    cr_assert_gt(spawn_server(&s, "srv-err-port", taken, 0), 0);
    cr_assert_eq(lines_in(s.errlog, first, sizeof first), 1, "%s", first);
    cr_assert(strstr(first, "cannot listen on 127.0.0.1:") && strstr(first, "in use"), "%s", first);
    char *all = read_text(s.errlog, NULL); /* the model was loaded: its compute path came first */
    cr_assert(all && strncmp(all, "compute: ", 9) == 0 && strstr(all, " weights -> "), "%s", all ? all : "(no stderr)");
    free(all);
    close(fd);
    /* a bad keys file: its line, not its key */
    test_tmpdir(s.dir, sizeof s.dir, "srv-err-keys");
    snprintf(s.keys, sizeof s.keys, "%s/keys", s.dir);
    const char *bad = KEY_A " alice\n" KEY_B " bob admin\n";
    cr_assert(write_bytes(s.keys, bad, strlen(bad)));
    chmod(s.keys, 0600);
    cr_assert_gt(spawn_server(&s, "srv-err-keys", NULL, 1), 0);
    cr_assert_eq(lines_in(s.errlog, first, sizeof first), 1, "%s", first);
    cr_assert(strstr(first, "keys:2"), "%s", first);
    cr_assert_null(strstr(first, KEY_B), "the key is in the message");
    /* no keys file, a model that is not there */
    cr_assert_gt(spawn_server(&s, "srv-err-nokeys", NULL, 1), 0);
    cr_assert_eq(lines_in(s.errlog, first, sizeof first), 1, "%s", first);
    const char *nomodel[] = { "--model", "/nonexistent/model", NULL };
    cr_assert_gt(spawn_server(&s, "srv-err-model", nomodel, 0), 0);
    cr_assert_eq(lines_in(s.errlog, first, sizeof first), 1, "%s", first);
    cr_assert(strstr(first, "/nonexistent/model"), "%s", first);
    /* a step that could not carry one token for each request in flight */
    const char *tight[] = { "--concurrency", "32", NULL };
    cr_assert_gt(spawn_server(&s, "srv-err-step", tight, 0), 0);
    cr_assert_eq(lines_in(s.errlog, first, sizeof first), 1, "%s", first);
    cr_assert(strstr(first, "--step-tokens 32 must exceed --concurrency 32"), "%s", first);
}

/* ---- tenant controls: erasure, no-store, cancellation ------------------------------------ */

#define PURGE "/v1/cacheprune/purge"

/* one operator metric, read now */
static double metric_now(int port, const char *name)
{
    http_resp m = http(port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(m.status, 200);
    double v = metric(m.body, name);
    resp_free(&m);
    return v;
}

/* a metric's value once it reaches want, read every 100 ms, at most `tries` reads after the first (then the last read) */
static double metric_reaching(int port, const char *name, double want, int tries)
{
    double v = metric_now(port, name);
    for (int i = 0; i < tries && v < want; i++) usleep(100000), v = metric_now(port, name);
    return v;
}

/* a purge's answer: 200 and its segment count (admission records into *adm) */
static int purge_as(int port, const char *key, const char *body, int *adm)
{
    http_resp r = http(port, "POST", PURGE, key, body);
    cr_assert_eq(r.status, 200, "%d %s", r.status, r.body);
    cJSON *j = json_of(&r);
    cr_assert_str_eq(str_at(j, "object"), "cacheprune.purge");
    int n = (int)num_at(j, "segments");
    if (adm) *adm = (int)num_at(j, "admission_records");
    cJSON_Delete(j), resp_free(&r);
    return n;
}

Test(server, purge_erases_the_tenants_own_private_segments_only, .timeout = TEST_TIMEOUT(60))
{
    server s;
    start(&s, "srv-purge", NULL);
    /* alice and bob each store the document and their own question */
    cr_assert_eq(cached_of(s.port, &seq[0], NULL, NULL, 0), 0);
    cr_assert_gt(cached_of(s.port, &seq[0], NULL, NULL, 0), 0, "alice's repeat shows no private reuse: the test proves nothing");
    cr_assert_eq(cached_of(s.port, &seq[1], NULL, NULL, 0), 0);
    cr_assert_gt(cached_of(s.port, &seq[1], NULL, NULL, 0), 0);
    double segs0 = metric_now(s.port, "cacheprune_pool_segments");
    /* a tenant cannot name another, nor name nonsense */
    expect_error(s.port, "POST", PURGE, KEY_B, "{\"tenant\": \"alice\"}", 403, "permission_error", "tenant", "forbidden", "operator");
    expect_error(s.port, "POST", PURGE, KEY_B, "{\"tenant\": \"nobody\"}", 403, "permission_error", "tenant", "forbidden", "operator");
    expect_error(s.port, "POST", PURGE, KEY_OP, "{\"tenant\": 7}", 400, "invalid_request_error", "tenant", NULL, "tenant id");
    expect_error(s.port, "POST", PURGE, KEY_OP, "{\"tenant\": \"\"}", 400, "invalid_request_error", "tenant", NULL, "tenant id");
    expect_error(s.port, "GET", PURGE, KEY_A, NULL, 405, "invalid_request_error", NULL, "method_not_allowed", "POST");
    /* a misspelt field is refused, not read as no field (the caller's own tenant) */
    expect_error(s.port, "POST", PURGE, KEY_OP, "{\"Tenant\": \"bob\"}", 400, "invalid_request_error", NULL, "unknown_field", "'tenant'");
    expect_error(s.port, "POST", PURGE, KEY_A, "{\"tenant\": \"alice\", \"all\": true}", 400, "invalid_request_error", NULL, "unknown_field",
                 "'tenant'");
    /* a repeated field: readers keeping the first and the last would purge different tenants */
    expect_error(s.port, "POST", PURGE, KEY_OP, "{\"tenant\": \"alice\", \"tenant\": \"bob\"}", 400, "invalid_request_error", NULL,
                 "unknown_field", "twice");
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_segments"), segs0, "a refused purge removed something");
    /* alice erases hers */
    int n = purge_as(s.port, KEY_A, NULL, NULL);
    cr_assert_gt(n, 0, "alice stored private segments; the purge found none");
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_segments"), segs0 - n, "the pool lost other than the count said");
    cr_assert_eq(cached_of(s.port, &seq[0], NULL, NULL, 0), 0, "alice's next identical request still hit her purged KV");
    cr_assert_gt(cached_of(s.port, &seq[1], NULL, NULL, 0), 0, "alice's purge took bob's segments");
    /* bob may name himself; the operator names anyone */
    cr_assert_gt(purge_as(s.port, KEY_B, "{\"tenant\": \"bob\"}", NULL), 0);
    cr_assert_eq(purge_as(s.port, KEY_B, "{}", NULL), 0, "a second purge found more");
    cr_assert_gt(cached_of(s.port, &seq[0], NULL, NULL, 0), 0); /* alice stores again */
    cr_assert_gt(purge_as(s.port, KEY_OP, "{\"tenant\": \"alice\"}", NULL), 0, "the operator's purge of alice found nothing");
    cr_assert_eq(cached_of(s.port, &seq[0], NULL, NULL, 0), 0, "the operator's purge left alice's KV");
    cr_assert_eq(purge_as(s.port, KEY_OP, "{\"tenant\": \"nobody\"}", NULL), 0);
    cr_assert_eq(metric_now(s.port, "cacheprune_purges_total"), 4); /* the unknown tenant needs no engine */
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_pinned_blocks"), 0);
    cr_assert_eq(stop(&s), 0);
}

Test(server, purge_drops_the_tenants_admission_records, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--admit-k", "2", "--report-reuse", NULL };
    start(&s, "srv-purge-admit", extra);
    cr_assert_eq(cached_of(s.port, &seq[0], NULL, NULL, 0), 0); /* alice produced the document: 1 of 2 */
    int adm = -1;
    purge_as(s.port, KEY_A, NULL, &adm);
    cr_assert_gt(adm, 0, "alice counted toward no admission");
    purge_as(s.port, KEY_A, NULL, &adm);
    cr_assert_eq(adm, 0, "the records were not dropped");
    /* bob is now the first producer, not the second: the document stays
     * unshared, so ops (a third tenant) gets no shared hit from it */
    cr_assert_eq(cached_of(s.port, &seq[1], NULL, NULL, 0), 0);
    seq_req third = seq[1];
    third.key = KEY_OP;
    cr_assert_eq(cached_of(s.port, &third, NULL, NULL, 0), 0, "alice's purged admission still counted: the document was shared");
    cr_assert_eq(stop(&s), 0);
}

Test(server, no_store_leaves_the_pool_as_it_was, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--admit-k", "2", NULL };
    start(&s, "srv-nostore", extra);
    const char *ns = "\"cache\": \"no-store\", ";
    cr_assert_eq(cached_of(s.port, &seq[2], NULL, NULL, 0), 0); /* something in the pool already */
    double segs = metric_now(s.port, "cacheprune_pool_segments"), bytes = metric_now(s.port, "cacheprune_pool_bytes");
    cr_assert_gt(segs, 0);
    cr_assert_eq(cached_of(s.port, &seq[0], ns, NULL, 0), 0);
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_segments"), segs, "a no-store request inserted a segment");
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_bytes"), bytes);
    cr_assert_eq(metric_now(s.port, "cacheprune_no_store_requests_total"), 1);
    int adm = -1;
    purge_as(s.port, KEY_A, NULL, &adm);
    cr_assert_eq(adm, 0, "a no-store request counted toward an admission");
    cr_assert_eq(cached_of(s.port, &seq[0], NULL, NULL, 0), 0, "a later identical request hit what no-store kept out");
    /* it may still read */
    cr_assert_gt(cached_of(s.port, &seq[0], ns, NULL, 0), 0, "a no-store request did not read the tenant's own KV");
    expect_error(s.port, "POST", CHAT, KEY_A,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"cache\": \"nostore\"}", 400, "invalid_request_error", "cache", NULL, "no-store");
    cr_assert_eq(stop(&s), 0);
}

Test(server, a_client_that_leaves_cancels_its_request_queued_or_streaming, .timeout = TEST_TIMEOUT(60))
{
    server s;
    /* one in flight: the others queue behind it */
    const char *extra[] = { "--concurrency", "1", "--max-tokens-cap", "1000", "--max-queue", "8", NULL };
    start(&s, "srv-cancel", extra);
    /* a long stream holds the engine; bob's request waits behind it */
    const char *hold = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1000, \"temperature\": 0, \"stream\": true}";
    int h = connect_to(s.port);
    send_request(h, "POST", "/v1/completions", KEY_A, hold, strlen(hold));
    struct pollfd hp = { h, POLLIN, 0 };
    cr_assert_gt(poll(&hp, 1, 20000), 0);
    char body[4096];
    body_of(&seq[1], 0, NULL, body, sizeof body);
    int q = connect_to(s.port);
    send_request(q, "POST", CHAT, KEY_B, body, strlen(body));
    cr_assert(wait_queue_depth(s.port, 1), "bob's request never queued");
    close(q); /* bob leaves while queued */
    http_resp m = { 0 };
    int seen = 0;
    for (int i = 0; i < 1000 && !seen; i++) {
        m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
        seen = strstr(m.body, "cacheprune_cancelled_total{when=\"queued\"} 1\n") != NULL;
        if (!seen && i < 999) resp_free(&m), usleep(10000);
    }
    cr_assert(seen, "bob's leaving was not noticed while he was queued: %s", m.body);
    resp_free(&m);
    close(h); /* alice leaves mid-stream */
    for (int i = 0, done = 0; i < 1000 && !done; i++) {
        m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
        done = strstr(m.body, "cacheprune_cancelled_total{when=\"running\"} 1\n") != NULL;
        if (!done && i < 999) resp_free(&m), usleep(10000);
        seen = done;
    }
    cr_assert(seen, "alice's leaving mid-stream was not counted: %s", m.body);
    cr_assert(strstr(m.body, "cacheprune_cancelled_total{when=\"queued\"} 1\n"), "bob's job ran after all");
    long generated = (long)metric(m.body, "cacheprune_generated_tokens_total");
    cr_assert(generated > 0 && generated < 1000, "%ld tokens: the abandoned stream ran to its end", generated);
    cr_assert_eq(metric(m.body, "cacheprune_pool_pinned_blocks"), 0, "a cancelled request kept its pins");
    cr_assert_eq(metric(m.body, "cacheprune_prompt_tokens_total") > 0, 1);
    resp_free(&m);
    /* bob's request never ran: nothing of it was stored, and the server still serves */
    cr_assert_eq(cached_of(s.port, &seq[1], NULL, NULL, 0), 0, "the cancelled queued request was run and stored");
    cr_assert_gt(cached_of(s.port, &seq[1], NULL, NULL, 0), 0);
    /* FIFO: bob's dropped job was behind alice's and before these, so by now it
     * would have run, and been counted as cancelled while running */
    m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert(strstr(m.body, "cacheprune_cancelled_total{when=\"running\"} 1\n"), "the request cancelled while queued ran: %s", m.body);
    resp_free(&m);
    cr_assert_eq(stop(&s), 0);
}

/* A stream of 1000 tokens that holds a place in flight: its request sent (its first bytes are the caller's to wait for). */
static int hold_stream(int port, const char *key)
{
    const char *hold = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1000, \"temperature\": 0, \"stream\": true}";
    int h = connect_to(port);
    cr_assert_geq(h, 0);
    send_request(h, "POST", "/v1/completions", key, hold, strlen(hold));
    return h;
}

Test(server, a_flooding_tenant_gets_429_while_others_are_served, .timeout = TEST_TIMEOUT(60))
{
    server s;
    /* one in flight: bob queues behind alice; the per-tenant cap at its
     * default, a quarter of --max-queue + --concurrency: 1 here */
    const char *extra[] = { "--concurrency", "1", "--max-tokens-cap", "1000", "--max-queue", "4", NULL };
    start(&s, "srv-fair", extra);
    int h = hold_stream(s.port, KEY_A);
    struct pollfd hp = { h, POLLIN, 0 };
    cr_assert_gt(poll(&hp, 1, 20000), 0);
    /* alice has her one request in flight: her next is refused at once */
    expect_error(s.port, "POST", CHAT, KEY_A, USER_MSG("Once upon a time"), 429, "rate_limit_error", NULL, "tenant_queue_full",
                 "per-tenant-queue");
    /* bob still gets a place in the queue, and his answer once alice's stream goes */
    char body[4096];
    body_of(&seq[1], 0, NULL, body, sizeof body);
    int q = connect_to(s.port);
    send_request(q, "POST", CHAT, KEY_B, body, strlen(body));
    cr_assert(wait_queue_depth(s.port, 1), "bob was not queued behind alice");
    close(h);
    http_resp r = { 0 };
    read_response(q, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    resp_free(&r);
    close(q);
    /* alice's slot came back when her request ended */
    r = http(s.port, "POST", CHAT, KEY_A, USER_MSG("Once upon a time"));
    cr_assert_eq(r.status, 200, "%s", r.body);
    resp_free(&r);
    cr_assert_eq(metric_now(s.port, "cacheprune_tenant_queue_refusals_total"), 1);
    cr_assert_eq(stop(&s), 0);
}

/* Requests sent and abandoned (the client closes before its turn) are
 * dropped by the queue unstarted: none costs the engine its rendering,
 * tokenizing and detection, while another tenant's stream runs -- also when
 * the client sent a byte more after its request and then closed (a peek at
 * the socket saw that byte and took the client for still there).  Before,
 * the engine took each before the connection's thread saw the close (its
 * look is every 50 ms), and a tenant sending them one after another held
 * the engine thread in admission: another tenant's 64 tokens took 5 s
 * instead of 0.06. */
Test(server, requests_abandoned_before_their_turn_never_reach_the_engine, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--max-tokens-cap", "1000", "--concurrency", "2", NULL }; /* bob's stream and one more */
    start(&s, "srv-abandoned", extra);
    int h = hold_stream(s.port, KEY_B);
    struct pollfd hp = { h, POLLIN, 0 };
    cr_assert_gt(poll(&hp, 1, 20000), 0);
    enum { n = 16 };
    int fds[n];
    for (int i = 0; i < n; i++) {
        fds[i] = connect_to(s.port);
        cr_assert_geq(fds[i], 0);
        const char *body = USER_MSG("Once upon a time");
        send_request(fds[i], "POST", CHAT, KEY_A, body, strlen(body));
        if (i % 2 == 0) close(fds[i]);
    }
    /* the other half send one more byte once their requests are read, then
     * close: the close is behind it */
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    for (int i = 1; i < n; i += 2) {
        cr_assert_eq(send(fds[i], "\r\n", 2, MSG_NOSIGNAL), 2);
        close(fds[i]);
    }
    const double cancelled = metric_reaching(s.port, "cacheprune_cancelled_total{when=\"queued\"}", n - 2, 500);
    const double started = metric_now(s.port, "cacheprune_engine_jobs_total{result=\"started\"}");
    cr_assert_leq(started, 1 + 2, "%g of %d abandoned requests reached the engine (%g dropped queued)", started - 1, n, cancelled);
    cr_assert_geq(cancelled, n - 2);
    close(h);
    http_resp r = http(s.port, "POST", CHAT, KEY_A, USER_MSG("Once upon a time"));
    cr_assert_eq(r.status, 200, "%s", r.body);
    resp_free(&r);
    cr_assert_eq(stop(&s), 0);
}

/* A tenant holding every place in flight but one waits for one of its own
 * to end before it takes the last: its second stream stays queued with one
 * of --concurrency 2 free, and another tenant's request starts there at
 * once and is answered while the first tenant's streams go on.  Before,
 * one tenant's long generations could fill every place and hold the
 * others' requests for as long as they ran. */
Test(server, the_last_place_in_flight_waits_for_a_tenant_with_none, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--concurrency", "2", "--step-tokens", "32", "--max-tokens-cap", "1000", NULL };
    start(&s, "srv-last-place", extra);
    int h1 = hold_stream(s.port, KEY_A);
    struct pollfd hp = { h1, POLLIN, 0 };
    cr_assert_gt(poll(&hp, 1, 20000), 0);
    int h2 = hold_stream(s.port, KEY_A);
    cr_assert(wait_queue_depth(s.port, 1), "alice's second stream was not held in the queue");
    cr_assert_eq(metric_now(s.port, "cacheprune_running_requests"), 1, "alice took the last place in flight");
    http_resp r = http(s.port, "POST", CHAT, KEY_B, USER_MSG("Once upon a time"));
    cr_assert_eq(r.status, 200, "%s", r.body);
    resp_free(&r);
    close(h1), close(h2);
    cr_assert_eq(stop(&s), 0);
}

/* One tenant's admitted prompts do not all prefill before another's: bob's
 * short prompt, sent while alice's four long ones are in flight, starts
 * once the prompt prefilling ends, and is answered before alice's third
 * and fourth (max_tokens 1: each is answered at its prefill's end).
 * Before, prompts started strictly oldest first, and bob's first token
 * waited for every prompt alice had in flight (~140 ms each at ~990
 * tokens: seconds). */
Test(server, another_tenants_prompt_starts_before_a_tenants_backlog, .timeout = TEST_TIMEOUT(90))
{
    server s;
    /* long prompts prefill over many steps: ~115 of 6 tokens each, so the
     * four stay in flight together for a while even where a step is fast
     * (with 16-token steps on AVX512_BF16 the first was answered before
     * the fourth was prepared, and the test saw at most three at once) */
    const char *extra[] = { "--concurrency", "5", "--step-tokens", "6", "--prefill-tokens", "6", NULL };
    start(&s, "srv-prefill-order", extra);
    char longp[4096], body[4300];
    longp[0] = 0;
    for (int i = 0; i < 60; i++) strcat(longp, i % 2 ? "the tide came in over the stones. " : "Once upon a time a fisher lived by the sea, ");
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 1, \"temperature\": 0, \"store\": false}", longp);
    int a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = connect_to(s.port);
        cr_assert_geq(a[i], 0);
        send_request(a[i], "POST", "/v1/completions", KEY_A, body, strlen(body));
    }
    cr_assert_eq(metric_reaching(s.port, "cacheprune_running_requests", 4, 100), 4, "alice's four were not all admitted");
    http_resp r = http(s.port, "POST", "/v1/completions", KEY_B, "{\"prompt\": \"Once\", \"max_tokens\": 1, \"temperature\": 0}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    resp_free(&r);
    int answered = 0;
    for (int i = 0; i < 4; i++) {
        struct pollfd p = { a[i], POLLIN, 0 };
        answered += poll(&p, 1, 0) > 0;
    }
    cr_assert_leq(answered, 2, "%d of alice's four prompts were answered before bob's (queued behind them all)", answered);
    for (int i = 0; i < 4; i++) {
        http_resp ra;
        read_response(a[i], &ra);
        cr_assert_eq(ra.status, 200);
        resp_free(&ra);
        close(a[i]);
    }
    cr_assert_eq(stop(&s), 0);
}

Test(server, tenant_insert_quota_is_a_server_option, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--tenant-quota-segments", "1", NULL };
    start(&s, "srv-quota", extra);
    cr_assert_eq(cached_of(s.port, &seq[0], NULL, NULL, 0), 0); /* stores more than one segment without a quota */
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_segments"), 1, "the quota of one segment let more in");
    cr_assert_geq(metric_now(s.port, "cacheprune_pool_quota_refusals_total"), 1);
    cr_assert_eq(stop(&s), 0);
}

Test(server, a_client_that_leaves_a_whole_answer_stops_its_generation, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--max-tokens-cap", "1000", NULL };
    start(&s, "srv-cancel-whole", extra);
    /* not streamed: nothing is written until the end, so only watching the
     * socket can tell the client left */
    const char *longreq = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1000, \"temperature\": 0}";
    int h = connect_to(s.port);
    send_request(h, "POST", "/v1/completions", KEY_A, longreq, strlen(longreq));
    usleep(100000);
    close(h);
    http_resp m = { 0 };
    int seen = 0;
    for (int i = 0; i < 1000 && !seen; i++) {
        m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
        seen = strstr(m.body, "cacheprune_cancelled_total{when=\"running\"} 1\n") != NULL;
        if (!seen && i < 999) resp_free(&m), usleep(10000);
    }
    cr_assert(seen, "the whole answer's client leaving was not counted: %s", m.body);
    long generated = (long)metric(m.body, "cacheprune_generated_tokens_total");
    cr_assert(generated < 1000, "%ld tokens: the abandoned request ran to its end", generated);
    cr_assert_eq(metric(m.body, "cacheprune_pool_pinned_blocks"), 0);
    resp_free(&m);
    cr_assert_eq(stop(&s), 0);
}

/* ---- load: 200 requests from 4 tenants over 32 connections ---------------------------- */

/* stories260K (a 260K-parameter model: a request takes milliseconds) so
 * that the load is many requests at once, not a long wait */
#define LOAD_MODEL "models/stories260K-hf"
#define LOAD_DOC "\"Once upon a time there was a little girl named Lily who lived in a small house near the big green park with her mom and dad.\""
enum { LOAD_N = 200, LOAD_CONNS = 32, LOAD_FLOOD_CONNS = 20, LOAD_CAP = 6, LOAD_TOKENS = 16, LOAD_LEAVE_TOKENS = 300 };
static const seq_req load_prompts[] = {
    { NULL, NULL, 0, "[{\"role\": \"document\", \"content\": " LOAD_DOC "}, {\"role\": \"user\", \"content\": \"What did Lily do in the park?\"}]" },
    { NULL, NULL, 0, "[{\"role\": \"document\", \"content\": " LOAD_DOC "}, {\"role\": \"user\", \"content\": \"Who was with Lily?\"}]" },
    { NULL, NULL, 0, "[{\"role\": \"user\", \"content\": \"Tell me a story about a dog and a ball.\"}]" },
    { NULL, NULL, 1, "\"Once upon a time, there was a big red car that liked to go fast on the road\"" },
    { NULL, NULL, 1, "\"Tom and his sister went to the beach. They built a sand castle and\"" },
    { NULL, NULL, 1, "\"The little bird sat on the tree and sang a happy song to the sun\"" },
};
#define LOAD_PROMPTS ((int)(sizeof load_prompts / sizeof *load_prompts))
static double srv_test_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static const char *const load_keys[4] = { KEY_A, KEY_B, KEY_C, KEY_D }; /* dave (3) floods */

typedef struct load_req {
    int tenant, prompt, stream, no_store, leave;
    char *raw; /* what came back (NULL: the connection failed) */
    size_t len;
} load_req;

typedef struct load_conn {
    int port, k;
    load_req *reqs;
} load_conn;

static void load_body(const load_req *q, char *out, size_t cap)
{
    const seq_req *p = &load_prompts[q->prompt];
    snprintf(out, cap, "{\"%s\": %s, \"max_tokens\": %d, \"temperature\": 0%s%s}", p->completion ? "prompt" : "messages", p->msgs,
             q->leave ? LOAD_LEAVE_TOKENS : LOAD_TOKENS, q->no_store ? ", \"cache\": \"no-store\"" : "",
             q->stream ? ", \"stream\": true" : "");
}

/* One client connection's requests, one after another; no assertion here
 * (a client thread): the main thread judges what came back. */
static void *load_client(void *arg)
{
    load_conn *c = arg;
    for (int i = c->k; i < LOAD_N; i += LOAD_CONNS) {
        load_req *q = &c->reqs[i];
        char body[2048];
        load_body(q, body, sizeof body);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)c->port), .sin_addr.s_addr = htonl(0x7f000001) };
        if (fd < 0) continue;
        /* a request the server dropped shows as lost, not as a hung test */
        struct timeval tv = { 20, 0 };
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            continue;
        }
        send_request(fd, "POST", load_prompts[q->prompt].completion ? "/v1/completions" : CHAT, load_keys[q->tenant], body, strlen(body));
        /* a leaver goes away once its first token is in */
        q->raw = read_raw(fd, q->leave ? "data: {" : NULL, &q->len);
    }
    return NULL;
}

/* a whole response is one response, complete: its Content-Length, or its
 * chunks up to the last, and nothing after */
static int whole_response(const char *raw, size_t n)
{
    const char *sep = strstr(raw, "\r\n\r\n");
    if (!sep) return 0;
    size_t head = (size_t)(sep - raw) + 4;
    const char *cl = strcasestr(raw, "\r\nContent-Length:");
    if (cl && cl < sep) return strtoul(cl + 17, NULL, 10) == n - head;
    return n >= head + 5 && strcmp(raw + n - 5, "0\r\n\r\n") == 0; /* the last chunk */
}

/* /metrics once more: reads counts the reads (each one is an ok answer) */
static char *load_metrics(int port, int *reads)
{
    http_resp m = http(port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(m.status, 200);
    ++*reads;
    char *b = m.body;
    m.body = NULL;
    resp_free(&m);
    return b;
}

Test(server, load_200_requests_4_tenants_32_connections_nothing_lost, .timeout = TEST_TIMEOUT(90))
{
    /* what each prompt says alone, on a server with no pool at all */
    server lone, s;
    const char *none[] = { "--sharing", "none", NULL };
    start_on(&lone, LOAD_MODEL, "srv-load-lone", none);
    static char want[LOAD_PROMPTS][1024];
    for (int p = 0; p < LOAD_PROMPTS; p++) {
        load_req q = { .prompt = p };
        char body[2048];
        load_body(&q, body, sizeof body);
        http_resp r = http(lone.port, "POST", load_prompts[p].completion ? "/v1/completions" : CHAT, KEY_A, body);
        cr_assert_eq(r.status, 200, "%s", r.body);
        cJSON *j = json_of(&r);
        const char *t = str_at(j, load_prompts[p].completion ? "choices.0.text" : "choices.0.message.content");
        cr_assert(t && *t, "prompt %d: nothing said alone", p);
        snprintf(want[p], sizeof want[p], "%s", t);
        cJSON_Delete(j), resp_free(&r);
    }
    cr_assert_eq(stop(&lone), 0);
    char cap[16];
    snprintf(cap, sizeof cap, "%d", LOAD_CAP);
    const char *extra[] = { "--per-tenant-queue", cap, "--max-queue", "64", "--max-tokens-cap", "400", NULL };
    start_on(&s, LOAD_MODEL, "srv-load", extra);
    /* connections 0-19 are dave's (a flood: 20 at once against a cap of 6),
     * 20-31 alice's, bob's and carol's, 4 each: never over the cap, even
     * with two more requests of theirs still running (one whose client left
     * counts until it stops at the next step that reaches it) */
    static load_req reqs[LOAD_N];
    int n_leave = 0, n_nostore_asked = 0;
    for (int i = 0; i < LOAD_N; i++) {
        int k = i % LOAD_CONNS;
        load_req *q = &reqs[i];
        *q = (load_req){ .tenant = k < LOAD_FLOOD_CONNS ? 3 : (k - LOAD_FLOOD_CONNS) % 3, .prompt = (i / LOAD_CONNS + k) % LOAD_PROMPTS,
                         .stream = (i / 3) % 2, .no_store = i % 8 == 2 };
        if (q->tenant != 3 && i % 8 == 5) { /* leaves mid-stream: a completion, whose first event is text */
            q->leave = q->stream = 1, q->no_store = 0;
            q->prompt = 3 + i % 3;
            n_leave++;
        }
        n_nostore_asked += q->no_store;
    }
    cr_assert(n_leave >= 5 && n_nostore_asked >= 10);
    pthread_t th[LOAD_CONNS];
    load_conn conns[LOAD_CONNS];
    double t0 = srv_test_now_ms();
    for (int k = 0; k < LOAD_CONNS; k++) {
        conns[k] = (load_conn){ s.port, k, reqs };
        cr_assert_eq(pthread_create(&th[k], NULL, load_client, &conns[k]), 0);
    }
    for (int k = 0; k < LOAD_CONNS; k++) pthread_join(th[k], NULL);
    double wall = srv_test_now_ms() - t0;
    /* every request: answered once, whole and well-formed, with the text
     * it has alone; or 429 (dave's only); or left by its client */
    int completed = 0, refused = 0, left = 0, nostore_done = 0;
    for (int i = 0; i < LOAD_N; i++) {
        load_req *q = &reqs[i];
        cr_assert(q->raw && q->len, "request %d (tenant %d) lost: no answer at all", i, q->tenant);
        if (q->leave) {
            cr_assert(strncmp(q->raw, "HTTP/1.1 200", 12) == 0 && strstr(q->raw, "text/event-stream"), "leaver %d: %.200s", i, q->raw);
            left++;
            free(q->raw);
            continue;
        }
        cr_assert(whole_response(q->raw, q->len), "request %d: not one whole response: %.300s", i, q->raw);
        http_resp r = { 0 };
        parse_response(q->raw, q->len, &r);
        free(q->raw);
        if (r.status == 429) {
            cr_assert_eq(q->tenant, 3, "request %d: tenant %d, under its cap, was refused: %s", i, q->tenant, r.body);
            cJSON *j = json_of(&r);
            cr_assert_str_eq(str_at(j, "error.code"), "tenant_queue_full");
            cJSON_Delete(j), resp_free(&r);
            refused++;
            continue;
        }
        cr_assert_eq(r.status, 200, "request %d: %d %s", i, r.status, r.body);
        const seq_req *p = &load_prompts[q->prompt];
        char finish[16];
        char *text;
        if (q->stream) {
            cJSON *usage;
            text = sse_text(r.body, !p->completion, finish, sizeof finish, &usage);
            cJSON_Delete(usage);
        } else {
            cJSON *j = json_of(&r);
            const char *t = str_at(j, p->completion ? "choices.0.text" : "choices.0.message.content");
            cr_assert(t, "request %d: %s", i, r.body);
            text = strdup(t);
            snprintf(finish, sizeof finish, "%s", str_at(j, "choices.0.finish_reason"));
            cJSON_Delete(j);
        }
        cr_assert_str_eq(text, want[q->prompt], "request %d (tenant %d, prompt %d) under load says\n%s\nalone\n%s", i, q->tenant,
                         q->prompt, text, want[q->prompt]);
        cr_assert(strcmp(finish, "length") == 0 || strcmp(finish, "stop") == 0, "request %d: finish '%s'", i, finish);
        free(text), resp_free(&r);
        completed++;
        nostore_done += q->no_store;
    }
    cr_assert_eq(completed + refused + left, LOAD_N);
    cr_assert_geq(refused, 1, "20 connections against a cap of %d: dave was never refused", LOAD_CAP);
    /* the server's account, once the last leaver's generation has stopped:
     * every other request is answered by now, and a leaver's was running
     * (its client had a token), so nothing runs or waits once that one is
     * done; its figures are published before the running gauge drops */
    int reads = 0;
    char *m = NULL;
    for (int t = 0; t < 500; t++) {
        free(m);
        m = load_metrics(s.port, &reads);
        if (metric(m, "cacheprune_running_requests") == 0 && metric(m, "cacheprune_queue_depth") == 0) break;
        usleep(10000);
    }
    cr_assert_eq(metric(m, "cacheprune_requests_total{outcome=\"ok\"}"), completed + left + reads - 1, "%s", m);
    /* every 429 is a queue_full outcome; these were all the tenant cap's */
    cr_assert_eq(metric(m, "cacheprune_requests_total{outcome=\"queue_full\"}"), refused, "%s", m);
    cr_assert_eq(metric(m, "cacheprune_tenant_queue_refusals_total"), refused);
    cr_assert_eq(metric(m, "cacheprune_requests_total{outcome=\"error\"}"), 0);
    cr_assert_eq(metric(m, "cacheprune_requests_total{outcome=\"bad_request\"}"), 0);
    /* a leaver is cancelled while it runs, unless its generation ended
     * (EOS, or its 300 tokens on a starved machine) before its connection's
     * thread saw the socket closed: then it was simply answered */
    double cancelled = metric(m, "cacheprune_cancelled_total{when=\"running\"}");
    cr_assert(cancelled >= 1 && cancelled <= left, "%d clients left mid-stream, %.0f cancelled: %s", left, cancelled, m);
    cr_assert_eq(metric(m, "cacheprune_cancelled_total{when=\"queued\"}"), 0, "a leaver had its first token: it was never queued");
    cr_assert_eq(metric(m, "cacheprune_no_store_requests_total"), nostore_done);
    cr_assert_eq(metric(m, "cacheprune_pool_pinned_blocks"), 0, "pins leaked: %s", m);
    cr_assert_eq(metric(m, "cacheprune_running_requests"), 0);
    cr_assert_eq(metric(m, "cacheprune_queue_depth"), 0);
    cr_assert_gt(metric(m, "cacheprune_reused_tokens_total"), 0, "nothing was reused: no pin was ever taken, the pin check proves nothing");
    cr_assert_gt(metric(m, "cacheprune_pool_segments"), 0);
    /* admission took turns with the steps: never more than one job taken
     * between two steps while others were in flight */
    cr_assert_eq(metric(m, "cacheprune_admitted_between_steps_max"), 1, "%s", m);
    cr_log_info("load: %d requests in %.0f ms: %d completed, %d refused (429), %d left mid-stream (%.0f cancelled), %d no-store", LOAD_N,
                wall, completed, refused, left, cancelled, nostore_done);
    free(m);
    cr_assert_eq(stop(&s), 0);
}

/* Reads fd until needle has arrived `count` times (or 15 s passed, or the
 * server closed); the bytes so far, NUL-terminated, malloc'd. */
static char *read_until_count(int fd, const char *needle, int count, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    cr_assert(buf);
    buf[0] = 0;
    struct pollfd pf = { fd, POLLIN, 0 };
    for (;;) {
        int seen = 0;
        for (const char *p = strstr(buf, needle); p; p = strstr(p + 1, needle)) seen++;
        if (seen >= count || n + 4096 > cap || poll(&pf, 1, 15000) <= 0) break;
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
    }
    *len = n;
    return buf;
}

/* polls /metrics until it holds line; 0 on timeout */
static int wait_metric_line(int port, const char *line)
{
    for (int i = 0; i < 500; i++) {
        http_resp m = http(port, "GET", "/metrics", KEY_OP, NULL);
        int hit = m.body && strstr(m.body, line) != NULL;
        resp_free(&m);
        if (hit) return 1;
        usleep(10000);
    }
    return 0;
}

#define KEEP_ALIVE ": keep-alive\n\n"

Test(server, a_queued_stream_gets_keep_alives_and_leaving_frees_its_place, .timeout = TEST_TIMEOUT(60))
{
    server s;
    /* one in flight: the others queue behind it */
    const char *extra[] = { "--concurrency", "1", "--max-tokens-cap", "1000", "--max-queue", "2", "--per-tenant-queue", "1", NULL };
    /* alice's stream must outlast the test's seconds of keep-alives on any
     * machine: cp-books-6m decodes 1000 tokens in 0.6 s, the 0.5B shape a minute */
    char abs[PATH_MAX];
    start_slow(&s, "srv-keepalive", extra, abs);
    /* alice's long stream holds the engine, carol's waits behind it */
    const char *hold = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1000, \"temperature\": 0, \"stream\": true}";
    int h1 = connect_to(s.port);
    send_request(h1, "POST", "/v1/completions", KEY_A, hold, strlen(hold));
    struct pollfd hp = { h1, POLLIN, 0 };
    cr_assert_gt(poll(&hp, 1, 20000), 0);
    int h2 = connect_to(s.port);
    send_request(h2, "POST", "/v1/completions", KEY_C, hold, strlen(hold));
    cr_assert(wait_queue_depth(s.port, 1), "carol's request never queued");
    /* bob's stream queues behind both: the queue (2) is full */
    const char *bob = "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], \"max_tokens\": 8, \"temperature\": 0, "
                      "\"stream\": true}";
    int q = connect_to(s.port);
    send_request(q, "POST", CHAT, KEY_B, bob, strlen(bob));
    cr_assert(wait_queue_depth(s.port, 2), "bob's request never queued");
    expect_error(s.port, "POST", CHAT, KEY_D, USER_MSG("Once upon a time"), 429, "rate_limit_error", NULL, "queue_full", "queue is full");
    /* while he waits: the 200, then a comment at once and one a second later */
    size_t n;
    char *raw = read_until_count(q, KEEP_ALIVE, 2, &n);
    cr_assert(strncmp(raw, "HTTP/1.1 200", 12) == 0 && strstr(raw, "text/event-stream"), "%s", raw);
    char *first = strstr(raw, KEEP_ALIVE);
    cr_assert(first && strstr(first + 1, KEEP_ALIVE), "bob waited 2 s and got no two keep-alive comments: %s", raw);
    cr_assert_null(strstr(raw, "data:"), "an event before bob's request ran: %s", raw);
    free(raw);
    cr_assert(wait_queue_depth(s.port, 2), "bob was not still queued: the keep-alives prove nothing about waiting");
    /* he leaves, closing his half of the connection: the server must see it
     * by watching his socket, not by a keep-alive's failed write -- a
     * half-closed client still takes writes, so without the watch more
     * comments would come and his request would wait on */
    cr_assert_eq(shutdown(q, SHUT_WR), 0);
    struct timeval tv = { 20, 0 };
    setsockopt(q, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t tail_n;
    char *tail = read_raw(q, NULL, &tail_n); /* to the server's close */
    cr_assert(tail && !strstr(tail, KEEP_ALIVE) && !strstr(tail, "data:"), "bob's leaving went unseen: %s", tail ? tail : "");
    free(tail);
    /* his place and his slot are free at once, alice still streaming */
    cr_assert(wait_metric_line(s.port, "cacheprune_cancelled_total{when=\"queued\"} 1\n"), "bob's leaving was not counted");
    cr_assert(wait_queue_depth(s.port, 1), "bob's place stayed taken after he left");
    /* under --per-tenant-queue 1 bob's next request is his one: accepted,
     * queued, and streamed once it runs (keep-alives first: it waits) */
    int q2 = connect_to(s.port);
    send_request(q2, "POST", CHAT, KEY_B, bob, strlen(bob));
    raw = read_until_count(q2, KEEP_ALIVE, 1, &n);
    cr_assert(strncmp(raw, "HTTP/1.1 200", 12) == 0, "bob's slot was not given back: %s", raw);
    cr_assert(wait_queue_depth(s.port, 2));
    /* carol leaves while queued, alice mid-stream: bob's request runs */
    close(h2);
    cr_assert(wait_metric_line(s.port, "cacheprune_cancelled_total{when=\"queued\"} 2\n"), "carol's leaving was not counted");
    close(h1);
    size_t rest_n;
    char *rest = read_raw(q2, NULL, &rest_n);
    char *all = malloc(n + rest_n + 1);
    memcpy(all, raw, n), memcpy(all + n, rest, rest_n + 1);
    http_resp r = { 0 };
    parse_response(all, n + rest_n, &r);
    char finish[16];
    cJSON *usage;
    char *text = sse_text(r.body, 1, finish, sizeof finish, &usage);
    cr_assert(*text && finish[0], "bob's stream after its keep-alives: '%s'", r.body);
    cr_assert(strstr(r.body, KEEP_ALIVE) < strstr(r.body, "data:"), "the keep-alive came after the data");
    free(text), free(all), free(rest), free(raw), resp_free(&r);
    cr_assert(wait_metric_line(s.port, "cacheprune_cancelled_total{when=\"running\"} 1\n"), "alice's leaving was not counted");
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_pinned_blocks"), 0);
    cr_assert_eq(metric_now(s.port, "cacheprune_queue_depth"), 0);
    cr_assert_eq(stop(&s), 0);
    slow_model_remove(abs);
}

/* A job whose client left before the engine started it never starts (the
 * engine may have taken it from the queue just before the client left: the
 * queue's withdrawal cannot catch that one); one still wanted starts. */
Test(server, job_cancelled_before_its_start_never_starts)
{
    cp_error err = { 0 };
    srv_job *j, *k;
    srv_gen g = { 0 }, h = { 0 };
    cr_assert_eq(srv_job_create(&g, 0, &j, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(srv_job_create(&h, 1, &k, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(srv_job_cancel(j), SRV_JOB_QUEUED);
    cr_assert_eq(srv_job_start(j), 0, "a cancelled job started");
    cr_assert_eq(srv_job_wait_ms(j, SRV_JOB_RUNNING, 0), SRV_JOB_QUEUED);
    cr_assert(srv_job_cancelled(j));
    cr_assert_eq(srv_job_start(k), 1);
    cr_assert_eq(srv_job_wait_ms(k, SRV_JOB_RUNNING, 0), SRV_JOB_RUNNING);
    cr_assert_eq(srv_job_cancel(k), SRV_JOB_RUNNING, "a running job's cancel must say it runs: the engine counts it");
    cr_assert(srv_job_cancelled(k));
    srv_job_unref(j), srv_job_unref(k);
}

/* ---- continuous batching (serve --concurrency) ------------------------------------- */

static void send_seq(int fd, const seq_req *q, int stream, const char *extra)
{
    char body[4096];
    body_of(q, stream, extra, body, sizeof body);
    send_request(fd, "POST", q->completion ? "/v1/completions" : CHAT, q->key, body, strlen(body));
}

/* The answer's text, streamed (checked as an SSE body) or not; malloc'd.
 * *tokens (may be NULL) gets usage.completion_tokens. */
static char *answer_text(const http_resp *r, const seq_req *q, int stream, int *tokens)
{
    cr_assert_eq(r->status, 200, "%s", r->body);
    if (stream) {
        char finish[16];
        cJSON *usage;
        char *t = sse_text(r->body, !q->completion, finish, sizeof finish, &usage);
        cr_assert(usage, "no usage chunk");
        if (tokens) *tokens = (int)num_at(usage, "completion_tokens");
        cJSON_Delete(usage);
        return t;
    }
    cJSON *j = json_of(r);
    const char *t = str_at(j, q->completion ? "choices.0.text" : "choices.0.message.content");
    cr_assert(t, "%s", r->body);
    if (tokens) *tokens = (int)num_at(j, "usage.completion_tokens");
    char *c = strdup(t);
    cJSON_Delete(j);
    return c;
}

/* The rest of a response whose first n bytes (head, malloc'd) were read. */
static void finish_response(int fd, char *head, size_t n, http_resp *r)
{
    size_t m;
    char *rest = read_raw(fd, NULL, &m);
    char *all = malloc(n + m + 1);
    cr_assert(all && rest);
    memcpy(all, head, n), memcpy(all + n, rest, m);
    all[n + m] = 0;
    parse_response(all, n + m, r);
    free(all), free(rest), free(head);
}

/* A stream's first token is out (so it has stored what it stores): the
 * chat role chunk, then a content chunk; a completion's first chunk. */
static char *wait_first_token(int fd, int chat, size_t *n)
{
    char *h = read_until_count(fd, "data: ", chat ? 2 : 1, n);
    cr_assert(strstr(h, "data: "), "no first token within 15 s");
    return h;
}

static void batch_figures(int port, double *steps, double *seqs, double *max_seqs)
{
    http_resp m = http(port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(m.status, 200);
    *steps = metric(m.body, "cacheprune_batch_steps_total");
    *seqs = metric(m.body, "cacheprune_batch_sequences_total");
    *max_seqs = metric(m.body, "cacheprune_batch_max_sequences");
    resp_free(&m);
}

/* Five requests of different lengths at once, streamed and not, against
 * four in flight: each gets exactly the greedy text it gets alone (`run`,
 * one request at a time, no batcher), and steps really carried several of
 * them (a serve that stayed sequential would show at most one a step). */
Test(server, batched_requests_give_their_lone_greedy_text, .timeout = TEST_TIMEOUT(90))
{
    static char want[N_SEQ][1024];
    run_texts_with("--sharing none", want);
    server s;
    const char *extra[] = { "--sharing", "none", "--concurrency", "4", NULL };
    start(&s, "srv-batch", extra);
    int fds[N_SEQ];
    for (size_t i = 0; i < N_SEQ; i++) {
        fds[i] = connect_to(s.port);
        cr_assert_geq(fds[i], 0);
    }
    for (size_t i = 0; i < N_SEQ; i++) send_seq(fds[i], &seq[i], (int)(i % 2), NULL);
    int nonempty = 0;
    for (size_t i = 0; i < N_SEQ; i++) {
        http_resp r = { 0 };
        read_response(fds[i], &r);
        char *t = answer_text(&r, &seq[i], (int)(i % 2), NULL);
        cr_assert_str_eq(t, want[i], "request %zu batched says\n%s\nalone it says\n%s", i, t, want[i]);
        nonempty += *t != 0;
        free(t), resp_free(&r);
    }
    cr_assert_geq(nonempty, 3, "the model said nothing: the comparison would be empty");
    double steps, seqs, max_seqs;
    batch_figures(s.port, &steps, &seqs, &max_seqs);
    cr_assert_geq(max_seqs, 2, "no step carried two requests: serve ran them one at a time (%g steps, %g sequences)", steps, seqs);
    cr_assert_leq(max_seqs, 4, "a step carried %g requests with --concurrency 4", max_seqs);
    cr_assert_gt(steps, 0);
    cr_assert_eq(metric_now(s.port, "cacheprune_running_requests"), 0);
    /* where the steps went: every prompt position prefilled once (no pool),
     * every generated token but each request's first (its prefill step's)
     * decoded once, no step over the all-prefill budget, the forward timed */
    http_resp m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(metric(m.body, "cacheprune_batch_tokens_total{kind=\"prefill\"}"), metric(m.body, "cacheprune_prompt_tokens_total"));
    cr_assert_eq(metric(m.body, "cacheprune_batch_tokens_total{kind=\"decode\"}"),
                 metric(m.body, "cacheprune_generated_tokens_total") - (double)N_SEQ);
    double most = metric(m.body, "cacheprune_batch_max_tokens");
    /* which request the engine sees first is the connection threads'
     * race: a short one first decodes while the others prefill, 32
     * tokens a step -- at least that much, never past the budget */
    cr_assert(most >= 32 && most <= 512, "the most one step computed is %g tokens (32 a step beside decoders, 512 at most)", most);
    cr_assert_gt(metric(m.body, "cacheprune_engine_seconds_total{phase=\"forward\"}"), 0);
    cr_assert_geq(metric(m.body, "cacheprune_engine_seconds_total{phase=\"admit\"}"), 0);
    double psteps = metric(m.body, "cacheprune_batch_prefill_steps_total");
    cr_assert(psteps >= 1 && psteps < steps, "%g of %g steps carried prefill (every prompt's, then decode-only ones)", psteps, steps);
    cr_assert_leq(metric(m.body, "cacheprune_batch_prefill_step_seconds_total"),
                  metric(m.body, "cacheprune_engine_seconds_total{phase=\"forward\"}"));
    resp_free(&m);
    /* a prompt alone (nobody decodes) is prefilled in one step: past the
     * 32 a step beside decoders carries, up to --prefill-tokens 512 */
    const double p0 = metric_now(s.port, "cacheprune_prompt_tokens_total");
    int fd = connect_to(s.port);
    cr_assert_geq(fd, 0);
    send_seq(fd, &seq[0], 0, NULL);
    http_resp r = { 0 };
    read_response(fd, &r);
    close(fd);
    cr_assert_eq(r.status, 200, "%s", r.body);
    resp_free(&r);
    const double prompt = metric_now(s.port, "cacheprune_prompt_tokens_total") - p0;
    most = metric_now(s.port, "cacheprune_batch_max_tokens");
    cr_assert(prompt > 32 && prompt <= 512, "the lone prompt has %g tokens: the check wants one between 32 and 512", prompt);
    cr_assert_geq(most, prompt, "a lone %g-token prompt, yet the most one step computed is %g tokens", prompt, most);
    cr_assert_eq(stop(&s), 0);
}

/* Under cacheprune, requests sent one after another's first token (so each
 * retrieves after the ones before it stored, as in a sequential run) while a
 * long no-store stream of carol's decodes beside them: each gets its lone
 * run's text (`run`, the same requests in the same order, one at a time).
 * With leave, carol's client goes away mid-stream while the others are
 * still decoding (without, once they are done): they complete unchanged,
 * her generation stops, and every pin is back (hers held the document
 * alice stored). */
static void staggered_beside_a_long_stream(const char *name, int leave)
{
    static char want[N_SEQ][1024];
    run_texts(want);
    server s;
    const char *extra[] = { "--concurrency", "4", "--max-tokens-cap", "1000", NULL };
    start(&s, name, extra);
    int fds[N_SEQ], hold = -1;
    char *heads[N_SEQ], *hold_head = NULL;
    size_t hold_len = 0;
    size_t lens[N_SEQ];
    for (size_t i = 0; i < N_SEQ; i++) {
        fds[i] = connect_to(s.port);
        cr_assert_geq(fds[i], 0);
        send_seq(fds[i], &seq[i], 1, NULL);
        heads[i] = wait_first_token(fds[i], !seq[i].completion, &lens[i]);
        if (i == 0) { /* carol reads alice's document: a shared hit, pinned while she decodes */
            seq_req carol = { KEY_C, "carol", 0, seq[1].msgs };
            char body[4096];
            snprintf(body, sizeof body, "{\"messages\": %s, \"max_tokens\": 700, \"temperature\": 0, \"stream\": true, "
                     "\"cache\": \"no-store\"}", carol.msgs);
            hold = connect_to(s.port);
            send_request(hold, "POST", CHAT, KEY_C, body, strlen(body));
            hold_head = wait_first_token(hold, 1, &hold_len);
        }
    }
    double steps, seqs, max_seqs;
    batch_figures(s.port, &steps, &seqs, &max_seqs);
    cr_assert_geq(max_seqs, 2, "no step carried two requests (%g steps, %g sequences)", steps, seqs);
    if (leave) {
        close(hold), free(hold_head);
        cr_assert(wait_metric_line(s.port, "cacheprune_cancelled_total{when=\"running\"} 1\n"), "carol's leaving was not noticed");
    }
    int others = 0;
    for (size_t i = 0; i < N_SEQ; i++) {
        http_resp r = { 0 };
        int k = 0;
        finish_response(fds[i], heads[i], lens[i], &r);
        char *t = answer_text(&r, &seq[i], 1, &k);
        others += k;
        cr_assert_str_eq(t, want[i], "request %zu batched says\n%s\nits lone run says\n%s", i, t, want[i]);
        free(t), resp_free(&r);
    }
    if (!leave) { /* carol is still decoding: no need to wait for her 700 tokens */
        cr_assert_eq(metric_now(s.port, "cacheprune_running_requests"), 1, "carol's stream ended before the others: no overlap");
        close(hold), free(hold_head);
    }
    cr_assert(wait_metric_line(s.port, "cacheprune_running_requests 0\n"), "a request is still in the engine");
    http_resp m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(metric(m.body, "cacheprune_pool_pinned_blocks"), 0, "pins are still held with nothing running");
    double generated = metric(m.body, "cacheprune_generated_tokens_total");
    cr_assert_lt(generated - others, 700, "%g tokens: carol's abandoned stream ran to its end", generated - others);
    cr_assert(strstr(m.body, "cacheprune_cancelled_total{when=\"running\"} 1\n"), "carol's leaving was not counted");
    resp_free(&m);
    cr_assert_eq(stop(&s), 0);
}

Test(server, batched_under_cacheprune_each_gets_its_lone_run, .timeout = TEST_TIMEOUT(150))
{
    staggered_beside_a_long_stream("srv-batch-cp", 0);
}

Test(server, a_client_leaving_mid_batch_leaves_the_others_unchanged, .timeout = TEST_TIMEOUT(150))
{
    staggered_beside_a_long_stream("srv-batch-leave", 1);
}

/* "data: " events read from fd within ms milliseconds, up to want */
static int events_within(int fd, int want, int ms)
{
    char buf[1 << 16];
    size_t keep = 0; /* a needle split across two reads is counted once */
    int seen = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct pollfd pf = { fd, POLLIN, 0 };
    while (seen < want) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        const long left = ms - ((t.tv_sec - t0.tv_sec) * 1000L + (t.tv_nsec - t0.tv_nsec) / 1000000L);
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0) break;
        ssize_t k = recv(fd, buf + keep, sizeof buf - keep - 1, 0);
        if (k <= 0) break;
        size_t n = keep + (size_t)k;
        buf[n] = 0;
        for (const char *p = strstr(buf, "data: "); p; p = strstr(p + 1, "data: ")) seen++;
        keep = n < 5 ? n : 5; /* the last 5 bytes start the next scan: no whole needle fits in them */
        memmove(buf, buf + n - keep, keep);
    }
    return seen;
}

/* A server whose detector plugin holds any prompt with "hold" in it until
 * the file DIR/go exists (it makes DIR/held when it starts holding), on
 * --concurrency 2; dir gets DIR.  The engine waits up to 20 s for an answer
 * (the plugin holds one for 10 s at most). */
static void start_holding(server *s, const char *name, char *dir, size_t cap)
{
    static char plugin[900];
    const char *pd = getenv("CP_PLUGINS");
    snprintf(plugin, sizeof plugin, "%s/cp_test_proc_plugin", pd && *pd ? pd : "build/tests");
    if (access(plugin, X_OK) != 0) cr_skip_test("no %s (make build/tests/cp_test_proc_plugin)", plugin);
    test_tmpdir(dir, cap, name);
    cr_assert_lt(strlen(plugin) + strlen(dir) + 8, sizeof plugin);
    strcat(plugin, " hold "), strcat(plugin, dir);
    const char *extra[] = { "--plugin-cmd", plugin, "--timeout-ms", "20000", "--concurrency", "2", "--max-tokens-cap", "1000", NULL };
    start(s, name, extra);
}

/* the holding plugin has a prompt (DIR/held), within 15 s */
static void wait_held(const char *dir)
{
    char held[700];
    snprintf(held, sizeof held, "%s/held", dir);
    for (int i = 0; i < 1500 && access(held, F_OK) != 0; i++) usleep(10000);
    cr_assert_eq(access(held, F_OK), 0, "the plugin never got the held prompt");
}

/* lets the holding plugin answer (DIR/go) */
static void release_held(const char *dir)
{
    char go[700];
    snprintf(go, sizeof go, "%s/go", dir);
    FILE *f = fopen(go, "w");
    cr_assert(f);
    fclose(f);
}

/* Detection runs off the engine thread: while the detector plugin holds
 * one request's prompt (it waits for a file before it answers), a stream
 * already decoding goes on producing tokens, and the held request is
 * answered once the plugin lets it go. */
Test(server, a_prompt_being_scanned_does_not_stall_the_streams_in_flight, .timeout = TEST_TIMEOUT(90))
{
    char dir[600];
    server s;
    start_holding(&s, "srv-hold", dir, sizeof dir);
    const char *a = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1000, \"temperature\": 0, \"stream\": true}";
    const char *b = "{\"prompt\": \"Please hold this one\", \"max_tokens\": 4, \"temperature\": 0}";
    int fa = connect_to(s.port), fb = connect_to(s.port);
    cr_assert(fa >= 0 && fb >= 0);
    size_t n;
    send_request(fa, "POST", "/v1/completions", KEY_A, a, strlen(a));
    free(wait_first_token(fa, 0, &n));
    send_request(fb, "POST", "/v1/completions", KEY_B, b, strlen(b));
    wait_held(dir);
    const int more = events_within(fa, 20, 5000);
    cr_assert_geq(more, 20, "the stream in flight gave %d tokens in 5 s while another prompt was being scanned", more);
    release_held(dir);
    http_resp rb = { 0 };
    read_response(fb, &rb);
    cr_assert_eq(rb.status, 200, "%s", rb.body ? rb.body : "");
    resp_free(&rb);
    close(fa), close(fb);
    cr_assert(wait_metric_line(s.port, "cacheprune_running_requests 0\n"), "a request is still in the engine");
    cr_assert_eq(stop(&s), 0);
}

/* While a prompt is being scanned and the job queued behind it cannot
 * start (its tenant's last place in flight), the engine thread sleeps
 * until something changes: its time taking jobs does not grow (a loop
 * back to the queue that returned at once spent a core on it), and both
 * requests are answered once the plugin lets the first go. */
Test(server, an_engine_waiting_on_a_prompt_being_scanned_sleeps, .timeout = TEST_TIMEOUT(90))
{
    char dir[600];
    server s;
    start_holding(&s, "srv-hold-idle", dir, sizeof dir);
    const char *held_req = "{\"prompt\": \"Please hold this one\", \"max_tokens\": 4, \"temperature\": 0}";
    const char *next_req = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4, \"temperature\": 0}";
    int f1 = connect_to(s.port), f2 = connect_to(s.port);
    cr_assert(f1 >= 0 && f2 >= 0);
    send_request(f1, "POST", "/v1/completions", KEY_A, held_req, strlen(held_req));
    wait_held(dir);
    send_request(f2, "POST", "/v1/completions", KEY_A, next_req, strlen(next_req));
    cr_assert(wait_metric_line(s.port, "cacheprune_queue_depth 1\n"), "alice's second request is not waiting in the queue");
    const char *admit = "cacheprune_engine_seconds_total{phase=\"admit\"}";
    const double a0 = metric_now(s.port, admit);
    usleep(1000000);
    const double a1 = metric_now(s.port, admit);
    cr_assert_lt(a1 - a0, 0.05, "the engine thread spent %.3f s of a second taking jobs while it had none to take", a1 - a0);
    release_held(dir);
    http_resp r1 = { 0 }, r2 = { 0 };
    read_response(f1, &r1), read_response(f2, &r2);
    cr_assert_eq(r1.status, 200, "%s", r1.body ? r1.body : "");
    cr_assert_eq(r2.status, 200, "%s", r2.body ? r2.body : "");
    resp_free(&r1), resp_free(&r2);
    close(f1), close(f2);
    cr_assert_eq(stop(&s), 0);
}

/* A purge while a batch decodes: it waits its turn and then for alice's
 * jobs in flight, so her request accepted before it — admitted in the very
 * step the purge reached the head of the queue, before it could store —
 * is stored before the purge and erased by it; bob's stream decodes on. */
Test(server, a_purge_during_a_batch_erases_what_came_before_it, .timeout = TEST_TIMEOUT(90))
{
    server s;
    const char *extra[] = { "--concurrency", "2", "--max-tokens-cap", "1000", "--max-queue", "8", NULL };
    start(&s, "srv-batch-purge", extra);
    const char *hold = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1000, \"temperature\": 0, \"stream\": true}";
    int hb = connect_to(s.port), ha = connect_to(s.port);
    size_t n;
    send_request(hb, "POST", "/v1/completions", KEY_B, hold, strlen(hold));
    free(wait_first_token(hb, 0, &n));
    send_request(ha, "POST", "/v1/completions", KEY_A, hold, strlen(hold));
    free(wait_first_token(ha, 0, &n));
    /* both places taken: alice's question, then her purge, queue */
    int q = connect_to(s.port);
    send_seq(q, &seq[0], 0, NULL);
    cr_assert(wait_queue_depth(s.port, 1), "alice's question never queued");
    int p = connect_to(s.port);
    send_request(p, "POST", PURGE, KEY_A, "{}", 2);
    cr_assert(wait_queue_depth(s.port, 2), "alice's purge never queued");
    close(ha); /* her place frees: the question is admitted, the purge is next */
    http_resp r = { 0 };
    read_response(q, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    resp_free(&r);
    read_response(p, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cJSON *j = json_of(&r);
    cr_assert_gt(num_at(j, "segments"), 0, "the purge found none of alice's segments");
    cJSON_Delete(j), resp_free(&r);
    cr_assert_eq(cached_of(s.port, &seq[0], NULL, NULL, 0), 0, "alice's question, accepted before her purge, was stored after it");
    /* bob decoded on through all that */
    cr_assert_eq(metric_now(s.port, "cacheprune_cancelled_total{when=\"running\"}"), 1);
    close(hb);
    cr_assert(wait_metric_line(s.port, "cacheprune_running_requests 0\n"));
    cr_assert(wait_metric_line(s.port, "cacheprune_pool_pinned_blocks 0\n"), "pins still held");
    cr_assert_eq(stop(&s), 0);
}

/* A request admitted into the batch but waiting there for KV room (the
 * running one reserved most of --kv-budget) whose client leaves is dropped
 * from the batch at the next step — it never prefills — not when room
 * comes: while alice's long stream still decodes, bob's leaving is counted
 * and only hers is in the engine. */
Test(server, a_client_leaving_while_its_request_waits_for_kv_frees_it_at_once, .timeout = TEST_TIMEOUT(60))
{
    server s;
    /* cp-books-6m: 9216 bytes of KV a token, 10 MB = 1137 tokens: alice's
     * 6 + 1000 fit, bob's 49 + 900 beside them do not */
    const char *extra[] = { "--sharing", "none", "--concurrency", "2", "--kv-budget", "10", "--max-tokens-cap", "1000", NULL };
    start(&s, "srv-batch-kv", extra);
    const char *hold = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1000, \"temperature\": 0, \"stream\": true}";
    int h = connect_to(s.port);
    size_t n;
    send_request(h, "POST", "/v1/completions", KEY_A, hold, strlen(hold));
    char *head = wait_first_token(h, 0, &n);
    char body[4096];
    snprintf(body, sizeof body, "{\"messages\": %s, \"max_tokens\": 900, \"temperature\": 0}", seq[1].msgs);
    int q = connect_to(s.port);
    send_request(q, "POST", CHAT, KEY_B, body, strlen(body));
    cr_assert(wait_metric_line(s.port, "cacheprune_running_requests 2\n"), "bob's request never entered the batch");
    close(q);
    cr_assert(wait_metric_line(s.port, "cacheprune_cancelled_total{when=\"running\"} 1\n"), "bob's leaving was never counted");
    http_resp m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(metric(m.body, "cacheprune_running_requests"), 1, "bob's request stayed in the batch after he left");
    cr_assert_eq(metric(m.body, "cacheprune_batch_max_sequences"), 1, "bob's request got work though it could not fit");
    resp_free(&m);
    close(h), free(head);
    cr_assert(wait_metric_line(s.port, "cacheprune_running_requests 0\n"));
    cr_assert_eq(stop(&s), 0);
}

/* ---- a long prompt arriving while others decode (the step budget) ---------------------- */

#define LONG_STREAMS 3
#define LONG_STREAM_TOKENS 160

/* A completion body: prompt, max_tokens, streamed or not. */
static void completion_body(const char *prompt, int max_tokens, int stream, char *out, size_t cap)
{
    snprintf(out, cap, "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0%s}", prompt, max_tokens,
             stream ? ", \"stream\": true, \"stream_options\": {\"include_usage\": true}" : "");
}

static int count_of(const char *buf, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(buf, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* One growing receive buffer per connection. */
typedef struct rbuf {
    char *p;
    size_t n, cap;
    int closed;
} rbuf;

static void rbuf_read(int fd, rbuf *b)
{
    if (b->n + 4096 > b->cap) {
        b->cap = b->cap ? b->cap * 2 : 1 << 16;
        b->p = realloc(b->p, b->cap);
        cr_assert(b->p);
    }
    ssize_t k = recv(fd, b->p + b->n, b->cap - b->n - 1, 0);
    if (k <= 0) b->closed = 1;
    else b->n += (size_t)k;
    b->p[b->n] = 0;
}

/* Three streams decode (their first tokens out) when a prompt of L tokens
 * arrives, with --step-tokens 6 and four in flight: each step gives the
 * streams their token and the long prompt the 3 left, so its first token
 * comes at least L / 3 steps after it was admitted — and every one of
 * those steps carries a token of each stream.  So between the moment the
 * long request is sent and its first token, every stream (160 tokens, all
 * still decoding then) is given at least L / 3 - 4 text chunks (a few may end inside a character; the
 * test asks for half that many delivered, see below); a server
 * that ran the whole prompt in one step, stalling the streams meanwhile,
 * gives them one or two plus the few steps the request took to be
 * admitted.  Counted in steps (SSE chunks), never in wall time.  And the
 * streams' texts are their lone greedy texts (each sent alone first). */
Test(server, a_long_prompt_arriving_does_not_stall_the_others_beyond_the_step_budget, .timeout = TEST_TIMEOUT(120))
{
    static const char *prompts[LONG_STREAMS] = { "Once upon a time there was a girl who", "The old miller said",
                                                 "In the morning the ships" };
    char longp[8192];
    size_t n = (size_t)snprintf(longp, sizeof longp, "The long letter began:");
    for (int k = 0; k < 24 && n + 64 < sizeof longp; k++)
        n += (size_t)snprintf(longp + n, sizeof longp - n, " the river %d ran past the mill and the bridge,", k);
    server s;
    const char *extra[] = { "--sharing", "none", "--concurrency", "4", "--step-tokens", "6", "--max-tokens-cap", "1000", NULL };
    start(&s, "srv-long-arrival", extra);
    static char want[LONG_STREAMS][8192];
    char body[9000];
    for (int i = 0; i < LONG_STREAMS; i++) { /* alone, one at a time */
        completion_body(prompts[i], LONG_STREAM_TOKENS, 0, body, sizeof body);
        http_resp r = http(s.port, "POST", "/v1/completions", KEY_A, body);
        seq_req q = { KEY_A, "alice", 1, NULL };
        char *t = answer_text(&r, &q, 0, NULL);
        snprintf(want[i], sizeof want[i], "%s", t);
        free(t), resp_free(&r);
    }
    completion_body(longp, 1, 0, body, sizeof body);
    http_resp lr = http(s.port, "POST", "/v1/completions", KEY_B, body);
    cJSON *lj = json_of(&lr);
    int L = (int)num_at(lj, "usage.prompt_tokens");
    cJSON_Delete(lj), resp_free(&lr);
    cr_assert_geq(L, 240, "the long prompt is only %d tokens", L);
    cr_assert_lt(L / 3 + 20, LONG_STREAM_TOKENS, "the streams would end before the long prompt's prefill");

    int fds[LONG_STREAMS + 1];
    rbuf b[LONG_STREAMS + 1];
    memset(b, 0, sizeof b);
    for (int i = 0; i < LONG_STREAMS; i++) {
        fds[i] = connect_to(s.port);
        cr_assert_geq(fds[i], 0);
        completion_body(prompts[i], LONG_STREAM_TOKENS, 1, body, sizeof body);
        send_request(fds[i], "POST", "/v1/completions", KEY_A, body, strlen(body));
    }
    for (int i = 0; i < LONG_STREAMS; i++) /* each decoding: its first text chunk is out */
        while (!b[i].closed && count_of(b[i].p ? b[i].p : "", "data: ") < 1) rbuf_read(fds[i], &b[i]);
    int at_send[LONG_STREAMS], at_first[LONG_STREAMS] = { 0 }, first_seen = 0;
    for (int i = 0; i < LONG_STREAMS; i++) at_send[i] = count_of(b[i].p, "data: ");
    fds[LONG_STREAMS] = connect_to(s.port);
    cr_assert_geq(fds[LONG_STREAMS], 0);
    completion_body(longp, 1, 1, body, sizeof body);
    send_request(fds[LONG_STREAMS], "POST", "/v1/completions", KEY_B, body, strlen(body));
    for (;;) {
        struct pollfd pf[LONG_STREAMS + 1];
        int open = 0;
        for (int i = 0; i <= LONG_STREAMS; i++) {
            pf[i] = (struct pollfd){ b[i].closed ? -1 : fds[i], POLLIN, 0 };
            open += !b[i].closed;
        }
        if (!open) break;
        cr_assert_gt(poll(pf, LONG_STREAMS + 1, 30000), 0, "no progress within 30 s");
        for (int i = 0; i <= LONG_STREAMS; i++)
            if (pf[i].revents) rbuf_read(fds[i], &b[i]);
        if (!first_seen && b[LONG_STREAMS].p && strstr(b[LONG_STREAMS].p, "data: ")) {
            first_seen = 1; /* the long prompt's first token: how far each stream got meanwhile */
            for (int i = 0; i < LONG_STREAMS; i++) {
                at_first[i] = count_of(b[i].p, "data: ");
                cr_assert(!strstr(b[i].p, "[DONE]"), "stream %d ended before the long prompt's first token: no overlap", i);
            }
        }
    }
    cr_assert(first_seen, "the long prompt never got its first token");
    for (int i = 0; i < LONG_STREAMS; i++) {
        int during = at_first[i] - at_send[i];
        cr_log_info("stream %d: %d tokens while the %d-token prompt prefilled", i, during, L);
        /* The count is of chunks *delivered* when the newcomer's first one
         * is read, and delivery lags production by however long the HTTP
         * threads wait for a core: at load 22 a stream was seen 11 chunks
         * behind (91 of 102).  Half the produced bound still separates a
         * scheduler that interleaves (>= L / 3 - 4 produced) from one that
         * stalls (a handful, 5 for the stall mutant). */
        cr_assert_geq(during, L / 6,
                      "stream %d got %d tokens while a %d-token prompt prefilled under a 6-token step budget (at least %d steps): "
                      "its decoding stalled", i, during, L, L / 3);
        http_resp r = { 0 };
        parse_response(b[i].p, b[i].n, &r);
        seq_req q = { KEY_A, "alice", 1, NULL };
        int k = 0;
        char *t = answer_text(&r, &q, 1, &k);
        cr_assert_eq(k, LONG_STREAM_TOKENS);
        cr_assert_str_eq(t, want[i], "stream %d beside the long prompt says\n%s\nalone it says\n%s", i, t, want[i]);
        free(t), resp_free(&r);
        close(fds[i]);
        free(b[i].p);
    }
    close(fds[LONG_STREAMS]);
    free(b[LONG_STREAMS].p);
    cr_assert_eq(stop(&s), 0);
}

/* ---- under attack: failing floods, slow clients ------------------------------------------ */

#define FLOOD_PER_CONN 12

typedef struct flood_conn {
    int port;
    const char *body;
    int answered, refused_for_context;
} flood_conn;

/* one connection of the flooding tenant: prompts past the context, one after another */
static void *flood_client(void *arg)
{
    flood_conn *f = arg;
    for (int i = 0; i < FLOOD_PER_CONN; i++) {
        http_resp r = http(f->port, "POST", CHAT, KEY_A, f->body);
        f->refused_for_context += r.status == 400 && r.body && strstr(r.body, "\"context_length_exceeded\"") &&
                                  strstr(r.body, "\"param\":\"messages\"");
        __atomic_add_fetch(&f->answered, 1, __ATOMIC_RELEASE);
        resp_free(&r);
    }
    return NULL;
}

/* Tenant alice floods on two connections with ~100 KB prompts past the
 * context while bob asks for 8 tokens.  Before, the engine thread tokenized
 * each flood prompt and refused it, and with two connections one was always
 * queued: the round taking jobs never ended and bob's request, in the batch,
 * got no step until the flood stopped.  Now the admission check refuses them
 * on their connections' threads before the queue: the engine thread takes
 * bob's job alone, and his answer costs exactly his own steps. */
Test(server, a_flood_of_over_context_prompts_never_reaches_the_engine, .timeout = TEST_TIMEOUT(120))
{
    server s;
    start(&s, "srv-flood", NULL);
    const char *line = "the cat sat on the mat and looked at the old lighthouse. ";
    size_t reps = 100000 / strlen(line), n = 0;
    char *body = malloc(reps * strlen(line) + 128);
    cr_assert(body);
    n += (size_t)sprintf(body, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
    for (size_t i = 0; i < reps; i++) n += (size_t)sprintf(body + n, "%s", line);
    sprintf(body + n, "\"}], \"max_tokens\": 8}");
    flood_conn fc[2] = { { .port = s.port, .body = body }, { .port = s.port, .body = body } };
    pthread_t th[2];
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, flood_client, &fc[i]), 0);
    while (__atomic_load_n(&fc[0].answered, __ATOMIC_ACQUIRE) + __atomic_load_n(&fc[1].answered, __ATOMIC_ACQUIRE) < 2)
        usleep(1000); /* the flood is under way */
    http_resp v = http(s.port, "POST", CHAT, KEY_B, USER_MSG("Once upon a time"));
    cr_assert_eq(v.status, 200, "%d %s", v.status, v.body);
    cJSON *j = json_of(&v);
    double generated = num_at(j, "usage.completion_tokens");
    cJSON_Delete(j), resp_free(&v);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    free(body);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(fc[i].refused_for_context, FLOOD_PER_CONN, "each flood prompt is a 400 context_length_exceeded naming messages");
    http_resp m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(m.status, 200);
    cr_assert_eq(metric(m.body, "cacheprune_engine_jobs_total{result=\"refused\"}"), 0,
                 "a flood prompt reached the engine thread:\n%s", m.body);
    cr_assert_eq(metric(m.body, "cacheprune_engine_jobs_total{result=\"started\"}"), 1, "bob's job is the only one taken");
    cr_assert_eq(metric(m.body, "cacheprune_refused_before_queue_total"), 2 * FLOOD_PER_CONN);
    /* bob's wait: his own prefill (one step: a short prompt) and one step per
     * further token, nothing for the flood */
    cr_assert_leq(metric(m.body, "cacheprune_batch_steps_total"), generated, "%s", m.body);
    resp_free(&m);
    cr_assert_eq(stop(&s), 0);
}

/* A connection to the server from the loopback address 127.0.0.host (a
 * second address stands for another client machine), or -1. */
static int connect_from(int port, int host)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in src = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)host) };
    struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001) };
    if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0 || connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Slow clients: each connection sends its opening bytes, then one byte
 * every tick (never reaching the end of its headers, or of its body), until
 * the server closes it or the test stops them. */
#define SLOW_MAX 16
#define SLOW_TICK_MS 100

typedef struct slow_clients {
    int fd[SLOW_MAX], n;
    int closed[SLOW_MAX]; /* the server closed it */
    int stop;
    pthread_t th;
} slow_clients;

static int peer_closed(int fd)
{
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void *slow_loop(void *arg)
{
    slow_clients *c = arg;
    while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < c->n; i++) {
            if (__atomic_load_n(&c->closed[i], __ATOMIC_ACQUIRE)) continue;
            if (peer_closed(c->fd[i]) || send(c->fd[i], "a", 1, MSG_NOSIGNAL) != 1) __atomic_store_n(&c->closed[i], 1, __ATOMIC_RELEASE);
        }
        usleep(SLOW_TICK_MS * 1000);
    }
    return NULL;
}

/* opening: what each connection sends first (the rest is 'a's) */
static void slow_start(slow_clients *c, int port, int host, int n, const char *opening)
{
    for (int i = 0; i < n && c->n < SLOW_MAX; i++) {
        int fd = connect_from(port, host);
        cr_assert_geq(fd, 0, "a slow client cannot connect from 127.0.0.%d", host);
        send_all(fd, opening, strlen(opening));
        c->fd[c->n++] = fd;
    }
}

static void slow_run(slow_clients *c) { cr_assert_eq(pthread_create(&c->th, NULL, slow_loop, c), 0); }

static int slow_closed(slow_clients *c)
{
    int k = 0;
    for (int i = 0; i < c->n; i++) k += __atomic_load_n(&c->closed[i], __ATOMIC_ACQUIRE);
    return k;
}

static void slow_stop(slow_clients *c)
{
    __atomic_store_n(&c->stop, 1, __ATOMIC_RELEASE);
    pthread_join(c->th, NULL);
    for (int i = 0; i < c->n; i++) close(c->fd[i]);
}

#define SLOW_HEADERS "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "

/* One request from 127.0.0.1: its status, or 0 when the server refused the
 * connection (closed it unanswered). */
static int try_chat(int port, char *text, size_t cap)
{
    int fd = connect_to(port);
    if (fd < 0) return 0;
    const char *body = USER_MSG("Once upon a time");
    send_request(fd, "POST", CHAT, KEY_B, body, strlen(body));
    size_t n;
    char *buf = read_raw(fd, NULL, &n);
    int status = 0;
    if (buf && sscanf(buf, "HTTP/1.%*d %d", &status) == 1 && status == 200 && text) {
        http_resp r = { 0 };
        parse_response(buf, n, &r);
        cJSON *j = json_of(&r);
        snprintf(text, cap, "%s", str_at(j, "choices.0.message.content"));
        cJSON_Delete(j), resp_free(&r);
    }
    free(buf);
    return status;
}

/* Eight connections from one address (127.0.0.2) sending headers a byte a
 * tick take what they can of --max-connections 8; with at most 4 from one
 * address, a client on another address (127.0.0.1) still gets its answer,
 * at the first try, long before any deadline (--header-timeout 600).
 * Before, the eight held every slot and the client was refused. */
Test(server, slow_header_clients_on_one_address_leave_room_for_others, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--max-connections", "8", "--max-connections-per-address", "4", "--header-timeout", "600", NULL };
    start(&s, "srv-slow-addr", extra);
    slow_clients c = { 0 };
    slow_start(&c, s.port, 2, 8, SLOW_HEADERS);
    slow_run(&c);
    char text[1024];
    int status = try_chat(s.port, text, sizeof text);
    cr_assert_eq(status, 200, "the legitimate client was refused (%d) while one address held the slots", status);
    for (int i = 0; i < 500 && slow_closed(&c) < 4; i++) usleep(10000);
    cr_assert_eq(slow_closed(&c), 4, "the four past the cap are refused, the four within it stay (their deadline is far)");
    slow_stop(&c);
    cr_assert_eq(stop(&s), 0);
}

/* A client trickling its headers, and one trickling its body (a byte a
 * tick: never idle, so libmicrohttpd's idle timeout never fires), are closed
 * at --header-timeout / --body-timeout (1 s) and counted; a prompt client on
 * the same server is unaffected.  Before, both stayed open for as long as
 * they trickled. */
Test(server, trickling_headers_or_body_are_cut_at_their_deadline, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--header-timeout", "1", "--body-timeout", "1", NULL };
    start(&s, "srv-slow-deadline", extra);
    slow_clients c = { 0 };
    slow_start(&c, s.port, 1, 1, SLOW_HEADERS);
    char head[512];
    snprintf(head, sizeof head,
             "POST " CHAT " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
             "Content-Length: 100000\r\n\r\n{\"messages\": [{\"role\": \"user\", \"content\": \"",
             KEY_A);
    slow_start(&c, s.port, 1, 1, head);
    slow_run(&c);
    /* 100 ticks trickled: ten times the deadline */
    for (int i = 0; i < 100 && slow_closed(&c) < 2; i++) usleep(SLOW_TICK_MS * 1000);
    cr_assert_eq(slow_closed(&c), 2, "a trickling client outlived its deadline (headers: %d, body: %d closed)", c.closed[0], c.closed[1]);
    slow_stop(&c);
    http_resp m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_eq(metric(m.body, "cacheprune_connections_cut_total{phase=\"headers\"}"), 1, "%s", m.body);
    cr_assert_eq(metric(m.body, "cacheprune_connections_cut_total{phase=\"body\"}"), 1);
    resp_free(&m);
    cr_assert_eq(try_chat(s.port, NULL, 0), 200);
    cr_assert_eq(stop(&s), 0);
}

/* A client that pipelines streamed requests and never reads (a receive
 * buffer of 2 KB) stops the server's writes once the socket's buffers are
 * full: the connection is closed --send-timeout (1 s) later and counted,
 * its slot and the engine free again.  Before, libmicrohttpd's 120 s idle
 * timeout held the slot, and the engine generated every request pipelined
 * behind the first. */
Test(server, a_client_that_stops_reading_is_cut_at_the_send_timeout, .timeout = TEST_TIMEOUT(180))
{
    server s;
    const char *extra[] = { "--send-timeout", "1", "--max-tokens-cap", "512", NULL };
    start(&s, "srv-send-timeout", extra);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    int small = 2048;
    cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s.port), .sin_addr.s_addr = htonl(0x7f000001) };
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me a long story about the fox.\"}], "
                       "\"max_tokens\": 512, \"temperature\": 1, \"stream\": true}";
    for (int i = 0; i < 8; i++) send_request(fd, "POST", CHAT, KEY_A, body, strlen(body));
    /* The socket buffers hold ~700 tokens' events (the server's 64 KB send
     * buffer, doubled by the kernel, at ~180 bytes an event): the cut can
     * come only once that many were generated, which on a loaded machine
     * (two test jobs, a sanitizer) takes tens of seconds.  Waited for up to
     * 120 s, scaled. */
    const int wait_s = TEST_TIMEOUT(120);
    const double cut = metric_reaching(s.port, "cacheprune_connections_cut_total{phase=\"send\"}", 1, wait_s * 10);
    cr_assert_eq(cut, 1, "a client that never read was not cut within %d s of a 1 s --send-timeout (cut in headers %g, body %g; tokens out %g)",
                 wait_s,
                 metric_now(s.port, "cacheprune_connections_cut_total{phase=\"headers\"}"),
                 metric_now(s.port, "cacheprune_connections_cut_total{phase=\"body\"}"), metric_now(s.port, "cacheprune_generated_tokens_total"));
    for (int i = 0; i < 300 && metric_now(s.port, "cacheprune_running_requests") > 0; i++) usleep(100000);
    cr_assert_eq(metric_now(s.port, "cacheprune_running_requests"), 0, "the engine kept generating for the cut connection");
    close(fd);
    cr_assert_eq(try_chat(s.port, NULL, 0), 200);
    cr_assert_eq(stop(&s), 0);
}

/* A body that goes silent before --body-timeout (30 s) meets
 * libmicrohttpd's idle timeout (--send-timeout, 1 s) first: the cut is
 * counted as the body's, where the connection was, not as an answer's
 * sending. */
Test(server, a_body_gone_silent_at_the_send_timeout_is_counted_as_the_bodys, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--send-timeout", "1", "--body-timeout", "30", NULL };
    start(&s, "srv-silent-body", extra);
    const int fd = connect_to(s.port);
    cr_assert_geq(fd, 0);
    char head[512];
    const int n = snprintf(head, sizeof head,
                           "POST " CHAT " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                           "Content-Length: 200\r\n\r\n{\"messages\": [",
                           KEY_A);
    cr_assert_eq(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
    /* 10 s: ten times the idle timeout, a third of the body deadline */
    const double body = metric_reaching(s.port, "cacheprune_connections_cut_total{phase=\"body\"}", 1, 100);
    const double send_cut = metric_now(s.port, "cacheprune_connections_cut_total{phase=\"send\"}");
    cr_assert_eq(body, 1, "the silent body was not counted as the body's (send: %g)", send_cut);
    cr_assert_eq(send_cut, 0, "the silent body was counted as an answer's sending");
    close(fd);
    cr_assert_eq(try_chat(s.port, NULL, 0), 200);
    cr_assert_eq(stop(&s), 0);
}

/* Trickling clients on two addresses, each at the per-address cap, hold all
 * eight slots; a legitimate client that retries (as clients do after a
 * refused connection) is served once the deadline (1 s) has cut them.
 * Before, the slots stayed held for as long as the trickle went on. */
Test(server, a_client_is_served_while_trickling_clients_hold_every_slot, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--max-connections", "8", "--max-connections-per-address", "4", "--header-timeout", "1", NULL };
    start(&s, "srv-slow-all", extra);
    slow_clients c = { 0 };
    slow_start(&c, s.port, 2, 4, SLOW_HEADERS);
    slow_start(&c, s.port, 3, 4, SLOW_HEADERS);
    slow_run(&c);
    int status = 0, tries = 0;
    while (status != 200 && tries++ < 100) { /* 100 tries a tick apart: ten times the deadline */
        status = try_chat(s.port, NULL, 0);
        if (status != 200) usleep(SLOW_TICK_MS * 1000);
    }
    cr_assert_eq(status, 200, "the client was never served while the slots were held (%d tries)", tries);
    slow_stop(&c);
    cr_assert_eq(stop(&s), 0);
}

/* With every one of --max-connections taken (four clients trickling their
 * headers), a new client's request is answered 503 with Retry-After and
 * Connection: close, and counted; once the slots free, it is served.
 * Before, libmicrohttpd reset the connection unanswered. */
Test(server, a_client_past_every_slot_gets_503_with_retry_after, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--max-connections", "4", "--max-connections-per-address", "0", "--header-timeout", "600", NULL };
    start(&s, "srv-over-cap", extra);
    slow_clients c = { 0 };
    slow_start(&c, s.port, 2, 4, SLOW_HEADERS);
    slow_run(&c);
    usleep(3 * SLOW_TICK_MS * 1000); /* every slow client accepted */
    int fd = connect_to(s.port);
    cr_assert_geq(fd, 0);
    const struct timeval wait = { .tv_sec = 5 }; /* a kept-alive connection would end the read here */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    const char *body = USER_MSG("Once upon a time");
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST " CHAT " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     KEY_B, strlen(body));
    send_all(fd, head, (size_t)n);
    send_all(fd, body, strlen(body));
    const double t0 = srv_test_now_ms();
    http_resp r = { 0 };
    read_response(fd, &r); /* to the connection's end */
    cr_assert_lt(srv_test_now_ms() - t0, 4000, "the 503's connection was kept alive");
    char v[64];
    cr_assert_eq(r.status, 503, "a client past every slot got %d", r.status);
    cr_assert(header(&r, "Retry-After", v, sizeof v) && atoi(v) >= 1, "%s", r.head);
    cr_assert(header(&r, "Connection", v, sizeof v) && strcasecmp(v, "close") == 0, "%s", r.head);
    cr_assert(r.body && strstr(r.body, "too_many_connections"), "%s", r.body ? r.body : "");
    resp_free(&r);
    cr_assert_eq(slow_closed(&c), 0, "the clients holding the slots were not touched");
    slow_stop(&c);
    int status = 0;
    for (int i = 0; i < 50 && status != 200; i++) /* the slots free as libmicrohttpd sees the closes */
        if ((status = try_chat(s.port, NULL, 0)) != 200) usleep(SLOW_TICK_MS * 1000);
    cr_assert_eq(status, 200);
    http_resp m = http(s.port, "GET", "/metrics", KEY_OP, NULL);
    cr_assert_geq(metric(m.body, "cacheprune_connections_over_cap_total"), 1, "%s", m.body);
    resp_free(&m);
    cr_assert_eq(stop(&s), 0);
}

/* SIGTERM while a client trickles a request's body (never accepted: it is
 * still arriving) closes that connection at once: the server drains what
 * it accepted and exits 0 well within --drain-seconds 3, though the body's
 * deadline is a minute away.  Before, the drain waited for the trickle,
 * gave up after 3 s and exited 1. */
Test(server, sigterm_does_not_wait_for_a_request_still_arriving, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--drain-seconds", "3", "--body-timeout", "60", NULL };
    start(&s, "srv-term-trickle", extra);
    slow_clients c = { 0 };
    char head[512];
    snprintf(head, sizeof head,
             "POST " CHAT " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
             "Content-Length: 100000\r\n\r\n{\"messages\": [{\"role\": \"user\", \"content\": \"",
             KEY_A);
    slow_start(&c, s.port, 1, 1, head);
    slow_run(&c);
    usleep(5 * SLOW_TICK_MS * 1000); /* its headers in, its body trickling */
    cr_assert_eq(slow_closed(&c), 0);
    cr_assert_eq(stop(&s), 0, "the drain waited for a request still arriving");
    slow_stop(&c);
}

/* A client that sends its request and half-closes (or closes) before its
 * turn gets no answer and costs nothing: never a 500 for a client that
 * left, nor a server error in /metrics.  And a request without max_tokens
 * on a small --kv-budget gets what the budget leaves, not a refusal for a
 * default it never asked for. */
Test(server, a_half_closed_request_is_dropped_quietly_and_a_default_fits_the_budget, .timeout = TEST_TIMEOUT(60))
{
    server s;
    const char *extra[] = { "--kv-budget", "1", "--max-tokens-cap", "1000", NULL };
    start(&s, "srv-half-close", extra);
    for (int i = 0; i < 3; i++) {
        int fd = connect_to(s.port);
        cr_assert_geq(fd, 0);
        const char *body = USER_MSG("Once upon a time");
        send_request(fd, "POST", CHAT, KEY_A, body, strlen(body));
        shutdown(fd, SHUT_WR);
        size_t n;
        char *raw = read_raw(fd, NULL, &n); /* nothing (dropped), or its answer if it ran first */
        int status = 0;
        if (raw && n) cr_assert_eq(sscanf(raw, "HTTP/1.%*d %d", &status), 1, "%s", raw);
        cr_assert(status == 0 || status == 200, "a half-closed request got %d: %s", status, raw ? raw : "");
        free(raw);
    }
    cr_assert_eq(metric_now(s.port, "cacheprune_requests_total{outcome=\"error\"}"), 0, "a client that left counted as a server error");
    http_resp fit = http(s.port, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}]}");
    cr_assert_eq(fit.status, 200, "a request without max_tokens was refused for the KV budget: %s", fit.body);
    resp_free(&fit);
    cr_assert_eq(stop(&s), 0);
}

/* ---- what a field or a header says, exactly ------------------------------------------------- */

/* OpenAI's "store": false is a no-store: the pool's segments and bytes stay
 * as they were, as for "cache": "no-store" (and "store": true stores as
 * usual).  Before, it was an unknown field and the request stored. */
Test(server, store_false_is_no_store, .timeout = TEST_TIMEOUT(60))
{
    server s;
    start(&s, "srv-store-false", NULL);
    cr_assert_eq(cached_of(s.port, &seq[2], NULL, NULL, 0), 0); /* something in the pool already */
    double segs = metric_now(s.port, "cacheprune_pool_segments"), bytes = metric_now(s.port, "cacheprune_pool_bytes");
    cr_assert_gt(segs, 0);
    cr_assert_eq(cached_of(s.port, &seq[0], "\"store\": false, ", NULL, 0), 0);
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_segments"), segs, "a store: false request inserted a segment");
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_bytes"), bytes);
    cr_assert_eq(metric_now(s.port, "cacheprune_no_store_requests_total"), 1);
    cr_assert_eq(cached_of(s.port, &seq[0], "\"store\": true, ", NULL, 0), 0);
    cr_assert_gt(metric_now(s.port, "cacheprune_pool_segments"), segs, "store: true stores as usual");
    expect_error(s.port, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"store\": \"no\"}", 400,
                 "invalid_request_error", "store", NULL, "store");
    cr_assert_eq(stop(&s), 0);
}

/* A privacy field in another case is refused, named as sent (before:
 * ignored, and the request stored); top_p 0, or a top_p too small for a
 * float, is the request's fault, named (before: a 400 with code
 * context_length_exceeded from the sampler); a raw control byte inside a
 * string is refused (before: taken); a null max_completion_tokens leaves
 * max_tokens in force. */
Test(server, privacy_fields_in_another_case_and_top_p_0_are_400_naming_them, .timeout = TEST_TIMEOUT(60))
{
    server s;
    start(&s, "srv-field-case", NULL);
#define HI "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
    expect_error(s.port, "POST", CHAT, KEY_A, HI "\"Cache\": \"no-store\"}", 400, "invalid_request_error", "Cache", NULL, "case-sensitive");
    expect_error(s.port, "POST", CHAT, KEY_A, HI "\"STORE\": false}", 400, "invalid_request_error", "STORE", NULL, "case-sensitive");
    expect_error(s.port, "POST", CHAT, KEY_A, HI "\"Sensitive\": true}", 400, "invalid_request_error", "Sensitive", NULL, "case-sensitive");
    expect_error(s.port, "POST", "/v1/completions", KEY_A, "{\"prompt\": \"hi\", \"cAcHe\": \"no-store\"}", 400, "invalid_request_error",
                 "cAcHe", NULL, "case-sensitive");
    expect_error(s.port, "POST", CHAT, KEY_A, HI "\"top_p\": 0}", 400, "invalid_request_error", "top_p", NULL, "top_p");
    /* above 0 as a double, 0 as the sampler's float */
    expect_error(s.port, "POST", CHAT, KEY_A, HI "\"top_p\": 1e-300}", 400, "invalid_request_error", "top_p", NULL, "top_p");
    /* a raw control byte inside a string is not JSON (RFC 8259): refused, as \\u0000 is */
    expect_error(s.port, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\x01b\"}]}", 400, "invalid_request_error",
                 NULL, NULL, "control byte");
    expect_error(s.port, "POST", CHAT, KEY_A, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\tb\"}]}", 400, "invalid_request_error",
                 NULL, NULL, "control byte");
    /* max_completion_tokens null is absent: max_tokens holds (before: the cap) */
    http_resp r = http(s.port, "POST", CHAT, KEY_A, HI "\"max_tokens\": 3, \"max_completion_tokens\": null, \"temperature\": 0, \"cache\": \"no-store\"}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    cJSON *j = json_of(&r);
    cr_assert_leq(num_at(j, "usage.completion_tokens"), 3, "max_tokens 3 beside a null max_completion_tokens: %s", r.body);
    cJSON_Delete(j), resp_free(&r);
#undef HI
    cr_assert_eq(metric_now(s.port, "cacheprune_pool_segments"), 0, "a refused request stored");
    cr_assert_eq(stop(&s), 0);
}

/* A request with the given raw header lines (each ending "\r\n"): its status. */
static int raw_status(int port, const char *headers, size_t hlen)
{
    int fd = connect_to(port);
    cr_assert_geq(fd, 0);
    const char *body = USER_MSG("Once upon a time");
    char head[256];
    int n = snprintf(head, sizeof head, "POST " CHAT " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    send_all(fd, head, (size_t)n);
    send_all(fd, headers, hlen);
    n = snprintf(head, sizeof head, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", strlen(body));
    send_all(fd, head, (size_t)n);
    send_all(fd, body, strlen(body));
    http_resp r = { 0 };
    read_response(fd, &r);
    int status = r.status;
    resp_free(&r);
    return status;
}

#define RAW(s) s, sizeof s - 1

/* Two Authorization headers, or a key followed by a NUL or holding a
 * control byte, are 401 whatever the key.  Before, the first header won
 * and a NUL cut the value silently, so both authenticated. */
Test(server, two_authorization_headers_or_control_bytes_are_401, .timeout = TEST_TIMEOUT(60))
{
    server s;
    start(&s, "srv-auth-forged", NULL);
    cr_assert_eq(raw_status(s.port, RAW("Authorization: Bearer " KEY_B "\r\n")), 200);
    cr_assert_eq(raw_status(s.port, RAW("Authorization: Bearer " KEY_B "\r\nAuthorization: Bearer " KEY_A "\r\n")), 401, "two keys");
    cr_assert_eq(raw_status(s.port, RAW("Authorization: Bearer " KEY_B "\r\nauthorization: Bearer " KEY_B "\r\n")), 401, "the same twice");
    cr_assert_eq(raw_status(s.port, RAW("Authorization: Bearer " KEY_B "\0junk\r\n")), 401, "a NUL after the key");
    cr_assert_eq(raw_status(s.port, RAW("Authorization: Bearer " KEY_B "\0junk\r\nX-After: 1\r\n")), 401, "a NUL, another header after");
    cr_assert_eq(raw_status(s.port, RAW("Authorization: Bearer " KEY_B "\x01\r\n")), 401, "a control byte after the key");
    cr_assert_eq(raw_status(s.port, RAW("Authorization: Bearer sk-bob-01234\x7f" "56789abcdefgh\r\n")), 401, "DEL inside");
    cr_assert_eq(raw_status(s.port, RAW("X-Before: 1\r\nAuthorization: Bearer " KEY_B "\r\nX-After: 2\r\n")), 200);
    /* the body's length said twice, even alike: a proxy framing by one and
     * the server by the other would split requests differently */
    char twice[256];
    int n = snprintf(twice, sizeof twice, "Authorization: Bearer " KEY_B "\r\nContent-Length: %zu\r\n", strlen(USER_MSG("Once upon a time")));
    cr_assert_eq(raw_status(s.port, twice, (size_t)n), 400, "two Content-Length headers");
    cr_assert_eq(stop(&s), 0);
}

/* the status lines in a whole exchange read until the server closed */
static int status_lines(const char *raw)
{
    int n = 0;
    for (const char *p = raw; (p = strstr(p, "HTTP/1.1 ")) != NULL; p++) n++;
    return n;
}

/* A body framed two ways -- Content-Length and Transfer-Encoding together,
 * a transfer coding other than chunked, a header name with a space -- is
 * refused at once and the connection closed after the one answer: a
 * request hidden in the body (read as the next one by whoever framed by
 * the other header) never runs.  Before, Content-Length + chunked served
 * both the outer request and the hidden one, and "gzip" waited 30 s for
 * a body. */
Test(server, a_body_framed_two_ways_is_refused_and_the_connection_closed, .timeout = TEST_TIMEOUT(60))
{
    server s;
    start(&s, "srv-framing", NULL);
    const char *body = USER_MSG("Once upon a time");
    char hidden[256], chunked[1024], req[2048];
    snprintf(hidden, sizeof hidden, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY_B "\r\nConnection: close\r\n\r\n");
    int cn = snprintf(chunked, sizeof chunked, "%zx\r\n%s\r\n0\r\n\r\n%s", strlen(body), body, hidden);
    int n = snprintf(req, sizeof req,
                     "POST " CHAT " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY_B "\r\nContent-Length: %d\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n%s", cn, chunked);
    int fd = connect_to(s.port);
    cr_assert_geq(fd, 0);
    send_all(fd, req, (size_t)n);
    size_t len;
    char *raw = read_raw(fd, NULL, &len);
    cr_assert(raw);
    cr_assert_eq(status_lines(raw), 1, "Content-Length with chunked: %d answers (the hidden request ran)", status_lines(raw));
    cr_assert(strncmp(raw, "HTTP/1.1 400", 12) == 0, "Content-Length with chunked: %.40s", raw);
    free(raw);
    static const char *const codings[] = { "gzip", "gzip, chunked", "identity" };
    for (size_t i = 0; i < sizeof codings / sizeof *codings; i++) {
        n = snprintf(req, sizeof req, "POST " CHAT " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY_B
                     "\r\nTransfer-Encoding: %s\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n", codings[i], strlen(body), body);
        fd = connect_to(s.port);
        cr_assert_geq(fd, 0);
        send_all(fd, req, (size_t)n);
        const double t0 = srv_test_now_ms();
        raw = read_raw(fd, NULL, &len);
        cr_assert(raw);
        cr_assert(strncmp(raw, "HTTP/1.1 501", 12) == 0, "Transfer-Encoding: %s: %.40s", codings[i], raw);
        cr_assert_eq(status_lines(raw), 1, "Transfer-Encoding: %s", codings[i]);
        cr_assert_lt(srv_test_now_ms() - t0, 5000.0, "Transfer-Encoding: %s: the answer waited for a body", codings[i]);
        free(raw);
    }
    char spaced[128];
    n = snprintf(spaced, sizeof spaced, "Authorization: Bearer " KEY_B "\r\nX-Length : 5\r\n");
    cr_assert_eq(raw_status(s.port, spaced, (size_t)n), 400, "a header name with a space");
    /* each refusal is the client's fault, not counted as a server error */
    cr_assert_eq(metric_now(s.port, "cacheprune_requests_total{outcome=\"error\"}"), 0, "a 501 for a transfer coding counted as a server error");
    cr_assert_eq(metric_now(s.port, "cacheprune_requests_total{outcome=\"bad_request\"}"), 5);
    cr_assert_eq(stop(&s), 0);
}

/* Fields asking for what the server does not give (log probabilities,
 * tool calls, echo, JSON mode, token biases, penalties, options of a stream
 * not asked for) are 400 naming the field, not a 200 that silently lacks
 * it; at their defaults they pass. */
Test(server, unsupported_openai_fields_are_400_naming_them, .timeout = TEST_TIMEOUT(60))
{
    server s;
    start(&s, "srv-unsupported", NULL);
    static const struct { const char *path, *body, *param; } bad[] = {
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"logprobs\": true}", "logprobs" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"top_logprobs\": 5}", "top_logprobs" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"tools\": [{\"type\": \"function\"}]}", "tools" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"response_format\": {\"type\": \"json_object\"}}",
          "response_format" },
        { "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"echo\": true}", "echo" },
        { "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"best_of\": 3}", "best_of" },
        { "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"suffix\": \"end\"}", "suffix" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"logit_bias\": {\"50256\": -100}}", "logit_bias" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"presence_penalty\": 1.5}", "presence_penalty" },
        { "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"frequency_penalty\": -0.5}", "frequency_penalty" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"stream_options\": {\"include_usage\": true}}",
          "stream_options" }, /* without "stream": true */
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"tools\": {}}", "tools" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"logprobs\": {}}", "logprobs" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"logit_bias\": []}", "logit_bias" },
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"logit_bias\": 0}", "logit_bias" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        http_resp r = http(s.port, "POST", bad[i].path, KEY_A, bad[i].body);
        cr_assert_eq(r.status, 400, "%s: %d", bad[i].param, r.status);
        cJSON *j = json_of(&r);
        const cJSON *param = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "param");
        cr_assert(cJSON_IsString(param) && strcmp(param->valuestring, bad[i].param) == 0, "%s: the error names another field", bad[i].param);
        cJSON_Delete(j);
        resp_free(&r);
    }
    http_resp r = http(s.port, "POST", CHAT, KEY_A,
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"logprobs\": false, \"tools\": [], "
                       "\"tool_choice\": \"none\", \"response_format\": {\"type\": \"text\"}, \"logit_bias\": {}, \"presence_penalty\": 0, "
                       "\"frequency_penalty\": 0, \"stream_options\": null}");
    cr_assert_eq(r.status, 200, "the defaults: %d", r.status);
    resp_free(&r);
    r = http(s.port, "POST", "/v1/completions", KEY_A, "{\"prompt\": \"hi\", \"max_tokens\": 2, \"best_of\": 1, \"logprobs\": 0, \"suffix\": null}");
    cr_assert_eq(r.status, 200, "the completion defaults: %d", r.status);
    resp_free(&r);
    cr_assert_eq(stop(&s), 0);
}

/* ---- what a request leaves in the server's memory ------------------------------------------- */

/* Copies of each of needles[0..n) in the writable memory of process pid
 * (heap, stacks, anonymous maps: where a request's buffers live) into
 * copies[], read through /proc/PID/mem (a parent may read its child's
 * memory); returns their sum. */
static int copies_in_memory(pid_t pid, const char *const *needles, int n_needles, int *copies)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *maps = fopen(path, "r");
    cr_assert(maps, "cannot read %s", path);
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    int mem = open(path, O_RDONLY);
    cr_assert_geq(mem, 0, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 0;
    char line[1024], *buf = NULL;
    int sum = 0;
    for (int i = 0; i < n_needles; i++) copies[i] = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long a, b;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) != 3 || perms[0] != 'r' || perms[1] != 'w') continue;
        size_t n = b - a;
        /* the pool's slab, the batch's workspace, a sanitizer's shadow: not
         * where a request's buffers live (malloc's arenas are at most 64 MB),
         * and reading their untouched pages would make the server fault them in */
        if (n > ((size_t)64 << 20)) continue;
        if (n > cap) {
            free(buf);
            cap = n;
            buf = malloc(cap);
            cr_assert(buf);
        }
        ssize_t got = pread(mem, buf, n, (off_t)a);
        if (got <= 0) continue; /* a guard page */
        for (int i = 0; i < n_needles; i++)
            for (const char *p = buf, *end = buf + got; (p = memmem(p, (size_t)(end - p), needles[i], strlen(needles[i]))); p++)
                copies[i]++, sum++;
    }
    free(buf);
    close(mem);
    fclose(maps);
    return sum;
}

/* Every path a request can end by — answered whole, streamed, no-store,
 * a completion, refused at parsing, refused past the context before the
 * queue, its client leaving mid-stream — leaves no copy of its prompt text
 * in the server's memory once it ended: the body (ours and libmicrohttpd's
 * read buffer), the JSON tree, the rendered and tokenized prompt and its
 * working copies, the detector's request lines are wiped before they are
 * freed: the server's memory is read after each request.  Before, 58-64
 * copies of the phrase stayed after each (237 after the one past the
 * context), the request refused at parsing aside.  (A copy whose memory
 * was reused before the scan is not one this can see.) */
Test(server, no_copy_of_a_prompt_stays_in_memory_after_its_request, .timeout = TEST_TIMEOUT(120))
{
    server s;
    start(&s, "srv-wipe", NULL);
    static const char *const path[] = { "whole", "streamed", "nostore", "completion", "badfield", "pastcontext", "leftmidstream" };
    enum { N_PATHS = 7 };
    /* each prompt a phrase of its own, 30 times over (80: past the context):
     * a freed block the allocator splits or reuses in part still shows the
     * rest of its copies */
    char needle[N_PATHS][128], *prompt[N_PATHS], body[16384];
    for (int i = 0; i < N_PATHS; i++) {
        snprintf(needle[i], sizeof needle[i], "the heron Falstrom counted %s coins beneath the quiet mill", path[i]);
        int reps = i == 5 ? 80 : 30;
        prompt[i] = malloc((size_t)reps * 128);
        cr_assert(prompt[i]);
        size_t n = 0;
        for (int k = 0; k < reps; k++) n += (size_t)sprintf(prompt[i] + n, "%s. ", needle[i]);
    }
    const char *fmt = "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 4, \"temperature\": 0%s}";
    static const char *const extra[] = { "", ", \"stream\": true", ", \"cache\": \"no-store\"", NULL, ", \"top_p\": 7", "" };
    static const int want[] = { 200, 200, 200, 200, 400, 400 };
    for (int i = 0; i < N_PATHS; i++) {
        if (i == 3) snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 4}", prompt[i]);
        else if (i < 6) snprintf(body, sizeof body, fmt, prompt[i], extra[i]);
        else snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 200, \"stream\": true}",
                      prompt[i]);
        if (i < 6) {
            http_resp r = http(s.port, "POST", i == 3 ? "/v1/completions" : CHAT, i % 2 ? KEY_B : KEY_A, body);
            cr_assert_eq(r.status, want[i], "%s: %s", path[i], r.body);
            if (i == 5) cr_assert(strstr(r.body, "context_length_exceeded"), "%s", r.body);
            resp_free(&r);
        } else { /* a stream whose client leaves after its first token */
            int fd = connect_to(s.port);
            cr_assert_geq(fd, 0);
            send_request(fd, "POST", CHAT, KEY_B, body, strlen(body));
            size_t n;
            free(wait_first_token(fd, 1, &n));
            close(fd);
        }
        free(prompt[i]);
        /* the request over (one whose client left stops at its next token),
         * then its phrase's tail — the allocator writes its own list
         * pointers over the first 16 bytes of a freed block, not over the
         * rest — looked for in the server's memory */
        cr_assert(wait_metric_line(s.port, "cacheprune_running_requests 0\n"));
        const char *tail = strstr(needle[i], "counted");
        int copies = 0;
        for (int t = 0; t < 10 && copies_in_memory(s.pid, &tail, 1, &copies) > 0; t++) usleep(100000); /* its threads' last frees */
        cr_expect_eq(copies, 0, "%d copies of the prompt of a request ended %s stay in the server's memory", copies, path[i]);
    }
    /* nor a single word of them: a tokenizer cache kept across requests
     * would hold every short pre-token it saw ("Falstrom" was in each) */
    const char *word = "Falstrom";
    int copies = 0;
    copies_in_memory(s.pid, &word, 1, &copies);
    cr_expect_eq(copies, 0, "%d copies of a word of the prompts stay in the server's memory", copies);
    cr_assert_eq(stop(&s), 0);
}

/* A request the server answers before it reads the body -- a wrong key, an
 * unknown path, a method a path does not take, no Host, a body over
 * --max-body -- leaves neither its body nor its key in the server's memory
 * once its connection is closed: the headers and whatever of the body had
 * arrived sit in libmicrohttpd's connection buffer, which was freed
 * unwiped (one copy of each stayed after every such request). */
Test(server, no_copy_of_a_refused_request_stays_in_memory, .timeout = TEST_TIMEOUT(120))
{
    server s;
    start(&s, "srv-wipe-refused", NULL);
    static const char *const path[] = { "wrongkey", "unknownpath", "wrongmethod", "nohost", "toolarge" };
    static const int want[] = { 401, 404, 405, 400, 413 };
    for (int i = 0; i < 5; i++) {
        char needle[128], body[4096], key[64], head[1024];
        snprintf(needle, sizeof needle, "the otter Quillane hid %s pearls under the lock gate", path[i]);
        snprintf(key, sizeof key, "sk-zz%s-0123456789abcdef", path[i]);
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s. %s.\"}], \"max_tokens\": 4}", needle, needle);
        const size_t blen = strlen(body);
        int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\n%sConnection: close\r\nAuthorization: Bearer %s\r\n"
                         "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                         i == 2 ? "PUT" : "POST", i == 1 ? "/v1/chat/completion" : CHAT, i == 3 ? "" : "Host: 127.0.0.1\r\n",
                         i == 0 ? key : KEY_A, i == 4 ? (size_t)1 << 30 : blen);
        int fd = connect_to(s.port);
        cr_assert_geq(fd, 0);
        send_all(fd, head, (size_t)n);
        send_all(fd, body, blen);
        http_resp r = { 0 };
        read_response(fd, &r);
        cr_assert_eq(r.status, want[i], "%s: %d %s", path[i], r.status, r.body);
        resp_free(&r);
        const char *what[2] = { strstr(needle, "hid"), key };
        int copies[2] = { 0, 0 };
        for (int t = 0; t < 20 && copies_in_memory(s.pid, what, i == 0 ? 2 : 1, copies) > 0; t++) usleep(100000); /* the connection's close */
        cr_expect_eq(copies[0], 0, "%d copies of the body of a request refused (%s) stay in the server's memory", copies[0], path[i]);
        if (i == 0) cr_expect_eq(copies[1], 0, "%d copies of a wrong key stay in the server's memory", copies[1]);
    }
    /* refused as JSON cJSON cannot take (a trailing comma: the tree it
     * built up to there is freed inside cJSON), or that parses but is not
     * the request (bytes after the value, an unknown purge field) */
    static const char *const bad[][3] = {
        { CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"},], \"max_tokens\": 4}", "trailingcomma" },
        { "/v1/completions", "{\"prompt\": \"%s\", \"max_tokens\": 4} x", "afterthevalue" },
        { PURGE, "{\"tenant\": \"alice\", \"note\": \"%s\"}", "purgefield" },
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        char phrase[128], text[4096], req[4600];
        snprintf(phrase, sizeof phrase, "the stoat Varrick buried %s acorns", bad[b][2]);
        size_t n = 0;
        for (int k = 0; k < 20; k++) n += (size_t)snprintf(text + n, sizeof text - n, "%s. ", phrase);
        snprintf(req, sizeof req, bad[b][1], text);
        http_resp rb = http(s.port, "POST", bad[b][0], b == 2 ? KEY_OP : KEY_A, req);
        cr_assert_eq(rb.status, 400, "%s: %d %s", bad[b][2], rb.status, rb.body);
        resp_free(&rb);
        const char *t = strstr(phrase, "Varrick");
        int c = 0;
        for (int k = 0; k < 20 && copies_in_memory(s.pid, &t, 1, &c) > 0; k++) usleep(100000);
        cr_expect_eq(c, 0, "%d copies of a body refused as JSON (%s) stay in the server's memory", c, bad[b][2]);
    }
    /* refused at parsing, with the value it refused quoted in the error:
     * the message, the error's JSON tree and its printing leave no copy */
    const char *role = "weasel Ormsby amber keys";
    char body[512];
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"%s\", \"content\": \"hello\"}], \"max_tokens\": 4}", role);
    http_resp r = http(s.port, "POST", CHAT, KEY_A, body);
    cr_assert_eq(r.status, 400, "%s", r.body);
    cr_assert(strstr(r.body, role), "the error does not quote the refused role: %s", r.body);
    resp_free(&r);
    const char *tail = strstr(role, "Ormsby");
    int copies = 0;
    for (int t = 0; t < 20 && copies_in_memory(s.pid, &tail, 1, &copies) > 0; t++) usleep(100000);
#ifndef __SANITIZE_ADDRESS__
    /* under AddressSanitizer one copy of this body's middle stays in a
     * connection thread's stack (its frames are laid out apart, so what an
     * unsanitized build overwrites stays): the promise is the release
     * build's */
    cr_expect_eq(copies, 0, "%d copies of a refused value quoted in its error stay in the server's memory", copies);
#endif
    cr_assert_eq(stop(&s), 0);
}
