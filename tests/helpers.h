/* Shared helpers for the Criterion suites. */
#ifndef CP_TEST_HELPERS_H
#define CP_TEST_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/detect/detect.h"
#include "../kernels/backend.h"
#include "../model/model.h"
#include "../model/safetensors.h"

/* The reference kit: $CP_SHARED, default ../shared.  A test that needs it
 * skips when it is absent (one summary line after the run says so), and
 * fails instead when CI is set, so CI still runs everything. */
const char *kit_root(void);
int kit_present(void);
/* Skips (or under CI fails) the calling test when the kit is absent. */
void require_kit(void);
/* The kit's root joined with rel, written to out; calls require_kit. */
const char *shared_path(char *out, size_t cap, const char *rel);
/* want bytes (cut back to a UTF-8 boundary, CRs made spaces; malloc'd) of a
 * Gutenberg book from the kit: which picks the book (Dorian Gray or
 * Frankenstein) and the place, from the line after len / div + which *
 * stride bytes — prose for the request-path suites' documents. */
char *test_passage(int which, size_t want, size_t div, size_t stride);
/* A test's time limit: s seconds, times CP_TEST_TIMEOUT_SCALE where the
 * build sets it (the sanitizer builds: ASan runs the suite ~8x slower on
 * a CPU without AVX-512, and its limits are for the plain build). */
#ifndef CP_TEST_TIMEOUT_SCALE
#define CP_TEST_TIMEOUT_SCALE 1
#endif
#define TEST_TIMEOUT(s) ((s) * CP_TEST_TIMEOUT_SCALE)
/* One line on stderr naming what this CPU cannot run of the calling test
 * (a kernel path it lacks) while the rest of the test runs.  Not
 * cr_log_warn: Criterion's runner exits 1 on any warning, so a passing
 * suite would fail on every CPU without the path. */
void test_note_untested(const char *what);
/* A fresh directory under $CP_TMP (default build/tmp) for one test. */
const char *test_tmpdir(char *out, size_t cap, const char *name);

cp_model *load_model_or_die(const char *dir, cp_backend **be_out);
/* The tokenizer of ../shared/<rel>. */
struct cp_tokenizer *open_tokenizer_or_die(const char *rel);

/* A Llama-3-style tokenizer built here (the kit has no Llama-3 tokenizer):
 * Llama-3's Split regex then ByteLevel without its own regex, byte-level
 * BPE with ignore_merges over the 256 byte symbols (id = byte value), a few
 * merges spelling " Bob" as one token (ids 256-258), and the Llama-3 control tokens (259-262) as
 * added tokens; BOS <|begin_of_text|>, EOS <|eot_id|>.  Every id is below
 * 300: any model with a larger vocabulary can run it. */
struct cp_tokenizer *llama3_style_tokenizer(void);

/* max |a - b| over n, and max |b| */
float max_abs_diff(const float *a, const float *b, size_t n);
float max_abs(const float *a, size_t n);

/* A CPU backend on the path CP_CPU_ISA=isa forces (NULL: automatic); the
 * variable is unset again afterwards. */
cp_backend *test_cpu_backend_on(const char *isa);
/* The model in dir loaded as dtype dt on test_cpu_backend_on(isa) (*be). */
cp_model *test_load_as(const char *dir, const char *isa, cp_weight_dtype dt, cp_backend **be);
/* All logits (T x vocab, malloc'd) of ids through a fresh state, prefill in
 * chunks of `chunk` (16 runs the GEMM paths, not the dot kernels). */
float *test_all_logits(cp_model *m, const int32_t *ids, int T, int chunk);
/* sum (a - ref)^2 / sum ref^2 over n */
double test_nmse(const float *a, const float *ref, size_t n);
/* mean over T positions of KL(softmax(ref) || softmax(lg)) over V logits, in nats */
double test_mean_kl(const float *lg, const float *ref, int T, int V);
/* The input_ids of DIR/golden.safetensors (malloc'd), their count in *T. */
int32_t *test_golden_ids(const char *dir, int *T);

/* reads a whole file; NULL on failure */
char *read_text(const char *path, size_t *len);
int write_bytes(const char *path, const void *data, size_t n);

/* Runs `$CP_BIN ARGS 2>&1` (default build/cacheprune) through the shell and
 * reads up to cap - 1 bytes of its output into out; its exit status, -1
 * when it did not exit normally. */
int test_cli_output(const char *args, char *out, size_t cap);
/* As test_cli_output with env (shell assignments such as "A='x' B='y'", may
 * be empty) before the command. */
int test_cli_output_env(const char *env, const char *args, char *out, size_t cap);
/* Runs the printf-formatted shell command; its exit status, -1 when it
 * did not exit normally. */
int test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* cp-books-6m's config.json and model.safetensors copied into the temp dir
 * `name` (its path in dir), the checkpoint's bytes read back (*len; the
 * caller frees them) and *off the byte offset of `tensor`'s data, which
 * must be BF16: for tests that corrupt one weight and load the copy. */
unsigned char *test_books_checkpoint_copy(const char *name, const char *tensor, char *dir, size_t cap, size_t *len,
                                          size_t *off);

/* out = softmax(q k^T / sqrt(hd)) v per head, in double, over keys with
 * k_pos <= q_pos (and inside the window); zeros when none is visible: the
 * attention kernels' scalar reference (k, v: n_keys rows of n_kv_heads x
 * head_dim floats; a->q and out: a->n rows of n_heads x head_dim). */
void test_attention_ref(const cp_attn_args *a, const float *k, const float *v, float *out);

/* Uniform in [-1, 1) from a 32-bit LCG whose state the caller keeps (the
 * kernel suites' operands: reproducible, no libc rand state shared). */
float test_lcg_uniform(uint32_t *state);
/* 64-byte aligned memory of at least bytes (rounded up to 64); the test
 * fails when it cannot be had. */
void *test_xalloc64(size_t bytes);

/* a row-major handle over w (rows x cols in be's matrix dtype; an int8 blob
 * names its own shape and order), for the ops that take a cp_matrix; it
 * lives until the end of the enclosing block */
/* a detector chain of the one detector make() builds (cp_detector_builtin,
 * cp_detector_names, ...): the detector suites' chain */
cp_detect_chain test_chain_of(cp_status (*make)(cp_detector **out, cp_error *err));
/* what the chain finds in text (a turn of role), none of it failed closed:
 * "type[start,end);" a span */
void test_spans_at(cp_detect_chain *c, const char *text, size_t len, cp_role role, char *out, size_t cap);
/* the same in a user turn as "type:matched text;", or only the spans of type
 * `only` as "matched text;" */
void test_spans_text(cp_detect_chain *c, const char *text, const char *only, char *out, size_t cap);

#define TEST_MAT(be, w, rows, cols) (&(cp_matrix){ (void *)(w), (be)->matrix_dtype, (rows), (cols), CP_LAYOUT_ROWS })

#endif
