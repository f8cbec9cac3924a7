#include "helpers.h"

#include "../tokenizer/tokenizer.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *shared_path(char *out, size_t cap, const char *rel)
{
    const char *root = getenv("CP_SHARED");
    snprintf(out, cap, "%s/%s", root && *root ? root : "../shared", rel);
    return out;
}

const char *test_tmpdir(char *out, size_t cap, const char *name)
{
    const char *root = getenv("CP_TMP");
    if (!root || !*root) root = "build/tmp";
    mkdir("build", 0755);
    mkdir(root, 0755);
    snprintf(out, cap, "%s/%s-%d", root, name, (int)getpid());
    mkdir(out, 0755);
    return out;
}

cp_model *load_model_or_die(const char *dir, cp_backend **be_out)
{
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK, "%s", err.msg);
    cp_model *m = NULL;
    cp_status rc = cp_model_load(dir, be, NULL, &m, &err);
    cr_assert_eq(rc, CP_OK, "loading %s: %s", dir, err.msg);
    *be_out = be;
    return m;
}

struct cp_tokenizer *open_tokenizer_or_die(const char *rel)
{
    char dir[512];
    cp_error err = { 0 };
    cp_tokenizer *t = NULL;
    cr_assert_eq(cp_tokenizer_load(shared_path(dir, sizeof dir, rel), &t, &err), CP_OK, "%s", err.msg);
    return t;
}

float max_abs_diff(const float *a, const float *b, size_t n)
{
    float d = 0;
    for (size_t i = 0; i < n; i++) {
        float x = fabsf(a[i] - b[i]);
        if (!(x <= d)) d = x; /* NaN propagates */
    }
    return d;
}

float max_abs(const float *a, size_t n)
{
    float d = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(a[i]) > d) d = fabsf(a[i]);
    return d;
}

char *read_text(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf) {
        buf[n] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}

int write_bytes(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    int ok = fwrite(data, 1, n, fp) == n;
    return fclose(fp) == 0 && ok;
}
