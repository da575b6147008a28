#!/usr/bin/env bash
# A private S3 server for tests: s3s-fs from crates.io (a real S3 API over a directory), built
# once into /var/cache/airlock/tools/s3s-fs-VERSION and reused, listening on 127.0.0.1 only
# (or ADDRESS), with random credentials and one bucket, `airlock-test`.
#
#   scripts/s3.sh install          builds it if it is not there yet (a few minutes, once)
#   scripts/s3.sh start DIR [PORT [ADDRESS]]
#                                  prints `export AIRLOCK_TEST_S3_URL=...` (an --object-store
#                                  URL with endpoint and credentials) and AIRLOCK_TEST_S3_DIR
#                                  (where the bucket's objects are, as files) to eval; PORT: a
#                                  free one if empty or missing; ADDRESS: a host address to
#                                  listen on instead of 127.0.0.1 (scripts/cluster.sh)
#   scripts/s3.sh stop DIR         stops it (DIR itself is the caller's to remove)
set -euo pipefail

# 0.14.1: the newest whose rust-version (1.92) the pinned toolchain meets; 0.15 wants 1.96.
version=0.14.1
root=/var/cache/airlock/tools/s3s-fs-$version
bin=$root/bin/s3s-fs
bucket=airlock-test
cmd=${1:-}; dir=${2:-}
usage() { echo "usage: $0 install | start DIR [PORT [ADDRESS]] | stop DIR" >&2; exit 2; }

install() {
  [ -x "$bin" ] && return
  mkdir -p "$(dirname "$root")"
  cargo install s3s-fs --features binary --locked --version "$version" --root "$root.tmp" \
    >"$(dirname "$root")/s3s-fs-$version.log" 2>&1 ||
    { tail -n 30 "$(dirname "$root")/s3s-fs-$version.log" >&2; exit 1; }
  rm -rf "$root" && mv "$root.tmp" "$root"
}

case "$cmd" in
install) install ;;
start)
  [ -n "$dir" ] || usage
  install
  port=${3:-}; host=${4:-127.0.0.1}
  if [ -z "$port" ]; then
    for candidate in $(shuf -i 20000-60000 -n 50); do
      if ! (exec 3<>"/dev/tcp/$host/$candidate") 2>/dev/null; then port=$candidate; break; fi
    done
    [ -n "$port" ] || { echo "s3.sh: found no free port" >&2; exit 1; }
  fi
  mkdir -p "$dir/data/$bucket" && chmod 700 "$dir"
  access=$(head -c 12 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
  secret=$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
  setsid "$bin" --host "$host" --port "$port" --access-key "$access" --secret-key "$secret" \
    "$dir/data" >"$dir/server.log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then break; fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/server.log" >&2; exit 1; }
    sleep 0.1
  done
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null ||
    { echo "s3.sh: s3s-fs did not listen on $port" >&2; cat "$dir/server.log" >&2; exit 1; }
  query="endpoint=http://$host:$port&allow_http=true&region=us-east-1"
  query+="&access_key_id=$access&secret_access_key=$secret"
  echo "export AIRLOCK_TEST_S3_URL='s3://$bucket?$query'"
  echo "export AIRLOCK_TEST_S3_DIR='$dir/data/$bucket'"
  ;;
stop)
  [ -n "$dir" ] || usage
  if [ -f "$dir/pid" ]; then
    kill "$(cat "$dir/pid")" 2>/dev/null || true
    rm -f "$dir/pid"
  fi
  ;;
*) usage ;;
esac
