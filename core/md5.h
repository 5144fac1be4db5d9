/* MD5 (RFC 1321): only to derive a peer's key from a name as the peer does
 * (tooz's PostgreSQL locks); never for anything that needs a secure hash. */
#ifndef DLOCK_CORE_MD5_H
#define DLOCK_CORE_MD5_H

#include <stddef.h>

#define DLOCK_MD5_LEN 16

void dlock_md5(const void *data, size_t len, unsigned char out[DLOCK_MD5_LEN]);

#endif
