/* A tiny in-process detector plugin for the tests.  Its config selects a
 * behaviour: "ok" flags every "secret" word, "error" fails, "badspan" returns
 * a span past the text, "fail-open" makes cp_plugin_open fail. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/detect/detect_plugin_abi.h"

typedef struct { char mode[16]; } plugin;

void *cp_plugin_open(const char *config)
{
    if (strcmp(config, "fail-open") == 0) return NULL;
    plugin *p = calloc(1, sizeof *p);
    if (p) strncpy(p->mode, config, sizeof p->mode - 1);
    return p;
}

int cp_plugin_detect(void *ctx, const char *text, size_t len, const char *role, cp_plugin_span *spans, size_t cap,
                     size_t *n)
{
    (void)role;
    plugin *p = ctx;
    *n = 0;
    if (strcmp(p->mode, "error") == 0) return 7;
    if (strcmp(p->mode, "badspan") == 0) {
        spans[0] = (cp_plugin_span){ 0, (uint32_t)len + 5, "x", 1 };
        *n = 1;
        return 0;
    }
    for (size_t i = 0; i + 6 <= len && *n < cap; i++)
        if (memcmp(text + i, "secret", 6) == 0) {
            spans[*n] = (cp_plugin_span){ (uint32_t)i, (uint32_t)i + 6, "so_secret", 0.5f };
            (*n)++;
        }
    return 0;
}

void cp_plugin_close(void *ctx) { free(ctx); }
