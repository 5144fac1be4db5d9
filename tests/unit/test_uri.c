/* URI parser: valid forms, malformed ones, limits, IPv6, percent-encoding,
 * and that no message ever carries the password. */
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>
#include <string.h>

#include "core/uri.h"
#include "dlock_backend.h"
#include "tests/tap.h"

static dlock_uri *parse_ok(const char *s)
{
    dlock_uri *u = NULL;
    char err[256];
    int rc = dlock_uri_parse(s, &u, err, sizeof err);
    ok(rc == 0 && u, "parses: %s", s);
    if (rc)
        diag("error: %s", err);
    return u;
}

/* Malformed: must fail with EBADURI, name the problem (want), and never
 * contain secret. */
static void parse_bad(const char *s, const char *want, const char *secret)
{
    dlock_uri *u = (dlock_uri *)1;
    char err[256] = "";
    int rc = dlock_uri_parse(s, &u, err, sizeof err);
    ok(rc == DLOCK_EBADURI && u == NULL, "rejects '%.60s'", s);
    ok(strstr(err, want) != NULL, "message for '%.40s' mentions '%s' (got: %s)", s, want, err);
    if (secret)
        ok(strstr(err, secret) == NULL, "message for '%.40s' hides the password", s);
}

static void test_basic(void)
{
    dlock_uri *u = parse_ok("REDIS://alice:pw@host1:6379,host2,[::1]:7000/3?prefix=app&timeout=5&prefix=b");
    if (!u)
        return;
    is_str(dlock_uri_scheme(u), "redis", "scheme is lower-cased");
    is_str(dlock_uri_user(u), "alice", "user");
    is_str(dlock_uri_password(u), "pw", "password");
    is_int(dlock_uri_host_count(u), 3, "three hosts");
    is_str(dlock_uri_host(u, 0), "host1", "host 1");
    is_int(dlock_uri_port(u, 0), 6379, "port 1");
    is_str(dlock_uri_host(u, 1), "host2", "host 2");
    is_int(dlock_uri_port(u, 1), 0, "no port gives 0");
    is_str(dlock_uri_host(u, 2), "::1", "IPv6 host without brackets");
    is_int(dlock_uri_port(u, 2), 7000, "IPv6 port");
    ok(dlock_uri_host(u, 3) == NULL, "host out of range is NULL");
    is_str(dlock_uri_path(u), "/3", "path");
    is_int(dlock_uri_param_count(u), 3, "repeated keys are all kept");
    is_str(dlock_uri_param_key(u, 0), "prefix", "first key");
    is_str(dlock_uri_param_value(u, 0), "app", "first value");
    is_str(dlock_uri_param(u, "prefix"), "b", "lookup returns the last value");
    ok(dlock_uri_param(u, "nope") == NULL, "absent key is NULL");
    is_str(dlock_uri_redacted(u),
           "REDIS://alice:***@host1:6379,host2,[::1]:7000/3?prefix=app&timeout=5&prefix=b",
           "redacted form masks the password");
    dlock_uri_free(u);
}

static void test_file_and_decoding(void)
{
    dlock_uri *u = parse_ok("file:///var/lib/my%20locks");
    if (u) {
        is_int(dlock_uri_host_count(u), 0, "file:/// has no host");
        is_str(dlock_uri_path(u), "/var/lib/my locks", "path is percent-decoded");
        ok(dlock_uri_user(u) == NULL && dlock_uri_password(u) == NULL, "no userinfo");
        dlock_uri_free(u);
    }
    u = parse_ok("redis://us%40er:p%3Aw%2F@h/?k%26=v%3D1&flag");
    if (u) {
        is_str(dlock_uri_user(u), "us@er", "user is decoded");
        is_str(dlock_uri_password(u), "p:w/", "password is decoded");
        is_str(dlock_uri_param_key(u, 0), "k&", "key is decoded");
        is_str(dlock_uri_param_value(u, 0), "v=1", "value is decoded");
        is_str(dlock_uri_param(u, "flag"), "", "key without '=' has an empty value");
        dlock_uri_free(u);
    }
    u = parse_ok("redis://user:p@ss@host");
    if (u) {
        is_str(dlock_uri_password(u), "p@ss", "the last '@' ends the userinfo");
        is_str(dlock_uri_host(u, 0), "host", "host after the last '@'");
        is_str(dlock_uri_redacted(u), "redis://user:***@host", "redacted with '@' in password");
        dlock_uri_free(u);
    }
    u = parse_ok("redis+sentinel://:pw1@s1:26379,s2/mymaster/0?sentinel_password=sek&"
                 "timeout=5&nopassword=x&password=p2");
    if (u) {
        is_str(dlock_uri_scheme(u), "redis+sentinel", "a scheme with '+'");
        is_str(dlock_uri_param(u, "sentinel_password"), "sek", "sentinel_password parsed");
        is_str(dlock_uri_redacted(u),
               "redis+sentinel://:***@s1:26379,s2/mymaster/0?sentinel_password=***&timeout=5&"
               "nopassword=x&password=***",
               "redacted: the password and every *_password parameter (not 'nopassword')");
        dlock_uri_free(u);
    }
    u = parse_ok("redis://user:@host?password=");
    if (u) {
        is_str(dlock_uri_redacted(u), "redis://user:***@host?password=***",
               "an empty password and an empty password parameter are masked once each");
        dlock_uri_free(u);
    }
    u = parse_ok("postgresql://[2001:db8::7]/db");
    if (u) {
        is_str(dlock_uri_host(u, 0), "2001:db8::7", "IPv6 without port");
        dlock_uri_free(u);
    }
    u = parse_ok("redis://:onlypass@h:1");
    if (u) {
        is_str(dlock_uri_user(u), "", "empty user with a password");
        is_str(dlock_uri_password(u), "onlypass", "password alone");
        dlock_uri_free(u);
    }
}

static void test_malformed(void)
{
    parse_bad("", "empty", NULL);
    parse_bad("foo", "scheme", NULL);
    parse_bad("://host", "scheme", NULL);
    parse_bad("1redis://h", "scheme", NULL);
    parse_bad("redis:/h", "//", NULL);
    parse_bad("redis://h:0", "out of range", NULL);
    parse_bad("redis://h:65536", "out of range", NULL);
    parse_bad("redis://h:12a", "not a number", NULL);
    parse_bad("redis://h:", "empty port", NULL);
    parse_bad("redis://a,,b", "empty host 2", NULL);
    parse_bad("redis://a,", "empty host 2", NULL);
    parse_bad("redis://[::1", "closing", NULL);
    parse_bad("redis://[zz::1]:5", "IPv6", NULL);
    parse_bad("redis://[::1]x", "after the address", NULL);
    parse_bad("redis://h/p#frag", "fragment", NULL);
    parse_bad("redis://h/a b", "space", NULL);
    parse_bad("redis://h/a\tb", "control", NULL);
    parse_bad("redis://h/%zz", "path", NULL);
    parse_bad("redis://h/%4", "path", NULL);
    parse_bad("redis://h/a%00b", "NUL", NULL);
    parse_bad("redis://h/?=v", "empty option name", NULL);
    parse_bad("redis://h/?a=%G1", "option values", NULL);
    parse_bad("redis://h_a$b/", "not allowed", NULL);
    parse_bad("redis://@h", "empty user", NULL);
    parse_bad("redis://bob:hunter2secret%zz@h", "password", "hunter2secret");
    parse_bad("redis://bob:topsecretpw@h:99999", "out of range", "topsecretpw");
    parse_bad("redis://bob:topsecretpw@[::1/", "closing", "topsecretpw");
}

static void test_limits(void)
{
    size_t n = DLOCK_URI_MAX + 100;
    char *s = malloc(n + 1);
    dlock_uri *u = NULL;
    char err[256];
    memcpy(s, "file:///", 8);
    memset(s + 8, 'a', n - 8);
    s[n] = '\0';
    parse_bad(s, "longer than", NULL);

    s[DLOCK_URI_MAX] = '\0'; /* exactly at the limit: accepted */
    is_int(dlock_uri_parse(s, &u, err, sizeof err), 0, "a URI of exactly DLOCK_URI_MAX bytes parses");
    dlock_uri_free(u);

    /* 65 hosts: over the host-list limit. */
    strcpy(s, "redis://");
    for (int i = 0; i < 65; i++)
        strcat(s, i ? ",h" : "h");
    parse_bad(s, "more than", NULL);
    free(s);

    is_int(dlock_uri_parse(NULL, &u, err, sizeof err), DLOCK_EBADURI, "NULL URI is EBADURI");
    dlock_uri_free(NULL);
    ok(1, "dlock_uri_free(NULL) is harmless");
}

/* What the fuzz target (tests/fuzz/fuzz_uri.c) also checks on every input:
 * any error buffer comes back terminated, even a tiny one or none; the
 * redacted form is the input itself when there is no password; the option
 * limit holds like the host limit. */
static void test_buffers(void)
{
    dlock_uri *u = (dlock_uri *)1;
    char tiny[8], one[1] = {'x'};
    is_int(dlock_uri_parse("redis://h:0", &u, tiny, sizeof tiny), DLOCK_EBADURI,
           "an 8-byte error buffer");
    ok(memchr(tiny, '\0', sizeof tiny) != NULL && tiny[0] != '\0',
       "is filled and terminated (got '%s')", tiny);
    is_int(dlock_uri_parse("redis://h:0", &u, one, sizeof one), DLOCK_EBADURI,
           "a 1-byte error buffer");
    is_int(one[0], '\0', "holds the empty string");
    is_int(dlock_uri_parse("redis://h:0", &u, NULL, 0), DLOCK_EBADURI, "no error buffer at all");
    ok(u == NULL, "and no URI");

    u = parse_ok("zookeeper://a:1,b:2/x/y?session_timeout=5000&k=%20");
    if (u) {
        is_str(dlock_uri_redacted(u), "zookeeper://a:1,b:2/x/y?session_timeout=5000&k=%20",
               "without a password the redacted form is the URI as given");
        dlock_uri_free(u);
    }

    char *s = malloc(16 + 65 * 4);
    strcpy(s, "redis://h/?");
    for (int i = 0; i < 65; i++)
        strcat(s, i ? "&k=v" : "k=v");
    parse_bad(s, "more than 64 options", NULL);
    s[strlen(s) - 4] = '\0'; /* 64 options: accepted */
    u = parse_ok(s);
    if (u) {
        is_int(dlock_uri_param_count(u), 64, "64 options are kept");
        dlock_uri_free(u);
    }
    free(s);
}

/* dlock_uri_param_choice(): exact matches only, absent leaves *out, and
 * anything else is EBADURI naming the key and listing the choices. */
static void test_choice(void)
{
    static const char *const layouts[] = {"dlock", "plain", "kazoo", NULL};
    char dir[] = "/tmp/dlock-uri-XXXXXX", uri[64];
    dlock_client *c = NULL;
    dlock_uri *u;
    int out = -1;
    if (!mkdtemp(dir))
        abort();
    snprintf(uri, sizeof uri, "file://%s", dir);
    if (dlock_client_open(uri, &c) != 0)
        abort();
    u = parse_ok("redis://h/0?layout=plain");
    is_int(dlock_uri_param_choice(c, u, "layout", layouts, &out), 0, "layout=plain is a choice");
    is_int(out, 1, "its index");
    out = -1;
    is_int(dlock_uri_param_choice(c, u, "other", layouts, &out), 0, "an absent key is no error");
    is_int(out, -1, "and leaves *out");
    dlock_uri_free(u);
    u = parse_ok("redis://h/0?layout=Plain");
    is_int(dlock_uri_param_choice(c, u, "layout", layouts, &out), DLOCK_EBADURI,
           "layout=Plain (case differs) → DLOCK_EBADURI");
    ok(strstr(dlock_errmsg(c), "option layout: dlock, plain or kazoo (not 'Plain')") != NULL,
       "the message lists the choices: %s", dlock_errmsg(c));
    dlock_uri_free(u);
    dlock_client_close(c);
    rmdir(dir);
}


/* Writes content into a new temporary file whose name goes into path. */
static void temp_file(char *path, size_t len, const char *content, size_t n)
{
    snprintf(path, len, "/tmp/dlock-test-uri-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, content, n) != (ssize_t)n)
        { diag("cannot write a temporary file"); exit(1); }
    close(fd);
}

/* password_file= and <x>_password_file=: read once here for every backend. */
static void test_password_file(void)
{
    char pw[64], crlf[64], empty[64], blank[64], nul[64], sent[64], uri[512];
    dlock_uri *u;
    temp_file(pw, sizeof pw, "fil3pass\nsecond line\n", 21);
    temp_file(crlf, sizeof crlf, "crlfpass\r\n", 10);
    temp_file(empty, sizeof empty, "", 0);
    temp_file(blank, sizeof blank, "\nnext\n", 6);
    temp_file(nul, sizeof nul, "ab\0cd\n", 6);
    temp_file(sent, sizeof sent, "sentpass", 8);

    snprintf(uri, sizeof uri, "redis://h:1/0?prefix=p&password_file=%s&timeout=5", pw);
    if ((u = parse_ok(uri))) {
        is_str(dlock_uri_password(u), "fil3pass", "password_file: its first line is the password");
        ok(dlock_uri_user(u) == NULL, "password_file: no user");
        is_int(dlock_uri_param_count(u), 2, "password_file is consumed, the other options stay");
        ok(dlock_uri_param(u, "password_file") == NULL, "backends never see password_file");
        is_str(dlock_uri_param_key(u, 1), "timeout", "options after it keep their order");
        ok(strstr(dlock_uri_redacted(u), "fil3pass") == NULL &&
           strstr(dlock_uri_redacted(u), "password_file=") != NULL,
           "the redacted form names the file, not its content");
        dlock_uri_free(u);
    }
    snprintf(uri, sizeof uri, "mysql://bob@h/db?password_file=%s", crlf);
    if ((u = parse_ok(uri))) {
        is_str(dlock_uri_password(u), "crlfpass", "password_file: \"\\r\\n\" is cut");
        is_str(dlock_uri_user(u), "bob", "the user stays");
        dlock_uri_free(u);
    }
    snprintf(uri, sizeof uri, "redis+sentinel://:pw9@s1/m/0?sentinel_password_file=%s", sent);
    if ((u = parse_ok(uri))) {
        is_str(dlock_uri_param(u, "sentinel_password"), "sentpass",
               "sentinel_password_file gives sentinel_password");
        ok(dlock_uri_param(u, "sentinel_password_file") == NULL, "and is consumed");
        is_str(dlock_uri_password(u), "pw9", "the URI's own password stays");
        dlock_uri_free(u);
    }
    snprintf(uri, sizeof uri, "redis://:uripw9@h?password_file=%s", pw);
    parse_bad(uri, "password already", "uripw9");
    snprintf(uri, sizeof uri, "redis://h?password_file=%s&password_file=%s", pw, pw);
    parse_bad(uri, "twice", "fil3pass");
    snprintf(uri, sizeof uri, "redis+sentinel://s/m?sentinel_password=sek9&sentinel_password_file=%s",
             sent);
    parse_bad(uri, "sentinel_password_file and sentinel_password", "sek9");
    parse_bad("redis://h?password_file=/nonexistent/dlock-pw", "password_file: cannot open "
              "'/nonexistent/dlock-pw'", NULL);
    parse_bad("redis://h?password_file=", "password_file: no file name", NULL);
    snprintf(uri, sizeof uri, "redis://h?password_file=%s", empty);
    parse_bad(uri, "is empty", NULL);
    snprintf(uri, sizeof uri, "redis://h?password_file=%s", blank);
    parse_bad(uri, "empty first line", "next");
    snprintf(uri, sizeof uri, "redis://h?password_file=%s", nul);
    parse_bad(uri, "NUL byte", "cd");
    parse_bad("redis://h?password_file=/tmp", "password_file: cannot read '/tmp'", NULL);
    /* At most 4096 bytes: a password of that length is fine, one more is not
     * (and /dev/zero is not read forever). */
    static char big[4100];
    memset(big, 'x', sizeof big);
    big[4096] = '\n';
    unlink(blank);
    temp_file(blank, sizeof blank, big, 4097);
    snprintf(uri, sizeof uri, "redis://h?password_file=%s", blank);
    if ((u = parse_ok(uri))) {
        is_int(strlen(dlock_uri_password(u)), 4096, "a 4096-byte password");
        dlock_uri_free(u);
    }
    unlink(blank);
    big[4096] = 'x';
    temp_file(blank, sizeof blank, big, 4100);
    snprintf(uri, sizeof uri, "redis://h?password_file=%s", blank);
    parse_bad(uri, "longer than 4096 bytes", NULL);
    parse_bad("redis://h?password_file=/dev/zero", "longer than 4096 bytes", NULL);
    /* Not a secret option: left alone. */
    if ((u = parse_ok("redis://h?log_file=/x"))) {
        is_str(dlock_uri_param(u, "log_file"), "/x", "other *_file options are not read");
        dlock_uri_free(u);
    }
    unlink(pw), unlink(crlf), unlink(empty), unlink(blank), unlink(nul), unlink(sent);
}

/* dlock_uri_hide(): the one function that hides a URI's secrets in text. */
static void test_hide(void)
{
    static const struct {
        const char *in, *mask, *drop;
    } cases[] = {
        {"redis://:pw@h/0", "redis://:***@h/0", "redis://h/0"},
        {"mysql://u:p@ss@h/db", "mysql://u:***@h/db", "mysql://u@h/db"},
        {"redis://u:@h", "redis://u:***@h", "redis://u@h"},
        {"redis://u@h?password_file=/f", "redis://u@h?password_file=/f",
         "redis://u@h?password_file=/f"},
        {"redis+sentinel://:a1@s/m?sentinel_password=b2&x=1",
         "redis+sentinel://:***@s/m?sentinel_password=***&x=1", "redis+sentinel://s/m?x=1"},
        {"redis+sentinel://s/m?x=1&sentinel%5Fpassword=b2",
         "redis+sentinel://s/m?x=1&sentinel%5Fpassword=***", "redis+sentinel://s/m?x=1"},
        {"redis://h?password=", "redis://h?password=***", "redis://h"},
        {"redis://h?nopassword=x", "redis://h?nopassword=x", "redis://h?nopassword=x"},
        {"file:///tmp/a:b@c", "file:///tmp/a:b@c", "file:///tmp/a:b@c"},
        {"not a uri", "not a uri", "not a uri"},
        {"  redis://:x@a\tetcd://u:y@b:1 ", "redis://:***@a etcd://u:***@b:1",
         "redis://a etcd://u@b:1"},
        {"", "", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *m = dlock_uri_hide(cases[i].in, DLOCK_URI_MASK);
        char *d = dlock_uri_hide(cases[i].in, DLOCK_URI_DROP);
        is_str(m, cases[i].mask, "hide, masked: '%s'", cases[i].in);
        is_str(d, cases[i].drop, "hide, dropped: '%s'", cases[i].in);
        free(m);
        free(d);
    }
}

int main(void)
{
    test_basic();
    test_file_and_decoding();
    test_malformed();
    test_limits();
    test_buffers();
    test_choice();
    test_password_file();
    test_hide();
    return done_testing();
}
