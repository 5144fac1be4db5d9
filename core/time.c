/* Every deadline and validity period in dlock is on CLOCK_MONOTONIC:
 * a wall-clock jump must never shorten or stretch a wait. */
#include <time.h>

#include "config.h"
#include "core/internal.h"

uint64_t dlock_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void dlock_ns_to_timespec(uint64_t ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}
