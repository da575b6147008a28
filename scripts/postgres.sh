#!/usr/bin/env bash
# A private PostgreSQL server for tests: Debian's own, in a directory of its own, run as the
# `postgres` user, listening on 127.0.0.1 only, with a random password.
#
#   scripts/postgres.sh start DIR [PORT]   prints `export AIRLOCK_TEST_POSTGRES_URL=...` to eval
#   scripts/postgres.sh stop DIR           stops it (DIR itself is the caller's to remove)
set -euo pipefail

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
[ -x "$bin/initdb" ] || { echo "postgres.sh: no PostgreSQL server (apt-get install postgresql)" >&2; exit 1; }
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2; }
as_postgres() { runuser -u postgres -- "$@"; }

case "$cmd" in
start)
  port=${3:-55432}
  mkdir -p "$dir" && chown postgres: "$dir" && chmod 700 "$dir"
  password=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
  printf '%s\n' "$password" > "$dir/password" && chown postgres: "$dir/password"
  as_postgres "$bin/initdb" -D "$dir/data" -U postgres --auth=scram-sha-256 \
    --pwfile="$dir/password" >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
  as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir" >/dev/null ||
    { cat "$dir/server.log" >&2; exit 1; }
  echo "export AIRLOCK_TEST_POSTGRES_URL='host=127.0.0.1 port=$port user=postgres password=$password dbname=postgres'"
  ;;
stop)
  [ -d "$dir/data" ] && as_postgres "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
  ;;
*)
  echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
