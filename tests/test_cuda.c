/* The CUDA backend against the CPU reference.  Skips cleanly where there is
 * no device (or the build has no CUDA backend). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops_cpu.h"
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

Test(cuda, rmsnorm_matches_cpu)
{
    cp_backend *be = cuda_or_skip();
    const int n = 37, dim = 896;
    float *x = malloc((size_t)n * dim * 4), *w = malloc((size_t)dim * 4), *ref = malloc((size_t)n * dim * 4),
          *got = malloc((size_t)n * dim * 4);
    uint64_t r = 12345;
    for (int i = 0; i < n * dim; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((r >> 40) / 16777216.0 * 4 - 2);
    }
    for (int j = 0; j < dim; j++) w[j] = 0.5f + (float)j / dim;
    cpu_rmsnorm(ref, x, w, n, dim, 1e-6f);
    cp_error err = { 0 };
    void *dx, *dw, *dy;
    cr_assert_eq(be->alloc(be, (size_t)n * dim * 4, &dx, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(be->alloc(be, (size_t)dim * 4, &dw, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(be->alloc(be, (size_t)n * dim * 4, &dy, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(be->upload(be, dx, x, (size_t)n * dim * 4, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(be->upload(be, dw, w, (size_t)dim * 4, &err), CP_OK, "%s", err.msg);
    be->rmsnorm(be, dy, dx, dw, n, dim, 1e-6f);
    cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(be->download(be, got, dy, (size_t)n * dim * 4, &err), CP_OK, "%s", err.msg);
    float d = max_abs_diff(got, ref, (size_t)n * dim), s = max_abs(ref, (size_t)n * dim);
    cr_assert(d <= 1e-5f * s, "cuda rmsnorm differs from cpu by %g (scale %g)", d, s);
    be->free(be, dx), be->free(be, dw), be->free(be, dy);
    free(x), free(w), free(ref), free(got);
    cp_backend_destroy(be);
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
