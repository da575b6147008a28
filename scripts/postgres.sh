#!/usr/bin/env bash
# A private PostgreSQL server for tests: Debian's own, in a directory of its own, run as the
# `postgres` user, listening on 127.0.0.1 only (and ADDRESS if given), with a random password.
#
#   scripts/postgres.sh start DIR [PORT [ADDRESS/PREFIX]]
#       prints `export AIRLOCK_TEST_POSTGRES_URL=...` to eval (PORT: a free one if empty or
#       missing). With ADDRESS/PREFIX (e.g. 10.78.0.1/24, a host address) it also listens on
#       ADDRESS, admits clients from its network, and the URL names ADDRESS (scripts/cluster.sh)
#   scripts/postgres.sh stop DIR           stops it (DIR itself is the caller's to remove)
#
# POSTGRES_TLS=1: it takes TLS connections only, with a certificate for 127.0.0.1 (and ADDRESS)
# from a CA made for it; the URL says sslmode=require, and `export AIRLOCK_TEST_POSTGRES_CA=...`
# names the CA's certificate (for `airlock --database-ca`).
set -euo pipefail

bin=$( (ls -d /usr/lib/postgresql/*/bin 2>/dev/null || true) | sort -V | tail -n1)
[ -x "$bin/initdb" ] || { echo "postgres.sh: no PostgreSQL server (apt-get install postgresql)" >&2; exit 1; }
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR [PORT [ADDRESS/PREFIX]]" >&2; exit 2; }
as_postgres() { runuser -u postgres -- "$@"; }

# A CA in DIR (ca.pem) and a server certificate it signed for 127.0.0.1 and HOST (server.pem,
# server.key, readable by postgres only, as the server demands).
tls_files() {
  local tls=$1 host=$2 ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  mkdir -p "$tls"
  {
    openssl req -x509 "${ec[@]}" -days 7 -subj /CN=airlock-test-postgres-ca \
      -keyout "$tls/ca.key" -out "$tls/ca.pem"
    openssl req "${ec[@]}" -subj "/CN=$host" -keyout "$tls/server.key" -out "$tls/server.csr"
    printf 'subjectAltName=IP:127.0.0.1,IP:%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
      "$host" >"$tls/server.ext"
    openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
      -CAcreateserial -days 7 -extfile "$tls/server.ext" -out "$tls/server.pem"
  } >"$tls/openssl.log" 2>&1 || { cat "$tls/openssl.log" >&2; exit 1; }
  chown postgres: "$tls/server.key" && chmod 600 "$tls/server.key"
}

case "$cmd" in
start)
  # A free port unless one is given: another run's server may hold any fixed one.
  port=${3:-}
  if [ -z "$port" ]; then
    for candidate in $(shuf -i 20000-60000 -n 50); do
      if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; break; fi
    done
    [ -n "$port" ] || { echo "postgres.sh: found no free port" >&2; exit 1; }
  fi
  mkdir -p "$dir" && chown postgres: "$dir" && chmod 700 "$dir"
  password=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
  printf '%s\n' "$password" > "$dir/password" && chown postgres: "$dir/password"
  as_postgres "$bin/initdb" -D "$dir/data" -U postgres --auth=scram-sha-256 \
    --pwfile="$dir/password" >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
  network=${4:-}; host=127.0.0.1; listen=127.0.0.1
  if [ -n "$network" ]; then
    host=${network%/*}; listen+=",$host"
    # Host bits are ignored: 10.78.0.1/24 admits 10.78.0.0/24. This host may connect to ADDRESS
    # from any of its addresses.
    printf 'host all all %s scram-sha-256\nhost all all samehost scram-sha-256\n' "$network" \
      >>"$dir/data/pg_hba.conf"
  fi
  options="-c listen_addresses=$listen -c port=$port -c unix_socket_directories=$dir"
  url="host=$host port=$port user=postgres password=$password dbname=postgres"
  if [ "${POSTGRES_TLS:-}" = 1 ]; then
    tls_files "$dir/tls" "$host"
    sed -i 's/^host /hostssl /' "$dir/data/pg_hba.conf"
    options+=" -c ssl=on -c ssl_cert_file=$dir/tls/server.pem -c ssl_key_file=$dir/tls/server.key"
    url+=" sslmode=require"
    echo "export AIRLOCK_TEST_POSTGRES_CA='$dir/tls/ca.pem'"
  fi
  as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start -o "$options" >/dev/null ||
    { cat "$dir/server.log" >&2; exit 1; }
  echo "export AIRLOCK_TEST_POSTGRES_URL='$url'"
  ;;
stop)
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_postgres "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
  fi
  ;;
*)
  echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
