/* Quality of reuse against full recompute, as `run --compare` and
 * `calibrate` report it (the README's KL / greedy / ROUGE-L columns).
 * Evaluation apparatus: the request path never calls these; the margins
 * they read come from cp_top2_margin (engine/sampler.h). */
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

/* KL(p || q) of the softmaxes of two logit vectors over their first n ids:
 * the first-token quality measure of reuse against full recompute. */
double cp_logits_kl(const float *lp, const float *lq, int n);

/* Greedy agreement over the reference's decided positions only: those
 * before its first near-tie (margin[k] < eps; margin per ref position as
 * cp_top2_margin in engine/sampler.h).  From a near-tie on, the argmax is a coin that rounding
 * alone may flip, and every later position follows it.  Same convention as
 * cp_greedy_agreement over the first `cut` positions (missing ones
 * disagree); -1 when the reference has no decided position. */
double cp_greedy_agreement_decided(const int32_t *ref, const float *margin, size_t n_ref, const int32_t *got, size_t n_got, float eps);

/* The first position where the two continuations differ (a missing
 * position differs: one cut short differs where it stops); their common
 * length when they are equal. */
size_t cp_first_divergence(const int32_t *ref, size_t n_ref, const int32_t *got, size_t n_got);

#endif
