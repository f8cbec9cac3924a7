/* Quality metrics of `run --compare` and `calibrate` (see quality.h). */
#include "quality.h"

#include <math.h>
#include <stdlib.h>

double cp_greedy_agreement(const int32_t *ref, size_t n_ref, const int32_t *got, size_t n_got)
{
    size_t same = 0, longer = n_ref > n_got ? n_ref : n_got;
    for (size_t k = 0; k < n_ref && k < n_got; k++) same += ref[k] == got[k];
    return longer ? (double)same / (double)longer : 1;
}

double cp_rouge_l(const int32_t *ref, size_t n_ref, const int32_t *got, size_t n_got)
{
    if (!n_ref || !n_got) return n_ref == n_got;
    /* LCS by the textbook DP, two rows over got */
    size_t *prev = calloc(n_got + 1, sizeof *prev), *cur = calloc(n_got + 1, sizeof *cur);
    if (!prev || !cur) {
        free(prev), free(cur);
        return -1;
    }
    for (size_t i = 1; i <= n_ref; i++) {
        for (size_t j = 1; j <= n_got; j++)
            cur[j] = ref[i - 1] == got[j - 1] ? prev[j - 1] + 1 : prev[j] > cur[j - 1] ? prev[j] : cur[j - 1];
        size_t *t = prev;
        prev = cur, cur = t;
    }
    double lcs = (double)prev[n_got], p = lcs / (double)n_got, r = lcs / (double)n_ref;
    free(prev), free(cur);
    return p + r > 0 ? 2 * p * r / (p + r) : 0;
}

double cp_logits_kl(const float *lp, const float *lq, int n)
{
    double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, k = 0;
    for (int i = 0; i < n; i++) mp = fmax(mp, lp[i]), mq = fmax(mq, lq[i]);
    for (int i = 0; i < n; i++) sp += exp(lp[i] - mp), sq += exp(lq[i] - mq);
    for (int i = 0; i < n; i++) {
        double a = lp[i] - mp - log(sp), b = lq[i] - mq - log(sq);
        k += exp(a) * (a - b);
    }
    return k > 0 ? k : 0;
}

size_t cp_first_divergence(const int32_t *ref, size_t n_ref, const int32_t *got, size_t n_got)
{
    size_t k = 0, n = n_ref < n_got ? n_ref : n_got;
    while (k < n && ref[k] == got[k]) k++;
    return k; /* k == n when one continuation is a prefix of the other: where it stops */
}

double cp_greedy_agreement_decided(const int32_t *ref, const float *margin, size_t n_ref, const int32_t *got, size_t n_got, float eps)
{
    size_t cut = 0;
    while (cut < n_ref && !(margin[cut] < eps)) cut++;
    if (cut == 0) return -1;
    size_t same = 0;
    for (size_t k = 0; k < cut && k < n_got; k++) same += ref[k] == got[k];
    return (double)same / (double)cut;
}
