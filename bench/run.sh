#!/usr/bin/env bash
# Runs the benchmarks against a server of their own (stop any other `airlock serve` first: one
# server per host). Builds Airlock and the templates first (scripts/prepare.sh).
#   bench/run.sh                      both suites
#   bench/run.sh startup [args]       bench/startup.py     (create → first command, idle memory)
#   bench/run.sh interpreter [args]   bench/interpreter.py (run_code round trips)
#   bench/run.sh restart [args]       bench/restart.py     (a restart putting N policies back)
#   bench/run.sh templates [args]     bench/templates.py   (template builds, disk, creates)
#   bench/run.sh pause [args]         bench/pause.py       (full and files-only pause: size, time)
#   bench/run.sh volumes [args]       bench/volumes.py     (volume create, creates with a mount, dd)
#   bench/run.sh transfer [args]      bench/transfer.py    (upload, download, streamed stdout)
#   bench/run.sh density [args]       bench/density.py     (N idle sandboxes: CPU, memory, latency)
#   bench/run.sh mcp [args]           bench/mcp_latency.py       (MCP run_code over stdio and HTTP)
#   bench/run.sh overload [args]      bench/overload.py    (bursts of 100 and 300 creates at once)
#   bench/run.sh pools [args]         bench/pools.py       (a quiet host's CPU with 20 templates' pools)
#   bench/run.sh cluster [args]       bench/cluster.py     (two gateways, two nodes: overhead, spread, loss)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/templates-dir.sh
if [ -n "${AIRLOCK_BENCH_DATA_DIR:-}" ]; then
  DATA_DIR=$AIRLOCK_BENCH_DATA_DIR
else
  DATA_DIR=$(mktemp -d /var/tmp/airlock-bench.XXXXXX)
  trap 'rm -rf --one-file-system "$DATA_DIR"' EXIT
fi
suite=${1:-all}
[ $# -gt 0 ] && shift
scripts/prepare.sh "$DATA_DIR" >/dev/null
case "$suite" in
  startup) .venv/bin/python bench/startup.py --data-dir "$DATA_DIR" "$@" ;;
  interpreter) .venv/bin/python bench/interpreter.py --data-dir "$DATA_DIR" "$@" ;;
  restart) .venv/bin/python bench/restart.py --data-dir "$DATA_DIR" "$@" ;;
  pause) .venv/bin/python bench/pause.py --data-dir "$DATA_DIR" "$@" ;;
  volumes) .venv/bin/python bench/volumes.py --data-dir "$DATA_DIR" "$@" ;;
  transfer) .venv/bin/python bench/transfer.py --data-dir "$DATA_DIR" "$@" ;;
  density) .venv/bin/python bench/density.py --data-dir "$DATA_DIR" "$@" ;;
  mcp) .venv/bin/python bench/mcp_latency.py --data-dir "$DATA_DIR" "$@" ;;
  overload) .venv/bin/python bench/overload.py --data-dir "$DATA_DIR" "$@" ;;
  pools) .venv/bin/python bench/pools.py --data-dir "$DATA_DIR" "$@" ;;
  cluster) .venv/bin/python bench/cluster.py "$@" ;;
  templates) scripts/install-test-deps.sh; .venv/bin/python bench/templates.py --data-dir "$DATA_DIR" "$@" ;;
  all)
    .venv/bin/python bench/startup.py --data-dir "$DATA_DIR"
    echo
    .venv/bin/python bench/interpreter.py --data-dir "$DATA_DIR" ;;
  *) echo "usage: bench/run.sh [startup|interpreter|restart|templates|pause|volumes|transfer|density|mcp|overload|pools|cluster|all] [args]" >&2; exit 2 ;;
esac
