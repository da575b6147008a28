#!/usr/bin/env bash
# Quick start, one command: installs what is missing (runsc, debootstrap, the Python SDK), builds
# Airlock, builds the `base` and `code-interpreter-v1` templates (cached after the first time),
# starts the server and runs a short demo through the stock E2B SDKs. The server keeps running
# until you press Ctrl-C.
#
#   AIRLOCK_DATA_DIR       state and sandboxes              (default /var/lib/airlock)
#   AIRLOCK_TEMPLATES_DIR  built templates, shared with ./test.sh and the benchmarks
#                          (default /var/cache/airlock/templates)
#   AIRLOCK_LISTEN         address of the API and proxy     (default 127.0.0.1:3000)
#   AIRLOCK_API_KEY        use this key instead of a generated one
set -euo pipefail
cd "$(dirname "$0")"
. scripts/templates-dir.sh

DATA_DIR=${AIRLOCK_DATA_DIR:-/var/lib/airlock}
LISTEN=${AIRLOCK_LISTEN:-127.0.0.1:3000}

scripts/prepare.sh "$DATA_DIR"

echo "==> starting the server"
target/release/airlock --data-dir "$DATA_DIR" serve --listen "$LISTEN" &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER' INT TERM
for _ in $(seq 1 300); do
  curl -fs "http://$LISTEN/health" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "the server exited; see the messages above" >&2; exit 1; }
  sleep 0.1
done

echo "==> demo: the stock e2b SDK against Airlock"
E2B_API_KEY=${AIRLOCK_API_KEY:-$(cat "$DATA_DIR/api-key")} \
E2B_API_URL="http://$LISTEN" E2B_SANDBOX_URL="http://$LISTEN" \
  .venv/bin/python examples/demo.py || echo "(the demo failed; the server is still running)"

echo
echo "Airlock is running on http://$LISTEN. Press Ctrl-C to stop it (running sandboxes run on; the next start adopts them)."
wait $SERVER
