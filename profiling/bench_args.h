/* The profiling tools' "--option value" pairs: whether argv asks for the
 * usage (--help, -h) or has an option without its value, so a tool prints
 * its usage instead of running a benchmark with what it understood. */
#ifndef CP_BENCH_ARGS_H
#define CP_BENCH_ARGS_H

#include <stdio.h>
#include <string.h>

/* 0: every option has its value; 1: usage asked for (print it, exit 0);
 * 2: an option without its value (print the usage, exit 2) */
static inline int bench_args_check(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return argc % 2 == 0 ? 2 : 0;
}

/* the usage on stdout (asked for) or stderr (a mistake); the exit status */
static inline int bench_usage(int why, const char *usage)
{
    fputs(usage, why == 1 ? stdout : stderr);
    return why == 1 ? 0 : 2;
}

#endif
