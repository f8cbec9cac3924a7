/* The free-text recognizer's dates: a full date in a user's turn (2000-04-16,
 * 2/16/1942, 16.04.2000) and the time written after it. */
#include <stdint.h>
#include <string.h>

#include "detect_names_internal.h"

/* the value of the digits t[a..e), or -1 if not all digits or not n_lo..n_hi of them */
static int digits_value(const char *t, uint32_t a, uint32_t e, unsigned n_lo, unsigned n_hi)
{
    if (e - a < n_lo || e - a > n_hi) return -1;
    int v = 0;
    for (uint32_t i = a; i < e; i++) {
        if (t[i] < '0' || t[i] > '9') return -1;
        v = v * 10 + (t[i] - '0');
    }
    return v;
}

/* y-m-d or d-m-y (either order of day and month) in three digit groups: a real calendar shape */
static int date_parts(int a, int b, int c, int year_first)
{
    int y = year_first ? a : c, p = year_first ? b : a, q = year_first ? c : b;
    return y >= 1900 && y <= 2099 && p >= 1 && q >= 1 && ((p <= 12 && q <= 31) || (p <= 31 && q <= 12));
}

/* a full date at word i: 2000-04-16 (one word: hyphens join digits), or
 * 2/16/1942, 16.04.2000 (three words and the same '/' or '.' between);
 * the index of its last word, or -1 */
static long date_at(const scan *s, size_t i)
{
    const word *w = s->w;
    const char *t = s->t;
    if (w[i].shape != S_NUM) return -1;
    uint32_t a = w[i].s, e = w[i].e, h1 = a, h2;
    while (h1 < e && t[h1] != '-') h1++;
    if (h1 < e) { /* one word with two hyphens */
        for (h2 = h1 + 1; h2 < e && t[h2] != '-'; h2++) {}
        if (h2 >= e || memchr(t + h2 + 1, '-', e - h2 - 1)) return -1;
        int x = digits_value(t, a, h1, 1, 4), y = digits_value(t, h1 + 1, h2, 1, 2), z = digits_value(t, h2 + 1, e, 1, 4);
        if (x < 0 || y < 0 || z < 0) return -1;
        return date_parts(x, y, z, h1 - a == 4) ? (long)i : -1;
    }
    if (i + 2 >= s->n) return -1;
    char sep = t[e];
    if ((sep != '/' && sep != '.') || w[i + 1].s != e + 1 || w[i + 1].shape != S_NUM || t[w[i + 1].e] != sep ||
        w[i + 2].s != w[i + 1].e + 1 || w[i + 2].shape != S_NUM)
        return -1;
    int x = digits_value(t, a, e, 1, 4), y = digits_value(t, w[i + 1].s, w[i + 1].e, 1, 2), z = digits_value(t, w[i + 2].s, w[i + 2].e, 1, 4);
    if (x < 0 || y < 0 || z < 0 || !date_parts(x, y, z, e - a == 4)) return -1;
    return (long)i + 2;
}

/* ... and a time after it: 11:34 or 11:34:35 (the words and the colons, no spaces between) */
static size_t time_after(const scan *s, size_t j)
{
    const word *w = s->w;
    size_t k = j + 1;
    if (k >= s->n || w[k].shape != S_NUM || (w[k].gap & ~(G_COMMA | G_NL)) || digits_value(s->t, w[k].s, w[k].e, 1, 2) < 0) return j;
    size_t end = j;
    for (size_t m = k; m + 1 < s->n && m < k + 2; m++) {
        STEP(s);
        if (s->t[w[m].e] != ':' || w[m + 1].s != w[m].e + 1 || digits_value(s->t, w[m + 1].s, w[m + 1].e, 2, 2) < 0) break;
        end = m + 1;
    }
    return end;
}

/* Full dates (with their time): in a user's turn a date is most often
 * theirs -- a birthday, an appointment, a timestamp.  Years alone and
 * weekdays are left alone. */
cp_status cp_names_pass_dates(scan *s, cp_error *err)
{
    for (size_t i = 0; i < s->lim; i++) {
        STEP(s);
        long j = s->used[i] ? -1 : date_at(s, i);
        if (j < 0) continue;
        size_t e = time_after(s, (size_t)j);
        cp_status rc = emit(s, i, e, "date", 0.6f, err);
        if (rc) return rc;
        i = e;
    }
    return CP_OK;
}
