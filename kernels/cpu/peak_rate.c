/* Best-of-runs rate of a register-only loop (peak_rate.h). */
#include "peak_rate.h"

#include <omp.h>
#include <time.h>

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double cpu_peak_rate(double (*loop)(long), int threads, double seconds, long probe, double *cpu_rate)
{
    double t0 = omp_get_wtime();
    loop(probe);
    double dt = omp_get_wtime() - t0;
    long iters = dt > 0 ? (long)(probe * seconds / 8 / dt) : probe;
    if (iters < probe) iters = probe;
    double best = 0, best_cpu = 0;
    for (int rep = 0; rep < 8; rep++) {
        double ops = 0;
        const double c0 = cpu_seconds();
        t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : ops)
        ops += loop(iters);
        dt = omp_get_wtime() - t0;
        const double dc = cpu_seconds() - c0;
        if (dt > 0 && ops / dt > best) best = ops / dt;
        if (dc > 0 && ops / dc > best_cpu) best_cpu = ops / dc;
    }
    if (cpu_rate) *cpu_rate = best_cpu;
    return best;
}
