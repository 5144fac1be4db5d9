/*
 * Redis Cluster and Sentinel helpers that need no server: the slot of a
 * name and the hash tag of each slot (backends/redis_cluster.c), and the
 * replies that steer a cluster or Sentinel client (backends/redis_reply.c),
 * built with hiredis's own reader from the bytes a server sends.
 */
#include <hiredis/hiredis.h>
#include <string.h>

#include "backends/redis_conn.h"
#include "backends/redis_reply.h"
#include "tests/tap.h"

/* The reply hiredis reads from raw (NULL if it is not one whole reply). */
static redisReply *parse(const char *raw)
{
    redisReader *rd = redisReaderCreate();
    void *r = NULL;
    redisReaderFeed(rd, raw, strlen(raw));
    if (redisReaderGetReply(rd, &r) != REDIS_OK)
        r = NULL;
    redisReaderFree(rd);
    return r;
}

static int redirect(const char *raw, struct redis_redirect *d)
{
    redisReply *r = parse(raw);
    int kind = dlock_redis_reply_redirect(r, d);
    freeReplyObject(r);
    return kind;
}

struct ranges {
    int n;
    unsigned first[4], last[4];
    char host[4][32];
    int port[4];
};

static int add_range(void *arg, unsigned first, unsigned last, const char *host, size_t len,
                     int port)
{
    struct ranges *g = arg;
    if (g->n >= 4)
        return -1;
    g->first[g->n] = first, g->last[g->n] = last, g->port[g->n] = port;
    snprintf(g->host[g->n], sizeof g->host[0], "%.*s", (int)len, host);
    g->n++;
    return 0;
}

int main(void)
{
    /* CLUSTER KEYSLOT on a Redis 7.0 server gives these. */
    is_int(dlock_redis_slot("foo", 3), 12182, "slot of \"foo\"");
    is_int(dlock_redis_slot("somekey", 7), 11058, "slot of \"somekey\"");
    is_int(dlock_redis_slot("123456789", 9), 12739, "slot of \"123456789\" (CRC16 0x31C3)");
    is_int(dlock_redis_slot("", 0), 0, "slot of the empty string");

    unsigned bad = 0;
    size_t longest = 0;
    for (unsigned s = 0; s < REDIS_SLOTS; s++) {
        const char *t = dlock_redis_slot_tag(s);
        size_t len = strlen(t);
        if (len == 0 || strpbrk(t, "{}") || dlock_redis_slot(t, len) != s)
            bad++;
        if (len > longest)
            longest = len;
    }
    is_int(bad, 0, "every slot has a tag whose own slot it is, without braces");
    ok(longest <= 4, "tags are at most 4 characters (longest: %zu)", longest);

    struct redis_redirect d;
    is_int(redirect("-MOVED 3999 127.0.0.1:6381\r\n", &d), REDIS_REDIR_MOVED, "MOVED parsed");
    ok(d.slot == 3999 && strcmp(d.host, "127.0.0.1") == 0 && d.port == 6381,
       "MOVED: slot %u, %s:%d", d.slot, d.host, d.port);
    is_int(redirect("-ASK 12182 ::1:7002\r\n", &d), REDIS_REDIR_ASK, "ASK parsed");
    ok(d.slot == 12182 && strcmp(d.host, "::1") == 0 && d.port == 7002,
       "ASK to an IPv6 host: the last ':' ends the host (%s:%d)", d.host, d.port);
    is_int(redirect("-MOVED 7 :7000\r\n", &d), REDIS_REDIR_MOVED, "MOVED with no host");
    ok(d.host[0] == '\0' && d.port == 7000, "MOVED with no host: the node asked, port 7000");
    is_int(redirect("-TRYAGAIN Multiple keys request during rehashing of slot\r\n", &d),
           REDIS_REDIR_TRYAGAIN, "TRYAGAIN");
    is_int(redirect("-CLUSTERDOWN The cluster is down\r\n", &d), REDIS_REDIR_DOWN,
           "CLUSTERDOWN");
    is_int(redirect("-MOVED 16384 127.0.0.1:6381\r\n", &d), REDIS_REDIR_NONE,
           "MOVED to slot 16384: not a direction");
    is_int(redirect("-MOVED 1 127.0.0.1:0\r\n", &d), REDIS_REDIR_NONE, "MOVED to port 0: not one");
    is_int(redirect("-MOVED 1 127.0.0.1:65536\r\n", &d), REDIS_REDIR_NONE,
           "MOVED to port 65536: not one");
    is_int(redirect("-MOVED 1 127.0.0.1\r\n", &d), REDIS_REDIR_NONE, "MOVED without a port");
    is_int(redirect("-MOVED x 127.0.0.1:1\r\n", &d), REDIS_REDIR_NONE, "MOVED without a slot");
    is_int(redirect("-ERR MOVED 1 h:1\r\n", &d), REDIS_REDIR_NONE, "another error");
    is_int(redirect("+MOVED 1 h:1\r\n", &d), REDIS_REDIR_NONE, "a status, not an error");

    redisReply *r = parse("-READONLY You can't write against a read only replica.\r\n");
    is_int(dlock_redis_reply_error_kind(r), DLOCK_REDIS_ERR_READONLY, "READONLY");
    freeReplyObject(r);

    struct ranges g = {0};
    r = parse("*3\r\n"
              "*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n"
              "*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$2\r\nid\r\n"
              "*3\r\n:5461\r\n:10922\r\n*2\r\n$0\r\n\r\n:7001\r\n"
              "*3\r\n:10923\r\n:20000\r\n*2\r\n$1\r\nh\r\n:7002\r\n");
    is_int(dlock_redis_reply_slots(r, add_range, &g), 0, "CLUSTER SLOTS parsed");
    freeReplyObject(r);
    is_int(g.n, 2, "two well-formed ranges (one past slot 16383 skipped)");
    ok(g.first[0] == 0 && g.last[0] == 5460 && strcmp(g.host[0], "127.0.0.1") == 0 &&
           g.port[0] == 7000,
       "first range: the primary, not its replica");
    ok(g.first[1] == 5461 && g.last[1] == 10922 && g.host[1][0] == '\0' && g.port[1] == 7001,
       "second range: a node that does not know its host");
    g.n = 0;
    r = parse("*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n_\r\n:7000\r\n$2\r\nid\r\n");
    if (!r) /* hiredis 0.14 reads RESP2 only: nil as a null bulk string */
        r = parse("*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$-1\r\n:7000\r\n$2\r\nid\r\n");
    is_int(dlock_redis_reply_slots(r, add_range, &g), 0, "CLUSTER SLOTS with a nil endpoint");
    freeReplyObject(r);
    ok(g.n == 1 && g.host[0][0] == '\0' && g.port[0] == 7000,
       "a nil endpoint is the node asked (unknown-endpoint)");
    r = parse("-ERR This instance has cluster support disabled\r\n");
    is_int(dlock_redis_reply_slots(r, add_range, &g), -1, "an error is no map");
    freeReplyObject(r);

    char host[64];
    int port = 0;
    r = parse("*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6380\r\n");
    ok(dlock_redis_reply_addr(r, host, sizeof host, &port) == 0 &&
           strcmp(host, "127.0.0.1") == 0 && port == 6380,
       "the sentinels' primary: 127.0.0.1:6380");
    freeReplyObject(r);
    r = parse("*-1\r\n");
    is_int(dlock_redis_reply_addr(r, host, sizeof host, &port), -1,
           "nil: the sentinel does not know the service");
    freeReplyObject(r);
    r = parse("*2\r\n$9\r\n127.0.0.1\r\n$5\r\n99999\r\n");
    is_int(dlock_redis_reply_addr(r, host, sizeof host, &port), -1, "port 99999 refused");
    freeReplyObject(r);

    r = parse("*3\r\n$6\r\nmaster\r\n:3129659\r\n*0\r\n");
    ok(dlock_redis_reply_is_primary(r), "ROLE: master");
    freeReplyObject(r);
    r = parse("*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:6379\r\n$9\r\nconnected\r\n:1\r\n");
    ok(!dlock_redis_reply_is_primary(r), "ROLE: a replica is not the primary");
    freeReplyObject(r);

    /* COMMAND INFO SSUBSCRIBE: what Redis 6 (nil) and 7.0 (the command's
     * description, cut short here) answer, and an ACL's refusal. */
    r = parse("*1\r\n$-1\r\n");
    is_int(dlock_redis_reply_command_known(r), 0, "COMMAND INFO: nil, not known");
    freeReplyObject(r);
    r = parse("*1\r\n*2\r\n$10\r\nssubscribe\r\n:-2\r\n");
    is_int(dlock_redis_reply_command_known(r), 1, "COMMAND INFO: known");
    freeReplyObject(r);
    r = parse("-NOPERM this user has no permissions to run the 'command|info' command\r\n");
    is_int(dlock_redis_reply_command_known(r), -1, "COMMAND INFO denied: cannot tell");
    freeReplyObject(r);
    r = parse("*0\r\n");
    is_int(dlock_redis_reply_command_known(r), -1, "COMMAND INFO: an empty array does not say");
    freeReplyObject(r);

    const char *chan = "dlock:{x}w:0123";
    r = parse("*3\r\n$12\r\nsunsubscribe\r\n$15\r\ndlock:{x}w:0123\r\n:0\r\n");
    ok(dlock_redis_reply_unsubscribed(r, chan, strlen(chan)),
       "an unsolicited sunsubscribe of our channel");
    ok(!dlock_redis_reply_unsubscribed(r, "other", 5), "...of another channel: not ours");
    freeReplyObject(r);
    r = parse("*3\r\n$10\r\nssubscribe\r\n$15\r\ndlock:{x}w:0123\r\n:1\r\n");
    ok(dlock_redis_reply_subscribed(r, chan, strlen(chan)), "ssubscribe confirms");
    freeReplyObject(r);
    r = parse("*3\r\n$8\r\nsmessage\r\n$15\r\ndlock:{x}w:0123\r\n$3\r\nabc\r\n");
    ok(dlock_redis_reply_message(r, chan, strlen(chan)), "smessage is a message");
    freeReplyObject(r);
    return done_testing();
}
