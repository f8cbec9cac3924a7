/* Internal structures of the tokenizer, shared by its files:
 *   tok_load.c    tokenizer.json -> these structures
 *   tok_text.c    the working text (arena with per-byte alignment to the input)
 *   tok_normal.c  normalizers and added-token matching
 *   tok_pretok.c  pre-tokenizers
 *   tok_bpe.c     the BPE model (heap-ordered merges, pre-token cache)
 *   tok_encode.c  the pipeline and post-processors
 *   tok_decode.c  decoders and the streaming decoder */
#ifndef CP_TOK_INTERNAL_H
#define CP_TOK_INTERNAL_H


#include "regex.h"
#include "strmap.h"
#include "tokenizer.h"

#define TK_MAX_STEPS 16

/* ---- components -------------------------------------------------------- */

typedef enum { NORM_NFC = 1, NORM_PREPEND, NORM_REPLACE } tk_norm_kind;

/* a String or a Regex pattern: compiled either way (a String literally) */
typedef cp_regex tk_pattern;

typedef struct tk_norm {
    tk_norm_kind kind;
    char *text;         /* Prepend: the prefix; Replace: the content */
    tk_pattern pattern; /* Replace */
} tk_norm;

typedef enum { PRE_SPLIT = 1, PRE_BYTELEVEL, PRE_METASPACE, PRE_DIGITS } tk_pre_kind;
typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } tk_split_behavior;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tk_prepend;

typedef struct tk_pre {
    tk_pre_kind kind;
    tk_pattern pattern;          /* Split; ByteLevel with use_regex (GPT-2's) */
    tk_split_behavior behavior;  /* Split */
    int invert;                  /* Split */
    int add_prefix_space;        /* ByteLevel */
    int use_regex;               /* ByteLevel */
    char replacement[8];         /* Metaspace, UTF-8 */
    tk_prepend prepend;          /* Metaspace */
    int split;                   /* Metaspace */
    int word_split;              /* Metaspace with split=false whose merges never join across a
                                    word start (see tok_load.c): cut before each word anyway */
    int individual_digits;       /* Digits */
} tk_pre;

typedef enum { POST_TEMPLATE = 1, POST_BYTELEVEL } tk_post_kind;

typedef struct tk_post {
    tk_post_kind kind;
    /* TemplateProcessing "single": -1 stands for the sequence, else the
     * index of a special-token entry whose ids are emitted */
    int32_t *items;
    int n_items;
    int32_t **special_ids;
    int *special_n;
    int n_special;
    int trim_offsets; /* ByteLevel */
} tk_post;

typedef enum { DEC_BYTELEVEL = 1, DEC_METASPACE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP } tk_dec_kind;

typedef struct tk_dec {
    tk_dec_kind kind;
    char *from, *to;      /* Replace (String pattern only) */
    char replacement[8];  /* Metaspace */
    tk_prepend prepend;   /* Metaspace */
    uint32_t strip_char;  /* Strip */
    int strip_start, strip_stop;
} tk_dec;

typedef struct tk_added {
    char *content;
    size_t len;
    int32_t id;
    int special, lstrip, rstrip, single_word, normalized;
} tk_added;

/* Pre-token cache: piece bytes (prefixed with a bytelevel flag) -> tokens.
 * One per encode call, never shared: a cache kept across calls would make
 * one tenant's tokenizing faster on words another tenant sent (a timing
 * channel on text the pool never shares), and would keep their text. */
typedef struct tk_cache_tok {
    int32_t id;
    uint16_t start, end; /* relative to the piece */
} tk_cache_tok;

typedef struct tk_cache {
    cp_strmap map;     /* key -> index into toks of [count, toks...] */
    tk_cache_tok *toks;
    size_t len, cap;
} tk_cache;

struct cp_tokenizer {
    char where[256];
    /* model */
    cp_strmap vocab;      /* piece -> id */
    char **pieces;        /* id -> piece (vocab and added tokens), n_ids entries */
    int32_t n_ids;
    cp_pairmap merges;    /* (left id, right id) -> (rank, merged id) */
    int32_t unk_id;       /* -1 when none */
    int byte_fallback, fuse_unk, ignore_merges;
    int merge_joins_words; /* some merge (a, b): b starts with U+2581, a holds another character */
    int32_t byte_fallback_id[256]; /* ids of the byte pieces <0x00> .. <0xFF>, -1 when absent */
    int32_t byte_level_id[256];    /* GPT-2 byte -> char pieces, -1 when absent */
    uint8_t *is_special;           /* [n_ids] */
    /* added tokens, bucketed by first byte, longest first */
    tk_added *added;
    int n_added;
    int *added_by_byte[256];
    int added_by_byte_n[256];
    /* pipeline */
    tk_norm norms[TK_MAX_STEPS];
    int n_norms;
    tk_pre pres[TK_MAX_STEPS];
    int n_pres;
    tk_post posts[TK_MAX_STEPS];
    int n_posts;
    tk_dec decs[TK_MAX_STEPS];
    int n_decs;
    /* tokenizer_config.json */
    int32_t bos_id, eos_id;
    char *chat_template;
};

/* GPT-2's byte <-> printable code point map of byte-level BPE. */
uint32_t tk_byte_to_cp(uint8_t b);
int tk_cp_to_byte(uint32_t cp); /* -1 when cp is not in the map */

typedef cp_regex_matcher tk_matcher;

/* ---- the working text ---------------------------------------------------- */

/* The arena holds every version of the text the pipeline makes; each byte
 * remembers the [a0, a1) range of the original input it stands for (a0 == a1:
 * inserted, e.g. a prefix ▁, standing at a0). */
typedef struct tk_arena {
    char *s;
    uint32_t *a0, *a1;
    size_t len, cap;
} tk_arena;

typedef struct tk_split {
    size_t off, len;    /* in the arena */
    int32_t token;      /* >= 0: an added token, already final */
    uint8_t bytelevel;  /* the BPE maps bytes through byte_level_id */
} tk_split;

typedef struct tk_splits {
    tk_split *v;
    size_t n, cap;
} tk_splits;

/* A tokenizer's working copies are a prompt's text (and its ids): wiped
 * before they are freed, and never left behind when a buffer grows
 * (tk_grow: a new block, the old one wiped and freed; NULL when out of
 * memory, the old one kept). */
void tk_wipe(void *p, size_t n);
void *tk_grow(void *p, size_t old_bytes, size_t new_bytes);
cp_status tk_arena_reserve(tk_arena *a, size_t extra, cp_error *err);
/* Appends bytes with one alignment for all of them, or copies from the arena
 * itself (keeping each byte's alignment). Returns the new bytes' offset. */
cp_status tk_arena_put(tk_arena *a, const char *s, size_t n, uint32_t a0, uint32_t a1, size_t *at, cp_error *err);
cp_status tk_arena_copy(tk_arena *a, size_t from, size_t n, size_t *at, cp_error *err);
void tk_arena_free(tk_arena *a);
cp_status tk_splits_push(tk_splits *s, tk_split v, cp_error *err);
/* The original position "at" the start of arena byte `off` (for inserted
 * bytes, their anchor). */
static inline uint32_t tk_anchor(const tk_arena *a, size_t off) { return a->a0[off]; }

/* ---- stages (each replaces `in` by its output in `out`) ------------------ */
cp_status tk_match_added(const cp_tokenizer *t, tk_arena *a, const tk_splits *in, tk_splits *out, int normalized_phase,
                         int flags, const uint8_t *special_ok, cp_error *err);
/* Applies every normalizer to every non-token split, in place. */
cp_status tk_normalize(const cp_tokenizer *t, tk_matcher *m, tk_arena *a, tk_splits *s, cp_error *err);
cp_status tk_pretokenize(const cp_tokenizer *t, tk_matcher *m, tk_arena *a, const tk_pre *p, const tk_splits *in,
                         tk_splits *out, cp_error *err);
/* Appends the tokens of one split; offsets are arena offsets [start, end). */
cp_status tk_bpe(const cp_tokenizer *t, const tk_arena *a, const tk_split *sp, tk_cache *cache, cp_encoding *out, cp_error *err);
/* the call's cache, its keys wiped */
void tk_cache_free(tk_cache *c);


/* the whole match of cp_regex_find as [ms, me) */
static inline cp_status find_span(const tk_pattern *p, tk_matcher *m, const char *s, size_t len, size_t from, size_t *ms,
                                  size_t *me, int *found, cp_error *err)
{
    cp_status rc = cp_regex_find(p, m, s, len, from, 0, found, err);
    if (rc == CP_OK && *found) cp_regex_group(m, 0, ms, me);
    return rc;
}

#endif
