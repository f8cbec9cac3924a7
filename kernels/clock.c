/* The monotonic clock (see clock.h). */
#include "clock.h"

static struct timespec mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for CLOCK_MONOTONIC on Linux */
    return ts;
}

double cp_now_ms(void)
{
    struct timespec ts = mono();
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double cp_now_s(void)
{
    struct timespec ts = mono();
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct timespec cp_deadline_ms(long ms)
{
    struct timespec t = mono();
    if (ms < 0) ms = 0;
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    return t;
}

long cp_ms_until(const struct timespec *deadline)
{
    struct timespec now = mono();
    return (long)(deadline->tv_sec - now.tv_sec) * 1000 + (deadline->tv_nsec - now.tv_nsec) / 1000000;
}
