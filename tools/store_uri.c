/*
 * The store's URI as the CLI handles it (tools/store_uri.h): the default
 * store, passwords added and removed. The library parses the URI itself;
 * here it is only cut where its userinfo is, found as the library finds it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/store_uri.h"

/* "file://" + path, percent-encoded so that '%', '?' or '#' in it survive. */
static int file_uri(char *buf, size_t len, const char *path)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen("file://");

    memcpy(buf, "file://", n);
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if (n + 4 > len)
            return -1;
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
            (*p >= '0' && *p <= '9') || strchr("-._~/", *p)) {
            buf[n++] = (char)*p;
        } else {
            buf[n++] = '%';
            buf[n++] = hex[*p >> 4];
            buf[n++] = hex[*p & 15];
        }
    }
    buf[n] = '\0';
    return 0;
}

const char *store_uri_default(char *buf, size_t len)
{
    const char *env = getenv("DLOCK_URI");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    char dir[DLOCK_URI_MAX];
    struct stat st;
    int n;

    if (env && *env)
        return env;
    /* A relative or stale XDG_RUNTIME_DIR must not scatter locks around. */
    if (xdg && xdg[0] == '/' && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode))
        n = snprintf(dir, sizeof dir, "%s/dlock", xdg);
    else
        n = snprintf(dir, sizeof dir, "/tmp/dlock-%lu", (unsigned long)getuid());
    if (n < 0 || (size_t)n >= sizeof dir || file_uri(buf, len, dir) != 0)
        return NULL;
    return buf;
}

/*
 * Passwords. The URI's userinfo is found as the library finds it: the
 * authority follows "scheme://" and ends at '/', '?' or '#'; its last '@'
 * ends the userinfo, whose first ':' starts the password.
 */
struct userinfo {
    const char *auth;  /* start of the authority (NULL: no "scheme://") */
    const char *at;    /* its last '@', NULL if none */
    const char *colon; /* the ':' before the password, NULL if none */
};

static struct userinfo find_userinfo(const char *uri)
{
    struct userinfo ui = {NULL, NULL, NULL};
    size_t i = strspn(uri, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "0123456789+-.");
    const char *end;

    if (i == 0 || strncmp(uri + i, "://", 3) != 0)
        return ui;
    ui.auth = uri + i + 3;
    end = ui.auth + strcspn(ui.auth, "/?#");
    for (const char *p = ui.auth; p < end; p++)
        if (*p == '@')
            ui.at = p;
    if (ui.at)
        ui.colon = memchr(ui.auth, ':', (size_t)(ui.at - ui.auth));
    return ui;
}

const char *store_uri_shown_value(const char *arg)
{
    static char shown[SHOWN_MAX + 4];
    char *clean = strstr(arg, "://") ? dlock_uri_hide(arg, DLOCK_URI_DROP) : strdup(arg);

    dlock_printable(shown, clean ? clean : "?");
    free(clean);
    return shown;
}

/* pw percent-encoded into uri's userinfo ("scheme://user:PW@..." or
 * "scheme://:PW@..."), in *out (malloc'd). PROCEED or an exit status. */
static int uri_with_password(const char *uri, const char *pw, const char *from,
                             char **out)
{
    static const char hex[] = "0123456789ABCDEF";
    struct userinfo ui = find_userinfo(uri);
    const char *split;
    size_t n;
    char *o;

    *out = NULL;
    if (uri[strcspn(uri, STORE_URI_SPACES)]) {
        dlock_say("%s gives the password of one URI, not of a list of stores", from);
        return EX_USAGE;
    }
    if (ui.colon) {
        dlock_say("the URI has a password already, and another one comes from %s: "
            "give it in one place only", from);
        return EX_USAGE;
    }
    if (!ui.auth)
        split = uri; /* malformed: left for dlock_client_open() to report */
    else
        split = ui.at ? ui.at : ui.auth;
    *out = o = malloc(strlen(uri) + 3 * strlen(pw) + 3);
    if (!o) {
        dlock_say("out of memory");
        return EX_SOFTWARE;
    }
    n = (size_t)(split - uri);
    memcpy(o, uri, n);
    o += n;
    if (ui.auth) {
        *o++ = ':';
        for (const unsigned char *p = (const unsigned char *)pw; *p; p++) {
            if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                (*p >= '0' && *p <= '9') || strchr("-._~", *p)) {
                *o++ = (char)*p;
            } else {
                *o++ = '%';
                *o++ = hex[*p >> 4];
                *o++ = hex[*p & 15];
            }
        }
        if (!ui.at)
            *o++ = '@';
    }
    strcpy(o, split);
    return PROCEED;
}

void store_uri_wipe_free(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

/* The first line of the password file (the library's reader). */
static int read_password_file(const char *path, char **pwp)
{
    char err[512], shown[SHOWN_MAX + 4];
    int rc = dlock_uri_read_secret("--password-file", path, pwp, err, sizeof err);

    if (rc == 0)
        return PROCEED;
    dlock_printable(shown, rc == DLOCK_ENOMEM ? "out of memory" : err);
    dlock_say("%s", shown);
    return rc == DLOCK_ENOMEM ? EX_SOFTWARE : EX_USAGE;
}

int store_uri_add_password(const char *uri, const char *password_file, char **out)
{
    const char *env = getenv("DLOCK_PASSWORD");

    char *pw = NULL;
    int status;

    *out = NULL;
    if (password_file) {
        status = read_password_file(password_file, &pw);
        if (status != PROCEED)
            return status;
        status = uri_with_password(uri, pw, "--password-file", out);
        store_uri_wipe_free(pw);
        return status;
    }
    if (!env)
        return PROCEED;
    if (!*env) {
        dlock_say("DLOCK_PASSWORD is set but empty: unset it, or give the password");
        return EX_USAGE;
    }
    return uri_with_password(uri, env, "DLOCK_PASSWORD", out);
}
