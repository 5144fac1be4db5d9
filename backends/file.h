/* File backend internals shared with its tests. */
#ifndef DLOCK_BACKENDS_FILE_H
#define DLOCK_BACKENDS_FILE_H

#include <stddef.h>

/* Longest encoded name kept verbatim; longer ones become prefix~sha256. */
#define DLOCK_FILE_ENCODED_MAX 200

/*
 * Encodes a lock name as a file name ending in ".lock": bytes outside
 * [A-Za-z0-9_.-] (and a leading '.') become %XX, so '/', "..", spaces and
 * arbitrary bytes are safe; names whose encoding exceeds
 * DLOCK_FILE_ENCODED_MAX bytes become a prefix, '~' and the SHA-256 of the
 * name. out needs DLOCK_FILE_ENCODED_MAX + 80 bytes.
 */
int dlock_file_encode_name(const char *name, size_t len, char *out, size_t outsz);

#endif
