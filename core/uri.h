/*
 * URI parsing: private to the library, its tests and the dlock tool (bench
 * reads a store's host through it). Exported from the shared library
 * (DLOCK_API) for the tool, but not installed: not part of the public API.
 */
#ifndef DLOCK_CORE_URI_H
#define DLOCK_CORE_URI_H

#include "dlock_backend.h"

/*
 * Parses s into a new dlock_uri. On failure returns DLOCK_EBADURI (or
 * DLOCK_ENOMEM) and writes a message naming the problem into err (never the
 * password, never the whole raw URI); *urip is left NULL.
 */
DLOCK_API int dlock_uri_parse(const char *s, dlock_uri **urip, char *err, size_t errlen);
DLOCK_API void dlock_uri_free(dlock_uri *uri);

/*
 * The secret in the file at path (password_file=, the CLI's
 * --password-file): its first line, without its "\n" or "\r\n", into *out
 * (malloc'd; wipe it before freeing). A missing or unreadable file, or an
 * empty or NUL-holding first line: DLOCK_EBADURI, and a message in err that
 * starts with what (e.g. "option password_file") and names the file, never
 * what it holds. DLOCK_ENOMEM when out of memory.
 */
DLOCK_API int dlock_uri_read_secret(const char *what, const char *path, char **out, char *err,
                                    size_t errlen);

/*
 * The one place that hides a URI's secrets in text (messages, `inspect`,
 * bench and check reports, the DLOCK_URI a command inherits): a copy of
 * list (one URI, or several separated by whitespace, then joined by one
 * space) whose password, and the value of every "password" or
 * "*_password" parameter (sentinel_password), are
 *   DLOCK_URI_MASK: replaced by "***" (redis://:***@h?sentinel_password=***);
 *   DLOCK_URI_DROP: removed, with the ':' (and an empty user name's '@') and
 *                   the whole parameter (redis://:pw@h -> redis://h).
 * A password_file parameter names a file, not a secret: it stays. Works on
 * malformed text too (found as the parser finds the userinfo: the last '@'
 * of the authority ends it, its first ':' starts the password). malloc'd;
 * NULL when out of memory.
 */
#define DLOCK_URI_MASK 0
#define DLOCK_URI_DROP 1
DLOCK_API char *dlock_uri_hide(const char *list, int mode);

#endif
