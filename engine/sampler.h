/* Next-token choice from logits: greedy, or temperature + top-k + top-p with
 * a seeded generator.  Only ids below n_valid are ever chosen (a config's
 * vocab_size can exceed the tokenizer's, e.g. Qwen's padded embedding). */
#ifndef CP_SAMPLER_H
#define CP_SAMPLER_H

#include <stdint.h>

#include "../kernels/status.h"

typedef struct cp_sampler_opts {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    uint64_t seed;
} cp_sampler_opts;

typedef struct cp_sampler {
    cp_sampler_opts o;
    int n_valid;
    uint64_t rng;
    struct cp_prob_idx *cand; /* [n_valid] */
} cp_sampler;

cp_status cp_sampler_init(cp_sampler *s, const cp_sampler_opts *o, int n_valid, cp_error *err);
void cp_sampler_free(cp_sampler *s);
int cp_sample(cp_sampler *s, const float *logits);
int cp_argmax(const float *logits, int n);

/* The top-1 logit minus the top-2 logit of one distribution (V >= 2;
 * 0 when the two largest are equal, or V < 2): how decided its argmax is.
 * Each generated id carries it (cp_response.margins). */
float cp_top2_margin(const float *logits, int V);

#endif
