#!/usr/bin/env bash
# Gets a host ready to run Airlock against DATA_DIR: installs what is missing, builds the release
# binaries, and builds the built-in templates from templates/ (each step cached: a few minutes
# the first time, seconds after that). Used by ./run.sh, ./test.sh and bench/run.sh.
#   scripts/prepare.sh DATA_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${1:?usage: scripts/prepare.sh DATA_DIR}

scripts/install-deps.sh
echo "==> building Airlock (the first build takes a few minutes)"
cargo build --locked --release --bins
# The agent runs inside every template, and an image's libc may be older than ours or musl:
# link it statically (glibc's static-pie; the agent reads /etc/passwd itself, so no NSS).
host=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS='-C target-feature=+crt-static' \
  cargo build --locked --release -p airlock-agent --target "$host"
install -m 0755 "target/$host/release/airlock-agent" target/release/airlock-agent
echo "==> building the built-in templates (first time: a few minutes; cached after that)"
target/release/airlock --data-dir "$DATA_DIR" serve --prepare-only
