/* Secrets in tables: a CSV, TSV, semicolon-separated or markdown table
 * whose header row names a secret column ("username,password",
 * "| user | api_key |") holds a secret in that column of every row under
 * it, though no row names it.  The built-in detector runs this beside its
 * recognizers (detect_builtin.c), on every policy that scans for secrets. */
#ifndef CP_DETECT_TABLE_H
#define CP_DETECT_TABLE_H

#include <stddef.h>

#include "detect.h"

/* Adds a "secret" span for each cell of 3 bytes or more under a
 * secret-naming header cell, on the lines after the header up to the first
 * that lacks the header's separator or holds another number of cells (a
 * markdown rule row skipped), and for the second cell of a two-cell line
 * whose first names a secret ("password,hunter2").  A cell that
 * placeholder(cell, length) calls a placeholder ("example", "${VAR}") is
 * left alone.  One pass over the text (out->steps counts its bytes). */
cp_status cp_find_table_secrets(const char *t, size_t len, int (*placeholder)(const char *, size_t), cp_spans *out,
                                cp_error *err);

#endif
