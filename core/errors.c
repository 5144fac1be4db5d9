/*
 * Errors: the table (generated from DLOCK_ERRNO_MAP, one source of truth)
 * and the recording of a client's detail (dlock_seterr and its save and
 * restore), with passwords masked. Calls nothing above it, so URI parsing,
 * cancel flags and backends record errors without calling up into the
 * client.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "core/internal.h"

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

/* Shorter passwords are not searched for in messages: masking every "ab" in
 * a message would wreck it, and the core never formats a password anyway. */
#define REDACT_MIN_LEN 4

static void redact(char *msg, const char *secret)
{
    size_t slen;
    char *hit;
    if (!secret || (slen = strlen(secret)) < REDACT_MIN_LEN)
        return;
    while ((hit = strstr(msg, secret)) != NULL) {
        size_t tail = strlen(hit + slen);
        memmove(hit + 3, hit + slen, tail + 1);
        memcpy(hit, "***", 3);
    }
}

/* On the keeper's threads, detail goes to the keeper's own buffer: the
 * application's thread may be reading or writing the client's. */
static _Thread_local dlock_errsave *err_sink;

void dlock_err_redirect(dlock_errsave *sink)
{
    err_sink = sink;
}

static int *err_slot(dlock_client *c, char **msg)
{
    if (err_sink) {
        *msg = err_sink->msg;
        return &err_sink->err;
    }
    *msg = c->errmsg;
    return &c->err;
}

int dlock_vseterr(dlock_client *c, int code, const char *fmt, va_list ap)
{
    /* Redact before truncating, so that no prefix of a password cut off at
     * the buffer's end can slip through. */
    char full[4 * DLOCK_ERRMSG_MAX], *msg;
    if (!c)
        return code;
    *err_slot(c, &msg) = code;
    vsnprintf(full, sizeof full, fmt, ap);
    for (size_t i = 0; i < sizeof c->secret / sizeof c->secret[0]; i++)
        redact(full, c->secret[i]);
    size_t n = strlen(full);
    if (n >= DLOCK_ERRMSG_MAX)
        n = DLOCK_ERRMSG_MAX - 1;
    memcpy(msg, full, n);
    msg[n] = '\0';
    return code;
}

int dlock_seterr(dlock_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dlock_vseterr(c, code, fmt, ap);
    va_end(ap);
    return code;
}

void dlock_err_clear(dlock_client *c)
{
    char *msg;
    if (!c)
        return;
    *err_slot(c, &msg) = 0;
    msg[0] = '\0';
}

void dlock_err_save(dlock_client *c, dlock_errsave *save)
{
    char *msg;
    if (!c)
        return;
    save->err = *err_slot(c, &msg);
    memcpy(save->msg, msg, sizeof save->msg);
}

void dlock_err_restore(dlock_client *c, const dlock_errsave *save)
{
    char *msg;
    if (!c)
        return;
    *err_slot(c, &msg) = save->err;
    memcpy(msg, save->msg, sizeof save->msg);
}

const char *dlock_errmsg(const dlock_client *c)
{
    if (!c)
        return "out of memory";
    return c->errmsg;
}
