/* Every deadline and validity period in dlock is on CLOCK_MONOTONIC:
 * a wall-clock jump must never shorten or stretch a wait. */
#include <stdlib.h>
#include <string.h>
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

/* The bound of the backend method running on this thread (dlock_backend.h). */
static _Thread_local uint64_t call_deadline = DLOCK_POLL_FOREVER;

uint64_t dlock_call_deadline(void)
{
    return call_deadline;
}

uint64_t dlock_call_deadline_set(uint64_t deadline_ns)
{
    uint64_t was = call_deadline;
    call_deadline = deadline_ns;
    return was;
}

void dlock_test_hooks_read(struct dlock_test_hooks *h)
{
    const char *v = getenv("DLOCK_TEST_UNBOUNDED_LOSS");
    h->unbounded_loss = v && strcmp(v, "1") == 0;
    v = getenv("DLOCK_TEST_LOSS_MARGIN_MS");
    h->margin_set = v && *v;
    h->margin_ns = h->margin_set ? strtoll(v, NULL, 10) * 1000000ll : 0;
    v = getenv("DLOCK_TEST_OBSERVE_POLL");
    h->observe_poll = v && strcmp(v, "1") == 0;
}
