/* Numbers spelt out in words: a phone, card or PIN read aloud or typed by
 * someone dodging a filter ("five five five, one two three, four five six
 * seven", "oh two oh seven double six ...", "zéro six douze trente-quatre",
 * "555 one two three 4567").  The regex recognizers see digits only, so a
 * number in words passed them all.  The built-in detector runs this beside
 * its recognizers (detect_builtin.c) on the roles it scans for formats. */
#ifndef CP_DETECT_SPELT_H
#define CP_DETECT_SPELT_H

#include <stddef.h>

#include "detect.h"

/* Adds a span for each run of digit words (English, French, Spanish or
 * German, one language a run; with "oh", "double", "triple", teens and
 * tens, "hundred") and digit groups that stands for 7 digits or more, or 4
 * or more after a number's name on its line (pin, code, card, phone,
 * account, ssn ...; the span's type follows the name).  Without a name,
 * a run that counts (one two three ...), counts down, steps evenly (four,
 * six, eight, ten) or repeats one digit is prose, as is an English list
 * of tens and teens split by commas at every step, and a run needs three
 * digits spelt in words (digits alone are the recognizers').  One pass
 * over the text, a bounded look back for the name (out->steps counts the
 * bytes). */
cp_status cp_find_spelt_numbers(const char *t, size_t len, cp_spans *out, cp_error *err);

#endif
