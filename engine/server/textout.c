#include "textout.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

void srv_text_init(srv_text *t, const char *const *stops, int n)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < n && t->n_stops < SRV_MAX_STOPS; i++) {
        if (!stops[i][0]) continue; /* an empty stop would stop everything */
        t->stops[t->n_stops] = stops[i];
        t->stop_len[t->n_stops++] = strlen(stops[i]);
    }
}

void srv_text_free(srv_text *t)
{
    if (t->buf) OPENSSL_cleanse(t->buf, t->cap);
    free(t->buf);
    t->buf = NULL;
    t->len = t->cap = t->visible = 0;
}

static cp_status reserve(srv_text *t, size_t need, cp_error *err)
{
    if (need + 1 <= t->cap) return CP_OK;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < need + 1) cap *= 2;
    /* not realloc: the old copy of the text is wiped, not left behind */
    char *b = malloc(cap);
    if (!b) return cp_fail(err, CP_ENOMEM, "server: out of memory for generated text");
    if (t->buf) memcpy(b, t->buf, t->len + 1), OPENSSL_cleanse(t->buf, t->cap);
    free(t->buf);
    t->buf = b, t->cap = cap;
    return CP_OK;
}

/* Length of the longest proper suffix of buf[from..len) that is a prefix of
 * a stop string: those bytes must wait for the next piece. */
static size_t held_back(const srv_text *t, size_t from)
{
    size_t best = 0;
    for (int s = 0; s < t->n_stops; s++) {
        size_t m = t->stop_len[s] - 1 < t->len - from ? t->stop_len[s] - 1 : t->len - from;
        for (size_t k = m; k > best; k--)
            if (memcmp(t->buf + t->len - k, t->stops[s], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

cp_status srv_text_push(srv_text *t, const char *bytes, size_t n, cp_error *err)
{
    if (t->stopped || n == 0) return CP_OK;
    cp_status rc = reserve(t, t->len + n, err);
    if (rc) return rc;
    memcpy(t->buf + t->len, bytes, n);
    t->len += n;
    t->buf[t->len] = 0;
    /* a stop can only begin in the held-back tail or the new bytes: the
     * earliest one wins */
    size_t cut = t->len;
    for (int s = 0; s < t->n_stops; s++) {
        const char *hay = t->buf + t->visible;
        size_t hn = t->len - t->visible, sl = t->stop_len[s];
        for (size_t i = 0; i + sl <= hn && t->visible + i < cut; i++)
            if (memcmp(hay + i, t->stops[s], sl) == 0) {
                cut = t->visible + i;
                break;
            }
    }
    if (cut < t->len) {
        t->len = t->visible = cut;
        t->buf[cut] = 0;
        t->stopped = 1;
        return CP_OK;
    }
    t->visible = t->len - held_back(t, t->visible);
    return CP_OK;
}

cp_status srv_text_finish(srv_text *t, const char *final_text, cp_error *err)
{
    if (!t->stopped && final_text) {
        size_t n = strlen(final_text);
        /* the engine's text is the same text unless the streaming decoder
         * decoded differently; what was shown is never taken back.  Its
         * tail goes through the stop check like any piece. */
        if (n >= t->visible && (t->visible == 0 || memcmp(final_text, t->buf, t->visible) == 0)) {
            t->len = t->visible;
            cp_status rc = srv_text_push(t, final_text + t->visible, n - t->visible, err);
            if (rc) return rc;
        }
    }
    if (t->buf) t->buf[t->len] = 0;
    t->visible = t->len;
    return CP_OK;
}
