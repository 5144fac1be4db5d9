/*
 * --chart FILE: pipes the run's JSON record into bench/plot.py, which draws
 * it with matplotlib (SVG, or PNG by FILE's extension). The interpreter and
 * the script's two homes are baked in by meson (bench/bench_config.h):
 *   $DLOCK_BENCH_PLOT      the script, when set
 *   the source tree's copy when this binary is the one in the build tree
 *   <datadir>/dlock/plot.py when installed
 *   $DLOCK_PYTHON          the interpreter, else the python3 meson found
 *                          with matplotlib (Debian: python3-matplotlib)
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_config.h"
#include "bench_int.h"

static int readable(const char *path)
{
    return access(path, R_OK) == 0;
}

static const char *plot_script(void)
{
    static char exe[PATH_MAX];
    const char *env = getenv("DLOCK_BENCH_PLOT");
    size_t root = strlen(BENCH_BUILD_ROOT);

    if (env && *env)
        return env;
    if (realpath("/proc/self/exe", exe) && strncmp(exe, BENCH_BUILD_ROOT, root) == 0 &&
        exe[root] == '/' && readable(BENCH_PLOT_SOURCE))
        return BENCH_PLOT_SOURCE;
    if (readable(BENCH_PLOT_INSTALLED))
        return BENCH_PLOT_INSTALLED;
    if (readable(BENCH_PLOT_SOURCE))
        return BENCH_PLOT_SOURCE;
    return NULL;
}

int bench_render_chart(const bench_opts *o, const bench_result *rs, size_t n)
{
    const char *script = plot_script(), *py = getenv("DLOCK_PYTHON");
    void (*old_pipe)(int);
    int fds[2], status = 0, werr;
    pid_t pid;
    FILE *f;

    if (!py || !*py)
        py = BENCH_PYTHON;
    if (!script) {
        fprintf(stderr, "dlock bench: --chart: plot.py not found (looked for "
                "%s and %s; set DLOCK_BENCH_PLOT)\n", BENCH_PLOT_INSTALLED,
                BENCH_PLOT_SOURCE);
        return BENCH_EXIT_ERROR;
    }
    if (pipe2(fds, O_CLOEXEC) != 0) {
        fprintf(stderr, "dlock bench: --chart: pipe: %s\n", strerror(errno));
        return BENCH_EXIT_ERROR;
    }
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "dlock bench: --chart: fork: %s\n", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return BENCH_EXIT_ERROR;
    }
    if (pid == 0) {
        char *argv[] = { (char *)py, (char *)script, "-o", (char *)o->chart,
                         "-", NULL };

        if (dup2(fds[0], STDIN_FILENO) < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
            _exit(127);
        execvp(py, argv);
        fprintf(stderr, "dlock bench: --chart: cannot run %s: %s (set "
                "DLOCK_PYTHON to a python3 with matplotlib)\n", py,
                strerror(errno));
        _exit(127);
    }
    close(fds[0]);
    old_pipe = signal(SIGPIPE, SIG_IGN);  /* the plotter may die early */
    f = fdopen(fds[1], "w");
    if (f) {
        bench_print_json(f, o, rs, n);
        fclose(f);
    } else {
        close(fds[1]);
    }
    while ((werr = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
        ;
    signal(SIGPIPE, old_pipe);
    if (werr < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "dlock bench: --chart: %s %s failed (status %d); "
                "no chart written\n", py, script,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return BENCH_EXIT_ERROR;
    }
    return BENCH_EXIT_OK;
}
