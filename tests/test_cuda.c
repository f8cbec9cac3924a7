/* The CUDA backend against the CPU reference: the device checks of
 * profiling/gpu_checks.c as Criterion tests (the lent GPU machine runs the
 * same checks through gpu_check, without Criterion).  Each skips cleanly where
 * there is no device or the build has no CUDA backend; the last runs the
 * checks with a CPU backend in the device's place, so the harness itself is
 * tested everywhere. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/cpu/ops_cpu.h"
#include "../profiling/gpu_checks.h"
#include "helpers.h"

static cp_backend *cuda_or_skip(void)
{
    cp_backend *be = NULL;
    cp_error err = { 0 };
    cp_status rc = cp_backend_cuda_create(&be, &err);
    if (rc != CP_OK) {
        /* the reason must be a clear one, not a crash or an empty message */
        cr_assert(rc == CP_EUNSUPPORTED || rc == CP_EDEVICE, "unexpected status %s: %s", cp_status_name(rc), err.msg);
        cr_assert(strlen(err.msg) > 10);
        cr_skip_test("no CUDA: %s", err.msg);
    }
    return be;
}

Test(cuda, memory_round_trip)
{
    cp_backend *be = cuda_or_skip();
    cp_error err = { 0 };
    unsigned char src[4096], dst[4096];
    for (int i = 0; i < 4096; i++) src[i] = (unsigned char)(i * 7);
    void *a, *b;
    cr_assert_eq(be->alloc(be, 4096, &a, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(be->alloc(be, 4096, &b, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(be->upload(be, a, src, 4096, &err), CP_OK, "%s", err.msg);
    be->copy(be, b, a, 4096);
    be->zero(be, a, 4096);
    cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(be->download(be, dst, b, 4096, &err), CP_OK, "%s", err.msg);
    cr_assert_arr_eq(dst, src, 4096);
    cr_assert_eq(be->download(be, dst, a, 4096, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < 4096; i++) cr_assert_eq(dst[i], 0);
    be->free(be, a), be->free(be, b);
    cp_backend_destroy(be);
}

static void open_or_skip(check *k)
{
    cp_error err = { 0 };
    cp_status rc = gpu_checks_open(k, 0, &err);
    if (rc != CP_OK) {
        cr_assert(rc == CP_EUNSUPPORTED || rc == CP_EDEVICE, "unexpected status %s: %s", cp_status_name(rc), err.msg);
        cr_skip_test("no CUDA: %s", err.msg);
    }
}

#define DEVICE_CHECK(name, call)                                                                                             \
    Test(cuda, name, .timeout = TEST_TIMEOUT(300))                                                                                     \
    {                                                                                                                    \
        check k;                                                                                                         \
        open_or_skip(&k);                                                                                                \
        int ok = (call);                                                                                                 \
        gpu_checks_close(&k);                                                                                            \
        cr_assert(ok, "%s", k.why);                                                                                      \
    }

DEVICE_CHECK(embed, t_embed(&k))
DEVICE_CHECK(rmsnorm, t_rmsnorm(&k))
DEVICE_CHECK(rope, t_rope(&k))
DEVICE_CHECK(swiglu, t_swiglu(&k))
DEVICE_CHECK(matmul_bf16, t_matmul(&k))
DEVICE_CHECK(matmul_exact, (k.gpu = k.exact, k.act_bf16 = 0, t_embed(&k) && t_matmul(&k)))
DEVICE_CHECK(place_kv, t_place(&k))
DEVICE_CHECK(attention, t_attention(&k))
DEVICE_CHECK(attention_mma, (k.gpu = k.mma, t_attention_mma(&k)))
DEVICE_CHECK(sample, t_sample(&k))
DEVICE_CHECK(annotator, t_annot(&k, 0))

/* the fixtures' goldens through the exact variant (every greedy token) */
Test(cuda, fixtures_end_to_end, .timeout = TEST_TIMEOUT(300))
{
    check k;
    open_or_skip(&k);
    static const char *names[] = { "qwen2-tiny", "mistral-tiny-swa", "llama-tiny" };
    k.gpu = k.exact;
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "build/gpu_carry/%s.pack", names[i]);
        if (access(path, R_OK) != 0) cr_skip_test("no %s: make gpu-packs", path);
        double nmse;
        int g_ok, g_n;
        cr_assert(e2e(&k, path, 1e-6, &nmse, &g_ok, &g_n), "%s", k.why);
        cr_assert_eq(g_ok, g_n, "%s: %d of %d greedy tokens", names[i], g_ok, g_n);
        cr_assert(t_reuse_prefill(&k, path, &nmse), "%s", k.why);
    }
    gpu_checks_close(&k);
}

/* The harness itself, with a CPU backend in the device's place: every op
 * check must pass (a check that failed here would fail on any device) */
Test(cuda, harness_against_itself, .timeout = TEST_TIMEOUT(300))
{
    check k;
    cp_error err = { 0 };
    cr_assert_eq(gpu_checks_open(&k, 1, &err), CP_OK, "%s", err.msg);
    int (*fns[])(check *) = { t_embed, t_rmsnorm, t_rope, t_swiglu, t_matmul, t_place, t_attention, t_sample };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) cr_assert(fns[i](&k), "check %zu: %s", i, k.why);
    k.gpu = k.mma;
    cr_assert(t_attention_mma(&k), "%s", k.why);
    k.gpu = k.fast;
    cr_assert(t_annot(&k, 1), "%s", k.why);
    gpu_checks_close(&k);
}
