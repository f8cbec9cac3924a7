/* The free-text recognizer's scanner: a message's UTF-8 bytes into words
 * (letters, digits and marks, with inner apostrophes and hyphens), each
 * with its shape, its lexicon flags and what lies between it and the word
 * before (a sentence end, a colon, a comma, line breaks).  No regexes: one
 * pass over the bytes, a window of words at a time. */
#include <stdint.h>
#include <utf8proc.h>

#include "../../tokenizer/utf8.h"
#include "detect_names_internal.h"

enum { C_SPACE, C_LOWER, C_UPPER, C_LETTER, C_DIGIT, C_MARK, C_PUNCT };

static int classify(uint32_t cp)
{
    if (cp < 128) {
        if (cp >= 'a' && cp <= 'z') return C_LOWER;
        if (cp >= 'A' && cp <= 'Z') return C_UPPER;
        if (cp >= '0' && cp <= '9') return C_DIGIT;
        if (cp == ' ' || cp == '\t' || cp == '\r' || cp == '\n' || cp == '\f' || cp == '\v') return C_SPACE;
        return C_PUNCT;
    }
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LT: return C_UPPER;
    case UTF8PROC_CATEGORY_LL: return C_LOWER;
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: return C_LETTER;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: return C_MARK;
    case UTF8PROC_CATEGORY_ND: return C_DIGIT;
    case UTF8PROC_CATEGORY_ZS: return C_SPACE;
    default: return C_PUNCT;
    }
}

/* the code point at t[i] (invalid bytes read as one punctuation byte) */
static int next_cp(const char *t, size_t len, size_t i, uint32_t *cp)
{
    int l = cp_utf8_len((const unsigned char *)t + i, len - i, cp);
    if (l == 0) {
        *cp = 0xfffd;
        l = 1;
    }
    return l;
}

size_t cp_names_tokenize(const names *nm, const char *t, size_t len, size_t pos, word *w, size_t cap, size_t *stop,
                         uint64_t *steps)
{
    size_t n = 0, i = pos;
    unsigned gap = pos == 0 ? G_PARA : 0, nl = 0, ends = 0;
    while (i < len && n < cap) {
        uint32_t cp;
        int l = next_cp(t, len, i, &cp), c = classify(cp);
        if (c == C_SPACE || c == C_PUNCT || c == C_MARK) {
            if (cp == '\n') nl++;
            else if (cp == '.' || cp == '!' || cp == '?' || cp == 0x2026) {
                if (cp == '.' && i > 0 && n > 0 && i == w[n - 1].e) gap |= G_DOT;
                ends++;
            } else if (cp == ':') gap |= G_COLON;
            else if (cp == ',' || cp == ';') gap |= G_COMMA;
            else if (cp == '>' && (nl > 0 || (gap & G_PARA))) {
            } /* a quote marker at a line start (> Suite 318): the lines still join */
            else if (cp == '#') gap |= G_HASH;
            else if (c != C_SPACE) gap |= G_OTHER;
            i += (size_t)l;
            continue;
        }
        /* a word: letters, digits and marks, with inner ' ’ - before a letter or digit */
        word *x = &w[n];
        x->s = (uint32_t)i;
        int first = c, lower = 0, letters = 0, digits = 0;
        for (;;) {
            lower += c == C_LOWER, letters += c == C_LOWER || c == C_UPPER || c == C_LETTER;
            digits += c == C_DIGIT;
            i += (size_t)l;
            if (i >= len) break;
            l = next_cp(t, len, i, &cp);
            c = classify(cp);
            if (c != C_SPACE && c != C_PUNCT) continue;
            if (cp != '\'' && cp != 0x2019 && cp != '-') break;
            uint32_t cp2;
            if (i + (size_t)l >= len) break;
            int l2 = next_cp(t, len, i + (size_t)l, &cp2), c2 = classify(cp2);
            if (c2 == C_LOWER || c2 == C_UPPER || c2 == C_LETTER || (cp == '-' && c2 == C_DIGIT)) {
                i += (size_t)l; /* the connector; the loop adds the letter */
                l = l2, c = c2;
                continue;
            }
            break;
        }
        x->e = (uint32_t)i;
        if (letters == 0) x->shape = S_NUM;
        else if (digits > 0) x->shape = S_ALNUM;
        else if (first == C_UPPER) x->shape = letters >= 2 && lower == 0 ? S_UPPER : S_CAP;
        else if (first == C_LOWER) x->shape = S_LOWER;
        else x->shape = S_OTHER;
        x->lex = letters && !digits ? cp_names_lookup(nm, t + x->s, x->e - x->s) : 0;
        if (x->shape == S_CAP && cp_names_compound_street(t + x->s, x->e - x->s)) x->lex |= L_COMPOUND;
        /* a single '.' after an abbreviation or an initial does not end the sentence */
        if (ends == 1 && (gap & G_DOT) && (w[n - 1].lex & L_ABBR || is_initial_letter(t, &w[n - 1]))) ends = 0;
        x->gap = (uint8_t)(gap | (ends ? G_END : 0) | (nl >= 2 ? G_PARA : nl == 1 ? G_NL : 0));
        gap = nl = ends = 0;
        n++;
    }
    *stop = n == cap ? w[n - 1].e : len;
    *steps += i - pos; /* bytes read */
    return n;
}
