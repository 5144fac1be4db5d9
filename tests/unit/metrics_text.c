/*
 * Prints a client's metrics in the Prometheus text format after a known
 * series of calls on a file:// store in argv[1] (a fresh directory):
 * 3 granted (one of them of two names), 1 busy, 1 timed out, 1 failed
 * (DLOCK_EALREADY is refused before the store; a bad store is not: see
 * below), 3 releases, 1 renewal. tests/unit/test_metrics.py parses it with
 * the Prometheus client library's parser and checks the values.
 * argv[2], optional: the labels to add.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"

static void die(const char *what, dlock_client *c)
{
    fprintf(stderr, "metrics_text: %s: %s\n", what, dlock_errmsg(c));
    exit(1);
}

int main(int argc, char **argv)
{
    char uri[1024];
    dlock_client *c = NULL, *d = NULL;
    dlock_lock *a = NULL, *b = NULL, *x = NULL;
    if (argc < 2)
        return 64;
    snprintf(uri, sizeof uri, "file://%s", argv[1]);
    if (dlock_client_open(uri, &c) || dlock_client_open(uri, &d))
        die("open", c);
    dlock_acquire_opts o = DLOCK_ACQUIRE_OPTS_INIT;
    if (dlock_acquire(c, "m-a", &o, &a))
        die("acquire m-a", c);
    const char *two[2] = {"m-b", "m-c"};
    if (dlock_acquire_names(c, two, 2, &o, &b))
        die("acquire {m-b, m-c}", c);
    o.wait = DLOCK_WAIT_TRY;
    if (dlock_acquire(d, "m-a", &o, &x) != DLOCK_EBUSY)
        die("a try on a held lock is not busy", d);
    o.wait = DLOCK_WAIT_DEADLINE;
    o.deadline_ns = dlock_monotonic_ns() + 20000000;
    if (dlock_acquire(d, "m-b", &o, &x) != DLOCK_ETIMEDOUT)
        die("a 20 ms wait on a held lock did not time out", d);
    if (dlock_renew(a, 1000))
        die("renew", c);
    if (dlock_release(a) || dlock_release(b))
        die("release", c);
    o = (dlock_acquire_opts)DLOCK_ACQUIRE_OPTS_INIT;
    if (dlock_acquire(d, "m-a", &o, &x) || dlock_release(x))
        die("acquire m-a on the second client", d);
    dlock_metrics mc, md, sum;
    dlock_client_metrics(c, &mc);
    dlock_client_metrics(d, &md);
    /* One text for both clients: the sum. */
    sum = mc;
    sum.granted += md.granted, sum.busy += md.busy, sum.timed_out += md.timed_out;
    sum.failed += md.failed, sum.releases += md.releases, sum.renewals += md.renewals;
    sum.wait.count += md.wait.count, sum.wait.sum_ns += md.wait.sum_ns;
    sum.hold.count += md.hold.count, sum.hold.sum_ns += md.hold.sum_ns;
    for (int k = 0; k < DLOCK_METRICS_BUCKETS; k++)
        sum.wait.le[k] += md.wait.le[k], sum.hold.le[k] += md.hold.le[k];
    const char *labels = argc > 2 ? argv[2] : NULL;
    int n = dlock_metrics_format(&sum, labels, NULL, 0);
    if (n < 0)
        die("format", c);
    char *text = malloc((size_t)n + 1);
    if (!text || dlock_metrics_format(&sum, labels, text, (size_t)n + 1) != n)
        die("format again", c);
    fputs(text, stdout);
    free(text);
    dlock_client_close(c);
    dlock_client_close(d);
    return 0;
}
