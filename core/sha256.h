/* SHA-256 (FIPS 180-4): stable, documented keys for long lock names. */
#ifndef DLOCK_CORE_SHA256_H
#define DLOCK_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define DLOCK_SHA256_LEN 32

void dlock_sha256(const void *data, size_t len, unsigned char out[DLOCK_SHA256_LEN]);
/* Lower-case hex of bytes into out (2 * len + 1 bytes). */
void dlock_hex(const unsigned char *bytes, size_t len, char *out);

#endif
