/*
 * A plain libpq session for the PostgreSQL tests, to look behind the
 * library (pg_locks, pg_stat_activity) and to play a client of an earlier
 * release: pg_raw_connect() to the test's URI, and q1() for one value;
 * PG_RUN_CASES() runs the cases named on the command line.
 * Include after tests/tap.h.
 */
#ifndef DLOCK_TESTS_PG_RAW_H
#define DLOCK_TESTS_PG_RAW_H

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/uri.h"

/* A session to uri's first host as its user, or the end of the run. */
static inline PGconn *pg_raw_connect(const char *uri)
{
    dlock_uri *u = NULL;
    char err[256], conninfo[512];
    dlock_uri_parse(uri, &u, err, sizeof err);
    snprintf(conninfo, sizeof conninfo, "host=%s port=%u dbname=%s user=%s", dlock_uri_host(u, 0),
             dlock_uri_port(u, 0), dlock_uri_path(u) + 1, dlock_uri_user(u));
    dlock_uri_free(u);
    PGconn *pg = PQconnectdb(conninfo);
    if (PQstatus(pg) != CONNECTION_OK) {
        printf("Bail out! raw connection: %s\n", PQerrorMessage(pg));
        exit(1);
    }
    PQclear(PQexec(pg, "SET client_min_messages = warning"));
    return pg;
}

/* First column of the first row of sql, as a new string ("" on error). */
static inline char *q1(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    char *v = strdup(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0
                         ? PQgetvalue(r, 0, 0)
                         : "");
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
        diag("sql failed: %s", PQresultErrorMessage(r));
    PQclear(r);
    return v;
}

/* Runs cases[i].run() for every case named in argv[1..argc) (all when
 * none); cases is an array of {name, run}. */
#define PG_RUN_CASES(cases, argc, argv)                                                        \
    for (size_t case_ = 0; case_ < sizeof(cases) / sizeof(cases)[0]; case_++) {               \
        int want_ = (argc) < 2;                                                                \
        for (int a_ = 1; a_ < (argc); a_++)                                                    \
            want_ |= strcmp((argv)[a_], (cases)[case_].name) == 0;                             \
        if (want_)                                                                             \
            (cases)[case_].run();                                                              \
    }

#endif
