/* The subcommands of dlock(1) that tools/dlock.c dispatches to, each in a
 * file of its own: argv[0] is the subcommand's name; each returns the exit
 * status. (check: tools/check.h; bench: bench/bench.h.) */
#ifndef DLOCK_TOOLS_COMMANDS_H
#define DLOCK_TOOLS_COMMANDS_H

int dlock_run_main(int argc, char **argv);     /* tools/run.c: run and elect */
int dlock_migrate_main(int argc, char **argv); /* tools/migrate.c */
int dlock_inspect_main(int argc, char **argv); /* tools/inspect.c */
int dlock_leader_main(int argc, char **argv);  /* tools/leader.c */

#endif
