/* The weight pack the device check carries (model/pack.h): a fixture packed
 * with its golden outputs and read back reproduces the golden logits and
 * greedy ids through the normal forward pass; damaged packs are refused
 * with a message, never read past. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/pack.h"
#include "../model/safetensors.h"
#include "helpers.h"

static void pack_fixture(const char *name, const char *path)
{
    char dir[512], golden[600];
    shared_path(dir, sizeof dir, "fixtures");
    snprintf(golden, sizeof golden, "%s/%s/golden.safetensors", dir, name);
    strcat(dir, "/"), strcat(dir, name);
    cp_backend *be;
    cp_model *m = load_model_or_die(dir, &be);
    cp_error err = { 0 };
    st_set *s;
    cr_assert_eq(st_open_file(golden, &s, &err), CP_OK, "%s", err.msg);
    st_tensor *ids = st_find(s, "input_ids"), *lg = st_find(s, "logits"), *gr = st_find(s, "greedy_ids");
    cp_pack_extra x = { .n_ids = (int)ids->numel, .n_greedy = (int)gr->numel };
    snprintf(x.name, sizeof x.name, "%s", name);
    x.ids = malloc(ids->numel * 4), x.logits = malloc(lg->numel * 4), x.greedy = malloc(gr->numel * 4);
    cr_assert_eq(st_read_i32(ids, x.ids, &err), CP_OK);
    cr_assert_eq(st_read_f32(lg, x.logits, &err), CP_OK);
    cr_assert_eq(st_read_i32(gr, x.greedy, &err), CP_OK);
    st_close(s);
    cr_assert_eq(cp_pack_write(path, m, &x, &err), CP_OK, "%s", err.msg);
    cp_pack_extra_free(&x);
    cp_model_free(m);
    cp_backend_destroy(be);
}

Test(pack, round_trip_reproduces_the_golden_outputs)
{
    const char *names[] = { "qwen2-tiny", "mistral-tiny-swa", "llama-tiny" };
    char tmp[512], path[600];
    test_tmpdir(tmp, sizeof tmp, "pack");
    for (int f = 0; f < 3; f++) {
        snprintf(path, sizeof path, "%s/%s.pack", tmp, names[f]);
        pack_fixture(names[f], path);
        cp_backend *be;
        cp_error err = { 0 };
        cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK);
        cp_model *m;
        cp_pack_extra x;
        cr_assert_eq(cp_pack_read(path, be, &m, &x, &err), CP_OK, "%s", err.msg);
        cr_assert_str_eq(x.name, names[f]);
        const int V = m->cfg.vocab;
        cp_state *st;
        float *got = malloc((size_t)x.n_ids * V * sizeof *got);
        cr_assert_eq(cp_state_create(m, x.n_ids + x.n_greedy, 64, &st, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(cp_forward(m, st, x.ids, NULL, x.n_ids, CP_LOGITS_ALL, got, NULL, &err), CP_OK, "%s", err.msg);
        float d = max_abs_diff(got, x.logits, (size_t)x.n_ids * V), sc = max_abs(x.logits, (size_t)x.n_ids * V);
        cr_assert(d <= 1e-3f * sc, "%s: packed model's logits differ from golden by %g (scale %g)", names[f], d, sc);
        float *last = got + (size_t)(x.n_ids - 1) * V;
        for (int i = 0; i < x.n_greedy; i++) {
            int32_t best = be->sample(be, last, V, 0, 1, 0);
            cr_assert_eq(best, x.greedy[i], "%s: greedy %d is %d, golden %d", names[f], i, best, x.greedy[i]);
            cr_assert_eq(cp_forward(m, st, &best, NULL, 1, CP_LOGITS_LAST, last, NULL, &err), CP_OK, "%s", err.msg);
        }
        free(got);
        cp_state_free(m, st);
        cp_pack_extra_free(&x);
        cp_model_free(m);
        cp_backend_destroy(be);
    }
}

static cp_status read_damaged(const char *path, const char *what, char *bytes, size_t len, cp_error *err)
{
    cr_assert(write_bytes(path, bytes, len), "writing %s", what);
    cp_backend *be;
    cr_assert_eq(cp_backend_cpu_create(&be, err), CP_OK);
    cp_model *m = NULL;
    cp_pack_extra x;
    cp_status rc = cp_pack_read(path, be, &m, &x, err);
    if (rc == CP_OK) cp_pack_extra_free(&x), cp_model_free(m);
    cp_backend_destroy(be);
    return rc;
}

Test(pack, damaged_packs_are_refused)
{
    char tmp[512], good[600], bad[600];
    test_tmpdir(tmp, sizeof tmp, "pack_bad");
    snprintf(good, sizeof good, "%s/good.pack", tmp);
    snprintf(bad, sizeof bad, "%s/bad.pack", tmp);
    pack_fixture("llama-tiny", good);
    size_t len;
    char *b = read_text(good, &len);
    cr_assert(b);
    cp_error err = { 0 };
    cr_assert_eq(read_damaged(bad, "a copy", b, len, &err), CP_OK, "the undamaged copy must load: %s", err.msg);
    cr_assert_eq(read_damaged(bad, "truncated", b, len - 7, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "size does not match"), "%s", err.msg);
    char *hdr = strstr(b, "tokens 33");
    cr_assert(hdr, "the fixture has 33 tokens");
    hdr[7] = '4'; /* tokens 34: the header now promises more than the file holds */
    cr_assert_eq(read_damaged(bad, "lying header", b, len, &err), CP_EFORMAT);
    hdr[7] = '3';
    char *heads = strstr(b, "heads ");
    heads[6] = 'x';
    cr_assert_eq(read_damaged(bad, "garbled header", b, len, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "bad or truncated header"), "%s", err.msg);
    heads[6] = '8';
    b[0] = 'X';
    cr_assert_eq(read_damaged(bad, "bad magic", b, len, &err), CP_EFORMAT);
    b[0] = 'C';
    char *data = strstr(b, "\ndata\n") + 6;
    float nan = NAN;
    memcpy(data + 4 * 8 + 16, &nan, 4); /* into the embedding table, past the RoPE frequencies */
    cr_assert_neq(read_damaged(bad, "NaN weight", b, len, &err), CP_OK);
    cr_assert(strstr(err.msg, "non-finite"), "%s", err.msg);
    cr_assert_neq(read_damaged(bad, "empty", b, 0, &err), CP_OK);
    free(b);
}
