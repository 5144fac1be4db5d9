/* What the dlock tool's subcommands share: messages and JSON output. */
#include <stdarg.h>
#include <sysexits.h>

#include "tools/cli.h"

const char *dlock_usage_cmd = "run";

void dlock_say(const char *fmt, ...)
{
    va_list ap;
    fputs("dlock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int dlock_usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("dlock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'dlock %s --help')\n", dlock_usage_cmd);
    return EX_USAGE;
}

void dlock_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}
