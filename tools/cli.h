/* What the dlock tool's subcommands (run, migrate, inspect, check, bench)
 * share: messages on stderr and JSON output. */
#ifndef DLOCK_TOOLS_CLI_H
#define DLOCK_TOOLS_CLI_H

#include <stdio.h>

/* "dlock: <message>\n" on stderr: every failure of the tool is one line. */
void dlock_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The subcommand whose help a usage error points to ("run" by default). */
extern const char *dlock_usage_cmd;

/* A usage error, as dlock_say() plus " (see 'dlock CMD --help')";
 * returns EX_USAGE (64). */
int dlock_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* s as a JSON string, quotes included: '"' and '\' escaped, control
 * characters (and DEL) as \u00XX; other bytes as they are. */
void dlock_json_string(FILE *f, const char *s);

#endif
