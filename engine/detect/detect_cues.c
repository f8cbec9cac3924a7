/* One pass over a text for a set of cue words (detect_cues.h). */
#include "detect_cues.h"

#include <string.h>

static inline unsigned char fold(unsigned char c) { return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c; }

static inline unsigned pair_of(unsigned char a, unsigned char b) { return (unsigned)a << 8 | b; }

static inline unsigned head_of(unsigned pair) { return (pair * 40503u) >> 4 & 4095u; }

void cp_cue_set_init(cp_cue_set *s)
{
    memset(s, 0, sizeof *s);
    memset(s->head, 0xff, sizeof s->head); /* -1: no chain */
}

cp_status cp_cue_set_add(cp_cue_set *s, const char *w, size_t n, uint64_t owners, cp_error *err)
{
    if (n < 2 || n > CP_CUE_LEN)
        return cp_fail(err, CP_ERANGE, "cue words: '%.*s' has %zu bytes (2 to %d)", (int)(n < 64 ? n : 64), w, n, CP_CUE_LEN);
    const unsigned pair = pair_of(fold((unsigned char)w[0]), fold((unsigned char)w[1]));
    /* the same word again: its owners join */
    for (int k = s->head[head_of(pair)]; k >= 0; k = s->word[k].next)
        if (s->word[k].len == n && memcmp(s->word[k].w, w, n) == 0) {
            s->word[k].owners |= owners;
            return CP_OK;
        }
    if (s->n == CP_CUE_WORDS) return cp_fail(err, CP_ERANGE, "cue words: more than %d", CP_CUE_WORDS);
    const int i = s->n++;
    for (size_t j = 0; j < n; j++) s->word[i].w[j] = (char)fold((unsigned char)w[j]);
    s->word[i].len = (uint8_t)n;
    s->word[i].owners = owners;
    s->word[i].next = s->head[head_of(pair)];
    s->head[head_of(pair)] = (int16_t)i;
    s->first2[pair >> 6] |= (uint64_t)1 << (pair & 63);
    return CP_OK;
}

uint64_t cp_cue_set_scan(const cp_cue_set *s, const char *text, size_t len)
{
    uint64_t all = 0, found = 0;
    for (int k = 0; k < s->n; k++) all |= s->word[k].owners;
    const unsigned char *t = (const unsigned char *)text;
    for (size_t i = 0; i + 1 < len && found != all; i++) {
        const unsigned pair = pair_of(fold(t[i]), fold(t[i + 1]));
        if (!(s->first2[pair >> 6] >> (pair & 63) & 1)) continue;
        for (int k = s->head[head_of(pair)]; k >= 0; k = s->word[k].next) {
            const size_t n = s->word[k].len;
            if (n > len - i || (s->word[k].owners & ~found) == 0) continue;
            size_t j = 0;
            while (j < n && fold(t[i + j]) == (unsigned char)s->word[k].w[j]) j++;
            if (j == n) found |= s->word[k].owners;
        }
    }
    return found;
}
