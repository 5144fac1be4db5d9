/*
 * dlock check: a bounded black-box safety test of lock stores (tools/check.c,
 * docs/check.md). The loopback proxy that cuts a holder's connections is in
 * tools/check_proxy.c.
 */
#ifndef DLOCK_TOOLS_CHECK_H
#define DLOCK_TOOLS_CHECK_H

#include <stdint.h>
#include <sys/types.h>

/* argv[0] is "check". Returns the exit status. */
int dlock_check_main(int argc, char **argv);

/* ---- the proxy (check_proxy.c) ------------------------------------------- */

#define CHECK_SLOTS_MAX 16   /* worker slots (--procs at most) */
#define CHECK_UPSTREAMS_MAX 32 /* hosts over all the stores of one URI list */

/* Shared with the proxy process (MAP_SHARED). */
struct check_proxy_ctl {
    volatile int stop;
    /* CLOCK_MONOTONIC ns until which slot s's connections are cut: closed,
     * and new ones closed at once. */
    volatile uint64_t cut_until[CHECK_SLOTS_MAX];
    volatile unsigned cuts[CHECK_SLOTS_MAX]; /* connections closed by a cut */
};

struct check_proxy {
    int slots, nup;
    pid_t pid;
    struct check_proxy_ctl *ctl;
    char *uri[CHECK_SLOTS_MAX]; /* the URI list rewritten for slot s (malloc'd) */
};

/*
 * Starts a proxy for uri (one URI or a whitespace-separated list): one
 * loopback listener per host of every store and per slot, and in
 * p->uri[s] the list with its hosts replaced by slot s's listeners.
 * Returns 0; 1 when the URI names no network host (file://): nothing
 * started; -1 with a message in err (never a password) on failure.
 */
int check_proxy_start(struct check_proxy *p, const char *uri, int slots, char *err,
                      size_t errlen);
/* Cuts slot's connections for ms milliseconds. */
void check_proxy_cut(struct check_proxy *p, int slot, unsigned ms);
void check_proxy_stop(struct check_proxy *p);

#endif
