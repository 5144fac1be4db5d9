/* Elections: how soon an observer hears of a change (a proclaim), one
 * change at a time. The election handoff is bench_solo.c's ping-pong with
 * leadership. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_int.h"

typedef struct notice {
    atomic_size_t heard; /* the last value number heard */
    atomic_uint_fast64_t at;
} notice;

/* Values are "v<k>": the callback records the k it heard, and when. */
static void on_change(dlock_observer *ob, const dlock_leader_info *li, void *user)
{
    notice *n = user;
    (void)ob;
    if (li->held && li->value_len > 1 && li->value[0] == 'v') {
        atomic_store(&n->at, bench_now());
        atomic_store(&n->heard, (size_t)strtoull(li->value + 1, NULL, 10));
    }
}

int bench_run_observe(const char *uri, const char *name, const bench_opts *o, bench_stats *out,
                      bench_ctx *ctx)
{
    dlock_client *c[1] = { NULL };
    dlock_observer *ob = NULL;
    dlock_lock *lead = NULL;
    notice n;
    bench_samples s;
    char v[32];
    int rc;

    atomic_init(&n.heard, 0);
    atomic_init(&n.at, 0);
    if ((rc = bench_samples_init(&s, o->handoffs)) != 0) {
        bench_ctx_fail(ctx, rc, NULL, "observer samples");
        return rc;
    }
    if ((rc = bench_open_clients(uri, c, 1, ctx)) != 0)
        goto out;
    dlock_acquire_opts opts = DLOCK_ACQUIRE_OPTS_INIT;
    opts.wait = DLOCK_WAIT_DEADLINE;
    opts.deadline_ns = bench_now() + BENCH_WAIT_NS;
    if ((rc = dlock_campaign(c[0], name, "v0", 2, &opts, &lead)) != 0) {
        bench_ctx_fail(ctx, rc, c[0], "observer: campaign");
        goto out;
    }
    if ((rc = dlock_observe(c[0], name, on_change, &n, &ob)) != 0) {
        bench_ctx_fail(ctx, rc, c[0], "observer: observe");
        goto out;
    }
    uint64_t cap = bench_now() + BENCH_PHASE_CAP_NS;
    for (size_t k = 1; k <= o->handoffs && bench_now() < cap && !bench_stopped(ctx); k++) {
        int len = snprintf(v, sizeof v, "v%zu", k);
        uint64_t t0 = bench_now();
        if ((rc = dlock_proclaim(lead, v, (size_t)len)) != 0) {
            bench_ctx_fail(ctx, rc, c[0], "observer: proclaim");
            break;
        }
        if (bench_wait_value(ctx, &n.heard, k, "observer: a proclaim was not reported")) {
            rc = ctx->err;
            break;
        }
        bench_samples_add(&s, atomic_load(&n.at) - t0);
    }
out:
    dlock_observer_close(ob);
    if (lead)
        dlock_resign(lead);
    bench_close_clients(c, 1);
    bench_samples_stats(&s, out);
    bench_samples_free(&s);
    return ctx->err;
}
