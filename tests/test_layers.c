/* The evaluation harness sits beside the engine, never inside it: eval/
 * (attacks, the scheduling probe, workload presets, eval-detect, quality
 * metrics) may call the engine and everything below it, and no product
 * source under engine/, model/, pool/, kernels/ or tokenizer/ includes
 * anything from eval/.  One include is the command line's by design:
 * `run --compare` prints the quality columns (engine/cli/cli_run.c includes
 * eval/quality.h); main.c dispatches to eval's commands through the
 * declarations in engine/cli/cli.h, including nothing from eval/. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

/* the one product file allowed an include from eval/, and the header it may name */
static const char *const allowed[][2] = { { "engine/cli/cli_run.c", "eval/quality.h" } };

/* grep, from directory dir, for the includes that name eval/ under roots
 * into out; returns grep's status (0 some found, 1 none) */
static int grep_eval_includes(const char *dir, const char *roots, const char *out)
{
    return test_sh("(cd %s && grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<]([^\">]*/)?eval/' "
                   "--include='*.c' --include='*.h' --include='*.cu' %s) > %s 2>&1",
                   dir, roots, out);
}

/* whether a grep line ("path:line:text") is the allowed include */
static int is_allowed(const char *line)
{
    for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++) {
        size_t n = strlen(allowed[i][0]);
        if (strncmp(line, allowed[i][0], n) == 0 && line[n] == ':') {
            const char *q = strchr(line + n + 1, ':');
            if (q && strstr(q, allowed[i][1])) {
                /* the header named must be that one exactly: "../../eval/quality.h" */
                const char *h = strstr(q, allowed[i][1]);
                if (h[strlen(allowed[i][1])] == '"') return 1;
            }
        }
    }
    return 0;
}

/* the lines of the file at path that are not allowed, joined (malloc'd) */
static char *disallowed_lines(const char *path, int *count)
{
    char *text = read_text(path, NULL);
    cr_assert(text, "cannot read %s", path);
    size_t cap = strlen(text) + 1;
    char *bad = calloc(cap, 1);
    cr_assert(bad);
    *count = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (!is_allowed(line)) strcat(strcat(bad, line), "\n"), (*count)++;
    free(text);
    return bad;
}

Test(layers, product_code_includes_nothing_from_eval, .timeout = TEST_TIMEOUT(30))
{
    char dir[512], hits[700];
    test_tmpdir(dir, sizeof dir, "layers");
    snprintf(hits, sizeof hits, "%s/hits.txt", dir);
    for (const char *d = "engine model pool kernels tokenizer"; *d;) { /* tests run from the repository root */
        size_t n = strcspn(d, " ");
        char one[64];
        snprintf(one, sizeof one, "%.*s", (int)n, d);
        cr_assert(test_sh("test -d %s", one) == 0, "%s/ not found: tests run from the repository root", one);
        d += n + (d[n] == ' ');
    }
    int rc = grep_eval_includes(".", "engine model pool kernels tokenizer", hits);
    cr_assert(rc == 0 || rc == 1, "grep failed (rc %d)", rc);
    int n_bad = 0;
    char *bad = disallowed_lines(hits, &n_bad);
    cr_assert(n_bad == 0, "product code includes the evaluation harness (eval/):\n%.4000s", bad);
    free(bad);
    /* the allowed include is there (the pattern reads this tree's spelling of it) */
    char *all = read_text(hits, NULL);
    cr_assert(all && strstr(all, "engine/cli/cli_run.c:") && strstr(all, "eval/quality.h\""),
              "the scan does not see cli_run.c's include of eval/quality.h: %s", all ? all : "(nothing)");
    free(all);
}

/* The scan itself: on a scratch tree it reports each spelling of an include
 * from eval/ and nothing else (a pattern that matches nothing would pass
 * the test above on any tree). */
Test(layers, the_scan_finds_each_spelling, .timeout = TEST_TIMEOUT(30))
{
    char dir[512], hits[700];
    test_tmpdir(dir, sizeof dir, "layers-scan");
    snprintf(hits, sizeof hits, "%s/hits.txt", dir);
    cr_assert(test_sh("mkdir -p %s/engine/cli %s/model && cd %s && "
                      "printf '#include \"../eval/quality.h\"\\n' > engine/a.c && "
                      "printf '  #  include \"../../eval/attack/attack.h\"\\n' > engine/cli/b.h && "
                      "printf '#include <eval/probe.h>\\n' > model/c.cu && "
                      "printf '#include \"../../eval/quality.h\"\\n#include \"../../eval/probe.h\"\\n' > engine/cli/cli_run.c && "
                      "printf '#include \"../medieval/x.h\"\\n#include \"evaluate.h\"\\n/* eval/quality.h */\\n' > engine/d.c",
                      dir, dir, dir) == 0);
    int rc = grep_eval_includes(dir, "engine model", hits);
    cr_assert_eq(rc, 0, "grep found nothing in %s (rc %d)", dir, rc);
    int n_bad = 0;
    char *bad = disallowed_lines(hits, &n_bad);
    /* a.c, b.h, c.cu and cli_run.c's probe.h; not cli_run.c's quality.h, not d.c */
    cr_assert_eq(n_bad, 4, "want 4 disallowed includes, got %d:\n%s", n_bad, bad);
    cr_assert(strstr(bad, "engine/a.c:") && strstr(bad, "engine/cli/b.h:") && strstr(bad, "model/c.cu:") && strstr(bad, "eval/probe.h"), "%s", bad);
    cr_assert(!strstr(bad, "engine/d.c"), "medieval/, evaluate.h or a comment counted as eval/: %s", bad);
    free(bad);
}
