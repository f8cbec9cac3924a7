/* The optional NER plugin (engine/detect/detect_ner.c, plugins/ner/):
 * configured but unavailable -- its script, its npm package or node
 * missing, or a first request unanswered -- it is refused with a message
 * that says which, and `run` / `serve` refuse to start (never a silent run
 * without it).  The folders here are fakes: a ner.mjs written for the test
 * (the protocol in a few lines, or an immediate exit) and an empty
 * node_modules/compromise/package.json standing for the package.  The
 * tests named real_plugin_* run this tree's plugins/ner/ner.mjs over the
 * compromise that make deps installed, and skip, saying so, without it. */
#define _DEFAULT_SOURCE /* realpath */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../engine/detect/detect.h"
#include "helpers.h"

static int have_node(void) { return test_sh("command -v node > /dev/null 2>&1") == 0; }

/* a plugin folder: ner.mjs with `script` (NULL: none), the package's
 * marker file if `package` */
static const char *fake_dir(const char *name, const char *script, int package, char *dir, size_t cap)
{
    char path[1024];
    test_tmpdir(dir, cap, name);
    if (script) {
        snprintf(path, sizeof path, "%s/ner.mjs", dir);
        cr_assert(write_bytes(path, script, strlen(script)));
    }
    if (package) {
        snprintf(path, sizeof path, "%s/node_modules", dir);
        mkdir(path, 0755);
        snprintf(path, sizeof path, "%s/node_modules/compromise", dir);
        mkdir(path, 0755);
        snprintf(path, sizeof path, "%s/node_modules/compromise/package.json", dir);
        cr_assert(write_bytes(path, "{}\n", 3));
    }
    return dir;
}

/* protocol v2 in a few lines: every "Zed" is a person */
static const char ECHO_NER[] =
    "import { createInterface } from 'node:readline';\n"
    "createInterface({ input: process.stdin }).on('line', (l) => {\n"
    "  const r = JSON.parse(l), spans = [];\n"
    "  for (let i = r.text.indexOf('Zed'); i >= 0; i = r.text.indexOf('Zed', i + 1))\n"
    "    spans.push({ start: i, end: i + 3, type: 'person', score: 0.7 });\n"
    "  process.stdout.write(JSON.stringify({ id: r.id, spans }) + '\\n');\n"
    "});\n";

Test(ner, unavailable_plugin_is_refused_with_the_reason)
{
    char dir[512];
    cp_detector *d = NULL;
    cp_error err = { 0 };
    /* no script */
    fake_dir("ner-noscript", NULL, 1, dir, sizeof dir);
    cr_assert_eq(cp_detector_ner("node", dir, 2000, &d, &err), CP_EIO);
    cr_assert(strstr(err.msg, "ner.mjs not found"), "%s", err.msg);
    cr_assert_null(d);
    /* no npm package: the message says how to install it */
    fake_dir("ner-nopkg", ECHO_NER, 0, dir, sizeof dir);
    cr_assert_eq(cp_detector_ner("node", dir, 2000, &d, &err), CP_EIO);
    cr_assert(strstr(err.msg, "compromise is not installed") && strstr(err.msg, "npm ci"), "%s", err.msg);
    /* no node */
    fake_dir("ner-nonode", ECHO_NER, 1, dir, sizeof dir);
    cr_assert_neq(cp_detector_ner("/nonexistent/node", dir, 2000, &d, &err), CP_OK);
    cr_assert(strstr(err.msg, "cannot start") && strstr(err.msg, "Node.js"), "%s", err.msg);
    if (!have_node()) return;
    /* a plugin that dies before answering (a broken install) */
    fake_dir("ner-dies", "process.exit(3);\n", 1, dir, sizeof dir);
    cr_assert_neq(cp_detector_ner("node", dir, 2000, &d, &err), CP_OK);
    cr_assert(strstr(err.msg, "did not answer its first request"), "%s", err.msg);
    cr_assert_null(d);
}

Test(ner, available_plugin_is_in_the_chain, .timeout = TEST_TIMEOUT(60))
{
    if (!have_node()) cr_skip_test("node is not installed");
    char dir[512];
    cp_detector *d = NULL;
    cp_error err = { 0 };
    fake_dir("ner-ok", ECHO_NER, 1, dir, sizeof dir);
    cr_assert_eq(cp_detector_ner("node", dir, 5000, &d, &err), CP_OK, "%s", err.msg);
    cr_assert_str_eq(d->name, "ner");
    cp_detect_chain c;
    cp_chain_init(&c);
    cr_assert_eq(cp_chain_add(&c, d, &err), CP_OK);
    cp_spans s = { 0 };
    cr_assert_eq(cp_chain_detect(&c, "ask Zed now", 11, CP_ROLE_USER, &s, &err), CP_OK);
    cr_assert(!s.wholly && s.n == 1 && s.v[0].start == 4 && s.v[0].end == 7, "%zu spans", s.n);
    cp_spans_free(&s);
    cp_chain_free(&c);
}

/* `run` and `serve` with --ner-dir on a folder without the package: exit
 * 1 with the message, before any request is read or any port opened */
Test(ner, run_and_serve_refuse_to_start_without_it, .timeout = TEST_TIMEOUT(120))
{
    require_kit();
    char dir[512], model[512], args[4096], out[8192], keys[700], req[700], res[700];
    shared_path(model, sizeof model, "models/cp-books-6m");
    fake_dir("ner-cli", ECHO_NER, 0, dir, sizeof dir);
    snprintf(req, sizeof req, "%s/req.jsonl", dir);
    snprintf(res, sizeof res, "%s/out.jsonl", dir);
    const char *line = "{\"tenant\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"hi Zed\"}],\"max_tokens\":1}\n";
    cr_assert(write_bytes(req, line, strlen(line)));
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s --out %s --ner-dir %s", model, req, res, dir);
    int rc = test_cli_output(args, out, sizeof out);
    cr_assert_eq(rc, 1, "run: exit %d: %s", rc, out);
    cr_assert(strstr(out, "NER plugin") && strstr(out, "compromise is not installed"), "run: %s", out);
    struct stat st;
    cr_assert(stat(res, &st) != 0 || st.st_size == 0, "run wrote results without the NER plugin");
    snprintf(keys, sizeof keys, "%s/keys", dir);
    const char *k = "0123456789abcdef0123 alice\n";
    cr_assert(write_bytes(keys, k, strlen(k)));
    chmod(keys, 0600);
    /* a serve that started would listen until the test's timeout fails it */
    snprintf(args, sizeof args, "serve --model %s --keys %s --port 0 --ner-dir %s", model, keys, dir);
    rc = test_cli_output(args, out, sizeof out);
    cr_assert_eq(rc, 1, "serve: exit %d: %s", rc, out);
    cr_assert(strstr(out, "NER plugin") && strstr(out, "compromise is not installed"), "serve: %s", out);
}

/* `$CP_BIN ARGS` with CP_NER_DIR (and PATH, when path is not NULL) set: its
 * output and exit status */
static int cli_with_ner_dir(const char *ner_dir, const char *path, const char *args, char *out, size_t cap)
{
    char env[2048];
    snprintf(env, sizeof env, "CP_NER_DIR='%s'%s%s%s", ner_dir, path ? " PATH='" : "", path ? path : "", path ? "'" : "");
    return test_cli_output_env(env, args, out, cap);
}

/* The default chain takes the NER plugin where make deps installed it (the
 * folder the default looks in is $CP_NER_DIR here, plugins/ner otherwise),
 * leaves it out with --no-ner or where the package is not installed, and
 * refuses to start, saying why, where it is installed but cannot start.
 * "aZed" is lowercase-first, so only the stand-in plugin finds its "Zed",
 * at bytes [7, 10) of "i met aZed". */
Test(ner, on_by_default_where_installed, .timeout = TEST_TIMEOUT(60))
{
    if (!have_node()) cr_skip_test("node is not installed");
    char dir[512], nopkg[512], out[8192];
    fake_dir("ner-default", ECHO_NER, 1, dir, sizeof dir);
    fake_dir("ner-default-nopkg", ECHO_NER, 0, nopkg, sizeof nopkg);
    static const char found[] = "{\"spans\":[{\"start\":7,\"end\":10,\"type\":\"person\"";
    int rc = cli_with_ner_dir(dir, NULL, "detect --json 'i met aZed'", out, sizeof out);
    cr_assert(rc == 0 && strstr(out, found), "installed: exit %d: %s", rc, out);
    rc = cli_with_ner_dir(dir, NULL, "detect --json --no-ner 'i met aZed'", out, sizeof out);
    cr_assert(rc == 0 && strstr(out, "{\"spans\":[]"), "--no-ner: exit %d: %s", rc, out);
    rc = cli_with_ner_dir(nopkg, NULL, "detect --json 'i met aZed'", out, sizeof out);
    cr_assert(rc == 0 && strstr(out, "{\"spans\":[]"), "not installed: exit %d: %s", rc, out);
    /* installed, but no node on PATH: refused, never a run without it */
    rc = cli_with_ner_dir(dir, "/nonexistent", "detect --json 'i met aZed'", out, sizeof out);
    cr_assert(rc != 0 && strstr(out, "on by default") && strstr(out, "--no-ner") && !strstr(out, "spans"),
              "no node: exit %d: %s", rc, out);
}

/* ---- the real plugin: this tree's plugins/ner/ner.mjs over compromise ------ */

/* A folder with a copy of this tree's plugins/ner/ner.mjs and a link to an
 * installed node_modules: $CP_NER_MODULES, else plugins/ner/node_modules of
 * this tree (make deps).  A copy, so that the script under test is this
 * tree's even where the package is installed elsewhere (a mutation worktree).
 * NULL, with the reason in why, without node or the package. */
static const char *real_dir(const char *name, char *dir, size_t cap, char *why, size_t wcap)
{
    const char *mods = getenv("CP_NER_MODULES");
    char abs[4096], path[1024], pkg[4200];
    if (!mods || !*mods) mods = "plugins/ner/node_modules";
    snprintf(pkg, sizeof pkg, "%s/compromise/package.json", mods);
    if (!have_node()) return snprintf(why, wcap, "node is not installed (make deps)"), NULL;
    if (access(pkg, R_OK) != 0 || !realpath(mods, abs))
        return snprintf(why, wcap, "compromise is not installed in %s (make deps, or CP_NER_MODULES=DIR)", mods), NULL;
    size_t n = 0;
    char *js = read_text("plugins/ner/ner.mjs", &n);
    cr_assert(js, "plugins/ner/ner.mjs: cannot read (the tests run from the repository root)");
    test_tmpdir(dir, cap, name);
    snprintf(path, sizeof path, "%s/ner.mjs", dir);
    cr_assert(write_bytes(path, js, n));
    free(js);
    snprintf(path, sizeof path, "%s/node_modules", dir);
    unlink(path);
    cr_assert_eq(symlink(abs, path), 0, "%s -> %s", path, abs);
    return dir;
}

/* the real plugin as a detector, started and probed; skips without it */
#define REAL_NER(name, timeout_ms, d)                                                                                   \
    do {                                                                                                               \
        char dir_[512], why_[512];                                                                                     \
        cp_error e_ = { 0 };                                                                                           \
        if (!real_dir(name, dir_, sizeof dir_, why_, sizeof why_)) cr_skip_test("the real NER plugin: %s", why_);      \
        cr_assert_eq(cp_detector_ner("node", dir_, timeout_ms, &(d), &e_), CP_OK, "%s", e_.msg);                       \
    } while (0)

/* the one live child of this process (the plugin's node), or -1 */
static long child_pid(void)
{
    DIR *dir = opendir("/proc");
    cr_assert(dir);
    long found = -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        char *end, path[300], buf[512];
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = 0;
        const char *rp = strrchr(buf, ')');
        char state;
        long ppid;
        if (rp && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == (long)getpid() && state != 'Z' && state != 'X')
            found = pid, n++;
    }
    closedir(dir);
    return n == 1 ? found : -1;
}

/* text through a chain holding d alone: its spans as "type:start-end ..."
 * (the byte offsets of each), and whether it failed closed */
static int chain_spans(cp_detect_chain *c, const char *text, char *got, size_t cap)
{
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_eq(cp_chain_detect(c, text, strlen(text), CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
    size_t w = 0;
    got[0] = 0;
    for (size_t i = 0; i < s.n && w < cap; i++)
        w += (size_t)snprintf(got + w, cap - w, "%s%s:%u-%u", i ? " " : "", s.v[i].type, s.v[i].start, s.v[i].end);
    int wholly = s.wholly;
    cp_spans_free(&s);
    return wholly;
}

/* "type:a-b" for the bytes of `what` inside `text` (found by strstr: the
 * golden offsets are the C string's own byte positions) */
static void span_of(const char *text, const char *what, const char *type, char *out, size_t cap)
{
    const char *at = strstr(text, what);
    cr_assert(at, "'%s' is not in '%s'", what, text);
    snprintf(out, cap, "%s:%ld-%ld", type, (long)(at - text), (long)(at - text + (long)strlen(what)));
}

/* a lowercase name, a lowercase place and a firm that compromise finds and
 * the built-ins (formats + names) do not: the plugin is what adds them */
Test(ner, real_plugin_finds_what_the_builtins_miss, .timeout = TEST_TIMEOUT(60))
{
    cp_detector *ner = NULL, *b = NULL, *nm = NULL;
    REAL_NER("ner-real-finds", 5000, ner);
    cp_detect_chain with, without;
    cp_error err = { 0 };
    cp_chain_init(&with);
    cp_chain_init(&without);
    cr_assert_eq(cp_chain_add(&with, ner, &err), CP_OK);
    cr_assert_eq(cp_detector_builtin(&b, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_add(&without, b, &err), CP_OK);
    cr_assert_eq(cp_detector_names(&nm, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_add(&without, nm, &err), CP_OK);
    static const char *const cases[][3] = {
        { "i talked to john smith yesterday", "john smith", "person" },
        { "we flew to paris last week", "paris", "location" },
        { "the report from microsoft was late", "microsoft", "org" },
    };
    char got[512], want[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        span_of(cases[i][0], cases[i][1], cases[i][2], want, sizeof want);
        cr_assert(!chain_spans(&with, cases[i][0], got, sizeof got) && strcmp(got, want) == 0, "ner on '%s': '%s', want '%s'",
                  cases[i][0], got, want);
        cr_assert(!chain_spans(&without, cases[i][0], got, sizeof got) && !got[0], "built-ins on '%s': '%s' (the case "
                  "no longer shows what the plugin adds)", cases[i][0], got);
    }
    cp_chain_free(&with);
    cp_chain_free(&without);
}

/* UTF-16 code units (JavaScript's offsets) become UTF-8 bytes: an emoji and
 * a CJK extension B character are 2 units and 4 bytes, É and 田 1 unit and 2
 * / 3 bytes; compromise's span of "😀john smith😀" takes in the trailing
 * emoji, which the plugin trims without splitting its surrogate pair, and
 * its span of "Nils Nakamura) But" a closing bracket and a word, cut. */
Test(ner, real_plugin_offsets_are_utf8_bytes_outside_the_bmp, .timeout = TEST_TIMEOUT(60))
{
    cp_detector *ner = NULL;
    REAL_NER("ner-real-utf8", 5000, ner);
    cp_detect_chain c;
    cp_error err = { 0 };
    cp_chain_init(&c);
    cr_assert_eq(cp_chain_add(&c, ner, &err), CP_OK);
    static const char *const cases[][7] = {
        { "\xF0\x9F\x98\x80 \xC3\x89mile Zola met John Smith in Paris.", "\xC3\x89mile Zola", "person", "John Smith", "person",
          "Paris", "location" },
        { "\xF0\xA0\xAE\xB7 and \xF0\x9F\x98\x80\xF0\x9F\x98\x80 then john smith went to paris", "john smith", "person", "paris",
          "location", NULL, NULL },
        { "\xF0\x9F\x98\x80john smith\xF0\x9F\x98\x80", "john smith", "person", NULL, NULL, NULL, NULL },
        { "Ask \xF0\xA0\xAE\xB7\xE7\x94\xB0 about Tanaka Hiroshi", "Tanaka", "person", NULL, NULL, NULL, NULL },
        /* compromise's term runs past the bracket ("Nils Nakamura) But"):
         * cut where it closes, kept whole where the term opened it */
        { "\xF0\x9F\x98\x80 (my name is Nils Nakamura) But he left", "Nils Nakamura", "person", NULL, NULL, NULL, NULL },
        { "Ask John (Jack) Smith today", "John (Jack) Smith", "person", NULL, NULL, NULL, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char want[512] = "", one[128], got[512];
        for (int k = 1; k < 7 && cases[i][k]; k += 2) {
            span_of(cases[i][0], cases[i][k], cases[i][k + 1], one, sizeof one);
            strcat(want, want[0] ? " " : "");
            strcat(want, one);
        }
        cr_assert(!chain_spans(&c, cases[i][0], got, sizeof got) && strcmp(got, want) == 0, "case %zu: '%s', want '%s'", i, got, want);
    }
    cp_chain_free(&c);
}

/* One process answers every message (protocol v2: one line each way, the
 * ids matched by the engine): 120 messages, right each time, the same
 * child throughout. */
Test(ner, real_plugin_answers_many_messages_in_one_process, .timeout = TEST_TIMEOUT(60))
{
    cp_detector *ner = NULL;
    REAL_NER("ner-real-many", 5000, ner);
    cp_detect_chain c;
    cp_error err = { 0 };
    cp_chain_init(&c);
    cr_assert_eq(cp_chain_add(&c, ner, &err), CP_OK);
    long pid = child_pid();
    cr_assert_gt(pid, 0, "the plugin's child is not found");
    static const char *const texts[][3] = {
        { "i talked to john smith yesterday", "john smith", "person" },
        { "nothing to see here", NULL, NULL },
        { "we flew to paris last week", "paris", "location" },
        { "the report from microsoft was late", "microsoft", "org" },
    };
    char got[512], want[128];
    for (int i = 0; i < 120; i++) {
        const char *const *t = texts[i % 4];
        want[0] = 0;
        if (t[1]) span_of(t[0], t[1], t[2], want, sizeof want);
        cr_assert(!chain_spans(&c, t[0], got, sizeof got) && strcmp(got, want) == 0, "message %d: '%s', want '%s'", i, got, want);
    }
    cr_assert_eq(child_pid(), pid, "the plugin was restarted (one process should answer every message)");
    cr_assert_eq(c.failures, 0);
    cp_chain_free(&c);
}

/* ~35 KB of prose: compromise takes about a second on it (far over the
 * timeouts below, far under the crash test's) */
static char *long_text(void)
{
    static const char unit[] = "John Smith met Mary Jones in Paris and they talked about the weather for a long while. ";
    size_t n = 400, u = sizeof unit - 1;
    char *t = malloc(n * u + 1);
    cr_assert(t);
    for (size_t i = 0; i < n; i++) memcpy(t + i * u, unit, u);
    t[n * u] = 0;
    return t;
}

typedef struct killer {
    long pid;
    long after_ms;
} killer;

static void *kill_later(void *arg)
{
    const killer *k = arg;
    struct timespec t = { k->after_ms / 1000, (k->after_ms % 1000) * 1000000L };
    nanosleep(&t, NULL);
    kill((pid_t)k->pid, SIGKILL);
    return NULL;
}

/* node killed while it works on a message: that message fails closed
 * (wholly sensitive, counted), and the next one is answered by a new child. */
Test(ner, real_plugin_crash_mid_message_fails_closed_and_restarts, .timeout = TEST_TIMEOUT(60))
{
    cp_detector *ner = NULL;
    REAL_NER("ner-real-crash", 30000, ner);
    cp_detect_chain c;
    cp_error err = { 0 };
    cp_chain_init(&c);
    cr_assert_eq(cp_chain_add(&c, ner, &err), CP_OK);
    char got[512], want[128];
    const char *t = "i talked to john smith yesterday";
    span_of(t, "john smith", "person", want, sizeof want);
    cr_assert(!chain_spans(&c, t, got, sizeof got) && strcmp(got, want) == 0, "before: '%s'", got);
    killer k = { child_pid(), 150 };
    cr_assert_gt(k.pid, 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, kill_later, &k), 0);
    char *big = long_text();
    cr_assert(chain_spans(&c, big, got, sizeof got) && !got[0], "a message whose plugin died must fail closed: '%.80s'", got);
    pthread_join(th, NULL);
    free(big);
    cr_assert_eq(c.failures, 1);
    cr_assert(!chain_spans(&c, t, got, sizeof got) && strcmp(got, want) == 0, "after the crash: '%s'", got);
    long again = child_pid();
    cr_assert(again > 0 && again != k.pid, "no new child after the crash (%ld, was %ld)", again, k.pid);
    cp_chain_free(&c);
}

/* A reply slower than the timeout (200 ms here; the long text takes about
 * a second): the message fails closed, the child is gone, and the next
 * message is answered by a new one (with the start allowance). */
Test(ner, real_plugin_slow_reply_times_out_and_fails_closed, .timeout = TEST_TIMEOUT(60))
{
    cp_detector *ner = NULL;
    REAL_NER("ner-real-slow", 200, ner);
    cp_detect_chain c;
    cp_error err = { 0 };
    cp_chain_init(&c);
    cr_assert_eq(cp_chain_add(&c, ner, &err), CP_OK);
    long pid = child_pid();
    cr_assert_gt(pid, 0);
    char *big = long_text(), got[512], want[128];
    cr_assert(chain_spans(&c, big, got, sizeof got) && !got[0], "a timed-out message must fail closed: '%.80s'", got);
    free(big);
    cr_assert_eq(c.failures, 1);
    cr_assert_eq(kill((pid_t)pid, 0), -1, "the timed-out child %ld is still there", pid);
    const char *t = "i talked to john smith yesterday";
    span_of(t, "john smith", "person", want, sizeof want);
    cr_assert(!chain_spans(&c, t, got, sizeof got) && strcmp(got, want) == 0, "after the timeout: '%s'", got);
    cp_chain_free(&c);
}
