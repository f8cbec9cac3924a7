/* The attack harness of `cacheprune attack` (THREAT_MODEL.md, attacks 1-7 and
 * the scheduling, chain, admission and batching channels), split by family:
 *   attack_probe.c  direct, misses, token, decision
 *   attack_reuse.c  context, poison, evict
 *   attack_sched.c  scheduling, batching
 *   attack_proof.c  chain, admission
 *   attack_common.c what they share (this header's helpers and texts)
 *   cli_attack.c    the command: options, the steps per mode, the tables.
 * The attacker is a client of the request API (engine/request.h) and sees
 * what a tenant sees; the harness calls the engine, never the reverse. */
#ifndef CP_EVAL_ATTACK_H
#define CP_EVAL_ATTACK_H

#include <stddef.h>
#include <stdint.h>

#include "../../engine/batch/batcher.h"
#include "../../engine/cli/cli.h"
#include "../../engine/request.h"
#include "../probe.h"
#include "../quality.h"

typedef struct att_opts {
    const char *model, *csv;
    const char *modes[8];
    int n_modes;
    int direct, token, misses, decision, context, poison, evict, sched, chain, admission, batching;
    int pool_blocks, quota; /* attack 7: a small pool, per-tenant quotas */
    int trials, cands, repeats, report_reuse, user_private, admit_k;
    int progress_line; /* a progress line is being drawn on stderr */
    cp_segkv segkv;
    double row_limit, beta; /* < 0: the engine's defaults */
    cp_weight_dtype dtype;
    cp_dtype kv_dtype; /* the request caches' and the pool's (0: f32) */
    uint64_t *rng;     /* the run's one random stream (att_rnd), shared by every copy of the options */
} att_opts;

/* the pool and engine one trial builds (att_make_engine) */
typedef struct att_engine {
    cp_pool *pool;
    cp_engine *e;
} att_engine;

/* a row of the main table: recovery by one channel, against chance */
typedef struct att_result {
    const char *mode, *attack, *channel;
    double recovery, chance, D, p;
} att_result;

typedef struct att_ctx_result {
    const char *label;
    int budget;
    double reused, spread, by_logits, by_text, chance;
} att_ctx_result;

typedef struct att_poison_result {
    const char *label;
    double kl_benign, kl_poison, kl_injection, changed_benign, changed_poison, reused;
} att_poison_result;

typedef struct att_sched_result {
    const char *mode, *order;
    cp_probe_result r;
} att_sched_result;

typedef struct att_batch_result {
    const char *mode;
    double hit_ms, miss_ms, auc; /* median gap sums; P(a miss trial's sum > a hit trial's) */
    int trials;
} att_batch_result;

/* The next number of the run's xorshift stream (one seed per run: the
 * attacks' candidates and secrets repeat run to run). */
uint32_t att_rnd(uint64_t *s);

/* the probes' public texts: a passage about a lighthouse, three passages
 * (the first is att_doc_text), the victim's question after a passage */
#define ATT_N_DOCS 3
extern const char att_doc_text[];
extern const char *const att_poison_docs[ATT_N_DOCS];
extern const char att_question[];

/* the median of v (sorted in place); 0 when n is 0 */
double att_median(double *v, int n);
/* two-sample Kolmogorov-Smirnov: the statistic in *D, the asymptotic p-value returned */
double att_ks(double *a, int na, double *b, int nb, double *D);
/* the token count of s, or -1 */
int att_tok_len(cp_tokenizer *t, const char *s);
/* K distinct candidates of one token length, card numbers or (misses) free-text
 * names; the first is the true secret.  0 when they cannot be found. */
int att_candidates(uint64_t *rng, cp_tokenizer *t, int misses, int K, char cand[][64]);
/* K distinct strings make() draws (one call a try), all of one token
 * length (the first's): what att_candidates and the proof probes' own
 * candidates are picked by; 1 when K were found */
int att_candidates_of(uint64_t *rng, cp_tokenizer *t, int K, char cand[][64], void (*make)(uint64_t *rng, char *s, size_t cap));

/* A fresh pool and engine in mode with the harness's options; 0 after
 * printing the error.  att_drop_engine frees both. */
int att_make_engine(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_engine *es);
void att_drop_engine(att_engine *es);
/* One request as tenant ([doc][user], or [user] when doc is NULL): its TTFT
 * and the reused + recomputed tokens that tenant is told of. */
int att_ask(att_engine *es, uint32_t tenant, const char *doc, const char *user, int report, double *ttft, int *reused);
/* One request of up to 4 documents and user turns as tenant (see attack_common.c). */
int att_ask_msgs(att_engine *es, uint32_t tenant, const cp_role *roles, const char *const *texts, int n, int no_store, int report,
                 double *ttft, int *seen, int *hit);
/* the row label of a segment-KV dependent attack (cacheprune/<segment-kv>) */
const char *att_segkv_label(const att_opts *o, const char *mode, int name_default);

/* the attacks, one mode each: 1 when they ran, 0 after printing the error */
int attack_direct(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, int misses,
                  att_result *by_counter, att_result *by_time);
int attack_token(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_result *by_counter,
                 att_result *by_time);
int attack_decision(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_result *out);
int attack_context(const att_opts *o0, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, int budget,
                   att_ctx_result *out);
int attack_poison(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_poison_result *out);
/* out[0]: recovery of the bit; out[1]: how often the probe hit at all */
int attack_evict(const att_opts *o0, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, int quota, att_result *out);
/* out[0]: FIFO, out[1]: the LPM control */
int attack_sched(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_sched_result *out);
int attack_batching(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_batch_result *out);
int attack_chain(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_result *by_counter,
                 att_result *by_time);
int attack_admission(const att_opts *o0, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_result *by_counter,
                     att_result *by_time);

#endif
