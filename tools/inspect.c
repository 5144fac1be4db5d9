/*
 * dlock inspect [--json] [URI] NAME...: what the store knows about each
 * name (dlock_inspect()) and every holder of it (dlock_inspect_holders()),
 * without taking or disturbing anything. A list of stores is inspected
 * store by store. Human lines by default (a name held shared or as a
 * semaphore followed by one line per holder); --json prints one object per
 * name (and store) per line.
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
#include "dlock_backend.h" /* DLOCK_CAP_LEASE */

/* Every holder of a name, as dlock_inspect_holders() lists them. */
struct holders {
    dlock_holder *h; /* h[0 .. shown) */
    size_t shown;    /* min(count, room) */
    size_t count;    /* how many hold */
    size_t room;
};

/* The holders of name into hs, the array grown to their count (holders
 * may come and go between calls: a few tries, then those that fit). */
static int get_holders(dlock_client *client, const char *name, struct holders *hs)
{
    for (int tries = 0;; tries++) {
        int err = dlock_inspect_holders(client, name, hs->h, hs->room, &hs->count);

        if (err)
            return err;
        hs->shown = hs->count < hs->room ? hs->count : hs->room;
        if (hs->count <= hs->room || tries == 3)
            return 0;
        dlock_holder *more = realloc(hs->h, hs->count * sizeof *more);
        if (!more)
            return 0; /* those that fit; the count says more hold */
        hs->h = more;
        hs->room = hs->count;
    }
}

static const char *mode_name(const dlock_holder *h)
{
    return h->limit ? "permit" : h->mode == DLOCK_MODE_SHARED ? "shared" : "exclusive";
}

/* Held otherwise than by one exclusive holder: shared, or a semaphore. */
static int held_in_mode(const struct holders *hs)
{
    for (size_t k = 0; k < hs->shown; k++)
        if ((hs->h[k].known & DLOCK_KNOWS_MODE) &&
            (hs->h[k].mode == DLOCK_MODE_SHARED || hs->h[k].limit))
            return 1;
    return hs->count > 1;
}

static void print_holders_json(const struct holders *hs)
{
    printf(",\"holder_count\":%zu,\"holders\":[", hs->count);
    for (size_t k = 0; k < hs->shown; k++) {
        const dlock_holder *h = &hs->h[k];

        fputs(k ? ",{" : "{", stdout);
        if (h->known & DLOCK_KNOWS_MODE)
            printf("\"mode\":\"%s\",\"limit\":%" PRIu32,
                   h->mode == DLOCK_MODE_SHARED ? "shared" : "exclusive", h->limit);
        else
            fputs("\"mode\":null,\"limit\":null", stdout);
        if (h->known & DLOCK_KNOWS_TOKEN)
            printf(",\"token\":%" PRIu64, h->token);
        else
            fputs(",\"token\":null", stdout);
        fputs(",\"owner\":", stdout);
        if (h->known & DLOCK_KNOWS_OWNER)
            dlock_json_string(stdout, h->owner);
        else
            fputs("null", stdout);
        if (h->known & DLOCK_KNOWS_LEASE)
            printf(",\"lease_ms\":%" PRIu64 "}", h->lease_ms);
        else
            fputs(",\"lease_ms\":null}", stdout);
    }
    putchar(']');
}

/* One line per holder, after the name's line. */
static void print_holders_text(const struct holders *hs, int leased)
{
    for (size_t k = 0; k < hs->shown; k++) {
        const dlock_holder *h = &hs->h[k];

        printf("  holder %zu of %zu: ", k + 1, hs->count);
        if (h->known & DLOCK_KNOWS_MODE)
            fputs(mode_name(h), stdout);
        else
            fputs("mode unknown", stdout);
        if (h->known & DLOCK_KNOWS_TOKEN)
            printf(", token %" PRIu64, h->token);
        if (h->known & DLOCK_KNOWS_LEASE)
            printf(", lease %.1f s left", (double)h->lease_ms / 1000);
        else
            fputs(leased ? ", lease left unknown" : ", no lease", stdout);
        if (h->known & DLOCK_KNOWS_OWNER) {
            fputs(", owner ", stdout);
            dlock_print_name(h->owner);
        }
        putchar('\n');
    }
    if (hs->shown < hs->count)
        printf("  ... and %zu more holders\n", hs->count - hs->shown);
}

static void print_inspect_json(const char *name, int store, int nstores, const dlock_info *i,
                               const struct holders *hs)
{
    unsigned k = i->known;

    fputs("{\"name\":", stdout);
    dlock_json_string(stdout, name);
    if (nstores > 1)
        printf(",\"store\":%d", store);
    printf(",\"held\":%s", !(k & DLOCK_KNOWS_HELD) ? "null" : i->held ? "true" : "false");
    if ((k & DLOCK_KNOWS_TOKEN) && i->held)
        printf(",\"token\":%" PRIu64, i->token);
    else
        fputs(",\"token\":null", stdout);
    fputs(",\"owner\":", stdout);
    if ((k & DLOCK_KNOWS_OWNER) && i->held)
        dlock_json_string(stdout, i->owner);
    else
        fputs("null", stdout);
    if ((k & DLOCK_KNOWS_LEASE) && i->held)
        printf(",\"lease_ms\":%" PRIu64, i->lease_ms);
    else
        fputs(",\"lease_ms\":null", stdout);
    if (k & DLOCK_KNOWS_WAITERS)
        printf(",\"waiters\":%" PRIu64, i->waiters);
    else
        fputs(",\"waiters\":null", stdout);
    fputs(",\"order\":", stdout);
    if (k & DLOCK_KNOWS_ORDER) {
        putchar('[');
        for (size_t w = 0; w < i->listed && w < DLOCK_INFO_LISTED; w++) {
            if (w)
                putchar(',');
            dlock_json_string(stdout, i->waiter[w]);
        }
        putchar(']');
    } else {
        fputs("null", stdout);
    }
    if (k & DLOCK_KNOWS_LAST_TOKEN)
        printf(",\"last_token\":%" PRIu64, i->last_token);
    else
        fputs(",\"last_token\":null", stdout);
    print_holders_json(hs);
    fputs("}\n", stdout);
}

/* leased: the store's locks have leases (DLOCK_CAP_LEASE). */
static void print_inspect_text(const char *name, const char *store, const dlock_info *i,
                               const struct holders *hs, int leased)
{
    unsigned k = i->known;

    dlock_print_name(name);
    printf("%s: ", store);
    if (!(k & DLOCK_KNOWS_HELD))
        fputs("held or free: unknown", stdout);
    else if (!i->held)
        fputs("free", stdout);
    else {
        fputs("held", stdout);
        if (held_in_mode(hs)) {
            /* The line's owner, token and lease are then the newest holder's. */
            unsigned hk = hs->shown ? hs->h[0].known : 0;
            uint32_t limit = hs->shown ? hs->h[0].limit : 0;

            if ((hk & DLOCK_KNOWS_MODE) && limit)
                printf(" as a semaphore of %" PRIu32 " (%zu permit%s taken)", limit, hs->count,
                       hs->count == 1 ? "" : "s");
            else
                printf(" %s (%zu holder%s)", (hk & DLOCK_KNOWS_MODE) ? mode_name(&hs->h[0]) :
                       "in an unknown mode", hs->count, hs->count == 1 ? "" : "s");
            if (hs->count > 1)
                fputs(", the newest", stdout);
        }
        if (k & DLOCK_KNOWS_OWNER) {
            fputs(" by ", stdout);
            dlock_print_name(i->owner);
        }
        if (k & DLOCK_KNOWS_TOKEN)
            printf(", token %" PRIu64, i->token);
        if (k & DLOCK_KNOWS_LEASE)
            printf(", lease %.1f s left", (double)i->lease_ms / 1000);
        else
            fputs(leased ? ", lease left unknown" : ", no lease", stdout);
    }
    if (k & DLOCK_KNOWS_WAITERS)
        printf(", %" PRIu64 " waiting", i->waiters);
    else
        fputs(", waiters unknown", stdout);
    if ((k & DLOCK_KNOWS_ORDER) && i->listed) {
        fputs(" (next: ", stdout);
        for (size_t w = 0; w < i->listed && w < DLOCK_INFO_LISTED; w++) {
            if (w)
                fputs(", ", stdout);
            dlock_print_name(i->waiter[w]);
        }
        fputs(i->listed < i->waiters ? ", ...)" : ")", stdout);
    }
    if ((k & DLOCK_KNOWS_LAST_TOKEN) && i->last_token)
        printf(", last token %" PRIu64, i->last_token);
    else if (k & DLOCK_KNOWS_LAST_TOKEN)
        fputs(", no token granted yet", stdout);
    putchar('\n');
    if (i->held && held_in_mode(hs))
        print_holders_text(hs, leased);
}

/* argv[0] is "inspect". */
int dlock_inspect_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"password-file", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char dflt[DLOCK_URI_MAX + 16], *words[16], *wbuf = NULL, *with_file = NULL;
    const char *password_file = NULL;
    struct holders hs = {0};
    const char *uri;
    int c, json = 0, npos, first, status = EX_OK;

    dlock_usage_cmd = "inspect";
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+:jh", longopts, NULL)) != -1) {
        switch (c) {
        case 'j':
            json = 1;
            break;
        case 'P':
            if (!*optarg)
                return dlock_usage_error("--password-file needs a file name");
            password_file = optarg;
            break;
        default:
            return dlock_other_option(c, argv);
        }
    }
    npos = argc - optind;
    if (npos == 0)
        return dlock_usage_error("missing lock NAME");
    if (npos >= 2 && !strstr(argv[optind], "://"))
        return dlock_usage_error("with several arguments the first is the URI, and '%s' is none: "
                           "give the URI first (e.g. \"$DLOCK_URI\")", store_uri_shown_value(argv[optind]));
    uri = npos >= 2 ? argv[optind] : store_uri_default(dflt, sizeof dflt);
    if (!uri) {
        dlock_say("cannot build the default store's URI (set DLOCK_URI)");
        return EX_SOFTWARE;
    }
    first = npos >= 2 ? optind + 1 : optind;
    for (int a = first; a < argc; a++)
        if (!argv[a][0] || strlen(argv[a]) > DLOCK_NAME_MAX)
            return dlock_usage_error("lock NAME %d is empty or longer than %d bytes", a - first + 1,
                               DLOCK_NAME_MAX);
    if (password_file) {
        status = store_uri_add_password(uri, password_file, &with_file);
        if (status != PROCEED)
            return status;
        uri = with_file;
        status = EX_OK;
    }
    /* A list of stores: each store alone, so that each says what it knows. */
    size_t nstores = 0;
    for (const char *p = uri; *p;) {
        p += strspn(p, STORE_URI_SPACES);
        if (*p)
            nstores++;
        p += strcspn(p, STORE_URI_SPACES);
    }
    if (nstores > sizeof words / sizeof words[0]) {
        store_uri_wipe_free(with_file);
        return dlock_usage_error("more than %zu stores in the list", sizeof words / sizeof words[0]);
    }
    wbuf = strdup(uri);
    store_uri_wipe_free(with_file);
    if (!wbuf) {
        dlock_say("out of memory");
        return EX_SOFTWARE;
    }
    nstores = 0;
    for (char *p = strtok(wbuf, STORE_URI_SPACES); p; p = strtok(NULL, STORE_URI_SPACES))
        words[nstores++] = p;
    for (size_t s = 0; s < nstores; s++) {
        dlock_client *client = NULL;
        char label[64] = "";
        int err = dlock_client_open(words[s], &client);

        if (err) {
            dlock_say("cannot open lock store%s: %s", nstores > 1 ? " (in the list)" : "",
                dlock_detail(client, err));
            dlock_client_close(client);
            status = dlock_exit_status(err);
            break;
        }
        if (nstores > 1)
            snprintf(label, sizeof label, " (store %zu of %zu, %s)", s + 1, nstores,
                     dlock_client_backend(client));
        for (int a = first; a < argc; a++) {
            dlock_info info;

            err = dlock_inspect(client, argv[a], &info);
            if (!err)
                err = get_holders(client, argv[a], &hs);
            if (err) {
                char shown_name[SHOWN_MAX + 4];

                dlock_printable(shown_name, argv[a]);
                dlock_say("cannot inspect lock '%s'%s: %s", shown_name, label, dlock_detail(client, err));
                if (status == EX_OK)
                    status = dlock_exit_status(err);
                continue;
            }
            if (json)
                print_inspect_json(argv[a], (int)s + 1, (int)nstores, &info, &hs);
            else
                print_inspect_text(argv[a], label, &info, &hs,
                                   (dlock_client_caps(client) & DLOCK_CAP_LEASE) != 0);
        }
        dlock_client_close(client);
    }
    store_uri_wipe_free(wbuf);
    free(hs.h);
    int out = dlock_finish_stdout();
    return status != EX_OK ? status : out;
}
