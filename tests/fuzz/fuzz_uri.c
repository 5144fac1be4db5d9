/*
 * libFuzzer target: the core URI parser (core/uri.c) and its getters.
 *
 * Only the parser runs: dlock_client_open() would go on to open a store (a
 * file:// URI makes its directory, so a fuzzed one creates directories
 * without end), and nothing here touches the network or the filesystem.
 *
 * Each input is parsed twice: as it is, and after the prefix
 * "redis://user:<secret>:" + "@", with the input as the rest, to check that
 * the password never reaches an error message or the redacted form. Beyond
 * the sanitizers, the target aborts when the parser breaks a documented
 * promise (see check()).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/uri.h"

#define SECRET "Zq9sEcReT"

#define require(cond)                                                        \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_uri: %s:%d: broken: %s\n", __FILE__,       \
                    __LINE__, #cond);                                        \
            abort();                                                         \
        }                                                                    \
    } while (0)

static void check_parsed(const dlock_uri *u, const char *s)
{
    const char *scheme = dlock_uri_scheme(u), *pw = dlock_uri_password(u);
    size_t nh = dlock_uri_host_count(u), np = dlock_uri_param_count(u);

    require(scheme && scheme[0]);
    for (const char *p = scheme; *p; p++)
        require((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                *p == '+' || *p == '-' || *p == '.');
    require(strncasecmp(s, scheme, strlen(scheme)) == 0);
    require(dlock_uri_path(u) != NULL);
    require(pw == NULL || dlock_uri_user(u) != NULL);
    require(nh <= 64 && np <= 64);
    for (size_t i = 0; i < nh; i++) {
        const char *h = dlock_uri_host(u, i);
        require(h && h[0]);
        require(dlock_uri_port(u, i) <= 65535);
    }
    require(dlock_uri_host(u, nh) == NULL && dlock_uri_port(u, nh) == 0);
    for (size_t i = 0; i < np; i++) {
        const char *k = dlock_uri_param_key(u, i), *v = dlock_uri_param_value(u, i);
        uint64_t n = 7;
        int b = 7;
        require(k && k[0] && v);
        /* The lookup gives the last value for a repeated key. */
        for (size_t j = i + 1; j < np; j++)
            if (strcmp(dlock_uri_param_key(u, j), k) == 0)
                v = dlock_uri_param_value(u, j);
        require(dlock_uri_param(u, k) == v);
        /* The typed getters, with no client (the detail is dropped). */
        if (dlock_uri_param_uint(NULL, u, k, 1, 1000, &n) == 0)
            require(n >= 1 && n <= 1000);
        else
            require(n == 7);
        if (dlock_uri_param_bool(NULL, u, k, &b) == 0)
            require(b == 0 || b == 1);
        else
            require(b == 7);
    }
    require(dlock_uri_param_key(u, np) == NULL && dlock_uri_param_value(u, np) == NULL);
    require(dlock_uri_redacted(u) != NULL);
    /* A secret: the password, or a parameter named "password" or
     * "*_password" with a value (one with an empty value may be masked or
     * not, as it was written with '=' or without). */
    int secret = pw != NULL, maybe = 0;
    for (size_t i = 0; i < np; i++) {
        const char *k = dlock_uri_param_key(u, i);
        size_t kl = strlen(k);
        if (kl >= 8 && strcmp(k + kl - 8, "password") == 0 && (kl == 8 || k[kl - 9] == '_')) {
            if (dlock_uri_param_value(u, i)[0])
                secret = 1;
            else
                maybe = 1;
        }
    }
    if (secret)
        require(strstr(dlock_uri_redacted(u), "***") != NULL);
    else if (!maybe)
        require(strcmp(dlock_uri_redacted(u), s) == 0);
}

/* Parses s; returns the URI (for the caller's checks) or NULL. */
static dlock_uri *check(const char *s, char *err, size_t errlen)
{
    dlock_uri *u = (dlock_uri *)&u;
    int rc = dlock_uri_parse(s, &u, err, errlen);
    require(memchr(err, '\0', errlen) != NULL);
    if (rc) {
        require(rc == DLOCK_EBADURI || rc == DLOCK_ENOMEM);
        require(u == NULL);
        require(err[0] != '\0');
        return NULL;
    }
    require(u != NULL);
    check_parsed(u, s);
    return u;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char prefix[] = "redis://user:" SECRET "@";
    char err[256], small[8];
    char *s = malloc(sizeof prefix + size);
    dlock_uri *u;
    if (!s)
        return 0;

    /* As it is (up to its first NUL, as a C string). */
    memcpy(s, data, size);
    s[size] = '\0';
    dlock_uri_free(check(s, err, sizeof err));
    /* A tiny error buffer must still come back terminated. */
    dlock_uri_free(check(s, small, sizeof small));

    /* Behind a password: never in a message, never in the redacted form. */
    if (!memmem(data, size, "Zq9", 3)) {
        memcpy(s, prefix, sizeof prefix - 1);
        memcpy(s + sizeof prefix - 1, data, size);
        s[sizeof prefix - 1 + size] = '\0';
        u = check(s, err, sizeof err);
        if (u) {
            require(strncmp(dlock_uri_password(u), SECRET, strlen(SECRET)) == 0);
            require(strstr(dlock_uri_redacted(u), SECRET) == NULL);
            dlock_uri_free(u);
        } else {
            require(strstr(err, SECRET) == NULL);
        }
    }
    free(s);
    return 0;
}
