/* safetensors round trips, dtype conversions, and random header damage. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

typedef struct blobs {
    const void *data[8];
} blobs;

static cp_status give(void *ctx, size_t i, void *buf, size_t nbytes, cp_error *err)
{
    (void)err;
    memcpy(buf, ((blobs *)ctx)->data[i], nbytes);
    return CP_OK;
}

Test(safetensors, round_trip_every_dtype)
{
    char dir[512], path[600];
    test_tmpdir(dir, sizeof dir, "st-rt");
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    float f32[3] = { 1.5f, -2.25f, 1e-30f };
    uint16_t bf16[3] = { cp_f32_to_bf16(1.0f), cp_f32_to_bf16(-3.0f), cp_f32_to_bf16(0.1f) };
    uint16_t f16[4] = { 0x3c00 /* 1 */, 0xc000 /* -2 */, 0x0001 /* 2^-24 */, 0x7c00 /* inf */ };
    int32_t i32[2] = { -7, 2147483647 };
    int64_t i64[2] = { 5, (int64_t)1 << 40 };
    st_write_entry e[] = {
        { "a.f32", CP_F32, 1, { 3 } },    { "b.bf16", CP_BF16, 2, { 1, 3 } }, { "c.f16", CP_F16, 1, { 4 } },
        { "d.i32", CP_I32, 1, { 2 } },    { "e.i64", CP_I64, 1, { 2 } },
    };
    blobs b = { { f32, bf16, f16, i32, i64 } };
    cp_error err = { 0 };
    cr_assert_eq(st_write_file(path, e, 5, give, &b, &err), CP_OK, "%s", err.msg);
    st_set *s = NULL;
    cr_assert_eq(st_open_file(path, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(st_count(s), 5);
    float out[4];
    cr_assert_eq(st_read_f32(st_find(s, "a.f32"), out, &err), CP_OK);
    cr_assert_arr_eq(out, f32, sizeof f32);
    cr_assert_eq(st_read_f32(st_find(s, "b.bf16"), out, &err), CP_OK);
    cr_assert(out[0] == 1.0f && out[1] == -3.0f && fabsf(out[2] - 0.1f) < 1e-3f);
    cr_assert_eq(st_find(s, "b.bf16")->shape[1], 3);
    cr_assert_eq(st_read_f32(st_find(s, "c.f16"), out, &err), CP_OK);
    cr_assert(out[0] == 1.0f && out[1] == -2.0f && out[2] == ldexpf(1, -24) && isinf(out[3]));
    int32_t iv[2];
    cr_assert_eq(st_read_i32(st_find(s, "d.i32"), iv, &err), CP_OK);
    cr_assert(iv[0] == -7 && iv[1] == 2147483647);
    cr_assert_eq(st_read_i32(st_find(s, "e.i64"), iv, &err), CP_ERANGE);
    cr_assert(strstr(err.msg, "'e.i64'[1]"), "%s", err.msg);
    cr_assert_eq(st_read_f32(st_find(s, "d.i32"), out, &err), CP_EFORMAT);
    cr_assert_null(st_find(s, "nope"));
    st_close(s);
}

Test(safetensors, bf16_rounds_to_nearest_even)
{
    cr_assert_eq(cp_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0) */
    cr_assert_eq(cp_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    cr_assert_eq(cp_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    cr_assert(isnan(cp_bf16_to_f32(cp_f32_to_bf16(NAN))));
}

/* Flips random header bytes of a real checkpoint many times: every open
 * either succeeds or fails with a message; nothing crashes (run under ASan
 * by make asan-test). */
Test(safetensors, random_header_damage_never_crashes)
{
    char src[512], dir[512], path[600];
    shared_path(src, sizeof src, "fixtures/qwen2-tiny/model.safetensors");
    size_t len;
    char *orig = read_text(src, &len);
    cr_assert(orig, "cannot read %s", src);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (unsigned char)orig[i];
    test_tmpdir(dir, sizeof dir, "st-fuzz");
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    char *buf = malloc(len);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    int failures = 0;
    const char alphabet[] = "{}[]\":,0123456789-eE.FBI";
    for (int iter = 0; iter < 300; iter++) {
        memcpy(buf, orig, len);
        int edits = 1 + iter % 4;
        for (int k = 0; k < edits; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (r >> 33) % (8 + hlen);
            char c = (r >> 20) & 1 ? alphabet[(r >> 8) % (sizeof alphabet - 1)] : (char)(r >> 12);
            buf[at] = c;
        }
        cr_assert(write_bytes(path, buf, len));
        st_set *s = NULL;
        cp_error err = { 0 };
        if (st_open_file(path, &s, &err) == CP_OK) {
            st_close(s);
        } else {
            failures++;
            cr_assert(strlen(err.msg) > 0 && strstr(err.msg, path), "error without a file name: '%s'", err.msg);
        }
    }
    cr_assert_gt(failures, 100); /* most damage must be caught */
    free(buf);
    free(orig);
}
