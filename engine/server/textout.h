/* The text a client is shown of one generation: the engine's pieces
 * (whole UTF-8 characters) appended as they come, cut at the first `stop`
 * string, and held back while its tail could still become one — so a
 * streamed client never sees text that a later stop would take back, and
 * the streamed chunks concatenate to the non-streamed text. */
#ifndef CP_SRV_TEXTOUT_H
#define CP_SRV_TEXTOUT_H

#include <stddef.h>

#include "../../kernels/status.h"

#define SRV_MAX_STOPS 4
#define SRV_STOP_MAX_BYTES 256

typedef struct srv_text {
    char *buf;      /* NUL-terminated */
    size_t len, cap;
    size_t visible; /* buf[0..visible) is final: it may be shown */
    const char *stops[SRV_MAX_STOPS];
    size_t stop_len[SRV_MAX_STOPS];
    int n_stops;
    int stopped;    /* a stop string was found; buf ends before it */
} srv_text;

/* stops[0..n) (non-empty, at most SRV_MAX_STOPS) must outlive t. */
void srv_text_init(srv_text *t, const char *const *stops, int n);
void srv_text_free(srv_text *t);
/* Appends a piece; sets stopped (and cuts buf) when a stop string is now
 * complete.  Pieces after a stop are ignored. */
cp_status srv_text_push(srv_text *t, const char *bytes, size_t n, cp_error *err);
/* Generation ended.  Without a stop, the engine's final text replaces buf
 * when it extends what was already made visible (the streaming decoder may
 * hold back a last partial character); the whole text becomes visible. */
cp_status srv_text_finish(srv_text *t, const char *final_text, cp_error *err);

#endif
