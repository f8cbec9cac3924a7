/* Small checked file helpers shared by the loaders. */
#ifndef CP_FILEIO_H
#define CP_FILEIO_H

#include <stddef.h>

#include "status.h"

/* out = dir + "/" + name; CP_EINVAL when it does not fit in cap (a path cut
 * short would name another file). */
cp_status cp_path_join(char *out, size_t cap, const char *dir, const char *name, cp_error *err);

/* Reads a whole file of at most cap bytes into a NUL-terminated malloc'd
 * buffer; *len (may be NULL) gets its length.  Larger files are refused. */
cp_status cp_read_file(const char *path, size_t cap, char **out, size_t *len, cp_error *err);

#endif
