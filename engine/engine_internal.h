/* The engine's insides, shared by its files (request.h is the API):
 *   engine.c          options, names, the engine's lifetime
 *   request.c         one request's context: render, detect, mask, its view
 *                     for the cache manager, lookup and placement through it
 *   prefill.c         the plan: deviation selection, request-time methods,
 *                     the computed tokens and the attention export
 *   request_store.c   after the first token: annotate, canonical runs, the
 *                     stores through the cache manager
 *   pipeline.c        the phases (cp_job_*), and cp_engine_run as a batch
 *                     of one through them
 *   replay.c          replays of a plan made elsewhere */
#ifndef CP_ENGINE_INTERNAL_H
#define CP_ENGINE_INTERNAL_H


#include "../kernels/clock.h"
#include "../model/forward_select.h"
#include "detect_memo.h"
#include "request.h"

struct cp_engine {
    cp_model *m;
    cp_tokenizer *tok;
    cp_cache *cache; /* the only door to stored KV */
    cp_detect_chain *chain;
    cp_detect_memo *memo; /* what the chain found in each tenant's earlier messages (NULL: none) */
    cp_engine_opts o;
    int cap;
    size_t piece_max; /* the most bytes any vocabulary piece spells (>= what one token covers) */
    cp_state *st, *canon;
    float *logits;
    int n_valid;
    cp_annot_cells band_cells; /* the annotator's band cells between requests (all zeros while kept) */
};


#define STATE_FIRST_SLOTS 256
#define STATE_BATCH 512 /* tokens per forward chunk */

/* Room for `need` slots in *st, up to the context (engine.c). */
cp_status cp_engine_grow_state(cp_engine *e, cp_state **st, int need, cp_error *err);

enum { TOK_FRESH = CP_CACHE_FRESH, TOK_REUSED = CP_CACHE_REUSED, TOK_RECOMPUTE = CP_CACHE_RECOMPUTE };

typedef struct reqctx {
    cp_engine *e;
    const cp_request *req;
    cp_response *resp;
    cp_prompt prompt;
    char **clean;
    size_t *clean_len; /* messages may hold NUL bytes: lengths, never strlen */
    cp_spans *spans;
    uint8_t *mask, *state, *eligible;
    uint8_t *shared_hit; /* per token: its KV came from a shared segment */
    float *A, *sens_mass;
    int A_on_backend;     /* the export stays in backend memory (the backend annotates next to it) */
    uint8_t *mask_backend; /* the sensitive mask there, for its annotator */
    cp_annot_band band;   /* else: the band of it the annotator reads, kept as the prefill runs */
    cp_select_held held_export; /* a selective prefill's export rows, into the band after the first token */
    int export_late;      /* the band is being fed after the first token (its time is the annotator's) */
    uint8_t *fresh;       /* per token: the annotator's fresh (computed here, not reused) */
    uint8_t *seg_off;     /* per token: its offset in the reused segment it came from (capped at 255) */
    uint8_t *exact;       /* per token: reused KV provably equal to this context's own (the cache's chain proof) */
    cp_cache_hits *hits;  /* what the lookup found, pinned until the request ends */
    cp_cache_writer *store; /* while storing */
    int T;
    cp_state *st; /* the request's KV: the engine's (cp_engine_run) or its own (a batched job) */
    double mark;  /* cp_now_ms() at the end of the last stage counted (cp_req_stage) */
} reqctx;


/* request.c */
void cp_req_stage(reqctx *c, cp_stage stage);
void cp_req_rendered_free(reqctx *c);
void cp_req_free(reqctx *c);
cp_status cp_req_render(reqctx *c, cp_error *err);
cp_status cp_req_prepare(reqctx *c, cp_error *err);
cp_cache_req cp_req_cache_view(const reqctx *c);
cp_status cp_req_lookup(reqctx *c, cp_error *err);
cp_status cp_req_place(reqctx *c, cp_error *err);

/* request_store.c */
uint8_t *cp_req_annot_fresh(const reqctx *c);
cp_status cp_req_band_rows(void *ctx, const float *rows, size_t ld, const int32_t *slots, int n, cp_error *err);
/* prefill.c: the annotator's export of the request (its fresh rows) */
cp_export cp_req_prefill_export(reqctx *c);
int cp_req_wants_export(const cp_engine *e);
cp_status cp_req_store(reqctx *c, cp_error *err);

/* prefill.c */
double cp_req_recompute_ratio(const cp_engine *e);
cp_status cp_req_deviation_probe(cp_engine *e, cp_state *st, const int32_t *ids, int n, float *dev, cp_error *err);
cp_status cp_req_select_by_deviation(reqctx *c, cp_error *err);
int cp_req_use_method(const reqctx *c, int need_export);
cp_status cp_req_prefill_inputs(reqctx *c, int by_method, float *logits, int32_t **slots_out, int32_t **toks_out, int *n_out,
                                cp_export *ex, int *need_export, cp_error *err);
void cp_req_keep_plan(reqctx *c);

struct cp_job {
    reqctx c;
    cp_sampler smp;
    cp_export ex;
    int need_export, begun;
    int32_t *slots, *toks; /* the computed tokens in prompt order (slot = position) */
    int n, cur;            /* how many; the first not yet handed to a step */
    int32_t next;          /* the token the next decode step feeds */
    float *logits;         /* [vocab] */
    cp_detok_stream ds;
    int ds_open;
    int alone; /* cp_engine_run's: the engine's KV state, no queue, its steps run one request each */
    double t0;
};


#endif
