/*
 * The store's URI as the CLI handles it before the library parses it: the
 * default store, a password added from --password-file or $DLOCK_PASSWORD,
 * and passwords removed where a URI is shown or handed on (the command's
 * DLOCK_URI, messages). A URI argument may be a list of stores separated by
 * whitespace.
 */
#ifndef DLOCK_TOOLS_STORE_URI_H
#define DLOCK_TOOLS_STORE_URI_H

#include <stddef.h>

#include "core/uri.h" /* dlock_uri_hide() */

/* What separates the stores of a list. */
#define STORE_URI_SPACES " \t\r\n\v\f"

/* $DLOCK_URI, else file://$XDG_RUNTIME_DIR/dlock, else
 * file:///tmp/dlock-$UID (in buf); NULL when the path does not fit. */
const char *store_uri_default(char *buf, size_t len);

/* Passwords are removed from a URI, or masked, by dlock_uri_hide()
 * (core/uri.h), the library's one copy of that. */

/* An option's bad value as it may be shown: printable, and without a
 * password when it is a URI given in the wrong place. Static storage. */
const char *store_uri_shown_value(const char *arg);

/*
 * The URI to open: uri with the password of the file password_file
 * (its first line, read as the library reads password_file=) if not NULL
 * or, failing that, of $DLOCK_PASSWORD, if either is given (*out NULL: use
 * uri as is). PROCEED or an exit status (the problem said).
 */
int store_uri_add_password(const char *uri, const char *password_file, char **out);

/* Wipes a string that may hold a password, and frees it. NULL is fine. */
void store_uri_wipe_free(char *s);

#endif
