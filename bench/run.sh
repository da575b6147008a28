#!/usr/bin/env bash
# Runs the start-up benchmark: builds Airlock and the base template, then bench/startup.py
# against a server of its own. Stop any other `airlock serve` first (one server per host).
#   bench/run.sh [--iterations 50] [--idle 10]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${AIRLOCK_BENCH_DATA_DIR:-/var/tmp/airlock-bench}
scripts/install-deps.sh
cargo build --release --bins --quiet
target/release/airlock --data-dir "$DATA_DIR" template build base >/dev/null
exec .venv/bin/python bench/startup.py --data-dir "$DATA_DIR" "$@"
