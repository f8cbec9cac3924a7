/* The one monotonic clock every layer reads: durations, deadlines and
 * timed waits.  CLOCK_MONOTONIC, so a change of the wall clock neither
 * stretches a timeout nor makes a duration negative.  (Wall-clock times,
 * such as the tier's TTLs and purge epochs, read CLOCK_REALTIME where they
 * are used.) */
#ifndef CP_CLOCK_H
#define CP_CLOCK_H

#include <time.h>

/* Milliseconds and seconds on the monotonic clock (an arbitrary origin:
 * only differences mean anything). */
double cp_now_ms(void);
double cp_now_s(void);
/* The monotonic time ms milliseconds from now, for pthread_cond_timedwait on
 * a condition created with CLOCK_MONOTONIC (ms < 0 counts as 0). */
struct timespec cp_deadline_ms(long ms);
/* Milliseconds from now until deadline (cp_deadline_ms); negative once past. */
long cp_ms_until(const struct timespec *deadline);

#endif
