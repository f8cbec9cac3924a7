#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

cp_status cp_path_join(char *out, size_t cap, const char *dir, const char *name, cp_error *err)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return cp_fail(err, CP_EINVAL, "path '%.64s.../%.64s' is longer than %zu bytes", dir, name, cap);
    return CP_OK;
}

/* O_NONBLOCK on the open itself: opening a FIFO for reading otherwise waits
 * for a writer, before any fstat could look at it.  The flag is cleared
 * once the file is known to be regular (it means nothing there, but a
 * caller may fdopen the descriptor). */
cp_status cp_open_regular(const char *path, int *fd_out, size_t *size_out, cp_error *err)
{
    *fd_out = -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return cp_fail(err, CP_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return cp_fail(err, CP_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return cp_fail(err, CP_EINVAL, "%s: not a regular file (a %s); a regular file is needed here", path,
                       S_ISFIFO(sb.st_mode) ? "FIFO" : S_ISDIR(sb.st_mode) ? "directory" : S_ISCHR(sb.st_mode) ? "character device"
                       : S_ISSOCK(sb.st_mode) ? "socket" : "special file");
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return cp_fail(err, CP_EIO, "%s: fcntl: %s", path, strerror(e));
    }
    *fd_out = fd;
    if (size_out) *size_out = (size_t)sb.st_size;
    return CP_OK;
}

cp_status cp_fopen_regular(const char *path, FILE **out, cp_error *err)
{
    *out = NULL;
    int fd;
    cp_status rc = cp_open_regular(path, &fd, NULL, err);
    if (rc) return rc;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        int e = errno;
        close(fd);
        return cp_fail(err, CP_EIO, "%s: fdopen: %s", path, strerror(e));
    }
    *out = fp;
    return CP_OK;
}

/* The buffer starts at the size fstat reports (a small rules or config file
 * costs its own size, not the cap: the cap is 16 MiB for some callers and
 * allocating it per read dominated the rules fuzzer) and grows, never past
 * cap + 1, only if the file grew since. */
cp_status cp_read_file(const char *path, size_t cap, char **out, size_t *len, cp_error *err)
{
    *out = NULL;
    int fd;
    size_t size;
    cp_status rc = cp_open_regular(path, &fd, &size, err);
    if (rc) return rc;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        int e = errno;
        close(fd);
        return cp_fail(err, CP_EIO, "%s: fdopen: %s", path, strerror(e));
    }
    size_t have = (size < cap ? size : cap) + 1, n = 0;
    char *buf = cp_malloc(have + 1, path, err);
    if (!buf) {
        fclose(fp);
        return CP_ENOMEM;
    }
    for (;;) {
        n += fread(buf + n, 1, have - n, fp);
        if (n < have || have > cap) break; /* end of file, or past the cap */
        size_t grow = have > cap / 2 ? cap + 1 : have * 2;
        char *nb = realloc(buf, grow + 1);
        if (!nb) {
            free(buf);
            fclose(fp);
            return cp_fail(err, CP_ENOMEM, "%s: out of memory reading %zu bytes", path, grow);
        }
        buf = nb;
        have = grow;
    }
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

/* dev+ino of path, or, for a path that does not exist yet, of its parent
 * directory with the last component (two spellings of one file to be
 * created are still one file). */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
    char leaf[256];
} file_id;

static int file_id_of(const char *path, file_id *id)
{
    struct stat sb;
    memset(id, 0, sizeof *id);
    if (stat(path, &sb) == 0) {
        id->dev = sb.st_dev, id->ino = sb.st_ino;
        return 1;
    }
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t cut = n;
    while (cut > 0 && path[cut - 1] != '/') cut--;
    if (n - cut == 0 || n - cut >= sizeof id->leaf) return 0;
    memcpy(id->leaf, path + cut, n - cut);
    char dir[4096];
    if (cut == 0) strcpy(dir, ".");
    else if (cut == 1) strcpy(dir, "/");
    else if (cut - 1 < sizeof dir) memcpy(dir, path, cut - 1), dir[cut - 1] = 0;
    else return 0;
    if (stat(dir, &sb) != 0) return 0;
    id->dev = sb.st_dev, id->ino = sb.st_ino;
    return 1;
}

int cp_same_file(const char *a, const char *b)
{
    file_id x, y;
    if (!file_id_of(a, &x) || !file_id_of(b, &y)) return 0;
    return x.dev == y.dev && x.ino == y.ino && strcmp(x.leaf, y.leaf) == 0;
}

cp_status cp_model_dir_check(const char *dir, cp_error *err)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return cp_fail(err, CP_EIO, "model directory %s %s", dir, errno == ENOENT ? "does not exist" : strerror(errno));
    if (!S_ISDIR(st.st_mode)) return cp_fail(err, CP_EIO, "model directory %s is not a directory", dir);
    return CP_OK;
}
