/* What the dlock tool's subcommands (run, migrate, inspect, check, bench)
 * share: messages on stderr, exit statuses, JSON output, and the small
 * helpers of their option parsing. */
#ifndef DLOCK_TOOLS_CLI_H
#define DLOCK_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "dlock.h"

/* Longest name, command or value shown in a message; the rest becomes
 * "...". Buffers for dlock_printable() hold SHOWN_MAX + 4 bytes. */
#define SHOWN_MAX 200

/* A subcommand's helpers' result meaning "carry on" rather than "exit with
 * this status". */
#define PROCEED (-1)

/* "dlock: <message>\n" on stderr: every failure of the tool is one line. */
void dlock_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The subcommand whose help a usage error points to ("run" by default). */
extern const char *dlock_usage_cmd;

/* A usage error, as dlock_say() plus " (see 'dlock CMD --help')";
 * returns EX_USAGE (64). */
int dlock_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * The exit status for a library error, after sysexits(3), the one mapping
 * of every subcommand: 75 (EX_TEMPFAIL) the lock is busy or the wait timed
 * out; 64 (EX_USAGE) a bad URI, scheme or argument; 69 (EX_UNAVAILABLE)
 * the store cannot be reached or refuses the credentials; 70
 * (EX_SOFTWARE) anything else.
 */
int dlock_exit_status(int err);

/* The client's detail of err if it has one (never a password), else the
 * generic text of err (dlock_errmsg(NULL) says "out of memory"). */
const char *dlock_detail(const dlock_client *client, int err);

/* src made printable into dst (SHOWN_MAX + 4 bytes): control characters as
 * '?', cut at SHOWN_MAX with "...", so that every message stays one line. */
void dlock_printable(char *dst, const char *src);

/* A name on standard output: whole, control characters shown as '?'. */
void dlock_print_name(const char *name);

/* s as a JSON string, quotes included: '"' and '\' escaped, control
 * characters (and DEL) as \u00XX; other bytes as they are. */
void dlock_json_string(FILE *f, const char *s);
/* The same, for len bytes that may hold NUL (as \u0000). */
void dlock_json_bytes(FILE *f, const char *s, size_t len);

/* A count of min..max in decimal digits only (no sign, space or suffix)
 * into *out; -1 if s is none. */
int dlock_parse_count(const char *s, unsigned long min, unsigned long max, unsigned long *out);

/* Seconds >= 0, fractions allowed, into *out; -1 if s is none. */
int dlock_parse_seconds(const char *s, double *out);

/* Seconds as nanoseconds; UINT64_MAX ("never") when they overflow. */
uint64_t dlock_seconds_ns(double seconds);

/* now + ns, or UINT64_MAX ("never") when that overflows the clock. */
uint64_t dlock_after_ns(uint64_t ns);

/* An absolute deadline seconds from now, or waiting forever when they
 * overflow the clock. */
void dlock_set_deadline(dlock_acquire_opts *acq, double seconds);

/* What getopt_long() returned (with opterr = 0 and ":" leading the short
 * options) for the options run, migrate and inspect share: 'h' prints the
 * usage (exit status from dlock_finish_stdout()); ':' (an argument missing)
 * and any other option are usage errors naming the option (EX_USAGE). */
int dlock_other_option(int c, char **argv);

/* The usage of dlock and of run, migrate and inspect (their -h too). */
void dlock_print_usage(FILE *f);

/* Closes stdout, where help, version and reports go: a full disk or a
 * closed pipe is an error (EX_SOFTWARE, said), else EX_OK. */
int dlock_finish_stdout(void);

#endif
