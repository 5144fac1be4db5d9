/* The error table: every code has a distinct name and a real message. */
#include <string.h>

#include "dlock.h"
#include "tests/tap.h"

int main(void)
{
    static const int codes[] = {
#define CODE_(name, num, text) DLOCK_##name,
        DLOCK_ERRNO_MAP(CODE_)
#undef CODE_
    };
    size_t n = sizeof codes / sizeof codes[0];

    is_str(dlock_strerror(0), "success", "0 is success");
    is_str(dlock_err_name(0), "DLOCK_OK", "0 is DLOCK_OK");
    for (size_t i = 0; i < n; i++) {
        const char *msg = dlock_strerror(codes[i]), *name = dlock_err_name(codes[i]);
        ok(codes[i] < 0, "%s is negative", name);
        ok(strcmp(msg, "unknown error") != 0 && msg[0], "%s has a message: %s", name, msg);
        ok(strncmp(name, "DLOCK_E", 7) == 0, "%s is named DLOCK_E*", name);
        for (size_t j = 0; j < i; j++)
            if (codes[j] == codes[i] || strcmp(dlock_err_name(codes[j]), name) == 0)
                ok(0, "%s is unique", name);
    }
    /* Numbers are ABI: spot-check that they never move. */
    is_int(DLOCK_EINVAL, -1, "EINVAL is -1");
    is_int(DLOCK_EBUSY, -7, "EBUSY is -7");
    is_int(DLOCK_ETIMEDOUT, -8, "ETIMEDOUT is -8");
    is_int(DLOCK_ELOST, -9, "ELOST is -9");
    is_int(DLOCK_EEXIST, -20, "EEXIST is -20");
    is_str(dlock_strerror(-9999), "unknown error", "unknown code");
    is_str(dlock_err_name(12345), "DLOCK_UNKNOWN", "unknown name");
    is_str(dlock_version(), DLOCK_VERSION_STRING, "runtime version matches the header");
    uint64_t t1 = dlock_monotonic_ns(), t2 = dlock_monotonic_ns();
    ok(t1 > 0 && t2 >= t1, "monotonic clock does not go back");
    return done_testing();
}
