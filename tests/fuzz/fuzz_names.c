/*
 * libFuzzer target: lock name -> file name (backends/file.c
 * dlock_file_encode_name), the one place a caller's bytes become a path.
 *
 * The function is pure (no file is opened). Checks, beyond the sanitizers:
 * every name of 1..DLOCK_NAME_MAX bytes encodes; the result is one safe
 * path component (no '/', no NUL inside, not starting with '.', shorter
 * than 255 bytes, ending in ".lock"); a short encoding decodes back to the
 * exact name (so two names never share a file); a long one is the
 * '~'-separated SHA-256 form; too small a buffer is refused, not overrun.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/file.h"
#include "dlock.h"

#define require(cond)                                                        \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_names: %s:%d: broken: %s\n", __FILE__,     \
                    __LINE__, #cond);                                        \
            abort();                                                         \
        }                                                                    \
    } while (0)

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum { OUTSZ = DLOCK_FILE_ENCODED_MAX + 80 };
    char *out, *tiny, *dec;
    size_t olen, stem;
    const char *name = (const char *)data;
    if (size == 0 || size > DLOCK_NAME_MAX)
        return 0;
    /* Exact-size heap buffers, so ASan sees a write past the end. */
    out = malloc(OUTSZ);
    dec = malloc(size + 1);
    require(out && dec);
    require(dlock_file_encode_name(name, size, out, OUTSZ) == 0);
    olen = strnlen(out, OUTSZ);
    require(olen < OUTSZ && olen < 255);
    require(olen > 5 && strcmp(out + olen - 5, ".lock") == 0);
    require(out[0] != '.' && strchr(out, '/') == NULL);
    stem = olen - 5;
    if (memchr(out, '~', stem)) {
        /* prefix '~' 64 hex digits */
        const char *t = memchr(out, '~', stem);
        require((size_t)(out + stem - t) == 1 + 64);
        for (const char *p = t + 1; p < out + stem; p++)
            require((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'));
    } else {
        size_t n = 0;
        for (size_t i = 0; i < stem; i++) {
            char c = out[i];
            require(c != '%' || (i + 2 < stem && hexval(out[i + 1]) >= 0 &&
                                 hexval(out[i + 2]) >= 0));
            if (c == '%') {
                c = (char)(hexval(out[i + 1]) << 4 | hexval(out[i + 2]));
                i += 2;
            } else {
                require((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.');
            }
            require(n < size);
            dec[n++] = c;
        }
        require(n == size && memcmp(dec, name, size) == 0);
    }
    /* A buffer one byte short of the result is refused and left alone
     * beyond its end (ASan checks the end). */
    tiny = malloc(olen);
    require(tiny);
    require(dlock_file_encode_name(name, size, tiny, olen) == DLOCK_EINVAL);
    free(tiny);
    free(dec);
    free(out);
    return 0;
}
