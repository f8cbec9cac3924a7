/* Detection in linear time: a rule's step budget is total over
 * all its matches in a message and fails closed when spent; every built-in
 * recognizer's work per byte stays constant on adversarial input (counted
 * in steps, never timed); the span -> token mask agrees with its
 * definition on random spans.
 *
 * "Linear" is asserted as: the steps on 4x the input are at most 4.2x the
 * steps on 1x, and the steps per byte are under a constant, for inputs
 * built to make each recognizer backtrack or rescan. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/detect/detect.h"
#include "../engine/detect/detect_match.h"
#include "helpers.h"

/* unit repeated to about n bytes (whole units), NUL-terminated */
static char *repeat(const char *unit, size_t n, size_t *len)
{
    size_t ul = strlen(unit), k = 0;
    char *t = malloc(n + 1);
    cr_assert(t);
    while (k + ul <= n) {
        memcpy(t + k, unit, ul);
        k += ul;
    }
    t[k] = 0;
    *len = k;
    return t;
}

static const char *write_rules(const char *name, const char *text)
{
    static char path[600];
    char dir[512];
    test_tmpdir(dir, sizeof dir, name);
    snprintf(path, sizeof path, "%s/rules.txt", dir);
    cr_assert(write_bytes(path, text, strlen(text)));
    return path;
}

/* x(a+)+y|x on "x" + 16 a's: every match succeeds (by the "|x") after
 * some 2^16 backtracking steps, each far under PCRE2's per-match limit; a
 * limit that restarts per match lets 1 MB of these run for minutes. */
Test(detect_linear, rule_budget_is_total_over_matches_and_fails_closed)
{
    cp_detector *d;
    cp_error err = { 0 };
    const char *p = write_rules("budget", "regex evil x(a+)+y|x\n");
    cr_assert_eq(cp_detector_rules(p, &d, &err), CP_OK, "%s", err.msg);
    size_t len;
    char *text = repeat("xaaaaaaaaaaaaaaaa\n", 4000, &len); /* 222 matches */
    /* one match on its own is within the budget: the rule is usable */
    cp_spans s = { 0 };
    cr_assert_eq(d->detect(d, text, 18, CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(s.n, 1);
    cr_assert_gt(s.steps, 1000, "the backtracking is counted (%llu steps)", (unsigned long long)s.steps);
    uint64_t one = s.steps;
    cp_spans_free(&s);
    /* all of them are not: the budget ran out part-way, an error naming
     * the rule and the budget, never the text */
    cr_assert_eq(d->detect(d, text, len, CP_ROLE_USER, &s, &err), CP_ERANGE);
    cr_assert(strstr(err.msg, "rule 1 (evil)") && strstr(err.msg, "step budget"), "%s", err.msg);
    cr_assert_null(strstr(err.msg, "aaaa"), "the message must not carry text: %s", err.msg);
    cp_step_budget b = cp_step_budget_for(len);
    cr_assert_geq(s.steps, b.limit, "the whole budget was spent (%llu of %llu)", (unsigned long long)s.steps,
                  (unsigned long long)b.limit);
    cr_assert_lt(s.steps, b.limit + one + 100, "and not much more");
    cr_assert_lt(b.limit, 222 * one, "the input costs more than the budget (else the test proves nothing)");
    cp_spans_free(&s);
    /* through the chain: the message is wholly sensitive, the failure counted */
    cp_detect_chain c;
    cp_chain_init(&c);
    cr_assert_eq(cp_chain_add(&c, d, &err), CP_OK);
    cr_assert_eq(cp_chain_detect(&c, text, len, CP_ROLE_USER, &s, &err), CP_OK);
    cr_assert(s.wholly, "a spent budget must fail closed");
    cr_assert_eq(s.n, 0);
    cr_assert_eq(c.failures, 1);
    cp_spans_free(&s);
    cp_chain_free(&c);
    free(text);
}

/* an allow rule's budget is total over the spans it tests: each span here
 * is allowed, by the second branch, after ~2^16 steps in the first */
Test(detect_linear, allow_budget_is_total_over_spans)
{
    cp_detector *d;
    cp_error err = { 0 };
    const char *p = write_rules("allow-budget", "regex w xa+\nallow x(a+)+y|xa+\n");
    cr_assert_eq(cp_detector_rules(p, &d, &err), CP_OK, "%s", err.msg);
    size_t len;
    char *text = repeat("xaaaaaaaaaaaaaaaa\n", 4000, &len);
    cp_spans s = { 0 };
    cr_assert_eq(d->detect(d, text, 36, CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(s.n, 0, "both spans are allowed");
    cp_spans_free(&s);
    cr_assert_eq(d->detect(d, text, len, CP_ROLE_USER, &s, &err), CP_ERANGE);
    cr_assert(strstr(err.msg, "allow rule 2") && strstr(err.msg, "step budget"), "%s", err.msg);
    cp_spans_free(&s);
    d->destroy(d);
    free(text);
}

typedef struct measure {
    cp_status rc;
    uint64_t steps;
    size_t spans;
    char msg[CP_ERR_MSG_MAX];
} measure;

static measure run(cp_detector *d, const char *unit, size_t n)
{
    size_t len;
    char *t = repeat(unit, n, &len);
    cp_spans s = { 0 };
    cp_error err = { 0 };
    measure m = { 0 };
    m.rc = d->detect(d, t, len, CP_ROLE_USER, &s, &err);
    m.steps = s.steps;
    m.spans = s.n;
    snprintf(m.msg, sizeof m.msg, "%s", m.rc ? err.msg : "");
    cp_spans_free(&s);
    free(t);
    return m;
}

/* steps on 16 KB and 64 KB of unit: no budget spent, work per byte constant */
static void assert_linear(cp_detector *d, const char *unit, double max_per_byte)
{
    const size_t n = 16384;
    measure a = run(d, unit, n), b = run(d, unit, 4 * n);
    cr_assert_eq(a.rc, CP_OK, "'%s' x 16 KB: %s", unit, a.msg);
    cr_assert_eq(b.rc, CP_OK, "'%s' x 64 KB: %s", unit, b.msg);
    cr_assert_gt(a.steps, 0, "'%s': work is counted", unit);
    cr_assert_leq((double)b.steps, 4.2 * (double)a.steps + 64, "'%s': %llu steps on 64 KB, %llu on 16 KB: superlinear", unit,
                  (unsigned long long)b.steps, (unsigned long long)a.steps);
    cr_assert_leq((double)b.steps / (4 * n), max_per_byte, "'%s': %.1f steps per byte", unit, (double)b.steps / (4 * n));
}

/* inputs that made a recognizer backtrack or rescan, or could */
static const char *const adversarial[] = {
    "Dr. ",                                /* person cue before a name-shaped cue, repeated */
    "-----BEGIN RSA PRIVATE KEY-----\n",   /* a key header without its END line: rescanned to the end */
    "-----BEGIN A A A A A A A -",          /* a header that never reaches PRIVATE KEY */
    "11111111111111111111111111 ",         /* digit runs: the phone pattern split them every way */
    "+11111111111111111111111111 ",
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 x", /* digit groups */
    "1.1.1.1.", "a@a.", "eyJaaaaaaaa.eyJ", "eyJ-", "1 Aaaa ", "born 1", "password=", "a://a:b:", "::",
    "AB12 ", "my name is ", "Mr Aa ",
    "mysql ", "mysql -", "wifi ", "wifi key ", /* a cue whose value may come later on the line */
    "password,token\n", "password,x\n", "| a | b |\n|---|\n", "\"password\",\"\"\"\n", /* table headers and rows */
    "pass\xe2\x80\x8bword: ", "\xe2\x80\x8b",      /* invisible characters (taken out before the scan) */
    "a [at] ", "a.b at ", "x dot ", "gmail dot ",  /* an address's at and dots, never its domain */
    "aB3/", "aB3-", "salary $1,", "salary 1 ", "3C:22:", "3c22.", "seed: ", "postcode ", "cvv ", /* tokens, money, cues */
    "one ", "five six, ", "twenty one ", "double ", "double one ", "oh ", "vingt et ", "1 two ", /* numbers in words */
    "pin one two three four. ", "card number: one. ",                                      /* ... after a name */
    "東京都新宿区", "区区区区", "新宿区1-", "市市1-1", "北京市朝阳区建国", "区路路", "市路1号", "区路路1", "市区市区市区市区市区市区1-", /* CJK units, numbers after them */
};

Test(detect_linear, builtin_recognizers_are_linear)
{
    cp_detector *d;
    cp_error err = { 0 };
    cr_assert_eq(cp_detector_builtin_counted(&d, &err), CP_OK, "%s", err.msg);
    /* the sum over the ~28 recognizers; prose takes about 30 */
    for (size_t i = 0; i < sizeof adversarial / sizeof adversarial[0]; i++) assert_linear(d, adversarial[i], 64);
    d->destroy(d);
}

/* the counted build is the production one plus counting: same spans */
Test(detect_linear, counted_builtin_finds_what_the_plain_one_finds)
{
    cp_detector *c, *p;
    cp_error err = { 0 };
    cr_assert_eq(cp_detector_builtin_counted(&c, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_detector_builtin(&p, &err), CP_OK, "%s", err.msg);
    const char *text = "Dr. Ada Obi, +44 20 7946 0958, 4111 1111 1111 1111, jo@example.com, 10.0.0.1, born 2 March 1990, "
                       "221 Baker Street, password: hunter22 -----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----";
    cp_spans a = { 0 }, b = { 0 };
    cr_assert_eq(c->detect(c, text, strlen(text), CP_ROLE_USER, &a, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(p->detect(p, text, strlen(text), CP_ROLE_USER, &b, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(a.n, b.n);
    cr_assert_geq(a.n, 9);
    for (size_t i = 0; i < a.n; i++)
        cr_assert(a.v[i].start == b.v[i].start && a.v[i].end == b.v[i].end && strcmp(a.v[i].type, b.v[i].type) == 0);
    cp_spans_free(&a), cp_spans_free(&b);
    c->destroy(c), p->destroy(p);
}

/* a key whose END line is missing is a key to the end of the message; a
 * closed one ends at its END line, and the next one is found after it */
Test(detect_linear, private_key_blocks)
{
    cp_detector *d;
    cp_error err = { 0 };
    cr_assert_eq(cp_detector_builtin(&d, &err), CP_OK, "%s", err.msg);
    const char *text = "a -----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY----- b -----BEGIN PUBLIC KEY----- c "
                       "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl";
    cp_spans s = { 0 };
    cr_assert_eq(d->detect(d, text, strlen(text), CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(s.n, 2);
    const char *k1 = strstr(text, "-----BEGIN EC"), *e1 = strstr(text, " b -----"), *k2 = strstr(text, "-----BEGIN OPENSSH");
    cr_assert_eq(s.v[0].start, (uint32_t)(k1 - text));
    cr_assert_eq(s.v[0].end, (uint32_t)(e1 - text));
    cr_assert_eq(s.v[1].start, (uint32_t)(k2 - text));
    cr_assert_eq(s.v[1].end, (uint32_t)strlen(text), "an unterminated key runs to the end");
    cr_assert_str_eq(s.v[1].type, "secret");
    cp_spans_free(&s);
    d->destroy(d);
}

Test(detect_linear, names_recognizer_is_linear)
{
    cp_detector *d;
    cp_error err = { 0 };
    cr_assert_eq(cp_detector_names(&d, &err), CP_OK, "%s", err.msg);
    static const char *const units[] = { "Dr. ",   "Dr ",       "Aa ",   "The ",   "The Aa ", "1 Aa St ", "Via Aa ", "Aa van ",
                                         "in OSLO ", "I am 3 ", "Aa. ", "Aa: ", "Aa'a-a ", "Mr Aa ", "1 ",
                                         /* the cues and honorifics of other scripts (detect_names_scripts.c) */
                                         "我叫王小明", "王先生", "先生", "田中さん", "さん", "名前は", "이름은 김민준 ", "김씨 ",
                                         "اسمي أحمد ", "السيد ", "शर्मा जी ", "श्री ", "меня зовут иван ", "я — ",
                                         /* lowercase addresses: a core, its parts, a locality with no postcode */
                                         "at 1 aa st ", "1 aa st, ", ", 1 aa rd", "flat 1, aa bb rd, ", "aa bb 12345, ",
                                         "1 rue aa ", "Aastr. 1, " };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) assert_linear(d, units[i], 16);
    d->destroy(d);
}

/* the mask by its definition, token by token over every span: a non-empty
 * token is hit when a span overlaps it, an empty one when the bytes on
 * both sides of it are covered */
static int covered(const cp_spans *s, uint64_t x)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i].start <= x && x < s->v[i].end) return 1;
    return 0;
}

Test(detect_linear, token_mask_matches_its_definition)
{
    unsigned seed = 12345;
    cp_error err = { 0 };
    for (int round = 0; round < 200; round++) {
        cp_encoding e = { 0 };
        size_t T = 1 + (size_t)(rand_r(&seed) % 60);
        e.n = T;
        e.start = calloc(T, sizeof *e.start), e.end = calloc(T, sizeof *e.end);
        cr_assert(e.start && e.end);
        uint32_t pos = 0;
        for (size_t k = 0; k < T; k++) {
            e.start[k] = pos;
            pos += (uint32_t)(rand_r(&seed) % 4); /* empty tokens too */
            e.end[k] = pos;
        }
        cp_spans s = { 0 };
        uint32_t base = (uint32_t)(rand_r(&seed) % 3);
        int ns = rand_r(&seed) % 6;
        for (int i = 0; i < ns; i++) {
            uint32_t a = (uint32_t)(rand_r(&seed) % (pos + 2)), b = a + (uint32_t)(rand_r(&seed) % 6);
            cr_assert_eq(cp_spans_add(&s, a, b, "x", 1, &err), CP_OK);
        }
        int pad = rand_r(&seed) % 3;
        uint8_t *got = calloc(T, 1), *want = calloc(T, 1);
        cp_spans_to_mask(&s, base, &e, 0, T, pad, got);
        cp_spans shifted = { 0 };
        for (size_t i = 0; i < s.n; i++)
            cr_assert_eq(cp_spans_add(&shifted, s.v[i].start + base, s.v[i].end + base, "x", 1, &err), CP_OK);
        for (size_t k = 0; k < T; k++) {
            uint32_t a = e.start[k], b = e.end[k];
            int hit = 0;
            if (a == b) hit = a > 0 && covered(&shifted, a - 1) && covered(&shifted, a);
            for (uint32_t x = a; x < b && !hit; x++) hit = covered(&shifted, x);
            if (!hit) continue;
            for (size_t j = k >= (size_t)pad ? k - (size_t)pad : 0; j < T && j <= k + (size_t)pad; j++) want[j] = 1;
        }
        for (size_t k = 0; k < T; k++)
            cr_assert_eq(got[k], want[k], "round %d token %zu [%u,%u) pad %d: mask %d, definition %d", round, k, e.start[k],
                         e.end[k], pad, got[k], want[k]);
        free(got), free(want), free(e.start), free(e.end);
        cp_spans_free(&s), cp_spans_free(&shifted);
    }
}
