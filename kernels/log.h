/* Diagnostics to stderr.  The level is the process's one logging singleton
 * (cp_log_singleton in log.c): set once by main from --verbose/--quiet.
 * Never pass prompt text or secrets to these functions. */
#ifndef CP_LOG_H
#define CP_LOG_H

typedef enum { CP_LOG_ERROR = 0, CP_LOG_WARN = 1, CP_LOG_INFO = 2, CP_LOG_DEBUG = 3 } cp_log_level;

void cp_log_set_level(cp_log_level level);
cp_log_level cp_log_get_level(void);
void cp_log(cp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define cp_warn(...) cp_log(CP_LOG_WARN, __VA_ARGS__)
#define cp_info(...) cp_log(CP_LOG_INFO, __VA_ARGS__)
#define cp_debug(...) cp_log(CP_LOG_DEBUG, __VA_ARGS__)

#endif
