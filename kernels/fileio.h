/* Small checked file helpers shared by the loaders. */
#ifndef CP_FILEIO_H
#define CP_FILEIO_H

#include <stddef.h>
#include <stdio.h>

#include "status.h"

/* out = dir + "/" + name; CP_EINVAL when it does not fit in cap (a path cut
 * short would name another file). */
cp_status cp_path_join(char *out, size_t cap, const char *dir, const char *name, cp_error *err);

/* Opens path for reading only if it is a regular file: opened with
 * O_NONBLOCK and fstat'ed before anything reads it, so a FIFO, device or
 * directory is refused with a message naming what it is instead of blocking
 * or reading forever.  *size (may be NULL) gets its size. */
cp_status cp_open_regular(const char *path, int *fd, size_t *size, cp_error *err);
/* The same as a stdio stream ("rb"). */
cp_status cp_fopen_regular(const char *path, FILE **out, cp_error *err);

/* Whether a and b name one file: the same device and inode, whatever the
 * spelling (links, "./", symlinks); a path that does not exist yet is
 * compared as its parent directory's device and inode plus its name. */
int cp_same_file(const char *a, const char *b);

/* CP_EIO with a message saying so when dir does not exist or is not a
 * directory ("model directory X does not exist"), before a loader names
 * the first file it could not open in it. */
cp_status cp_model_dir_check(const char *dir, cp_error *err);

/* Reads a whole regular file of at most cap bytes into a NUL-terminated malloc'd
 * buffer; *len (may be NULL) gets its length.  Larger files are refused. */
cp_status cp_read_file(const char *path, size_t cap, char **out, size_t *len, cp_error *err);

#endif
