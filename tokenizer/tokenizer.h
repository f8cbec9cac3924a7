/* HF tokenizer.json (+ tokenizer_config.json): BPE models (byte-level with a
 * split regex, and SentencePiece-style Metaspace with byte fallback), added
 * tokens, normalizers, pre-tokenizers, post-processors and decoders, as the
 * HF tokenizers library interprets them.
 *
 * Every token carries the [start, end) UTF-8 byte range of the input it came
 * from.  Ranges are widened to whole characters: pieces that split one
 * character (byte-level BPE, byte fallback) share its range; tokens that
 * carry no input (an added BOS, Metaspace's prefix ▁) get an empty range at
 * their position.
 *
 * Input must be valid UTF-8: anything else is refused with the offset of the
 * first bad byte (no silent U+FFFD substitution on the way in).
 *
 * A tokenizer may be shared by threads: an encode call changes nothing in it
 * (its pre-token cache is the call's own, dropped at its end). */
#ifndef CP_TOKENIZER_H
#define CP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/status.h"

typedef struct cp_tokenizer cp_tokenizer;

typedef struct cp_encoding {
    int32_t *ids;
    uint32_t *start, *end; /* byte offsets into the encoded text */
    size_t n, cap;
} cp_encoding;

enum {
    CP_TOK_ADD_SPECIAL = 1,    /* run the post-processor (BOS/EOS templates) */
    CP_TOK_NO_SPECIAL_TEXT = 2 /* never match *special* added tokens inside the text */
};

cp_status cp_tokenizer_load(const char *model_dir, cp_tokenizer **out, cp_error *err);
/* From tokenizer.json text (config_json may be NULL); `where` names it in messages. */
cp_status cp_tokenizer_from_json(const char *json, size_t len, const char *config_json, const char *where,
                                 cp_tokenizer **out, cp_error *err);
void cp_tokenizer_free(cp_tokenizer *t);

/* Appends the tokens of text[0..len) to enc (offsets relative to text). */
cp_status cp_tokenize(const cp_tokenizer *t, const char *text, size_t len, int flags, cp_encoding *enc, cp_error *err);
/* The same, with special added tokens matched only where special_ok[byte]
 * is set (a chat template's own markup), so that text inside a message can
 * never forge a control token. */
cp_status cp_tokenize_ex(const cp_tokenizer *t, const char *text, size_t len, int flags, const uint8_t *special_ok,
                         cp_encoding *enc, cp_error *err);
void cp_encoding_free(cp_encoding *e);
cp_status cp_encoding_push(cp_encoding *e, int32_t id, uint32_t start, uint32_t end, cp_error *err);

/* ids -> malloc'd NUL-terminated UTF-8 text (invalid byte sequences that
 * the ids spell become U+FFFD, as HF does). */
cp_status cp_detokenize(const cp_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *len,
                        cp_error *err);

/* Number of ids (1 + largest id of the vocab and the added tokens). */
int cp_tokenizer_n_ids(const cp_tokenizer *t);
/* The token's string in the vocabulary (NULL for an unknown id). */
const char *cp_tokenizer_piece(const cp_tokenizer *t, int32_t id);
/* Id of an added token or vocabulary entry spelled exactly `piece`, or -1. */
int32_t cp_tokenizer_find(const cp_tokenizer *t, const char *piece);
int cp_tokenizer_is_special(const cp_tokenizer *t, int32_t id);
/* tokenizer_config.json: bos/eos token ids (-1 when absent) and the chat
 * template text (NULL when absent). */
int32_t cp_tokenizer_bos(const cp_tokenizer *t);
int32_t cp_tokenizer_eos(const cp_tokenizer *t);
const char *cp_tokenizer_chat_template(const cp_tokenizer *t);

/* Streaming decoder: push ids one at a time; each push yields the text that
 * is now final, never half a UTF-8 character. */
typedef struct cp_detok_stream {
    const cp_tokenizer *t;
    int32_t *ids;
    size_t n, cap, prefix, read; /* ids[prefix..read) already emitted */
    int skip_special;
} cp_detok_stream;

void cp_detok_stream_init(cp_detok_stream *s, const cp_tokenizer *t, int skip_special);
/* *out (malloc'd, may be "") receives the newly final text. */
cp_status cp_detok_stream_push(cp_detok_stream *s, int32_t id, char **out, cp_error *err);
void cp_detok_stream_free(cp_detok_stream *s);

#endif
