/* Rule files (--rules FILE), one rule a line:
 *
 *   # a comment; blank lines are ignored
 *   regex   TYPE  PATTERN        PCRE2 (UTF, UCP), the rest of the line
 *   keyword TYPE  word|word|...  whole words, case-insensitive
 *   allow   PATTERN              a span whose whole text matches PATTERN is
 *                                never flagged, whichever detector found it
 *
 * TYPE is a name of up to 23 characters ([A-Za-z0-9_-]).  Errors name the
 * file and line.
 *
 * Each rule matches a message under a step budget of its own that is total
 * over all its matches in that message (detect_match.h): a pattern that
 * backtracks at every position, or matches often after much work, spends
 * it and the message fails closed, instead of running for minutes. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/fileio.h"
#include "../../tokenizer/regex.h"
#include "../../tokenizer/utf8.h"
#include "detect.h"
#include "detect_match.h"

typedef struct rule {
    cp_regex re;
    char type[CP_SPAN_TYPE_MAX];
    int allow;
} rule;

typedef struct rules {
    rule *v;
    size_t n;
    cp_regex_matcher m;
} rules;

static void rules_destroy(cp_detector *d)
{
    rules *r = d->impl;
    if (r) {
        for (size_t i = 0; i < r->n; i++) cp_regex_free(&r->v[i].re);
        free(r->v);
        cp_regex_matcher_free(&r->m);
        free(r);
    }
    free(d);
}

static cp_status rules_detect(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    (void)role;
    rules *r = d->impl;
    cp_status rc;
    for (size_t i = 0; i < r->n; i++) {
        const rule *ru = &r->v[i];
        if (ru->allow) continue;
        size_t from = 0, ms, me;
        int found;
        cp_step_budget b = cp_step_budget_for(len);
        while (from <= len) {
            rc = cp_regex_find_counted(&ru->re, &r->m, &b, text, len, from, 0, &found, err);
            if (rc) {
                out->steps += b.limit - b.left;
                return cp_fail_wrap(err, "rule %zu (%s)", i + 1, ru->type);
            }
            if (!found) break;
            cp_regex_group(&r->m, 0, &ms, &me);
            if (me > ms && (rc = cp_spans_add(out, (uint32_t)ms, (uint32_t)me, ru->type, 0.9f, err))) return rc;
            from = me > ms ? me : ms + 1;
            while (from < len && cp_utf8_continues((unsigned char)text[from])) from++;
        }
        out->steps += b.limit - b.left;
    }
    /* allow rules drop any span whose whole text they match, found by this
     * file's rules or by detectors before it in the chain */
    for (size_t i = 0; i < r->n; i++) {
        if (!r->v[i].allow) continue;
        cp_step_budget b = cp_step_budget_for(len); /* over all the spans it tests */
        size_t k = 0;
        for (size_t s = 0; s < out->n; s++) {
            int allowed = 0;
            rc = cp_regex_find_counted(&r->v[i].re, &r->m, &b, text + out->v[s].start, out->v[s].end - out->v[s].start, 0,
                                       1, &allowed, err);
            if (rc) {
                out->steps += b.limit - b.left;
                return cp_fail_wrap(err, "allow rule %zu", i + 1);
            }
            if (!allowed) out->v[k++] = out->v[s];
        }
        out->n = k;
        out->steps += b.limit - b.left;
    }
    return CP_OK;
}

static cp_status add_rule(rules *r, const char *type, const char *pattern, size_t plen, int allow, const char *where,
                          cp_error *err)
{
    rule *v = realloc(r->v, (r->n + 1) * sizeof *v);
    if (!v) return cp_fail(err, CP_ENOMEM, "%s: out of memory", where);
    r->v = v;
    rule *ru = &r->v[r->n];
    memset(ru, 0, sizeof *ru);
    cp_status rc = cp_regex_compile_counted(&ru->re, pattern, plen, where, err);
    if (rc) return rc;
    snprintf(ru->type, sizeof ru->type, "%s", type ? type : "allow");
    ru->allow = allow;
    r->n++;
    return CP_OK;
}

/* next whitespace-separated field of *p, NUL-terminated in place */
static char *field(char **p)
{
    while (**p == ' ' || **p == '\t') (*p)++;
    if (!**p) return NULL;
    char *s = *p;
    while (**p && **p != ' ' && **p != '\t') (*p)++;
    if (**p) *(*p)++ = 0;
    return s;
}

static int valid_type(const char *t)
{
    size_t n = strlen(t);
    if (n == 0 || n >= CP_SPAN_TYPE_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)t[i]) && t[i] != '_' && t[i] != '-') return 0;
    return 1;
}

/* keyword list -> (?i)\b(?:\Qw1\E|\Qw2\E)\b */
static char *keyword_regex(const char *list, cp_error *err)
{
    size_t n = strlen(list);
    char *re = cp_malloc(n * 3 + 32, "keyword rule", err);
    if (!re) return NULL;
    char *o = re;
    o += sprintf(o, "(?i)\\b(?:");
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|'), *end = bar ? bar : p + strlen(p);
        if (end > p) {
            if (o[-1] != ':') *o++ = '|';
            o += sprintf(o, "\\Q");
            for (const char *q = p; q < end; q++) {
                if (q[0] == '\\' && q + 1 < end && q[1] == 'E') { /* \E inside \Q..\E: split it */
                    o += sprintf(o, "\\E\\\\\\QE");
                    q++;
                    continue;
                }
                *o++ = *q;
            }
            o += sprintf(o, "\\E");
        }
        p = bar ? bar + 1 : end;
    }
    sprintf(o, ")\\b");
    return re;
}

cp_status cp_detector_rules(const char *path, cp_detector **out, cp_error *err)
{
    *out = NULL;
    char *text;
    cp_status rc = cp_read_file(path, (size_t)16 << 20, &text, NULL, err);
    if (rc) return rc;
    cp_detector *d = cp_calloc(1, sizeof *d, "rules detector", err);
    rules *r = d ? cp_calloc(1, sizeof *r, "rules detector", err) : NULL;
    if (!r) {
        free(d);
        free(text);
        return CP_ENOMEM;
    }
    d->name = "rules";
    d->detect = rules_detect;
    d->destroy = rules_destroy;
    d->impl = r;
    int lineno = 0;
    for (char *line = text, *next; line && rc == CP_OK; line = next) {
        lineno++;
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r') line[--ll] = 0;
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        char *p = line, *kind = field(&p);
        if (!kind || kind[0] == '#') continue;
        if (strcmp(kind, "allow") == 0) {
            while (*p == ' ' || *p == '\t') p++;
            if (!*p) rc = cp_fail(err, CP_EFORMAT, "%s: 'allow' needs a pattern", where);
            else rc = add_rule(r, NULL, p, strlen(p), 1, where, err);
        } else if (strcmp(kind, "regex") == 0 || strcmp(kind, "keyword") == 0) {
            char *type = field(&p);
            while (*p == ' ' || *p == '\t') p++;
            if (!type || !*p) rc = cp_fail(err, CP_EFORMAT, "%s: '%s' needs a TYPE and a %s", where, kind,
                                           kind[0] == 'r' ? "PATTERN" : "word list");
            else if (!valid_type(type)) rc = cp_fail(err, CP_EFORMAT, "%s: bad TYPE '%.40s' (letters, digits, _ and -, < 24)", where, type);
            else if (kind[0] == 'r') rc = add_rule(r, type, p, strlen(p), 0, where, err);
            else {
                char *re = keyword_regex(p, err);
                rc = re ? add_rule(r, type, re, strlen(re), 0, where, err) : CP_ENOMEM;
                free(re);
            }
        } else {
            rc = cp_fail(err, CP_EFORMAT, "%s: unknown rule '%.40s' (regex, keyword, allow)", where, kind);
        }
    }
    free(text);
    if (rc == CP_OK) rc = cp_regex_matcher_init(&r->m, 0, err);
    if (rc) {
        rules_destroy(d);
        return rc;
    }
    *out = d;
    return CP_OK;
}
