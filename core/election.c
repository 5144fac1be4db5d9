/*
 * Leader election on the lock (dlock.h "Leader election"): a leader is the
 * holder of the election's exclusive lock, kept by the keeper; its term is
 * the grant's token; its value is what it published through the backend's
 * publish(). Everything here goes through the lock's own methods, so lists
 * of stores elect as they lock (core/composite.c forwards publish, leader
 * and wake). Observers live in core/observer.c.
 */
#include <string.h>

#include "core/internal.h"

static int check_value(dlock_client *c, const void *value, size_t len)
{
    if (len > DLOCK_VALUE_MAX)
        return dlock_seterr(c, DLOCK_EINVAL, "a leader's value is %zu bytes: at most %d", len,
                            DLOCK_VALUE_MAX);
    if (len && !value)
        return dlock_seterr(c, DLOCK_EINVAL, "no value for a length of %zu bytes", len);
    return 0;
}

static int check_elections(dlock_client *c)
{
    if (dlock_client_caps(c) & DLOCK_CAP_ELECTION)
        return 0;
    const char *layout = c->uri ? dlock_uri_param(c->uri, "layout") : NULL;
    int peer = layout && strcmp(layout, "dlock") != 0;
    return dlock_seterr(c, DLOCK_ENOTSUP, "the %s backend has no elections%s%.32s",
                        c->backend->name, peer ? " in layout=" : "", peer ? layout : "");
}

/* Publishes on the lock's store(s), between the keeper's calls on it. */
static int publish(dlock_lock *lock, const void *value, size_t len)
{
    dlock_client *c = lock->client;
    if (atomic_load(&lock->lost)) /* never act on a grant reported lost */
        return dlock_report_lost(c, dlock_keeper_lost_detail(lock));
    dlock_keeper_hold(lock);
    int rc = dlock_finish(c, dlock_lock_ops(lock)->publish(c->conn, lock->held, value, len));
    dlock_keeper_unhold_call(lock, rc);
    return rc;
}

/* The caller's options, as far as their version goes, over the defaults. */
static void copy_opts(dlock_acquire_opts *o, const dlock_acquire_opts *from)
{
    dlock_acquire_opts_init_version(o, DLOCK_ACQUIRE_OPTS_VERSION);
    if (!from)
        return;
    o->ttl_ms = from->ttl_ms;
    o->wait = from->wait;
    o->deadline_ns = from->deadline_ns;
    if (from->version >= 2) {
        o->on_lost = from->on_lost;
        o->on_lost_user = from->on_lost_user;
        o->reentrant = from->reentrant;
    }
    if (from->version >= 3)
        o->cancel = from->cancel;
    if (from->version >= 4) {
        o->mode = from->mode;
        o->limit = from->limit;
    }
}

int dlock_campaign(dlock_client *c, const char *name, const void *value, size_t len,
                   const dlock_acquire_opts *opts, dlock_lock **lockp)
{
    dlock_acquire_opts o;
    dlock_lock *lock;
    int rc;
    if (!c || !lockp || dlock_not_on_keeper())
        return c && lockp && !dlock_keeper_on_thread()
                   ? dlock_seterr(c, DLOCK_EINVAL, "no place to store the leadership")
                   : DLOCK_EINVAL;
    *lockp = NULL;
    if ((rc = dlock_check_usable(c)) != 0 || (rc = check_value(c, value, len)) != 0 ||
        (rc = check_elections(c)) != 0)
        return rc;
    if (opts && (opts->version == 0 || opts->version > DLOCK_ACQUIRE_OPTS_VERSION))
        return dlock_seterr(c, DLOCK_EINVAL,
                            "acquire options version %u is not supported (use DLOCK_ACQUIRE_OPTS_INIT)",
                            opts->version);
    copy_opts(&o, opts);
    if (o.reentrant || o.mode != DLOCK_MODE_EXCLUSIVE || o.limit)
        return dlock_seterr(c, DLOCK_EINVAL, "an election has one leader: exclusive, with no "
                                             "limit, not reentrant");
    o.keep = 1; /* leadership is kept, and its loss reported */
    if ((rc = dlock_acquire(c, name, &o, &lock)) != 0)
        return rc;
    lock->elected = 1;
    if ((rc = publish(lock, value, len)) != 0) {
        dlock_errsave e;
        dlock_err_save(c, &e);
        dlock_release(lock);
        dlock_err_restore(c, &e);
        return rc;
    }
    *lockp = lock;
    return 0;
}

int dlock_proclaim(dlock_lock *lock, const void *value, size_t len)
{
    int rc;
    if (!lock || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    dlock_client *c = lock->client;
    dlock_clearerr(c);
    if (!lock->elected)
        return dlock_seterr(c, DLOCK_EINVAL, "the lock was not won in an election "
                                             "(dlock_campaign())");
    if ((rc = check_value(c, value, len)) != 0)
        return rc;
    return publish(lock, value, len);
}

int dlock_resign(dlock_lock *lock)
{
    /* The release wakes the election's observers (core/client.c). */
    return dlock_release(lock);
}

int dlock_leader_read(dlock_client *c, const char *name, size_t len, dlock_leader_info *out)
{
    dlock_info info;
    int rc;
    memset(out, 0, sizeof *out);
    out->version = DLOCK_LEADER_VERSION;
    if ((rc = dlock_check_name(c, name, len)) != 0 || (rc = check_elections(c)) != 0)
        return rc;
    memset(&info, 0, sizeof info);
    info.version = DLOCK_INFO_VERSION;
    size_t vlen = 0;
    rc = c->backend->leader(c->conn, name, len, &info, out->value, &vlen);
    if (rc) {
        memset(out->value, 0, sizeof out->value);
        return dlock_finish(c, rc);
    }
    out->known = info.known;
    out->held = info.held;
    out->term = info.held ? info.token : 0;
    out->lease_ms = info.held ? info.lease_ms : 0;
    memcpy(out->owner, info.owner, sizeof out->owner);
    out->value_len = info.held && vlen <= DLOCK_VALUE_MAX ? vlen : 0;
    out->value[out->value_len] = '\0';
    return 0;
}

int dlock_leader(dlock_client *c, const char *name, dlock_leader_info *info)
{
    int rc;
    if (!c || dlock_not_on_keeper())
        return DLOCK_EINVAL;
    if ((rc = dlock_check_usable(c)) != 0)
        return rc;
    if (!info)
        return dlock_seterr(c, DLOCK_EINVAL, "no place to store the leader");
    return dlock_leader_read(c, name, name ? strnlen(name, DLOCK_NAME_MAX + 1) : 0, info);
}
