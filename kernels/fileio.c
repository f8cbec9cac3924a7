#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cp_status cp_path_join(char *out, size_t cap, const char *dir, const char *name, cp_error *err)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return cp_fail(err, CP_EINVAL, "path '%.64s.../%.64s' is longer than %zu bytes", dir, name, cap);
    return CP_OK;
}

cp_status cp_read_file(const char *path, size_t cap, char **out, size_t *len, cp_error *err)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return cp_fail(err, CP_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = cp_malloc(cap + 1, path, err);
    if (!buf) {
        fclose(fp);
        return CP_ENOMEM;
    }
    size_t n = fread(buf, 1, cap + 1, fp);
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return cp_fail(err, CP_EIO, "%s: read error", path);
    }
    if (n > cap) {
        free(buf);
        return cp_fail(err, CP_EFORMAT, "%s: larger than the %zu-byte cap", path, cap);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return CP_OK;
}
