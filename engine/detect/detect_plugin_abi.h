/* The C ABI of an in-process detector plugin (cacheprune detect --plugin
 * lib.so).  A plugin is TRUSTED code: it runs inside the engine with its
 * privileges and sees every message it is given.  Load only what you would
 * link in yourself; use a process plugin (--plugin-cmd) to isolate one.
 *
 * The engine calls, all from one thread at a time:
 *   void *cp_plugin_open(const char *config);            NULL = failed
 *   int   cp_plugin_detect(void *ctx, const char *text, size_t len,
 *                          const char *role, cp_plugin_span *spans,
 *                          size_t cap, size_t *n);        0 = ok
 *   void  cp_plugin_close(void *ctx);
 * cp_plugin_detect writes at most `cap` spans and sets *n; a return value
 * other than 0, *n > cap, or any span outside [0, len) or with start > end
 * makes the message wholly sensitive (fail closed).  Offsets are UTF-8
 * byte offsets into text.
 *
 * A process plugin (--plugin-cmd "CMD ARGS") needs no header: it speaks
 * protocol v2, one JSON object per line on stdin/stdout,
 *   in:  {"id":N,"text":"...","role":"system|user|assistant|document"}
 *   out: {"id":N,"spans":[{"start":a,"end":b,"type":"t","score":s},...]}
 * with the same byte offsets and limits.  N increases with every request;
 * the reply must echo it and be the only line written until the next
 * request.  A wrong or missing id, a second line, output between requests,
 * a timeout or an exit fails the message closed and gets the plugin killed
 * (its whole process group) and restarted for the next message. */
#ifndef CP_DETECT_PLUGIN_ABI_H
#define CP_DETECT_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef struct cp_plugin_span {
    uint32_t start, end;
    char type[24]; /* NUL-terminated */
    float score;
} cp_plugin_span;

#define CP_PLUGIN_MAX_SPANS 4096

#endif
