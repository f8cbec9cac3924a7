/* The benchmarks' one clock: CLOCK_MONOTONIC in seconds or milliseconds
 * (every profiling tool measures wall time between two reads of it). */
#ifndef CP_BENCH_CLOCK_H
#define CP_BENCH_CLOCK_H

#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline double now_ms(void) { return now_s() * 1e3; }

#endif
