/*
 * dlock(1): run a command while holding a distributed lock, in the spirit of
 * flock(1) (`dlock run`, tools/run.c, its supervisor in tools/supervise.c);
 * `dlock migrate` prepares a store to take over locks from another
 * (tools/migrate.c, docs/migration.md); `dlock inspect` tells what a store
 * knows of a lock (tools/inspect.c); `dlock check` tests stores
 * (tools/check.c); `dlock bench` is dispatched to bench/. This file only
 * picks the subcommand. What they share is in tools/cli.c, and the store's
 * URI as the CLI handles it (default, passwords) in tools/store_uri.c.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sysexits.h>

#include "check.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "dlock.h"
#ifdef DLOCK_HAVE_BENCH
#include "bench/bench.h"
#endif

static int cmd_bench(int argc, char **argv)
{
#ifdef DLOCK_HAVE_BENCH
    return dlock_bench_main(argc, argv);
#else
    (void)argc;
    (void)argv;
    dlock_say("this dlock was built without the benchmark (meson -Dbench=true)");
    return EX_UNAVAILABLE;
#endif
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : NULL;

    if (!cmd) {
        dlock_print_usage(stderr);
        return EX_USAGE;
    }
    if (strcmp(cmd, "run") == 0 || strcmp(cmd, "elect") == 0)
        return dlock_run_main(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - 1, argv + 1);
    /* A closed stdout is reported (dlock_finish_stdout()), not fatal. */
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
        strcmp(cmd, "-h") == 0) {
        dlock_print_usage(stdout);
        return dlock_finish_stdout();
    }
    if (strcmp(cmd, "migrate") == 0)
        return dlock_migrate_main(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0)
        return dlock_inspect_main(argc - 1, argv + 1);
    if (strcmp(cmd, "leader") == 0)
        return dlock_leader_main(argc - 1, argv + 1);
    if (strcmp(cmd, "check") == 0)
        return dlock_check_main(argc - 1, argv + 1);
    if (strcmp(cmd, "--version") == 0) {
        printf("dlock %s\n", dlock_version());
        return dlock_finish_stdout();
    }
    dlock_say("unknown command '%s' (see 'dlock --help')", cmd);
    return EX_USAGE;
}
