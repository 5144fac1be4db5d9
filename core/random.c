/* Owner ids: 128 bits from the kernel's CSPRNG, never a counter or a time,
 * so that a retried request is recognisable and never mistaken for another
 * owner's. */
#include <errno.h>
#include <sys/random.h>

#include "config.h"
#include "core/internal.h"
#include "core/sha256.h"

int dlock_random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return DLOCK_EIO;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int dlock_owner_new(unsigned char owner[16], char hex[33])
{
    int rc = dlock_random_bytes(owner, 16);
    if (rc == 0)
        dlock_hex(owner, 16, hex);
    return rc;
}
