/* Shared pieces of the command-line front end (engine/cli/cli_*.c). */
#ifndef CP_CLI_H
#define CP_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../../kernels/backend.h"
#include "../../model/model.h"
#include "../../tokenizer/chat.h"

int cli_generate(int argc, char **argv);
int cli_synth(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detect(int argc, char **argv);
int cli_annotate(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_calibrate(int argc, char **argv);
/* the evaluation commands, defined beside the engine in eval/ (attack in
 * eval/attack/); main.c dispatches to them through these declarations */
int cli_workload(int argc, char **argv);
int cli_attack(int argc, char **argv);
int cli_eval_detect(int argc, char **argv);
int cli_demo(int argc, char **argv);
/* the modes demo compares, and its steps after its options (cli_demo_steps.c) */
#define CLI_DEMO_MODES "none,global-prefix,chunk,cacheprune"
int cli_demo_run(const char *model, const char *outdir, int requests, int quiet);
int cli_serve(int argc, char **argv);

/* Detector options shared by the commands that build a chain. */
typedef struct cli_detect_opts {
    const char *rules[8];
    int n_rules;
    const char *plugin, *plugin_config, *plugin_cmd, *policy;
    int timeout_ms, mask_pad, builtin, names;
    /* the NER plugin of plugins/ner: 1 with --ner (refused at start if
     * unavailable), 0 with --no-ner, -1 (the default) on when installed
     * there (make deps), and then refused at start too if it cannot start */
    int ner;
    const char *ner_dir; /* --ner-dir DIR: where it is (default $CP_NER_DIR, else plugins/ner) */
    const char *words;   /* --words FILE: the names recognizer's common-word list (default CP_WORDS_DEFAULT) */
} cli_detect_opts;
#define CLI_DETECT_DEFAULTS { .timeout_ms = 2000, .mask_pad = 1, .builtin = 1, .names = 1, .ner = -1 }
struct cp_detect_chain;
int cli_parse_detect_opt(int argc, char **argv, int *i, cli_detect_opts *o);
/* Their lines for a command's --help (every command that takes them prints them). */
void cli_detect_opts_help(FILE *f);
int cli_make_chain(struct cp_detect_chain *c, const cli_detect_opts *o);

/* Strict number parsing: the whole string must be a number in [lo, hi].
 * On failure prints "cacheprune: OPT: ..." and returns 0. */
int cli_parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out);
int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out);
/* "1,2,3" -> ids (malloc'd); returns count, or -1 after printing an error. */
int cli_parse_ids(const char *opt, const char *s, int32_t **out);

/* A progress line on stderr ("\r<what>: 42% (1.2 / 2.9 GB)"), printed only
 * when stderr is a terminal or the work is large. */
typedef struct cli_progress {
    const char *what;
    int last_pct;
    int enabled;
} cli_progress;
void cli_progress_cb(void *ctx, size_t done, size_t total);
/* The same for counted work: "\r<what>: 42% (63 / 150 <unit>)". */
void cli_progress_items(cli_progress *p, size_t done, size_t total, const char *unit);
void cli_progress_end(cli_progress *p);
/* Whether a progress line is wanted: stderr is a terminal and the command
 * was not given --quiet-progress (every command with progress takes it). */
int cli_progress_wanted(int quiet);

/* The value of option argv[*i], advancing *i past it; NULL (after printing
 * "cacheprune: CMD: OPT needs a value") when it is the last argument. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* Whether a is one of the NULL-terminated list (a parser's options that
 * take a value: an unknown option is then reported as unknown, not as
 * missing its value). */
int cli_one_of(const char *a, const char *const *list);
/* Prints "cacheprune: CMD: unknown option 'A' (see --help)", or for an
 * argument that is no option, "unexpected argument". */
void cli_unknown(const char *cmd, const char *a);

/* --backend cpu|cuda */
int cli_make_backend(const char *name, cp_backend **out);

/* On f (run and serve: stderr; demo: stdout, its story), unless --quiet:
 * the compute path the loaded model runs on (cp_cpu_compute_line), the
 * first thing run, serve and demo say. */
void cli_print_compute(cp_backend *be, FILE *f);

/* --dtype auto|f32|bf16 (model.h: cp_weight_dtype): 0 after printing an
 * error.  Every command that loads a model takes it; auto is the default. */
int cli_parse_dtype(const char *v, cp_weight_dtype *out);
/* --kv-dtype f32|bf16: the KV cache's element type (f32 the default); 0
 * after printing an error */
int cli_parse_kv_dtype(const char *v, cp_dtype *out);
#define CLI_KV_DTYPE_USAGE "  --kv-dtype D          KV cache and pool elements: f32 (default) or bf16 (half the bytes per token: twice the\n" \
                           "                        tokens in the pool's budget; CPU backend only)\n"

#define CLI_DTYPE_USAGE "  --dtype D             weights in memory: auto (as stored: bf16 checkpoints stay bf16; the default), f32, bf16,\n"                              \
                        "                        int8 (CPU: every matrix quantized at load, one scale per row)\n"


/* Reads chat messages from {"messages": [...]} or a bare array of
 * {"role", "content"}; the message texts point into *root (free it with
 * cJSON_Delete after use).  Prints the error and returns 0 on failure. */
struct cJSON;
int cli_load_chat(const char *path, struct cJSON **root, cp_message **msgs, size_t *n);

/* Whether a prompt of prompt_tokens plus to_generate more fits the model's
 * context; otherwise prints an error with the three numbers and returns 0
 * (a prompt past the context is refused wherever it enters, as run does). */
int cli_fits_context(const char *cmd, long long prompt_tokens, long long to_generate, int context);

/* A comma-separated list of sharing modes (--compare, --modes): each a
 * known name, none empty or repeated, at most max; modes point into *buf
 * (free it).  Returns the count, or -1 after printing an error that names
 * the bad entry and the valid ones. */
int cli_parse_modes(const char *opt, const char *list, const char **modes, int max, char **buf);

/* Every output file (--out, --plan-out, ...) is a file of its own: not one
 * of the inputs, not another output, not a file of the model directory
 * (compared by device and inode, not by spelling).  Entries with a NULL
 * path are skipped.  Prints the error and returns 0 otherwise. */
typedef struct cli_path {
    const char *opt, *path;
} cli_path;
int cli_outputs_distinct(const char *cmd, const cli_path *outs, int n_out, const cli_path *ins, int n_in, const char *model_dir);

/* Prints "cacheprune: <msg>" to stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));


#endif
