/* The optional NER plugin (engine/detect/detect_ner.c, plugins/ner/):
 * configured but unavailable -- its script, its npm package or node
 * missing, or a first request unanswered -- it is refused with a message
 * that says which, and `run` / `serve` refuse to start (never a silent run
 * without it).  The folders here are fakes: a ner.mjs written for the test
 * (the protocol in a few lines, or an immediate exit) and an empty
 * node_modules/compromise/package.json standing for the package. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

Test(ner, available_plugin_is_in_the_chain, .timeout = 60)
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
Test(ner, run_and_serve_refuse_to_start_without_it, .timeout = 120)
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
Test(ner, on_by_default_where_installed, .timeout = 60)
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
