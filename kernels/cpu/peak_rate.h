/* The best rate of a register-only loop over a few short runs: the in-run
 * ceilings the benchmarks print beside their results (AMX tiles, VNNI). */
#ifndef CP_PEAK_RATE_H
#define CP_PEAK_RATE_H

/* loop(iters) runs iters iterations on the calling thread and returns the
 * operations it did.  Best of 8 runs on `threads` threads at once (a shared
 * machine preempts some), each about seconds / 8, the length calibrated on
 * one thread first from `probe` iterations (at least probe a run).
 * Returns operations per wall second; *cpu_rate (may be NULL) the best per
 * CPU second of the process. */
double cpu_peak_rate(double (*loop)(long), int threads, double seconds, long probe, double *cpu_rate);

#endif
