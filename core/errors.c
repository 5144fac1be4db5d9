/* The error table, generated from DLOCK_ERRNO_MAP: one source of truth. */
#include "config.h"
#include "dlock.h"

const char *dlock_strerror(int err)
{
    switch (err) {
    case DLOCK_OK:
        return "success";
#define DLOCK_STRERROR_(name, num, text)                                      \
    case DLOCK_##name:                                                         \
        return text;
        DLOCK_ERRNO_MAP(DLOCK_STRERROR_)
#undef DLOCK_STRERROR_
    }
    return "unknown error";
}

const char *dlock_err_name(int err)
{
    switch (err) {
    case DLOCK_OK:
        return "DLOCK_OK";
#define DLOCK_ERR_NAME_(name, num, text)                                       \
    case DLOCK_##name:                                                         \
        return "DLOCK_" #name;
        DLOCK_ERRNO_MAP(DLOCK_ERR_NAME_)
#undef DLOCK_ERR_NAME_
    }
    return "DLOCK_UNKNOWN";
}

const char *dlock_version(void)
{
    return DLOCK_VERSION;
}
