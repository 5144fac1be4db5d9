/*
 * etcd helpers that need no server (backends/etcd_json.c): base64 of keys
 * and values, int64s as the gateway writes them; and the URIs the etcd
 * backend refuses before it contacts anything, or cannot reach.
 */
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include "backends/etcd_json.h"
#include "dlock.h"
#include "tests/tap.h"

static void test_base64(void)
{
    unsigned char in[64], out[80];
    int bad = 0;
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (unsigned char)(i * 37 + 11);
    for (size_t len = 0; len <= sizeof in; len++) {
        json_object *s = etcd_new_bytes(in, len);
        size_t got = sizeof out;
        if (!s || (size_t)json_object_get_string_len(s) != (len + 2) / 3 * 4 ||
            etcd_bytes(s, out, &got) != 0 || got != len || memcmp(in, out, len) != 0)
            bad++;
        json_object_put(s);
    }
    is_int(bad, 0, "base64 round trip of 0..64 bytes, every byte value pattern");

    json_object *s = json_object_new_string("ZGxvY2svYS94");
    size_t got = sizeof out;
    ok(etcd_bytes(s, out, &got) == 0 && got == 9 && memcmp(out, "dlock/a/x", 9) == 0,
       "decodes what etcd sent (dlock/a/x)");
    got = 4;
    is_int(etcd_bytes(s, out, &got), -1, "no room: refused, not overrun");
    json_object_put(s);
    s = json_object_new_string("ab$d");
    got = sizeof out;
    is_int(etcd_bytes(s, out, &got), -1, "a byte outside base64: refused");
    json_object_put(s);
    s = json_object_new_int(3);
    is_int(etcd_bytes(s, out, &got), -1, "not a string: refused");
    json_object_put(s);
    is_int(etcd_bytes(NULL, out, &got), -1, "absent: refused");
}

static void test_ints(void)
{
    json_object *o = json_tokener_parse(
        "{\"revision\":\"9223372036854775807\",\"n\":42,\"s\":\"17\",\"x\":{\"y\":\"5\"}}");
    ok(o != NULL, "a reply parses");
    ok(etcd_int(o, "revision") == INT64_MAX, "an int64 written as a string, to its largest");
    is_int((int)etcd_int(o, "n"), 42, "a number");
    is_int((int)etcd_int(o, "s"), 17, "a small string");
    is_int((int)etcd_int(o, "missing"), 0, "absent: 0");
    is_int((int)etcd_int(etcd_get(o, "x"), "y"), 5, "nested");
    ok(etcd_get(etcd_get(o, "n"), "y") == NULL, "a member of a number: none");
    json_object *req = json_object_new_object();
    json_object_object_add(req, "key", etcd_new_bytes("a/b", 3));
    json_object_object_add(req, "range_end", NULL); /* what a failed allocation leaves */
    ok(!etcd_body_ok(json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN)),
       "a request with a null is never sent: %s",
       json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
    json_object_object_del(req, "range_end");
    ok(etcd_body_ok(json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN)),
       "a whole one is: %s", json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
    ok(!etcd_body_ok("[null]") && !etcd_body_ok("[1,null]") && !etcd_body_ok(NULL),
       "nulls in arrays, and no body, are refused");
    json_object_put(req);
    json_object *v = etcd_new_int(-42);
    is_str(json_object_get_string(v), "-42", "an int64 goes out as a string");
    json_object_put(v);
    json_object_put(o);
}

static int open_rc(const char *uri, char *msg, size_t len)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(uri, &c);
    snprintf(msg, len, "%s", dlock_errmsg(c));
    dlock_client_close(c);
    return rc;
}

static void test_uris(void)
{
    char msg[DLOCK_ERRMSG_MAX];
    is_int(open_rc("etcd:///dlock", msg, sizeof msg), DLOCK_EBADURI, "no endpoint: %s", msg);
    is_int(open_rc("etcd://:pw-only-secret@127.0.0.1:1/x", msg, sizeof msg), DLOCK_EBADURI,
           "a password without a user: %s", msg);
    ok(!strstr(msg, "pw-only-secret"), "the message hides the password");
    is_int(open_rc("etcd://127.0.0.1:1/x?cert=/nonexistent.pem", msg, sizeof msg), DLOCK_EBADURI,
           "cert= without key=: %s", msg);
    is_int(open_rc("etcd://127.0.0.1:1/x?tls=maybe", msg, sizeof msg), DLOCK_EBADURI,
           "tls=maybe: %s", msg);
    ok(strstr(msg, "tls") != NULL, "the message names the option");
    is_int(open_rc("etcd://127.0.0.1:1/x?timeout=0", msg, sizeof msg), DLOCK_EBADURI,
           "timeout=0: %s", msg);
    is_int(open_rc("etcd://127.0.0.1:1/x?cacert=", msg, sizeof msg), DLOCK_EBADURI,
           "an empty cacert=: %s", msg);
    is_int(open_rc("etcd://127.0.0.1:1/x?lease=5", msg, sizeof msg), DLOCK_EBADURI,
           "an unknown option: %s", msg);
    is_int(open_rc("etcd://127.0.0.1:1/x?layout=nonsense", msg, sizeof msg), DLOCK_EBADURI,
           "layout=nonsense: %s", msg);
    ok(strstr(msg, "dlock") && strstr(msg, "etcd3"), "the message lists the layouts");
    is_int(open_rc("etcd://127.0.0.1:1/x?layout=ETCD3", msg, sizeof msg), DLOCK_EBADURI,
           "layout=ETCD3 (a case that differs): %s", msg);
    /* A good layout passes the parse: the closed port is what fails. */
    is_int(open_rc("etcd://127.0.0.1:1/x?layout=etcd3&connect_timeout=200", msg, sizeof msg),
           DLOCK_ECONNECT, "layout=etcd3 is accepted: %s", msg);

    /* A closed port on every endpoint: DLOCK_ECONNECT at once, naming them. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    char uri[128];
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0) {
        ok(0, "cannot find a free port");
        return;
    }
    unsigned port = ntohs(a.sin_port);
    close(fd); /* bound, never listened: now closed */
    snprintf(uri, sizeof uri, "etcd://dlock:a-secret-pw@127.0.0.1:%u,[::1]:%u/x", port, port);
    is_int(open_rc(uri, msg, sizeof msg), DLOCK_ECONNECT, "closed ports: %s", msg);
    ok(strstr(msg, "127.0.0.1") && strstr(msg, "[::1]"), "the message names the endpoints");
    ok(!strstr(msg, "a-secret-pw"), "and hides the password");
}

int main(void)
{
    test_base64();
    test_ints();
    test_uris();
    return done_testing();
}
