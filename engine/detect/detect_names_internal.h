/* The free-text recognizer's pieces shared between its files (internal to
 * engine/detect): the word flags of the lexicon, a scanned word and its
 * gap, the lexicon's tables, one window's scan state, and the helpers every
 * rule uses.
 *
 *   detect_names.c          the detector: the window loop, names by cue and
 *                           by capitalised run
 *   detect_names_lexicon.c  the word lists (lexicon, gazetteer, street
 *                           suffixes), their hash table, the common-word list
 *   detect_names_words.c    UTF-8 text into words with shapes and gaps
 *   detect_names_dates.c    full dates and the time after them
 *   detect_names_address.c  street addresses with units, locality, postcode
 *   detect_names_address_lower.c  the same typed in lowercase
 *   detect_names_scripts.c  names by cue and honorific in scripts without
 *                           capitals or spaces (Chinese, Japanese, Korean,
 *                           Arabic, Hindi) and in Russian */
#ifndef CP_DETECT_NAMES_INTERNAL_H
#define CP_DETECT_NAMES_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "detect.h"

enum {
    L_STOP = 1 << 0,     /* capitalised, never a name: days, months, "I" */
    L_FUNC = 1 << 1,     /* function / sentence-start word: dropped from a run's start */
    L_HONOR = 1 << 2,    /* Mr, Dr, Prof ...: the next capitalised words are a person */
    L_PARTICLE = 1 << 3, /* van, de, of ...: joins two capitalised words */
    L_ORG = 1 << 4,      /* Inc, Ltd, University ...: the run is an organisation */
    L_PLACE = 1 << 5,    /* City, River, North ...: the run is a place */
    L_LOCCUE = 1 << 6,   /* in, from, near ...: a run right after it is a place */
    L_STREET = 1 << 7,   /* Street, Rd, Strasse ...: after a number and names */
    L_STREETPRE = 1 << 8, /* Via, Rue, ul. ...: before names and a number */
    L_UNIT = 1 << 9,     /* Apt, Suite, Box ...: before a number */
    L_ABBR = 1 << 10,    /* a '.' after it does not end the sentence */
    L_AGECUE = 1 << 11,  /* aged, turned ...: before a number that is an age */
    /* single words of the cue phrases (my name is X, call me X, I am X, 34 years old) */
    K_IS = 1 << 12, K_NAME = 1 << 13, K_ME = 1 << 14, K_CALL = 1 << 15, K_AM = 1 << 16, K_I = 1 << 17, K_IM = 1 << 18,
    K_NAMED = 1 << 19, K_YEARS = 1 << 20, K_OLD = 1 << 21,
    K_SAYS = 1 << 23, /* said, replied, lives ...: a verb whose subject is most often a person */
    K_AND = 1 << 30,  /* and: Clark, Romero and Hall (a firm), Usamov and Bowers (two people) */
    L_ROLE = 1 << 22, /* Manager, Professor, Sir ...: a run of only these (and initials) names a role, no one */
    L_COMPOUND = 1 << 24, /* set per word, not listed: a capitalised word ending in a street type */
    L_GAZ = 1 << 25,      /* a country or a major place (the gazetteer, detect_names_lexicon.c): a place wherever it stands */
    L_GAZLC = 1 << 26,    /* ... and no ordinary English word, so a place in lowercase too (i'm from france) */
    L_SHIP = 1 << 27,     /* USNS, USNV, USS, USCGC: a US military address is a ship's name */
    L_ADDRCUE = 1 << 28,  /* at, on, to, of, lives ...: capitalised words and a number after it are an address */
    L_LEGAL = 1 << 29,    /* inc, ltd, llc ...: a legal suffix, an organisation even in lowercase */
};

enum { S_LOWER, S_CAP, S_UPPER, S_NUM, S_ALNUM, S_OTHER }; /* a word's shape */
/* what lies between a word and the one before it */
enum {
    G_END = 1,    /* . ! ? (a sentence ends; not after an abbreviation) */
    G_COLON = 2,  /* : */
    G_COMMA = 4,  /* , ; */
    G_NL = 8,     /* one line break */
    G_PARA = 16,  /* a blank line, or the start of the message */
    G_OTHER = 32, /* quotes, brackets, dashes, ... */
    G_DOT = 64,   /* the gap starts with '.' */
    G_HASH = 128, /* # (before a unit number) */
};

typedef struct word {
    uint32_t s, e;
    uint32_t lex; /* L_* and K_* of its lowercase form */
    uint8_t shape, gap;
} word;

#define WINDOW 4096 /* words scanned at once */
#define LOOK 16     /* the most words any rule looks past its start */
#define MAX_RUN 8   /* the most words in one name run (a longer run is split) */

/* The lexicon as an open-addressing hash table (built once, read-only
 * after: detectors may be shared by threads), so a word costs one hash and
 * about one compare. */
#define SLOTS 4096 /* a power of two, over twice the lexicon and gazetteer */
typedef struct slot {
    const char *w;
    uint32_t len, f;
} slot;

/* The common-word list: every lowercase entry of the word file, an
 * open-addressing table of (offset, length) into the file's bytes. */
typedef struct wordlist {
    char *buf;
    struct wl_slot {
        uint32_t off, len; /* len 0: empty */
    } *tab;
    uint32_t mask;
} wordlist;

typedef struct names {
    slot tab[SLOTS];
    wordlist words;
} names;

/* one window of words under the rules */
typedef struct scan {
    const char *t;
    size_t len;
    word *w;
    size_t n, lim; /* words in the window; matches start before lim */
    uint8_t *used; /* per word: already in a span */
    cp_spans *out;
    uint64_t *steps; /* words visited, for out->steps: linear in the message */
    const wordlist *words;
} scan;

#define STEP(s) (++*(s)->steps)

static inline int is_initial_letter(const char *t, const word *w) { return w->shape == S_CAP && w->e - w->s == 1 && t[w->s] >= 'A'; }

/* word k continues a name begun before it: only spaces (or one line break)
 * between, or the '.' of an initial / abbreviation */
static inline int joined(const scan *s, size_t k) { return (s->w[k].gap & (G_END | G_COLON | G_COMMA | G_PARA | G_OTHER | G_HASH)) == 0; }

/* the span's end byte: past the '.' of a final abbreviation (Inc., St.) */
static inline uint32_t end_of(const scan *s, size_t j)
{
    uint32_t e = s->w[j].e;
    if ((s->w[j].lex & L_ABBR) && e < s->len && s->t[e] == '.') e++;
    return e;
}

/* words i..j as one span of type: marked used, so no later rule takes them */
static inline cp_status emit(scan *s, size_t i, size_t j, const char *type, float score, cp_error *err)
{
    for (size_t k = i; k <= j; k++) STEP(s), s->used[k] = 1;
    return cp_spans_add(s->out, s->w[i].s, end_of(s, j), type, score, err);
}

/* detect_names_lexicon.c */

/* every word of the lexicon and the gazetteer into nm's hash table */
void cp_names_lexicon_fill(names *nm);
/* the L_* and K_* flags of s[0..n) in lowercase (ASCII folded); 0 if unlisted */
uint32_t cp_names_lookup(const names *nm, const char *s, size_t n);
/* whether w[0..n) ends in a compound street type (Hammarv\u00e4gen) */
int cp_names_compound_street(const char *w, size_t n);
/* reads the common-word list at path into wl */
cp_status cp_names_words_load(wordlist *wl, const char *path, cp_error *err);
/* whether s[0..n) in lowercase (ASCII folded) is a common word */
int cp_names_common_word(const wordlist *wl, const char *s, size_t n);

/* detect_names_words.c: fills w with up to cap words of t from byte pos;
 * *stop is where the scan stopped (len, or the end of the last word when
 * the window is full); *steps grows by the bytes read */
size_t cp_names_tokenize(const names *nm, const char *t, size_t len, size_t pos, word *w, size_t cap, size_t *stop,
                         uint64_t *steps);

/* detect_names_dates.c: full dates (with their time) as "date" spans */
cp_status cp_names_pass_dates(scan *s, cp_error *err);
/* detect_names_address.c: street addresses as "address" spans */
cp_status cp_names_pass_addresses(scan *s, cp_error *err);
/* detect_names_scripts.c: names after a cue or next to an honorific in
 * non-Latin scripts, over the whole message (not a window of words: those
 * scripts may have no spaces); *steps grows with the bytes and characters read */
cp_status cp_names_pass_scripts(const char *t, size_t len, cp_spans *out, uint64_t *steps, cp_error *err);
/* detect_names_address_lower.c: the end of a lowercase address core at
 * word i (42 baker street) or 0; the end of the lowercase parts that
 * follow an address ending at word j (avenue nw, | 27 high st, | mg road,
 * | london sw1a 1aa), or j */
size_t cp_names_lower_address(const scan *s, size_t i);
size_t cp_names_lower_tail(const scan *s, size_t j);

#endif
