#!/usr/bin/env bash
# The full test suite, one command: installs what is missing, builds, checks formatting and
# clippy's lints, runs the Rust unit tests and the store's tests on a private PostgreSQL, starts a
# private S3 server (scripts/s3.sh) for the object storage's tests, Rust and integration ones,
# renders deploy/kubernetes and checks it against the Kubernetes API's schemas (tests/deploy),
# builds the `base` and `code-interpreter-v1` templates (cached by content hash), runs a short,
# bounded fuzz of the parsers that read untrusted bytes (scripts/fuzz.sh), then runs the
# integration tests: a real `airlock serve` with real gVisor sandboxes, driven by the pinned e2b
# and e2b-code-interpreter SDKs from PyPI, then the suites of the SDK's own surface again with
# the older ones that tests/requirements-compat.txt pins (less the tests marked `newest_sdk`).
# Between the two, tests/cluster starts a whole cluster on this machine (PostgreSQL, S3, two
# nodes in network namespaces of their own, two gateways) and drives it with the SDK.
# A skipped test fails
# the run unless tests/integration/conftest.py's ALLOWED_SKIPS names it, and so does an unknown
# marker (--strict-markers, in tests/integration/pytest.ini).
#
#   AIRLOCK_TEST_DATA_DIR  data dir the integration tests use (default: a fresh private one,
#                          removed afterwards)
#   AIRLOCK_TEMPLATES_DIR  where built templates are cached between runs, shared with ./run.sh
#                          (default /var/cache/airlock/templates)
#   PYTEST_ARGS            extra pytest arguments, e.g. "-k files -x"
set -euo pipefail
cd "$(dirname "$0")"

. scripts/templates-dir.sh
own_data_dir="" postgres_dir="" s3_dir=""
stop_postgres() {
  if [ -n "$postgres_dir" ]; then
    scripts/postgres.sh stop "$postgres_dir" || true
    rm -rf "$postgres_dir"
    postgres_dir=""
  fi
}
cleanup() {
  stop_postgres
  if [ -n "$s3_dir" ]; then scripts/s3.sh stop "$s3_dir" || true; rm -rf "$s3_dir"; fi
  # --one-file-system: never into anything a failed run left mounted there.
  if [ -n "$own_data_dir" ]; then rm -rf --one-file-system "$own_data_dir"; fi
}
trap cleanup EXIT
if [ -z "${AIRLOCK_TEST_DATA_DIR:-}" ]; then
  AIRLOCK_TEST_DATA_DIR=$(mktemp -d /var/tmp/airlock-test.XXXXXX)
  own_data_dir=$AIRLOCK_TEST_DATA_DIR
fi
export AIRLOCK_TEST_DATA_DIR

# A step's heading, with how long the run has taken so far (where CI's time goes).
phase() { echo "==> $* [$((SECONDS / 60))m$((SECONDS % 60))s in]"; }

scripts/prepare.sh "$AIRLOCK_TEST_DATA_DIR"
scripts/install-test-deps.sh
phase "formatting and lints"
cargo fmt --all -- --check
cargo clippy --locked --all-targets --quiet -- -D warnings
phase "the Kubernetes manifests (rendered by kubectl kustomize, validated offline)"
.venv/bin/python -m pytest tests/deploy -q
phase "unit tests"
cargo test --locked --release --workspace --quiet
# Runs the ignored unit tests of PACKAGE (airlock-core by default) named by FILTER (they need a
# server this script started, or root), and fails if none ran: a renamed test module must not
# make the step pass by running nothing.
ignored_tests() {
  local what=$1 filter=$2 package=${3:-airlock-core} out
  out=$(cargo test --locked --release -p "$package" --lib "$filter" -- --ignored 2>&1) ||
    { echo "$out"; exit 1; }
  grep "test result" <<<"$out"
  grep -q "test result: ok. [1-9]" <<<"$out" || { echo "no $what test ran" >&2; exit 1; }
}
phase "the driver's tests that need root"
ignored_tests root root_ airlock-gvisor
phase "the store on PostgreSQL"
postgres_dir=$(mktemp -d /var/tmp/airlock-postgres.XXXXXX)
postgres_env=$(scripts/postgres.sh start "$postgres_dir")
eval "$postgres_env"
ignored_tests PostgreSQL postgres
stop_postgres
phase "object storage on a real S3 server (kept for the integration tests)"
s3_dir=$(mktemp -d /var/tmp/airlock-s3.XXXXXX)
s3_env=$(scripts/s3.sh start "$s3_dir")
eval "$s3_env"
ignored_tests S3 s3_
phase "fuzz (bounded)"; scripts/fuzz.sh
phase "integration tests"
# shellcheck disable=SC2086
.venv/bin/python -m pytest tests/integration ${PYTEST_ARGS:-}
phase "many machines: two gateways and two nodes on this machine (scripts/cluster.sh)"
# shellcheck disable=SC2086
.venv/bin/python -m pytest tests/cluster ${PYTEST_ARGS:-}
phase "integration tests with the older SDKs of tests/requirements-compat.txt"
# What differs between SDK versions is the SDK's own surface: sandboxes, commands, files, the code
# interpreter, pause and resume, logs and metrics, templates and volumes. The suites of the server's
# own guards (escapes, network, host, limits, tenants, quotas, restarts, pauses kept in memory)
# and of Airlock's own clients (CLI, MCP, dashboard, airlock-tools) test the server, not the SDK,
# and run once above; so do the tests marked `server_only` in the suites that run again.
compat_suites=()
for suite in auth auto_resume code_interpreter commands file_metadata files images lifecycle \
  logs metrics pause template_tags templates volume_mounts volumes; do
  compat_suites+=("tests/integration/test_$suite.py")
done
# shellcheck disable=SC2086
.venv-compat/bin/python -m pytest "${compat_suites[@]}" -m "not newest_sdk and not server_only" \
  ${PYTEST_ARGS:-}
phase "all passed"
