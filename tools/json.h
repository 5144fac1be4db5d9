/* JSON output shared by the dlock tool's subcommands (run, inspect, check,
 * bench). */
#ifndef DLOCK_TOOLS_JSON_H
#define DLOCK_TOOLS_JSON_H

#include <stdio.h>

/* s as a JSON string, quotes included: '"' and '\' escaped, control
 * characters (and DEL) as \u00XX; other bytes as they are. */
void dlock_json_string(FILE *f, const char *s);

#endif
