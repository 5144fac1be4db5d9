/*
 * dlock migrate OLD NEW [NAME...]: prepares NEW to take over locks from OLD.
 * First every name at once: NEW's token floor is raised to the highest
 * token OLD has granted (migrate_floor). Then each NAME given is acquired once on the list "OLD NEW" (in OLD, then in NEW,
 * waiting its turn behind the current holders) and released at once: the
 * list's grant raises NEW's counter for the name to the largest token
 * either store has granted, so that every later grant by NEW alone is above
 * everything OLD granted. Safe to repeat; a name nobody holds costs one
 * acquire and release in each store.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/store_uri.h"
#include "dlock.h"

#define MIGRATE_WAIT_DEFAULT_S 10.0

/* The name being migrated, printable, for messages. */
static char shown_name[SHOWN_MAX + 4];

/* Whether a and b are the same store as written, passwords aside. */
static int same_store(const char *a, const char *b)
{
    char *ca = dlock_uri_hide(a, DLOCK_URI_DROP), *cb = dlock_uri_hide(b, DLOCK_URI_DROP);
    int same = ca && cb ? strcmp(ca, cb) == 0 : strcmp(a, b) == 0;

    free(ca);
    free(cb);
    return same;
}

/* Opens one of the two stores alone, so that a message can say which. */
static int open_store(const char *uri, const char *which, dlock_client **cp)
{
    int err = dlock_client_open(uri, cp);

    if (err) {
        dlock_say("cannot open %s: %s", which, dlock_detail(*cp, err));
        dlock_client_close(*cp);
        *cp = NULL;
    }
    return err ? dlock_exit_status(err) : PROCEED;
}

/* A store that cannot do what migrating asks of it (tell its top, raise
 * its tokens that far): a property of the stores, which no retry helps. */
static int migrate_status(int err)
{
    return err == DLOCK_ENOTSUP || err == DLOCK_EINVAL ? EX_UNAVAILABLE : dlock_exit_status(err);
}

/* Every name at once: NEW's floor raised to OLD's top, so that a name
 * never taken on the list still gets tokens from NEW above all OLD
 * granted. Prints "* TOP ok" ('*': every name), or "* - failed". */
static int migrate_floor(dlock_client *old, dlock_client *new)
{
    uint64_t top = 0;
    int err = dlock_client_token_top(old, &top);

    if (err) {
        puts("* - failed");
        dlock_say("cannot read the highest token of OLD: %s", dlock_detail(old, err));
    } else if ((err = dlock_client_raise_floor(new, top)) != 0) {
        puts("* - failed");
        dlock_say("cannot raise NEW's tokens above %" PRIu64 " (OLD's highest): %s", top,
            dlock_detail(new, err));
    } else {
        printf("* %" PRIu64 " ok\n", top);
    }
    fflush(stdout);
    return err ? migrate_status(err) : EX_OK;
}

/* One name: EX_OK, or the exit status its failure calls for. */
static int migrate_one(dlock_client *client, const char *name, double wait_s)
{
    dlock_acquire_opts acq;
    dlock_lock *lock = NULL;
    uint64_t token;
    int err, status;

    dlock_printable(shown_name, name);
    dlock_acquire_opts_init_version(&acq, DLOCK_ACQUIRE_OPTS_VERSION);
    dlock_set_deadline(&acq, wait_s);
    do
        err = dlock_acquire(client, name, &acq, &lock);
    while (err == DLOCK_EINTR);
    if (err == 0) {
        token = dlock_lock_token(lock);
        err = dlock_release(lock);
        dlock_print_name(name);
        printf(" %" PRIu64 " ok\n", token);
        fflush(stdout);
        if (err == 0)
            return EX_OK;
        /* The raise was made (and checked) while the lock was held. */
        dlock_say("lock '%s' was migrated (token %" PRIu64 "), but releasing it failed: %s",
            shown_name, token, dlock_detail(client, err));
        return EX_SOFTWARE;
    }
    dlock_print_name(name);
    if (err == DLOCK_EBUSY || err == DLOCK_ETIMEDOUT) {
        fputs(" - busy\n", stdout);
        /* Mostly held elsewhere; a store that did not answer in time also
         * times out: the library's detail says which. */
        dlock_say("lock '%s' not migrated within %g s: %s", shown_name, wait_s,
            dlock_detail(client, err));
        status = EX_TEMPFAIL;
    } else {
        fputs(" - failed\n", stdout);
        dlock_say("cannot migrate lock '%s' (store 1 is OLD, store 2 is NEW): %s", shown_name,
            dlock_detail(client, err));
        status = migrate_status(err);
    }
    fflush(stdout);
    return status;
}

/* argv[0] is "migrate". */
int dlock_migrate_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"wait", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    double wait_s = MIGRATE_WAIT_DEFAULT_S;
    const char *old_uri, *new_uri;
    dlock_client *client = NULL, *old = NULL, *new = NULL;
    char *list;
    int c, err, status, busy = 0, failed = 0;

    dlock_usage_cmd = "migrate";
    opterr = 0;
    optind = 1;
    /* "+": options end at OLD, so a NAME may start with '-'. */
    while ((c = getopt_long(argc, argv, "+:w:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'w':
            if (dlock_parse_seconds(optarg, &wait_s) != 0)
                return dlock_usage_error("invalid wait '%s': expected seconds >= 0",
                                   store_uri_shown_value(optarg));
            break;
        default:
            return dlock_other_option(c, argv);
        }
    }
    if (argc - optind < 2)
        return dlock_usage_error("missing OLD and NEW: the stores to migrate from and to");
    old_uri = argv[optind];
    new_uri = argv[optind + 1];
    if (old_uri[strcspn(old_uri, STORE_URI_SPACES)])
        return dlock_usage_error("OLD is a list of stores (it contains whitespace): "
                           "give one URI");
    if (new_uri[strcspn(new_uri, STORE_URI_SPACES)])
        return dlock_usage_error("NEW is a list of stores (it contains whitespace): "
                           "give one URI");
    if (same_store(old_uri, new_uri))
        return dlock_usage_error("OLD and NEW are the same store");
    for (int i = optind + 2; i < argc; i++) {
        size_t len = strlen(argv[i]);

        if (len == 0)
            return dlock_usage_error("empty lock NAME (argument %d)", i - optind + 1);
        if (len > DLOCK_NAME_MAX) {
            dlock_printable(shown_name, argv[i]);
            return dlock_usage_error("lock NAME '%s' is longer than %d bytes", shown_name,
                               DLOCK_NAME_MAX);
        }
    }
    status = open_store(old_uri, "OLD", &old);
    if (status == PROCEED)
        status = open_store(new_uri, "NEW", &new);
    if (status == PROCEED) {
        failed = migrate_floor(old, new);
        status = failed ? failed : PROCEED;
    }
    dlock_client_close(old);
    dlock_client_close(new);
    if (status != PROCEED)
        return status;
    if (optind + 2 == argc)
        return dlock_finish_stdout();
    if (asprintf(&list, "%s %s", old_uri, new_uri) < 0) {
        dlock_say("out of memory");
        return EX_SOFTWARE;
    }
    err = dlock_client_open(list, &client);
    store_uri_wipe_free(list);
    if (err) {
        dlock_say("cannot open the list \"OLD NEW\": %s", dlock_detail(client, err));
        dlock_client_close(client);
        return dlock_exit_status(err);
    }
    for (int i = optind + 2; i < argc; i++) {
        status = migrate_one(client, argv[i], wait_s);
        if (status == EX_TEMPFAIL)
            busy = 1;
        else if (status != EX_OK && !failed)
            failed = status;
    }
    dlock_client_close(client);
    status = dlock_finish_stdout();
    if (status != EX_OK)
        return status;
    return failed ? failed : busy ? EX_TEMPFAIL : EX_OK;
}
