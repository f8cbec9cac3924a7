/* The scheduling-channel probe (THREAT_MODEL.md, scheduling channel): can a
 * tenant read another tenant's cache hit from its own queueing delay and
 * completion order under concurrent load?
 *
 * One trial: on a cold engine a victim stores a prompt holding a secret (a
 * card number) with cp_engine_run.  Then the attacker submits K candidate
 * prompts (the victim's text with each of K card numbers of one token
 * length, the true one among them), each from a fresh tenant, in a random
 * order, behind and among filler requests of other tenants, all at once to
 * a batcher running few requests at a time, so the candidates queue.  What
 * it sees of each of its requests is what a client sees: when the request
 * finished (counted in scheduler steps, deterministic, and in wall time,
 * TTFT from submission).  It guesses that the earliest is the true one.
 *
 * The same burst is replayed on a second cold engine whose victim sent a
 * decoy card (none of the candidates): when every request of the burst
 * finishes at the same step in both runs, the step trace carries nothing
 * about the secret, whatever the attacker computes from it.  Under the FIFO
 * order that holds by construction (admission reads arrival order, prompt
 * length and max_tokens only); under CP_SCHED_LPM_UNSAFE in a mode that
 * shares the secret (global-prefix) the true candidate jumps the queue. */
#ifndef CP_PROBE_H
#define CP_PROBE_H

#include "../engine/batch/batcher.h"

/* The burst's admission order.  CP_SCHED_FIFO: arrival order, the
 * batcher's own (no policy registered), what serve and run use.
 * CP_SCHED_LPM_UNSAFE, the leaky control: the probe registers a batcher
 * policy that sorts the waiting requests by how many prompt tokens the
 * pool would serve each (cp_job_peek_hits; longest first, arrival order
 * among equals), as SGLang's longest-prefix-match policy does — so a tenant
 * reads another's cache hits from its own place in the queue
 * (THREAT_MODEL.md, scheduling channel).  Never a serve or run option. */
typedef enum cp_sched_order { CP_SCHED_FIFO = 0, CP_SCHED_LPM_UNSAFE } cp_sched_order;

/* The LPM control's sort: w[0..n) and hits[0..n) together, most hits
 * first, arrival order (smaller id) among equals. */
void cp_probe_sort_by_hits(cp_batcher_waiting *w, int *hits, size_t n);

typedef struct cp_probe_opts {
    int trials;      /* >= 1 */
    int candidates;  /* K >= 2: chance is 1/K */
    int fillers;     /* other tenants' requests in the burst, ahead of the candidates */
    int max_running; /* requests in flight (small: the candidates queue) */
    int step_tokens; /* a step's token budget (> max_running) */
    int max_tokens;  /* tokens each request of the burst generates (>= 1; EOS ignored) */
    cp_sched_order order;
    uint64_t seed;   /* candidates, the true one's place in the submission order */
} cp_probe_opts;

/* A Luhn-valid card number from its first 15 digits (each 0..9): the check
 * digit appended, grouped by four ("4111 1111 1111 1111").  The probe's
 * secrets, and the attack harness's. */
void cp_probe_card_format(const int d15[15], char *out, size_t cap);

/* probe defaults: 4 trials, 8 candidates, 2 fillers, 2 in flight, 32 tokens a step, 2 tokens each, FIFO */
void cp_probe_opts_default(cp_probe_opts *o);

typedef struct cp_probe_result {
    int trials, candidates;
    double by_steps;  /* recovery: the candidate finished at the earliest step (ties share the credit) */
    double by_wall;   /* recovery: the candidate with the lowest TTFT from submission */
    double chance;    /* 1 / candidates */
    int same_trace;   /* trials whose burst finished step for step as with the decoy */
} cp_probe_result;

/* A fresh engine for each run (a cold pool; the probe runs the victim
 * itself), and its release. */
typedef struct cp_probe_env {
    cp_status (*open)(void *ctx, cp_engine **e, cp_error *err);
    void (*close)(void *ctx, cp_engine *e);
    void *ctx;
    cp_tokenizer *tok; /* the engine's, for candidates of one token length */
} cp_probe_env;

cp_status cp_sched_probe(const cp_probe_env *env, const cp_probe_opts *o, cp_probe_result *out, cp_error *err);

#endif
