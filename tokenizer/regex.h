/* PCRE2 in UTF + UCP mode with JIT, for the tokenizer's split patterns and
 * the detector's recognizers and rules.  Subjects must be valid UTF-8
 * (callers check once; matching skips PCRE2's own check).  Matching is
 * bounded by a match limit, and every matching error is an error, never a
 * silent "no match". */
#ifndef CP_REGEX_H
#define CP_REGEX_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>

#include "../kernels/status.h"

typedef struct cp_regex {
    pcre2_code *re;
} cp_regex;

/* literal: the pattern is a plain string.  `where` prefixes the message. */
cp_status cp_regex_compile(cp_regex *r, const char *src, size_t len, int literal, const char *where, cp_error *err);
/* As cp_regex_compile with the PCRE2 compile options given (then JIT). */
cp_status cp_regex_compile_opts(cp_regex *r, const char *src, size_t len, uint32_t opts, const char *where, cp_error *err);
void cp_regex_free(cp_regex *r);

/* Per-thread matching state: match data for `groups` capture groups (plus
 * the whole match) and the match limit. */
typedef struct cp_regex_matcher {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
} cp_regex_matcher;

cp_status cp_regex_matcher_init(cp_regex_matcher *m, int groups, cp_error *err);
void cp_regex_matcher_free(cp_regex_matcher *m);

/* The first match in s[0..len) at or after `from`; with `whole`, the match
 * must cover all of s.  *found = 0 when there is none.  After a match,
 * cp_regex_group reads its groups (0 = the whole match). */
cp_status cp_regex_find(const cp_regex *r, cp_regex_matcher *m, const char *s, size_t len, size_t from, int whole,
                        int *found, cp_error *err);
/* 1 and the group's [start, end) if the group took part in the match. */
int cp_regex_group(const cp_regex_matcher *m, int group, size_t *start, size_t *end);

#endif
