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

#endif
