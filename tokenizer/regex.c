#include "regex.h"

#include <stdio.h>

#define CP_REGEX_MATCH_LIMIT 10000000

cp_status cp_regex_compile_opts(cp_regex *r, const char *src, size_t len, uint32_t opts, const char *where, cp_error *err)
{
    int ec;
    PCRE2_SIZE eo;
    r->re = pcre2_compile((PCRE2_SPTR)src, len, opts, &ec, &eo, NULL);
    if (!r->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return cp_fail(err, CP_EFORMAT, "%s: regex error at offset %zu: %s", where, (size_t)eo, (char *)msg);
    }
    /* without JIT (unsupported CPU, no executable memory) the interpreter
     * gives the same results (auto-callouts included), only slower */
    pcre2_jit_compile(r->re, PCRE2_JIT_COMPLETE);
    return CP_OK;
}

cp_status cp_regex_compile(cp_regex *r, const char *src, size_t len, int literal, const char *where, cp_error *err)
{
    /* PCRE2_LITERAL admits only a few other options (UTF is one, UCP is
     * not: 10.42 refuses the pair with "invalid option bits"); a literal has
     * no character classes for UCP to change anyway. */
    uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
    return cp_regex_compile_opts(r, src, len, opts, where, err);
}

void cp_regex_free(cp_regex *r)
{
    if (r->re) pcre2_code_free(r->re);
    r->re = NULL;
}

cp_status cp_regex_matcher_init(cp_regex_matcher *m, int groups, cp_error *err)
{
    m->md = pcre2_match_data_create((uint32_t)groups + 1, NULL);
    m->mctx = pcre2_match_context_create(NULL);
    if (!m->md || !m->mctx) {
        cp_regex_matcher_free(m);
        return cp_fail(err, CP_ENOMEM, "out of memory for regex match data");
    }
    pcre2_set_match_limit(m->mctx, CP_REGEX_MATCH_LIMIT);
    return CP_OK;
}

void cp_regex_matcher_free(cp_regex_matcher *m)
{
    if (m->md) pcre2_match_data_free(m->md);
    if (m->mctx) pcre2_match_context_free(m->mctx);
    m->md = NULL;
    m->mctx = NULL;
}

cp_status cp_regex_find(const cp_regex *r, cp_regex_matcher *m, const char *s, size_t len, size_t from, int whole,
                        int *found, cp_error *err)
{
    /* pcre2_match runs the JIT code when it can (not for match-time
     * anchoring, where it interprets) */
    uint32_t opts = PCRE2_NO_UTF_CHECK | (whole ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0);
    int rc = pcre2_match(r->re, (PCRE2_SPTR)s, len, from, opts, m->md, m->mctx);
    *found = rc >= 0;
    if (rc >= 0 || rc == PCRE2_ERROR_NOMATCH) return CP_OK;
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return cp_fail(err, CP_ERANGE, "regex matching failed: %s", (char *)msg);
}

int cp_regex_group(const cp_regex_matcher *m, int group, size_t *start, size_t *end)
{
    if ((uint32_t)group >= pcre2_get_ovector_count(m->md)) return 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    if (ov[2 * group] == PCRE2_UNSET) return 0;
    *start = ov[2 * group];
    *end = ov[2 * group + 1];
    return 1;
}
