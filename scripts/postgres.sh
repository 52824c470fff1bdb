#!/usr/bin/env bash
# The PostgreSQL the tests use: 127.0.0.1:5432, trust auth for local TCP, a database `test`.
# Installs Debian's server when it is missing, configures trust on loopback once, starts the
# cluster when it is down, and creates the database. Idempotent; needs root (as on CI) to install.
set -euo pipefail

if ! ls /etc/postgresql/*/main/pg_hba.conf >/dev/null 2>&1; then
    echo "postgres: installing Debian's postgresql" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /etc/postgresql | sort -V | tail -1)
hba=/etc/postgresql/$version/main/pg_hba.conf

# Trust on loopback only, ahead of every other rule (the tests connect as postgres, no password).
if ! grep -q "^# iris-airflow-provider tests" "$hba"; then
    {
        echo "# iris-airflow-provider tests: trust on loopback"
        echo "host all all 127.0.0.1/32 trust"
        echo "host all all ::1/128 trust"
        cat "$hba"
    } > "$hba.new"
    chown --reference="$hba" "$hba.new" && chmod --reference="$hba" "$hba.new"
    mv "$hba.new" "$hba"
    if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
        pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    fi
fi

if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    for _ in $(seq 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
if ! psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
    psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE test"
fi
echo "postgres: ready on 127.0.0.1:5432 (PostgreSQL $version, database test)" >&2
