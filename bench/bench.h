/* `dlock bench`: latency and throughput of dlock over one or more stores. */
#ifndef DLOCK_BENCH_H
#define DLOCK_BENCH_H

/*
 * Runs the benchmark. argv[0] is "bench"; the rest are options and URIs
 * (see `dlock bench --help`). Returns the process exit status: 0 on success,
 * 64 on a usage error or a bad URI, 1 if a mutual-exclusion violation was
 * seen, 70 on any other error.
 */
int dlock_bench_main(int argc, char **argv);

#endif
