/*
 * dlock leader [--json] [--watch] [URI] NAME: who leads the election NAME
 * (dlock_leader()), without campaigning; with --watch, a line per change
 * (dlock_observe()) until SIGINT or SIGTERM, which end it with status 0.
 * Human lines by default; --json prints one object per line.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/store_uri.h"
#include "dlock.h"
#include "dlock_backend.h" /* DLOCK_KNOWS_* */

static void print_json(const char *name, const dlock_leader_info *li)
{
    fputs("{\"name\":", stdout);
    dlock_json_string(stdout, name);
    if (li->err) {
        printf(",\"error\":\"%s\",\"detail\":", dlock_err_name(li->err));
        dlock_json_string(stdout, li->value);
        fputs("}\n", stdout);
        return;
    }
    printf(",\"held\":%s", li->held ? "true" : "false");
    if (li->held) {
        fputs(",\"value\":", stdout);
        dlock_json_bytes(stdout, li->value, li->value_len);
    } else {
        fputs(",\"value\":null", stdout);
    }
    if (li->held && (li->known & DLOCK_KNOWS_TOKEN))
        printf(",\"term\":%" PRIu64, li->term);
    else
        fputs(",\"term\":null", stdout);
    if (li->held && (li->known & DLOCK_KNOWS_LEASE))
        printf(",\"lease_ms\":%" PRIu64, li->lease_ms);
    else
        fputs(",\"lease_ms\":null", stdout);
    fputs(",\"owner\":", stdout);
    if (li->held && (li->known & DLOCK_KNOWS_OWNER))
        dlock_json_string(stdout, li->owner);
    else
        fputs("null", stdout);
    fputs("}\n", stdout);
}

static void print_text(const char *name, const dlock_leader_info *li)
{
    dlock_print_name(name);
    if (li->err) {
        printf(": cannot read the store: %s\n", li->value);
        return;
    }
    if (!li->held) {
        fputs(": no leader\n", stdout);
        return;
    }
    fputs(": led", stdout);
    if (li->known & DLOCK_KNOWS_OWNER) {
        fputs(" by ", stdout);
        dlock_print_name(li->owner);
    }
    if (li->known & DLOCK_KNOWS_TOKEN)
        printf(", term %" PRIu64, li->term);
    if (li->known & DLOCK_KNOWS_LEASE)
        printf(", lease %.1f s left", (double)li->lease_ms / 1000);
    fputs(", value '", stdout);
    for (size_t i = 0; i < li->value_len; i++)
        putchar((unsigned char)li->value[i] < 0x20 || li->value[i] == 0x7f ? '?' : li->value[i]);
    fputs("'\n", stdout);
}

static int stop_pipe[2] = {-1, -1};

static void on_stop(int sig)
{
    char byte = (char)sig;
    ssize_t n = write(stop_pipe[1], &byte, 1);
    (void)n;
}

/* Prints every change the observer reports until SIGINT or SIGTERM. */
static int watch(dlock_client *client, const char *name, int json)
{
    dlock_observer *ob = NULL;
    dlock_leader_info li;
    int err;

    if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        dlock_say("cannot create a pipe: %s", strerror(errno));
        return EX_SOFTWARE;
    }
    struct sigaction act = {.sa_handler = on_stop};
    sigemptyset(&act.sa_mask);
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGTERM, &act, NULL);
    if ((err = dlock_observe(client, name, NULL, NULL, &ob)) != 0) {
        char shown[SHOWN_MAX + 4];
        dlock_printable(shown, name);
        dlock_say("cannot observe election '%s': %s", shown, dlock_detail(client, err));
        return dlock_exit_status(err);
    }
    for (;;) {
        struct pollfd fds[2] = {{dlock_observer_fd(ob), POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0 && errno != EINTR)
            break;
        if (fds[1].revents)
            break;
        while (dlock_observer_next(ob, &li, 0) == 0) {
            if (json)
                print_json(name, &li);
            else
                print_text(name, &li);
        }
        if (fflush(stdout) != 0)
            break; /* the reader went away */
    }
    dlock_observer_close(ob);
    return EX_OK;
}

/* argv[0] is "leader". */
int dlock_leader_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"watch", no_argument, NULL, 'W'},
        {"password-file", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char dflt[DLOCK_URI_MAX + 16], *with_file = NULL;
    const char *uri, *name, *password_file = NULL;
    dlock_client *client = NULL;
    int c, json = 0, follow = 0, npos, status;

    dlock_usage_cmd = "leader";
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+:jWh", longopts, NULL)) != -1) {
        switch (c) {
        case 'j':
            json = 1;
            break;
        case 'P':
            if (!*optarg)
                return dlock_usage_error("--password-file needs a file name");
            password_file = optarg;
            break;
        case 'W':
            follow = 1;
            break;
        default:
            return dlock_other_option(c, argv);
        }
    }
    npos = argc - optind;
    if (npos == 0)
        return dlock_usage_error("missing election NAME");
    if (npos > 2)
        return dlock_usage_error("too many arguments: dlock leader takes [URI] NAME");
    if (npos == 2 && !strstr(argv[optind], "://"))
        return dlock_usage_error("with two arguments the first is the URI, and '%s' is none: "
                                 "give the URI first (e.g. \"$DLOCK_URI\")",
                                 store_uri_shown_value(argv[optind]));
    uri = npos == 2 ? argv[optind] : store_uri_default(dflt, sizeof dflt);
    if (!uri) {
        dlock_say("cannot build the default store's URI (set DLOCK_URI)");
        return EX_SOFTWARE;
    }
    name = argv[argc - 1];
    if (!name[0] || strlen(name) > DLOCK_NAME_MAX)
        return dlock_usage_error("election NAME is empty or longer than %d bytes", DLOCK_NAME_MAX);
    if (password_file && (status = store_uri_add_password(uri, password_file, &with_file)) !=
                             PROCEED)
        return status;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int err = dlock_client_open(with_file ? with_file : uri, &client);
    store_uri_wipe_free(with_file);
    if (err) {
        dlock_say("cannot open lock store: %s", dlock_detail(client, err));
        dlock_client_close(client);
        return dlock_exit_status(err);
    }
    if (follow) {
        status = watch(client, name, json);
    } else {
        dlock_leader_info li;
        if ((err = dlock_leader(client, name, &li)) != 0) {
            char shown[SHOWN_MAX + 4];
            dlock_printable(shown, name);
            dlock_say("cannot read election '%s': %s", shown, dlock_detail(client, err));
            status = dlock_exit_status(err);
        } else {
            if (json)
                print_json(name, &li);
            else
                print_text(name, &li);
            status = EX_OK;
        }
    }
    dlock_client_close(client);
    int out = dlock_finish_stdout();
    return status != EX_OK ? status : out;
}
