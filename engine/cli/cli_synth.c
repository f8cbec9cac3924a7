/* cacheprune synth: write a random-weight model in a real shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../model/synth.h"
#include "../../tokenizer/tokenizer.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cacheprune synth --shape NAME --out DIR [--seed N] [--tokenizer DIR] [--shard-mb N] [--quiet-progress]\n"
            "\n"
            "Writes config.json, bf16 safetensors with seeded random weights and a tokenizer.\n"
            "Random weights are for speed and memory work only, never for quality or hit-rate claims.\n"
            "\n"
            "  --shape NAME     one of: %s\n"
            "  --out DIR        output directory (created if absent)\n"
            "  --seed N         weight seed (default 1)\n"
            "  --tokenizer DIR  copy DIR/tokenizer.json (+ tokenizer_config.json); default: a byte-level\n"
            "                   tokenizer of our own (256 byte tokens, <s> = 256, </s> = 257)\n"
            "  --shard-mb N     split the weights into shards of at most N MB (default 4096)\n"
            "  --quiet-progress no progress line (shown only when stderr is a terminal)\n",
            cp_synth_shape_names());
}

int cli_synth(int argc, char **argv)
{
    cp_synth_opts o = { .seed = 1 };
    long long v;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--quiet-progress") == 0) {
            quiet = 1;
            continue;
        }
        static const char *const with_value[] = { "--shape", "--out", "--tokenizer", "--seed", "--shard-mb", NULL };
        if (!cli_one_of(a, with_value)) {
            cli_unknown("synth", a);
            return 2;
        }
        if (!(val = cli_value("synth", argc, argv, &i))) return 2;
        if (strcmp(a, "--shape") == 0) o.shape = val;
        else if (strcmp(a, "--out") == 0) o.out_dir = val;
        else if (strcmp(a, "--tokenizer") == 0) o.tokenizer_dir = val;
        else if (strcmp(a, "--seed") == 0) {
            if (!cli_parse_int(a, val, 0, INT64_MAX, &v)) return 2;
            o.seed = (uint64_t)v;
        } else {
            if (!cli_parse_int(a, val, 1, 1 << 30, &v)) return 2;
            o.shard_bytes = (size_t)v << 20;
        }
    }
    if (!o.shape || !o.out_dir) {
        cli_error("synth: --shape and --out are required (see --help)");
        return 2;
    }
    cp_error err = { 0 };
    if (o.tokenizer_dir) {
        /* loaded before it is copied: a broken tokenizer.json is refused
         * here, not found by the model's first user; and the copy may not
         * be written over its own source */
        cp_tokenizer *tok = NULL;
        if (cp_tokenizer_load(o.tokenizer_dir, &tok, &err) != CP_OK) {
            cli_error("synth: --tokenizer %s: %s", o.tokenizer_dir, err.msg);
            return 1;
        }
        cp_tokenizer_free(tok);
        cli_path out = { "--out", o.out_dir }, in = { "--tokenizer", o.tokenizer_dir };
        if (!cli_outputs_distinct("synth", &out, 1, &in, 1, NULL)) return 2;
    }
    cli_progress prog = { "writing", -1, cli_progress_wanted(quiet) };
    o.progress = cli_progress_cb;
    o.progress_ctx = &prog;
    cp_status rc = cp_synth(&o, &err);
    cli_progress_end(&prog);
    if (rc) {
        cli_error("%s", err.msg);
        return 1;
    }
    fprintf(stderr, "wrote %s model to %s (random weights: not for quality claims)\n", o.shape, o.out_dir);
    return 0;
}
