/* UTF-8 helpers.  All offsets in the engine are UTF-8 byte offsets. */
#ifndef CP_UTF8_H
#define CP_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when the bytes
 * there are not well-formed (overlong, surrogate, past U+10FFFF, cut). */
int cp_utf8_len(const unsigned char *s, size_t n, uint32_t *cp);
/* Offset of the first byte that is not well-formed UTF-8, or n if all are. */
size_t cp_utf8_validate(const char *s, size_t n);
/* Writes cp as UTF-8 into out (4 bytes room); returns its length. */
int cp_utf8_encode(uint32_t cp, char *out);
/* Whether byte b continues a character (10xxxxxx): no character starts there. */
static inline int cp_utf8_continues(unsigned char b) { return (b & 0xC0) == 0x80; }

#endif
