/* cacheprune demo: its options; the steps (this binary's own workload, run
 * and attack as child processes, and the verdict) are in cli_demo_steps.c. */
#include <stdio.h>
#include <string.h>

#include "cli.h"


int cli_demo(int argc, char **argv)
{
    const char *model = NULL, *outdir = "build/demo";
    int requests = 24, quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long k;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: cacheprune demo [--model DIR] [--requests N] [--out-dir DIR] [--quiet-progress]\n"
                   "The same multi-tenant rag-v1 log under " CLI_DEMO_MODES " (hit rate, TTFT against none, quality\n"
                   "against full recompute), one privacy probe per mode (another tenant tries to recover a victim's card\n"
                   "number through the sharing), and a verdict per mode.  Model: --model, else the reference kit's\n"
                   "cp-books-6m ($CP_SHARED or ../shared), else a random-weight synth model (mechanics only).\n"
                   "  --requests N       requests in the log (default 24)\n"
                   "  --out-dir DIR      where the log, results and summaries go (default build/demo)\n"
                   "  --quiet-progress   no progress lines\n");
            return 0;
        }
        if (strcmp(a, "--quiet-progress") == 0) { quiet = 1; continue; }
        if (!v) return cli_error("demo: unknown option or missing value '%s' (see --help)", a), 2;
        i++;
        if (strcmp(a, "--model") == 0) model = v;
        else if (strcmp(a, "--out-dir") == 0) outdir = v;
        else if (strcmp(a, "--requests") == 0) {
            if (!cli_parse_int(a, v, 4, 150, &k)) return 2;
            requests = (int)k;
        } else return cli_error("demo: unknown option '%s' (see --help)", a), 2;
    }
    return cli_demo_run(model, outdir, requests, quiet);
}
