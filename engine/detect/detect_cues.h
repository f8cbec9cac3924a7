/* Which of a fixed set of cue words a text holds, ASCII letters in any
 * case, in one pass over it.  The built-in detector runs a recognizer
 * only on a message that holds one of its cue words (detect_builtin.c):
 * looking for each of its ~70 words in turn (memchr on the first letter,
 * or memmem) read a 2 KB message 70 times and was the largest cost of the
 * built-ins on prose.  Here each position's first two bytes are looked up
 * in a bitset of the words' first two bytes; only the words that begin
 * with them are compared. */
#ifndef CP_DETECT_CUES_H
#define CP_DETECT_CUES_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/status.h"

#define CP_CUE_WORDS 384 /* words a set holds (the built-ins use some 300) */
#define CP_CUE_LEN 32    /* bytes a word may have (at least 2) */

typedef struct cp_cue_set {
    struct {
        char w[CP_CUE_LEN];
        uint8_t len;
        int16_t next; /* the next word with the same first two bytes, -1 at the end */
        uint64_t owners;
    } word[CP_CUE_WORDS];
    int n;
    uint64_t first2[65536 / 64]; /* bit (a << 8 | b): some word begins with bytes a, b */
    int16_t head[4096];          /* the first word of a chain, by a hash of its first two bytes; -1: none */
} cp_cue_set;

void cp_cue_set_init(cp_cue_set *s);
/* Adds word w[0..n) (its ASCII letters lowercase) for the owners in the
 * mask (bits of the caller's choosing).  CP_ERANGE when the set is full or
 * the word is shorter than 2 or longer than CP_CUE_LEN bytes. */
cp_status cp_cue_set_add(cp_cue_set *s, const char *w, size_t n, uint64_t owners, cp_error *err);
/* The owners of every word that occurs in text[0..len), ASCII letters
 * compared in any case. */
uint64_t cp_cue_set_scan(const cp_cue_set *s, const char *text, size_t len);

#endif
