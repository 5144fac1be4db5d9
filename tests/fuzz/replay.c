/*
 * Replays a corpus through a fuzz target without libFuzzer (gcc builds,
 * sanitizer and valgrind runs): every regular file of every directory (or
 * file) named on the command line is passed to LLVMFuzzerTestOneInput once.
 * Prints TAP: one line per directory. A crash or sanitizer report ends the
 * program, which fails the test.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    long len;
    uint8_t *buf;
    if (!f)
        return -1;
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return -1;
    }
    /* An exact-size heap copy, so ASan sees any read past the input. */
    buf = malloc(len ? (size_t)len : 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int failed = 0;
    printf("1..%d\n", argc - 1);
    for (int a = 1; a < argc; a++) {
        struct stat st;
        size_t n = 0, bad = 0;
        if (stat(argv[a], &st) == 0 && S_ISREG(st.st_mode)) {
            bad += run_file(argv[a]) != 0;
            n++;
        } else {
            DIR *d = opendir(argv[a]);
            struct dirent *e;
            if (!d) {
                printf("not ok %d - cannot open %s\n", a, argv[a]);
                failed = 1;
                continue;
            }
            while ((e = readdir(d)) != NULL) {
                char path[4096];
                if (e->d_name[0] == '.')
                    continue;
                snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
                if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
                    continue;
                bad += run_file(path) != 0;
                n++;
            }
            closedir(d);
        }
        if (n == 0 || bad) {
            printf("not ok %d - %s: %zu inputs, %zu unreadable\n", a, argv[a], n, bad);
            failed = 1;
        } else {
            printf("ok %d - %s: %zu inputs replayed\n", a, argv[a], n);
        }
    }
    return failed;
}
