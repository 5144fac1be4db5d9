/*
 * Minimal TAP producer for dlock's tests: meson runs every test binary with
 * protocol 'tap', and scripts/test.sh counts the "ok"/"not ok" lines.
 * Every check prints exactly one line; plan is printed at the end.
 */
#ifndef DLOCK_TAP_H
#define DLOCK_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A program of several files defines TAP_SHARED in each and defines the
 * counters once (TAP_COUNTERS), so that every file counts on one plan. */
#ifdef TAP_SHARED
extern int tap_n_, tap_failed_;
#define TAP_COUNTERS int tap_n_, tap_failed_
#else
static int tap_n_, tap_failed_;
#endif

static inline int tap_ok_(int cond, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    tap_n_++;
    printf("%sok %d - ", cond ? "" : "not ", tap_n_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond) {
        tap_failed_++;
        printf("#   failed at %s:%d\n", file, line);
    }
    fflush(stdout);
    return cond;
}

/* ok(cond, "description %d", args...) */
#define ok(cond, ...) tap_ok_(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* is_int(got, want, "description") prints both values on failure. */
#define is_int(got, want, ...)                                                 \
    do {                                                                       \
        long long g_ = (long long)(got), w_ = (long long)(want);               \
        if (!tap_ok_(g_ == w_, __FILE__, __LINE__, __VA_ARGS__))               \
            printf("#   got %lld, want %lld\n", g_, w_);                       \
    } while (0)

/* is_str(got, want, "description"); NULL-safe. */
#define is_str(got, want, ...)                                                 \
    do {                                                                       \
        const char *g_ = (got), *w_ = (want);                                  \
        int eq_ = (g_ && w_) ? strcmp(g_, w_) == 0 : g_ == w_;                  \
        if (!tap_ok_(eq_, __FILE__, __LINE__, __VA_ARGS__))                    \
            printf("#   got '%s', want '%s'\n", g_ ? g_ : "(null)",            \
                   w_ ? w_ : "(null)");                                        \
    } while (0)

/* A case the running backend cannot do: counted as skipped, and says why. */
#define skip(why, ...)                                                         \
    do {                                                                       \
        tap_n_++;                                                              \
        printf("ok %d - ", tap_n_);                                            \
        printf(__VA_ARGS__);                                                   \
        printf(" # SKIP %s\n", why);                                           \
    } while (0)

/* DLOCK_STORES_REQUIRED=1 (CI: scripts/test.sh exports it): every store
 * the suites use must be there. */
static inline int tap_stores_required_(void)
{
    const char *v = getenv("DLOCK_STORES_REQUIRED");
    return v && strcmp(v, "1") == 0;
}

/* A case that needs a store, its directory (DLOCK_STORES_DIR) or its
 * scripts, which cannot be found: skipped, and said why; a failure under
 * DLOCK_STORES_REQUIRED=1, where a store that went missing must not turn
 * into skips. */
#define skip_store(why, ...)                                                   \
    do {                                                                       \
        if (tap_stores_required_()) {                                          \
            tap_ok_(0, __FILE__, __LINE__, __VA_ARGS__);                       \
            printf("#   %s (DLOCK_STORES_REQUIRED=1)\n", why);                 \
        } else {                                                               \
            skip(why, __VA_ARGS__);                                            \
        }                                                                      \
    } while (0)

#define diag(...)                                                              \
    do {                                                                       \
        printf("# ");                                                          \
        printf(__VA_ARGS__);                                                   \
        printf("\n");                                                          \
        fflush(stdout);                                                        \
    } while (0)

static inline int done_testing(void)
{
    printf("1..%d\n", tap_n_);
    fflush(stdout);
    return tap_failed_ ? 1 : 0;
}

#endif
