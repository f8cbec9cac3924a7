/* PCRE2 matching under a per-message step budget: see detect_match.h. */
#include "detect_match.h"

#include <stdio.h>

cp_step_budget cp_step_budget_for(size_t len)
{
    uint64_t per = (uint64_t)len * CP_DETECT_STEPS_PER_BYTE;
    return (cp_step_budget){ .left = CP_DETECT_STEPS_BASE + per, .limit = CP_DETECT_STEPS_BASE + per };
}

cp_status cp_regex_compile_counted(cp_regex *r, const char *src, size_t len, const char *where, cp_error *err)
{
    /* JIT runs the callouts too; without it the interpreter counts the same */
    return cp_regex_compile_opts(r, src, len, PCRE2_UTF | PCRE2_UCP | PCRE2_AUTO_CALLOUT, where, err);
}

/* one step per callout; a negative return abandons the whole match */
static int spend_step(pcre2_callout_block *cb, void *data)
{
    cp_step_budget *b = data;
    if (b->left == 0) {
        b->at = cb->current_position;
        return PCRE2_ERROR_CALLOUT;
    }
    b->left--;
    return 0;
}

cp_status cp_regex_find_counted(const cp_regex *r, cp_regex_matcher *m, cp_step_budget *b, const char *s, size_t len,
                                size_t from, int whole, int *found, cp_error *err)
{
    *found = 0;
    if (b->left == 0)
        return cp_fail(err, CP_ERANGE, "step budget of %llu spent before byte %zu of %zu", (unsigned long long)b->limit,
                       from, len);
    uint32_t opts = PCRE2_NO_UTF_CHECK | (whole ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0);
    /* the callout's data is this call's budget: set per call, as the
     * matcher may serve other messages between calls */
    pcre2_set_callout(m->mctx, spend_step, b);
    int rc = pcre2_match(r->re, (PCRE2_SPTR)s, len, from, opts, m->md, m->mctx);
    pcre2_set_callout(m->mctx, NULL, NULL);
    /* every call costs a step, even one the start-up optimisations answer
     * without reaching the pattern (a rule that matches at every byte) */
    if (b->left) b->left--;
    *found = rc >= 0;
    if (rc >= 0 || rc == PCRE2_ERROR_NOMATCH) return CP_OK;
    if (rc == PCRE2_ERROR_CALLOUT)
        return cp_fail(err, CP_ERANGE, "step budget of %llu spent at byte %zu of %zu", (unsigned long long)b->limit,
                       b->at, len);
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return cp_fail(err, CP_ERANGE, "regex matching failed: %s", (char *)msg);
}
