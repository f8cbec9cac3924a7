/* PCRE2 matching under a per-message step budget (detect_builtin.c and
 * detect_rules.c).
 *
 * Why not PCRE2's match limit alone: it bounds one attempt at one start
 * position and starts again at every position and every call (measured on
 * 10.42: `(a+)+y` needs the same limit on 1, 2 and 4 KB of "aaaaaaaaaaa "),
 * so a pattern that backtracks a little at every position, or matches
 * often after much work (`x(a+)+y|x`), runs for minutes on a megabyte while
 * no single attempt is over the limit.  Here every pattern is compiled with
 * auto-callouts (one before each pattern item PCRE2 tries, backtracking
 * included; JIT keeps them) and the callout spends one step of a budget
 * that lives for the whole message, over every match and every pattern
 * sharing it.  When it is spent the match is abandoned and the caller gets
 * an error: the chain then fails closed (the message is wholly sensitive).
 *
 * Internal to engine/detect. */
#ifndef CP_DETECT_MATCH_H
#define CP_DETECT_MATCH_H

#include <stdint.h>

#include "../../tokenizer/regex.h"
#include "detect.h"

typedef struct cp_step_budget {
    uint64_t left;  /* steps still allowed */
    uint64_t limit; /* the budget it started with: limit - left were taken */
    size_t at;      /* where matching stood when the budget ran out */
} cp_step_budget;

/* The budget for one pattern on a message of len bytes: a base that lets a
 * short message match anything reasonable, plus a number of steps per byte
 * several times what an ordinary rule takes on prose (measured on Pride and
 * Prejudice: a keyword list 0.4, \b\w+\b 1.3, \b\w+@\w+\.\w+\b 1.5).  A
 * step costs about 7 ns (JIT, callout included), so a pattern that would
 * run away fails closed within about 60 ms per MB. */
#define CP_DETECT_STEPS_BASE ((uint64_t)1 << 20)
#define CP_DETECT_STEPS_PER_BYTE 8
cp_step_budget cp_step_budget_for(size_t len);

/* As cp_regex_compile (UTF + UCP, JIT), with auto-callouts for counting. */
cp_status cp_regex_compile_counted(cp_regex *r, const char *src, size_t len, const char *where, cp_error *err);

/* As cp_regex_find on a pattern from cp_regex_compile_counted, spending
 * steps from b.  A spent budget is an error (CP_ERANGE, "step budget of N
 * spent at byte B of L"), never "no match". */
cp_status cp_regex_find_counted(const cp_regex *r, cp_regex_matcher *m, cp_step_budget *b, const char *s, size_t len,
                                size_t from, int whole, int *found, cp_error *err);

/* The built-in recognizers compiled with auto-callouts, for measuring:
 * out->steps counts every step each recognizer takes, under a budget per
 * recognizer and message.  Auto-callouts turn off PCRE2's start-up
 * optimisations (measured: the card pattern goes from skipping to the next
 * digit to 3 steps at every byte, the chain from 53 to 7 MB/s), so the
 * production detector (cp_detector_builtin) runs the same patterns plainly:
 * they are linear by construction (every repeat bounded or possessive, the
 * key block scanned in C), and the tests hold them to it through this one. */
cp_status cp_detector_builtin_counted(cp_detector **out, cp_error *err);

#endif
