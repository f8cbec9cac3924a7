/* `cacheprune demo` tells its story: the side-by-side table with quality
 * columns, and a verdict per mode in which global-prefix gives the victim's
 * card away through the counters, chunk through the reused KV computed
 * after it, and cacheprune through neither; its first line names the
 * compute path.  Read for those facts, not for timings. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static char *verdict_line(char *out, const char *mode)
{
    char key[64];
    snprintf(key, sizeof key, "\n  %-14s ", mode);
    char *v = strstr(out, "3. verdict");
    return v ? strstr(v, key) : NULL;
}

Test(demo, table_privacy_and_verdicts, .timeout = TEST_TIMEOUT(600))
{
    char model[512], dir[512], cmd[2048];
    shared_path(model, sizeof model, "models/cp-books-6m"); /* the trained model: skipped without the kit */
    test_tmpdir(dir, sizeof dir, "demo");
    const char *b = getenv("CP_BIN");
    snprintf(cmd, sizeof cmd, "%s demo --requests 6 --quiet-progress --model %s --out-dir %s 2>/dev/null", b && *b ? b : "build/cacheprune",
             model, dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t cap = 1 << 16, n = 0;
    char *out = calloc(cap, 1);
    for (size_t r; (r = fread(out + n, 1, cap - 1 - n, p)) > 0;) n += r;
    cr_assert_eq(pclose(p), 0, "demo failed:\n%s", out);
    const char *nl = strchr(out, '\n'), *w = strstr(out, " weights -> ");
    cr_assert(strncmp(out, "compute: ", 9) == 0 && w && nl && w < nl, "the first line does not name the compute path:\n%s", out);
    cr_assert(strstr(out, "hit rate") && strstr(out, "greedy") && strstr(out, "ROUGE-L"), "no side-by-side table:\n%s", out);
    static const char *const modes[] = { "none", "global-prefix", "chunk", "cacheprune" };
    static const char *const want[] = { "private", "LEAKS", "LEAKS", "private" };
    for (int i = 0; i < 4; i++) {
        char *v = verdict_line(out, modes[i]);
        cr_assert(v, "no verdict for %s:\n%s", modes[i], out);
        cr_assert(strncmp(v + 3 + 15, want[i], strlen(want[i])) == 0, "%s should be %s:\n%s", modes[i], want[i], out);
    }
    /* speed said plainly: "N.NNx faster" or "N.NNx slower" than none, N >= 1 */
    for (int i = 1; i < 4; i++) {
        char *v = verdict_line(out, modes[i]), *eol = strchr(v + 1, '\n'), *f = strstr(v, "x faster than none"), *sl = strstr(v, "x slower than none");
        char *at = f && (!eol || f < eol) ? f : sl && (!eol || sl < eol) ? sl : NULL;
        cr_assert(at, "%s: no 'x faster / slower than none':\n%s", modes[i], out);
        while (at > v && (at[-1] == '.' || (at[-1] >= '0' && at[-1] <= '9'))) at--;
        cr_assert(strtod(at, NULL) >= 1.0, "%s: a speed ratio under 1 said as such:\n%s", modes[i], out);
    }
    /* the reasons: global-prefix by the counters, chunk by the reused KV */
    char *gp = verdict_line(out, "global-prefix"), *ch = verdict_line(out, "chunk");
    cr_assert(strstr(gp, "reuse counters: 100 %"), "%s", gp);
    cr_assert(strstr(ch, "attacker's own logits): 100 %"), "%s", ch);
    free(out);
}
