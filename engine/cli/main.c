/* cacheprune: the command-line entry point.  Only main decides to exit. */
#include <stdio.h>
#include <string.h>

#include "../../kernels/log.h"
#include "../json_fields.h"
#include "cli.h"

/* The one place the version is written.  The Makefile adds `git describe`
 * of the checkout it was built from (empty outside one). */
#define CP_VERSION "0.1.0"
#ifndef CP_GIT_DESCRIBE
#define CP_GIT_DESCRIBE ""
#endif

/* The version, then the compute path without a model: the ISA the CPU
 * backend chose (cpuid, or CP_CPU_ISA), each weight dtype's GEMM provider,
 * the OpenBLAS kernel set and OpenMP's wait policy. */
static int version(void)
{
    if (*CP_GIT_DESCRIBE) printf("cacheprune %s (git %s)\n", CP_VERSION, CP_GIT_DESCRIBE);
    else printf("cacheprune %s\n", CP_VERSION);
    cp_backend *be = NULL;
    cp_error err = { 0 };
    char line[1024];
    int ok = cp_backend_cpu_create(&be, &err) == CP_OK && cp_cpu_compute_line(be, 1, line, sizeof line, &err) == CP_OK;
    if (be) be->destroy(be);
    if (!ok) return cli_error("compute: %s", err.msg), 1;
    printf("%s\n", line);
    return 0;
}

static void usage(FILE *f)
{
    fputs("usage: cacheprune <command> [options]\n"
          "\n"
          "commands:\n"
          "  run        a multi-tenant request log (JSONL) through the engine, or several sharing modes side by side\n"
          "  workload   write a benchmark request log (rag-v1, chat-v1, meetings-v1)\n"
          "  demo       the story in one screen: sharing modes side by side, a privacy probe, a verdict\n"
          "  serve      an OpenAI-compatible HTTP server, one tenant per API key\n"
          "  attack     the privacy attack harness (THREAT_MODEL.md): recovery per mode and channel\n"
          "  calibrate  measure reuse settings on a sample of your log; write the cheapest meeting a quality budget\n"
          "  generate   run a prompt through a model and generate tokens\n"
          "  synth      write a model with random weights in a real shape (speed/memory work only)\n"
          "  tokenize   token ids, pieces and byte offsets of a text or a chat\n"
          "  detect     sensitive spans of a text, and its token mask\n"
          "  eval-detect  per-type precision/recall of the detector on a labelled PII set\n"
          "  annotate   the segments of a prompt the annotator would share, and why runs were cut\n"
          "  version    the version, the git commit it was built from, the compute path (also --version)\n"
          "  help       this text; `cacheprune <command> --help` for a command's options\n"
          "\n"
          "global options (before or after the command):\n"
          "  --verbose  more diagnostics (e.g. config keys that were ignored)\n"
          "  --quiet    errors only\n",
          f);
}

int main(int argc, char **argv)
{
    cp_json_wipe_on_free(); /* before any thread parses a request */
    /* strip global flags wherever they are */
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--verbose") == 0) cp_log_set_level(CP_LOG_DEBUG);
        else if (i > 0 && strcmp(argv[i], "--quiet") == 0) cp_log_set_level(CP_LOG_ERROR);
        else argv[n++] = argv[i];
    }
    argc = n;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "generate") == 0) return cli_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0) return cli_run(argc - 1, argv + 1);
    if (strcmp(cmd, "calibrate") == 0) return cli_calibrate(argc - 1, argv + 1);
    if (strcmp(cmd, "workload") == 0) return cli_workload(argc - 1, argv + 1);
    if (strcmp(cmd, "serve") == 0) return cli_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "attack") == 0) return cli_attack(argc - 1, argv + 1);
    if (strcmp(cmd, "demo") == 0) return cli_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "synth") == 0) return cli_synth(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0) return cli_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "detect") == 0) return cli_detect(argc - 1, argv + 1);
    if (strcmp(cmd, "eval-detect") == 0) return cli_eval_detect(argc - 1, argv + 1);
    if (strcmp(cmd, "annotate") == 0) return cli_annotate(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) return version();
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    cli_error("unknown command '%s' (try `cacheprune help`)", cmd);
    return 2;
}
