/*
 * What the conformance suite's files share: the run's store and its
 * capabilities, the per-run name prefix, and the helpers every case uses
 * (conformance.c defines them; modes.c holds the cases of shared locks and
 * semaphores).
 */
#ifndef DLOCK_CONFORMANCE_H
#define DLOCK_CONFORMANCE_H

#define TAP_SHARED
#include "dlock.h"
#include "tests/tap.h"
#include "tests/util.h"

#define MS 1000000ull

/* A SIGKILLed holder's lock is free within HOLDER_DEATH_BOUND_MS on a store
 * that declares DLOCK_CAP_HOLDER_DEATH (docs/backends.md); a case adds
 * HOLDER_DEATH_SLACK_MS for a busy machine. Its lease is
 * HOLDER_DEATH_TTL_MS, far above both. */
#define HOLDER_DEATH_BOUND_MS 1000u
#define HOLDER_DEATH_SLACK_MS 1000u
#define HOLDER_DEATH_TTL_MS 20000u

extern const char *uri;      /* the store (or list of stores) under test */
extern unsigned int caps;    /* what the cases go by (the suite's table) */
extern char prefix[64];      /* per-run name prefix: runs never collide */
extern char backend[32];     /* "file", "redis", "redlock", "postgres", ... */
extern int composite;        /* a list of stores */

/* prefix + what, into buf. */
void name_of(char *buf, size_t len, const char *what);
/* A new client of the store under test (exits the run when it cannot). */
dlock_client *client(void);
/* Exclusive options that wait ms from now, or try once. */
dlock_acquire_opts wait_for(uint64_t ms);
dlock_acquire_opts try_once(void);
/* 1 when the run is the negative control --break what. */
int breaking(const char *what);
/* Until the store counts n waiters for name (at most ms): 1 when it did,
 * 0 when it did not in time, -1 when it cannot count them. */
int waiters_reach(dlock_client *c, const char *name, uint64_t n, uint32_t ms, dlock_info *i);
/* The lease of the keep cases on this store, ms. */
uint32_t keep_ttl(void);

/* modes.c: the cases of shared locks and semaphores. The ones that run
 * one after another; the side-by-side ones, in the form run_parallel
 * takes. */
void test_modes(void);
void test_modes_holder_killed(void);
void test_modes_kept(void);
/* --break shared: the negative control of the read-write exclusion check
 * (writers ask for shared locks), that case alone. */
void test_modes_break_shared(void);
/* --break limit: the negative control of the semaphore's limit check
 * (permits ask for a semaphore one larger), that case alone. */
void test_modes_break_limit(void);

/* election.c: the cases of leader election (side by side), and --break
 * election: the race alone, with candidates that lead on a busy try. */
void test_election(void);
void test_election_idle(void);
void test_election_killed(void);
void test_election_break(void);

#endif
