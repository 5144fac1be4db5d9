#!/bin/sh
# Run once by the official postgres image (docker-compose.yml mounts it into
# /docker-entrypoint-initdb.d/): adds the password-only role dlock_pw, like
# scripts/stores/start.sh does for the local cluster.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE dlock_pw LOGIN PASSWORD 'dlock-secret-pw';
GRANT ALL ON DATABASE dlock TO dlock_pw;
GRANT ALL ON SCHEMA public TO dlock_pw;
SQL
# dlock_pw must authenticate with its password; everyone else is trusted.
{
    echo 'local all dlock_pw     scram-sha-256'
    echo 'host  all dlock_pw all scram-sha-256'
    cat "$PGDATA/pg_hba.conf"
} >"$PGDATA/pg_hba.conf.new"
mv "$PGDATA/pg_hba.conf.new" "$PGDATA/pg_hba.conf"
