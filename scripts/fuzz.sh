#!/usr/bin/env bash
# Fuzzes Airlock's parsers with cargo fuzz (libFuzzer), a bounded run by default, as ./test.sh
# does:
#   connect_envelope  the Connect envelope decoder and the agent's streaming-request reader
#   rest_request      the server's REST bodies (with create's map and network checks), the list
#                     query and metadata filter, percent-decoding, and the proxy's routing
#   files_multipart   the agent's POST /files upload (multipart, octet-stream, gzip, paths)
# Targets are in fuzz/fuzz_targets/ (each file says what it checks), seeds in fuzz/corpus/<target>/.
#
# Builds every target, then runs the chosen ones side by side, each for FUZZ_RUNS inputs from the
# committed seeds. What a run adds to the corpus goes to a scratch directory that is deleted
# afterwards, so nothing under fuzz/corpus/ changes. Exits non-zero on any crash, panic, timeout
# or out-of-memory, printing the input that caused it (kept in fuzz/artifacts/<target>/, with the
# log). Reproduce one with:
#   fuzz/target/x86_64-unknown-linux-gnu/release/<target> <input>
#
#   scripts/fuzz.sh                                                 all targets, FUZZ_RUNS each
#   scripts/fuzz.sh rest_request files_multipart                    some targets
#   FUZZ_RUNS=0 FUZZ_SECONDS=600 scripts/fuzz.sh connect_envelope   a longer session: 10 minutes
#   FUZZ_RUNS=0 FUZZ_SECONDS=3600 FUZZ_CORPUS_OUT=/var/tmp/corpus FUZZ_ARGS=-fork=2 \
#     scripts/fuzz.sh rest_request            an hour on two cores, keeping the grown corpus
#
#   FUZZ_RUNS        inputs per target (0: no limit). Default: 200000 for files_multipart (each
#                    of its inputs is an upload to disk), ten times that for the others
#   FUZZ_SECONDS     seconds per target (default 0: no limit)
#   FUZZ_CORPUS_OUT  keep the inputs a run adds in FUZZ_CORPUS_OUT/<target>/ (e.g. to pick new
#                    seeds from after `-merge=1`)
#   FUZZ_ARGS        more libFuzzer flags, e.g. "-seed=1234" to repeat a run exactly
#   FUZZ_SANITIZER   none (default) or address
#
# Stable Rust: cargo fuzz needs a nightly compiler only for sanitizers (`-Zsanitizer=...`). With
# `--sanitizer none`, every flag it gives rustc is stable (`-Cpasses=sancov-module` and
# `-Cllvm-args=-sanitizer-coverage-*` for libFuzzer's coverage feedback), and libFuzzer itself is
# C++ that the libfuzzer-sys crate builds with the system's C++ compiler. The code under test is
# safe Rust, where AddressSanitizer has little to find; `--debug-assertions` turns on overflow
# checks and debug assertions instead. FUZZ_SANITIZER=address builds with ASan anyway, on stable,
# by setting RUSTC_BOOTSTRAP=1, which lets a stable rustc accept `-Z` flags: acceptable for a
# test-only build that never ships (into fuzz/target/asan, so the default build stays cached).
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(connect_envelope rest_request files_multipart host_parsers)
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  [[ -f fuzz/fuzz_targets/$t.rs ]] || { echo "fuzz: no target '$t' (have: ${ALL_TARGETS[*]})" >&2; exit 2; }
done
default_runs() { if [[ $1 == files_multipart ]]; then echo 200000; else echo 2000000; fi; }
SECONDS_EACH=${FUZZ_SECONDS:-0}
SANITIZER=${FUZZ_SANITIZER:-none}

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
if ! command -v c++ >/dev/null; then
  echo "fuzz: libFuzzer needs a C++ compiler: apt-get install g++" >&2
  exit 1
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
build=(cargo fuzz build --debug-assertions --sanitizer "$SANITIZER")
target_dir=fuzz/target
case $SANITIZER in
  none) ;;
  address)
    export RUSTC_BOOTSTRAP=1
    # As `cargo fuzz run` sets it: the bundled SQLite (rusqlite) trips ASan's ODR check.
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0
    target_dir=fuzz/target/asan
    build+=(--target-dir "$target_dir")
    ;;
  *) echo "fuzz: FUZZ_SANITIZER must be none or address" >&2; exit 2 ;;
esac
# cargo fuzz has no --locked: check the lock file first, so that the run never rewrites it.
if ! cargo metadata --locked --format-version 1 --filter-platform "$triple" \
    --manifest-path fuzz/Cargo.toml >/dev/null; then
  echo "fuzz: fuzz/Cargo.lock is out of date: run (cd fuzz && cargo update -w) and commit it" >&2
  exit 1
fi
echo "==> building fuzz targets (sanitizer: $SANITIZER)"
build_start=$(date +%s)
"${build[@]}"
echo "    built in $(($(date +%s) - build_start)) s"

# The corpus a run grows: thousands of small files, cheapest on tmpfs.
scratch_base=/dev/shm
[[ -d $scratch_base && -w $scratch_base ]] || scratch_base=${TMPDIR:-/tmp}
scratch=$(mktemp -d "$scratch_base/airlock-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

flags=(-print_final_stats=1 -timeout=30 -rss_limit_mb=2048)
[[ $SECONDS_EACH != 0 ]] && flags+=("-max_total_time=$SECONDS_EACH")
# shellcheck disable=SC2206
[[ -n ${FUZZ_ARGS:-} ]] && flags+=($FUZZ_ARGS)

limit() { if [[ $1 == 0 ]]; then echo "no limit"; else echo "$1"; fi; }
echo "==> fuzzing ${TARGETS[*]} (runs each: $(limit "${FUZZ_RUNS:-the default}"), seconds each: $(limit "$SECONDS_EACH"))"
run_start=$(date +%s)
pids=()
for t in "${TARGETS[@]}"; do
  out=${FUZZ_CORPUS_OUT:+$FUZZ_CORPUS_OUT/$t}
  out=${out:-$scratch/corpus/$t}
  mkdir -p "$out" "fuzz/artifacts/$t"
  runs=${FUZZ_RUNS:-$(default_runs "$t")}
  run_flags=("${flags[@]}")
  [[ $runs != 0 ]] && run_flags+=("-runs=$runs")
  # New inputs go to the first corpus directory; the seeds are only read.
  (exec "$target_dir/$triple/release/$t" "${run_flags[@]}" "-artifact_prefix=fuzz/artifacts/$t/" \
    "$out" "fuzz/corpus/$t" >"$scratch/$t.log" 2>&1) &
  pids+=($!)
done

failed=()
for i in "${!TARGETS[@]}"; do
  t=${TARGETS[$i]}
  log=$scratch/$t.log
  status=0
  wait "${pids[$i]}" || status=$?
  # files_multipart's scratch directory, in case the run died before removing it.
  rm -rf "/dev/shm/airlock-fuzz-files.${pids[$i]}" "${TMPDIR:-/tmp}/airlock-fuzz-files.${pids[$i]}"
  if [[ $status -eq 0 ]]; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -n1)
    echo "    $t: ok, $runs runs ($speed/s), $cov"
  else
    failed+=("$t")
    cp "$log" "fuzz/artifacts/$t/fuzz.log"
    echo "    $t: FAILED (exit $status); log: fuzz/artifacts/$t/fuzz.log"
    if grep -Eq "panicked at|ERROR: libFuzzer" "$log"; then
      grep -E -A12 "panicked at|ERROR: libFuzzer" "$log" | head -n 30 | sed 's/^/      /'
    else
      tail -n 20 "$log" | sed 's/^/      /'
    fi
    input=$(grep -Eo 'Test unit written to [^ ]+' "$log" | tail -n1 | sed 's/^Test unit written to //')
    if [[ -n $input ]]; then
      echo "    crashing input: $PWD/$input"
      echo "    reproduce: $target_dir/$triple/release/$t $input"
    fi
  fi
done
echo "    fuzzed in $(($(date +%s) - run_start)) s"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
