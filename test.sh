#!/usr/bin/env bash
# The full test suite, one command: installs what is missing, builds, checks formatting and
# clippy's lints, runs the Rust unit tests,
# builds the `base` and `code-interpreter-v1` templates (cached by content hash), runs a short,
# bounded fuzz of the parsers that read untrusted bytes (scripts/fuzz.sh), then runs the
# integration tests: a real `airlock serve` with real gVisor sandboxes, driven by the pinned e2b
# and e2b-code-interpreter SDKs from PyPI.
#
#   AIRLOCK_TEST_DATA_DIR  data dir the integration tests use (default /var/tmp/airlock-test)
#   PYTEST_ARGS            extra pytest arguments, e.g. "-k files -x"
set -euo pipefail
cd "$(dirname "$0")"

export AIRLOCK_TEST_DATA_DIR=${AIRLOCK_TEST_DATA_DIR:-/var/tmp/airlock-test}

scripts/prepare.sh "$AIRLOCK_TEST_DATA_DIR"
echo "==> formatting and lints"
cargo fmt --all -- --check
cargo clippy --locked --all-targets --quiet -- -D warnings
echo "==> unit tests"
cargo test --locked --release --workspace --quiet
echo "==> fuzz (bounded)"; scripts/fuzz.sh
echo "==> integration tests"
# shellcheck disable=SC2086
.venv/bin/python -m pytest tests/integration ${PYTEST_ARGS:-}
