#include "sampler.h"

#include <math.h>
#include <stdlib.h>

typedef struct cp_prob_idx {
    float p;
    int id;
} cp_prob_idx;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) with 24 random bits */
static float next_uniform(cp_sampler *s) { return (float)(splitmix64(&s->rng) >> 40) / 16777216.0f; }

cp_status cp_sampler_init(cp_sampler *s, const cp_sampler_opts *o, int n_valid, cp_error *err)
{
    s->o = *o;
    s->n_valid = n_valid;
    s->rng = o->seed;
    s->cand = NULL;
    if (n_valid < 1) return cp_fail(err, CP_EINVAL, "sampler: vocabulary size %d must be positive", n_valid);
    if (!(o->temperature >= 0) || o->temperature > 100)
        return cp_fail(err, CP_ERANGE, "sampler: temperature %g is outside [0, 100]", o->temperature);
    if (!(o->top_p > 0 && o->top_p <= 1)) return cp_fail(err, CP_ERANGE, "sampler: top-p %g is outside (0, 1]", o->top_p);
    if (o->top_k < 0) return cp_fail(err, CP_ERANGE, "sampler: top-k %d is negative", o->top_k);
    if (o->temperature > 0) {
        s->cand = cp_malloc((size_t)n_valid * sizeof *s->cand, "sampler candidates", err);
        if (!s->cand) return CP_ENOMEM;
    }
    return CP_OK;
}

void cp_sampler_free(cp_sampler *s)
{
    free(s->cand);
    s->cand = NULL;
}

int cp_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static int by_prob_desc(const void *a, const void *b)
{
    const cp_prob_idx *x = a, *y = b;
    return x->p > y->p ? -1 : x->p < y->p ? 1 : (x->id - y->id);
}

int cp_sample(cp_sampler *s, const float *logits)
{
    int n = s->n_valid;
    if (s->o.temperature == 0) return cp_argmax(logits, n);
    float mx = logits[cp_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float p = expf((logits[i] - mx) / s->o.temperature);
        s->cand[i] = (cp_prob_idx){ p, i };
        sum += p;
    }
    /* Only candidates that can fall inside top-p or top-k need sorting: any
     * id with p < (1 - top_p) / (n - 1) of the mass cannot be in the nucleus
     * (llama2.c's trick), which keeps the sort small on 150k vocabularies. */
    int m = n;
    if (s->o.top_p < 1 && n > 1) {
        double cut = (1.0 - s->o.top_p) / (n - 1) * sum;
        m = 0;
        for (int i = 0; i < n; i++)
            if (s->cand[i].p >= cut) s->cand[m++] = s->cand[i];
    }
    qsort(s->cand, (size_t)m, sizeof *s->cand, by_prob_desc);
    if (s->o.top_k > 0 && s->o.top_k < m) m = s->o.top_k;
    double kept = 0;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        kept += s->cand[i].p;
        if (s->o.top_p < 1 && kept >= s->o.top_p * sum) {
            last = i;
            break;
        }
    }
    double total = 0;
    for (int i = 0; i <= last; i++) total += s->cand[i].p;
    double r = next_uniform(s) * total, acc = 0;
    for (int i = 0; i <= last; i++) {
        acc += s->cand[i].p;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[last].id;
}

float cp_top2_margin(const float *logits, int V)
{
    if (V < 2) return 0;
    float a = logits[0] >= logits[1] ? logits[0] : logits[1], b = logits[0] >= logits[1] ? logits[1] : logits[0];
    for (int i = 2; i < V; i++) {
        if (logits[i] > a) b = a, a = logits[i];
        else if (logits[i] > b) b = logits[i];
    }
    return a - b;
}
