#include "log.h"

#include <stdarg.h>
#include <stdio.h>

/* The one piece of process-wide mutable state for logging. */
static struct {
    cp_log_level level;
} cp_log_singleton = { CP_LOG_WARN };

void cp_log_set_level(cp_log_level level) { cp_log_singleton.level = level; }
cp_log_level cp_log_get_level(void) { return cp_log_singleton.level; }

void cp_log(cp_log_level level, const char *fmt, ...)
{
    if (level > cp_log_singleton.level) return;
    static const char *const tag[] = { "error", "warning", "info", "debug" };
    fprintf(stderr, "cacheprune: %s: ", tag[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
