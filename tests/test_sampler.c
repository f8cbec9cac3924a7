#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "../engine/sampler.h"
#include "../kernels/backend.h"

static cp_sampler make(float temp, int top_k, float top_p, uint64_t seed, int n_valid)
{
    cp_sampler s;
    cp_error err = { 0 };
    cp_sampler_opts o = { temp, top_k, top_p, seed };
    cr_assert_eq(cp_sampler_init(&s, &o, n_valid, &err), CP_OK, "%s", err.msg);
    return s;
}

Test(sampler, greedy_is_argmax_within_valid_ids)
{
    float lg[6] = { 0.1f, 2.0f, -1.0f, 1.9f, 9.0f, 8.0f };
    cp_sampler s = make(0, 0, 1, 0, 4); /* ids 4 and 5 are padding past the tokenizer */
    cr_assert_eq(cp_sample(&s, lg), 1);
    cp_sampler_free(&s);
    s = make(5.0f, 0, 1, 3, 4);
    for (int i = 0; i < 2000; i++) cr_assert_lt(cp_sample(&s, lg), 4);
    cp_sampler_free(&s);
}

Test(sampler, frequencies_follow_softmax)
{
    float lg[3] = { logf(0.5f), logf(0.3f), logf(0.2f) };
    cp_sampler s = make(1.0f, 0, 1, 42, 3);
    int cnt[3] = { 0 };
    const int N = 20000;
    for (int i = 0; i < N; i++) cnt[cp_sample(&s, lg)]++;
    /* 5 sigma of a binomial with N = 20000 is under 0.018 */
    cr_assert(fabs(cnt[0] / (double)N - 0.5) < 0.018, "p0 = %g", cnt[0] / (double)N);
    cr_assert(fabs(cnt[1] / (double)N - 0.3) < 0.018, "p1 = %g", cnt[1] / (double)N);
    cr_assert(fabs(cnt[2] / (double)N - 0.2) < 0.018, "p2 = %g", cnt[2] / (double)N);
    cp_sampler_free(&s);
}

Test(sampler, top_p_and_top_k_cut_the_tail)
{
    float lg[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
    cp_sampler s = make(1.0f, 0, 0.7f, 1, 4); /* nucleus {0, 1} holds 0.8 >= 0.7 */
    int seen[4] = { 0 };
    for (int i = 0; i < 5000; i++) seen[cp_sample(&s, lg)]++;
    cr_assert(seen[0] > 0 && seen[1] > 0 && seen[2] == 0 && seen[3] == 0);
    cp_sampler_free(&s);
    s = make(2.0f, 1, 1, 1, 4); /* top-1 is greedy at any temperature */
    for (int i = 0; i < 500; i++) cr_assert_eq(cp_sample(&s, lg), 0);
    cp_sampler_free(&s);
}

Test(sampler, seed_makes_runs_repeatable)
{
    float lg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    cp_sampler a = make(1, 0, 1, 99, 8), b = make(1, 0, 1, 99, 8), c = make(1, 0, 1, 100, 8);
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        int x = cp_sample(&a, lg), y = cp_sample(&b, lg), z = cp_sample(&c, lg);
        cr_assert_eq(x, y);
        differ += x != z;
    }
    cr_assert_gt(differ, 0);
    cp_sampler_free(&a), cp_sampler_free(&b), cp_sampler_free(&c);
}

Test(sampler, bad_options_are_rejected)
{
    cp_sampler s;
    cp_error err = { 0 };
    cp_sampler_opts o = { -1, 0, 1, 0 };
    cr_assert_eq(cp_sampler_init(&s, &o, 10, &err), CP_ERANGE);
    o = (cp_sampler_opts){ 1, 0, 0, 0 };
    cr_assert_eq(cp_sampler_init(&s, &o, 10, &err), CP_ERANGE);
    cr_assert(strstr(err.msg, "top-p"), "%s", err.msg);
}

/* The backend's sample op (the device sampler's reference): argmax with the
 * lowest index on ties; top-p keeps exactly the ids the probabilities call
 * for; u walks the kept ids in index order, so sweeping u reproduces the
 * kept distribution. */
Test(sampler, backend_sample_op_matches_its_definition)
{
    cp_backend *be;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK);
    float l[6] = { 1.0f, 3.0f, 0.5f, 3.0f, 2.0f, -1.0f };
    cr_assert_eq(be->sample(be, l, 6, 0.0f, 1.0f, 0.5f), 1, "argmax ties go to the lowest index");
    cr_assert_eq(be->sample(be, l, 6, 1.0f, 1.0f, 1.0f), -1, "u must be below 1");
    cr_assert_eq(be->sample(be, l, 0, 1.0f, 1.0f, 0.5f), -1);
    cr_assert_eq(be->sample(be, l, 6, 1.0f, 0.0f, 0.5f), -1, "top_p must be positive");
    /* p over ids 1 and 3 (tied top) = 2 e^3 / Z ~ 0.72: top_p 0.5 keeps both and nothing else */
    int seen[6] = { 0 };
    for (int k = 0; k < 1000; k++) seen[be->sample(be, l, 6, 1.0f, 0.5f, (k + 0.5f) / 1000)]++;
    cr_assert(seen[1] == 500 && seen[3] == 500, "top_p 0.5: ids 1 and 3 half each, got %d and %d", seen[1], seen[3]);
    /* top_p 1: u sweeps the whole softmax in index order */
    double z = 0, p[6];
    for (int i = 0; i < 6; i++) z += p[i] = exp(l[i]);
    memset(seen, 0, sizeof seen);
    for (int k = 0; k < 10000; k++) seen[be->sample(be, l, 6, 1.0f, 1.0f, (k + 0.5f) / 10000)]++;
    for (int i = 0; i < 6; i++)
        cr_assert(fabs(seen[i] / 10000.0 - p[i] / z) < 2e-4, "id %d: %d of 10000, want %.4f", i, seen[i], p[i] / z);
    cp_backend_destroy(be);
}
