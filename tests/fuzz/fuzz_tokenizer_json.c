/* libFuzzer target: arbitrary tokenizer.json text must load or fail with a
 * message; a file that loads must encode a fixed sentence without crashing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_tokenizer *t = NULL;
    cp_error err;
    err.msg[0] = 0;
    if (cp_tokenizer_from_json((const char *)data, size, NULL, "fuzz.json", &t, &err) != CP_OK) {
        if (t || !err.msg[0]) abort();
        return 0;
    }
    static const char text[] = "Hello w\xc3\xb6rld 123 <s> \xe6\x97\xa5\xe6\x9c\xac";
    cp_encoding e = { 0 };
    if (cp_tokenize(t, text, sizeof text - 1, CP_TOK_ADD_SPECIAL, &e, &err) == CP_OK) {
        char *s = NULL;
        if (cp_detokenize(t, e.ids, e.n, 0, &s, NULL, &err) == CP_OK) free(s);
    }
    cp_encoding_free(&e);
    cp_tokenizer_free(t);
    return 0;
}
