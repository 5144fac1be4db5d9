/*
 * Per-client metrics: relaxed atomic counters bumped on the calls' own
 * paths (the application's thread and the keeper's), and their rendering
 * in the Prometheus text exposition format. Nothing here allocates or
 * takes a lock.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

static void add(_Atomic uint64_t *v, uint64_t n)
{
    atomic_fetch_add_explicit(v, n, memory_order_relaxed);
}

static uint64_t get(const _Atomic uint64_t *v)
{
    return atomic_load_explicit((_Atomic uint64_t *)v, memory_order_relaxed);
}

/* Bucket k holds observations of at most 2^k us (above the last: none). */
static void observe(struct dlock_hist *h, uint64_t ns)
{
    uint64_t us = (ns + 999) / 1000;
    unsigned k = us <= 1 ? 0 : 64u - (unsigned)__builtin_clzll(us - 1);
    add(&h->count, 1);
    add(&h->sum_ns, ns);
    if (k < DLOCK_METRICS_BUCKETS)
        add(&h->bucket[k], 1);
}

void dlock_metrics_acquire(dlock_client *c, int rc, uint64_t took_ns)
{
    struct dlock_counters *m = &c->metrics;
    if (rc == 0)
        add(&m->granted, 1);
    else if (rc == DLOCK_EBUSY)
        add(&m->busy, 1);
    else if (rc == DLOCK_ETIMEDOUT)
        add(&m->timed_out, 1);
    else {
        add(&m->failed, 1);
        if (rc < 0 && -rc < DLOCK_METRICS_ERRORS)
            add(&m->errors[-rc], 1);
    }
    observe(&m->wait, took_ns);
}

void dlock_metrics_release(dlock_client *c, int rc, uint64_t held_ns)
{
    /* Two counters, each only growing: "ok" as a difference could go back
     * between a reader's two loads. */
    add(rc == DLOCK_ELOST ? &c->metrics.releases_lost : &c->metrics.releases_ok, 1);
    observe(&c->metrics.hold, held_ns);
}

void dlock_metrics_renewal(dlock_client *c, int rc)
{
    add(rc == 0 ? &c->metrics.renewals : &c->metrics.renewal_failures, 1);
}

void dlock_metrics_loss(dlock_client *c)
{
    add(&c->metrics.losses, 1);
}

void dlock_count_reconnect(dlock_client *c)
{
    if (c)
        add(&c->metrics.reconnects, 1);
}

static void snap_hist(const struct dlock_hist *h, dlock_histogram *out)
{
    uint64_t run = 0;
    out->count = get(&h->count);
    out->sum_ns = get(&h->sum_ns);
    for (int k = 0; k < DLOCK_METRICS_BUCKETS; k++) {
        run += get(&h->bucket[k]);
        out->le[k] = run;
    }
    /* Read at different instants: keep the snapshot self-consistent. */
    if (out->count < run)
        out->count = run;
}

int dlock_client_metrics(const dlock_client *c, dlock_metrics *m)
{
    if (!c || !m)
        return DLOCK_EINVAL;
    const struct dlock_counters *s = &c->metrics;
    memset(m, 0, sizeof *m);
    m->version = DLOCK_METRICS_VERSION;
    m->granted = get(&s->granted);
    m->busy = get(&s->busy);
    m->timed_out = get(&s->timed_out);
    m->failed = get(&s->failed);
    for (int i = 0; i < DLOCK_METRICS_ERRORS; i++)
        m->errors[i] = get(&s->errors[i]);
    m->releases_lost = get(&s->releases_lost);
    m->releases = get(&s->releases_ok) + m->releases_lost;
    m->renewals = get(&s->renewals);
    m->renewal_failures = get(&s->renewal_failures);
    m->losses = get(&s->losses);
    m->reconnects = get(&s->reconnects);
    snap_hist(&s->wait, &m->wait);
    snap_hist(&s->hold, &m->hold);
    return 0;
}

/* The text written so far, snprintf-style: out is never overrun, and the
 * length is counted past its end. */
struct text {
    char *buf;
    size_t len, used;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->used < t->len ? t->len - t->used : 0;
    int n = vsnprintf(room ? t->buf + t->used : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->used += (size_t)n;
}

/* A label name the text already uses, or that Prometheus reserves. */
static int label_taken(const char *name, size_t len, const char *all, const char *upto)
{
    static const char *const ours[] = {"le", "result", "code"};
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
        if (strlen(ours[i]) == len && memcmp(ours[i], name, len) == 0)
            return 1;
    if (len >= 2 && name[0] == '_' && name[1] == '_')
        return 1;
    /* The same name earlier in the list. */
    for (const char *p = all; p < upto;) {
        size_t n = strcspn(p, "=");
        if (n == len && memcmp(p, name, len) == 0)
            return 1;
        p += n + 2; /* past =" */
        while (*p && *p != '"')
            p += *p == '\\' ? 2 : 1;
        p += *p ? 1 : 0;
        p += *p == ',' ? 1 : 0;
    }
    return 0;
}

/* name="value"[,name="value"...]: what may go between the braces, with no
 * name twice and none of those the text adds itself (le, result, code) or
 * Prometheus reserves (__*). */
static int labels_ok(const char *s)
{
    const char *p = s;
    if (!*p)
        return 1;
    for (;;) {
        const char *name = p;
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_'))
            return 0;
        while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
               *p == '_')
            p++;
        if (label_taken(name, (size_t)(p - name), s, name))
            return 0;
        if (*p++ != '=' || *p++ != '"')
            return 0;
        while (*p && *p != '"' && *p != '\n') {
            if (*p == '\\' && (p[1] == '\\' || p[1] == '"' || p[1] == 'n'))
                p++;
            else if (*p == '\\')
                return 0;
            p++;
        }
        if (*p++ != '"')
            return 0;
        if (!*p)
            return 1;
        if (*p++ != ',')
            return 0;
    }
}

/* One sample: name{labels,extra} value. */
static void sample(struct text *t, const char *name, const char *labels, const char *extra,
                   uint64_t v)
{
    const char *sep = labels[0] && extra[0] ? "," : "";
    if (labels[0] || extra[0])
        put(t, "%s{%s%s%s} %llu\n", name, labels, sep, extra, (unsigned long long)v);
    else
        put(t, "%s %llu\n", name, (unsigned long long)v);
}

static void help(struct text *t, const char *name, const char *type, const char *text)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

static void histogram(struct text *t, const char *name, const char *text, const char *labels,
                      const dlock_histogram *h)
{
    char extra[48], full[96];
    help(t, name, "histogram", text);
    snprintf(full, sizeof full, "%s_bucket", name);
    for (int k = 0; k < DLOCK_METRICS_BUCKETS; k++) {
        /* 2^k us in seconds, exactly (at most 8 significant digits). */
        snprintf(extra, sizeof extra, "le=\"%.9g\"", (double)(1ull << k) / 1e6);
        sample(t, full, labels, extra, h->le[k]);
    }
    sample(t, full, labels, "le=\"+Inf\"", h->count);
    const char *sep = labels[0] ? "{" : "", *end = labels[0] ? "}" : "";
    put(t, "%s_sum%s%s%s %.9f\n", name, sep, labels, end, (double)h->sum_ns / 1e9);
    snprintf(full, sizeof full, "%s_count", name);
    sample(t, full, labels, "", h->count);
}

int dlock_metrics_format(const dlock_metrics *m, const char *labels, char *buf, size_t len)
{
    struct text t = {buf, len, 0};
    char extra[64];
    if (!m || (labels && !labels_ok(labels)))
        return DLOCK_EINVAL;
    if (!labels)
        labels = "";
    if (len)
        buf[0] = '\0';
    help(&t, "dlock_acquires_total", "counter",
         "Acquires that reached the store, by result (granted, busy, timed_out, failed).");
    sample(&t, "dlock_acquires_total", labels, "result=\"granted\"", m->granted);
    sample(&t, "dlock_acquires_total", labels, "result=\"busy\"", m->busy);
    sample(&t, "dlock_acquires_total", labels, "result=\"timed_out\"", m->timed_out);
    sample(&t, "dlock_acquires_total", labels, "result=\"failed\"", m->failed);
    help(&t, "dlock_acquire_errors_total", "counter", "Failed acquires, by error code.");
    for (int i = 1; i < DLOCK_METRICS_ERRORS; i++)
        if (m->errors[i]) {
            snprintf(extra, sizeof extra, "code=\"%s\"", dlock_err_name(-i));
            sample(&t, "dlock_acquire_errors_total", labels, extra, m->errors[i]);
        }
    help(&t, "dlock_releases_total", "counter",
         "Locks released in the store, by result (ok, lost: no longer ours).");
    sample(&t, "dlock_releases_total", labels, "result=\"ok\"",
           m->releases >= m->releases_lost ? m->releases - m->releases_lost : 0);
    sample(&t, "dlock_releases_total", labels, "result=\"lost\"", m->releases_lost);
    help(&t, "dlock_renewals_total", "counter",
         "Lease renewals (dlock_renew and the keeper's), by result.");
    sample(&t, "dlock_renewals_total", labels, "result=\"ok\"", m->renewals);
    sample(&t, "dlock_renewals_total", labels, "result=\"failed\"", m->renewal_failures);
    help(&t, "dlock_losses_total", "counter", "Kept locks the keeper reported lost.");
    sample(&t, "dlock_losses_total", labels, "", m->losses);
    help(&t, "dlock_reconnects_total", "counter",
         "Connections to the store opened again after one broke.");
    sample(&t, "dlock_reconnects_total", labels, "", m->reconnects);
    histogram(&t, "dlock_acquire_seconds", "How long acquires took (waiting included).", labels,
              &m->wait);
    histogram(&t, "dlock_hold_seconds", "How long locks were held (grant to release).", labels,
              &m->hold);
    return t.used > (size_t)INT32_MAX ? DLOCK_EINVAL : (int)t.used;
}
