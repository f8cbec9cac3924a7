/* Quality of reuse against full recompute, as `run --compare` reports it
 * (the README's KL / greedy / ROUGE-L columns).  KL of the first-token
 * distributions is cp_logits_kl (sampler.h). */
#ifndef CP_QUALITY_H
#define CP_QUALITY_H

#include <stddef.h>
#include <stdint.h>

/* Greedy agreement: positions where the two continuations hold the same id,
 * over the longer one's length (a continuation cut short disagrees on every
 * missing position); 1 when both are empty. */
double cp_greedy_agreement(const int32_t *ref, size_t n_ref, const int32_t *got, size_t n_got);

/* ROUGE-L F1 of two id sequences: LCS length l, precision l / n_got, recall
 * l / n_ref, F1 = 2PR / (P + R); 1 when both are empty, 0 when one is.
 * Returns -1 when it cannot allocate its two rows (the caller decides). */
double cp_rouge_l(const int32_t *ref, size_t n_ref, const int32_t *got, size_t n_got);

#endif
