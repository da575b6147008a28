#!/usr/bin/env bash
# Runs the benchmarks against a server of their own (stop any other `airlock serve` first: one
# server per host). Builds Airlock and the templates first (scripts/prepare.sh).
#   bench/run.sh                      both suites
#   bench/run.sh startup [args]       bench/startup.py     (create → first command, idle memory)
#   bench/run.sh interpreter [args]   bench/interpreter.py (run_code round trips)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${AIRLOCK_BENCH_DATA_DIR:-/var/tmp/airlock-bench}
suite=${1:-all}
[ $# -gt 0 ] && shift
scripts/prepare.sh "$DATA_DIR" >/dev/null
case "$suite" in
  startup) exec .venv/bin/python bench/startup.py --data-dir "$DATA_DIR" "$@" ;;
  interpreter) exec .venv/bin/python bench/interpreter.py --data-dir "$DATA_DIR" "$@" ;;
  all)
    .venv/bin/python bench/startup.py --data-dir "$DATA_DIR"
    echo
    .venv/bin/python bench/interpreter.py --data-dir "$DATA_DIR" ;;
  *) echo "usage: bench/run.sh [startup|interpreter|all] [args]" >&2; exit 2 ;;
esac
