#!/usr/bin/env bash
# Installs what Airlock needs on a Debian 12 host (tested) or an Ubuntu 24.04 host (untested):
# a C compiler (SQLite is built from source), gVisor's runsc (Debian: bookworm-backports;
# Ubuntu: gVisor's own apt repository), debootstrap for the built-in templates' Debian root, npm (for the JavaScript SDK's tests),
# iproute2, nftables and conntrack for per-sandbox networking, e2fsprogs for per-sandbox disks, and a
# Python venv with the pinned e2b SDK for the demo and the integration tests. Raises the
# kernel's pid_max, which a thousand sandboxes need.
# Safe to run again: it only installs what is missing.
set -euo pipefail

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "airlock: this step needs root (runsc, network namespaces and mounts are privileged)." >&2
    exit 1
  fi
}

add_backports() {
  # The mirror serves bookworm-backports but the default sources list does not name it.
  if grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    return
  fi
  local uri
  uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/debian.sources | head -n1 | awk '{print $2}')
  if [ -z "$uri" ]; then
    uri=$(grep -hs '^deb ' /etc/apt/sources.list | grep -v security | head -n1 | awk '{print $2}')
  fi
  uri=${uri:-http://deb.debian.org/debian}
  cat > /etc/apt/sources.list.d/airlock-backports.sources <<SRC
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  APT_UPDATED=0
}

# Ubuntu has no runsc package: gVisor publishes its own apt repository, signed with its key.
GVISOR_REPO="https://storage.googleapis.com/gvisor/releases"
GVISOR_KEY_URL="https://gvisor.dev/archive.key"
GVISOR_KEYRING=/usr/share/keyrings/gvisor-archive-keyring.gpg
add_gvisor_repo() {
  [ -f /etc/apt/sources.list.d/gvisor.list ] && return
  echo "airlock: adding gVisor's apt repository ($GVISOR_REPO) for runsc"
  apt_install curl gnupg ca-certificates
  if ! curl -fsSL "$GVISOR_KEY_URL" | gpg --dearmor --yes -o "$GVISOR_KEYRING"; then
    echo "airlock: could not fetch gVisor's signing key from $GVISOR_KEY_URL; install runsc" \
      "yourself (https://gvisor.dev/docs/user_guide/install/) and run this again." >&2
    exit 1
  fi
  echo "deb [arch=$(dpkg --print-architecture) signed-by=$GVISOR_KEYRING] $GVISOR_REPO release main" \
    > /etc/apt/sources.list.d/gvisor.list
  APT_UPDATED=0
}

# Cargo.toml's rust-version.
RUST_MIN=1.85
check_rust() {
  if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
    echo "airlock: Rust is missing: install Rust $RUST_MIN or newer (https://rustup.rs:" \
      "curl --proto '=https' -sSf https://sh.rustup.rs | sh), then run this again." >&2
    exit 1
  fi
  local have
  have=$(rustc --version | awk '{print $2}')
  if [ "$(printf '%s\n%s\n' "$RUST_MIN" "$have" | sort -V | head -n1)" != "$RUST_MIN" ]; then
    echo "airlock: Rust $have is too old: Airlock needs $RUST_MIN or newer" \
      "(\`rustup update stable\`; distribution packages are often older)." >&2
    exit 1
  fi
}

APT_UPDATED=${APT_UPDATED:-0}
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$APT_UPDATED" -eq 0 ]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  echo "airlock: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

need_root
check_rust
. /etc/os-release
case "${ID:-}:${VERSION_CODENAME:-}" in
  debian:bookworm) add_backports ;;
  ubuntu:*) ;;
  *) echo "airlock: ${PRETTY_NAME:-this system} is not Debian 12 or Ubuntu 24.04; trying anyway" >&2 ;;
esac
# cc and make: the bundled SQLite is compiled when Airlock is built.
command -v cc >/dev/null || apt_install build-essential
apt_install debootstrap iproute2 nftables conntrack e2fsprogs util-linux ca-certificates python3-venv curl
command -v npm >/dev/null || apt_install npm
if ! command -v runsc >/dev/null; then
  if [ "${ID:-}" = ubuntu ]; then
    add_gvisor_repo
    apt_install runsc
  else
    if [ "$APT_UPDATED" -eq 0 ]; then apt-get update -qq; APT_UPDATED=1; fi
    echo "airlock: installing runsc from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports runsc >/dev/null
  fi
fi

# Every sandbox holds about 24 threads on the host (runsc's sandbox and gofer are Go programs),
# and each takes a pid: the kernel's default pid_max (32768) stopped a host at ~950 sandboxes.
PID_MAX=4194304
if [ "$(cat /proc/sys/kernel/pid_max)" -lt "$PID_MAX" ]; then
  if sysctl -q -w kernel.pid_max="$PID_MAX" 2>/dev/null; then
    echo "kernel.pid_max = $PID_MAX" > /etc/sysctl.d/60-airlock.conf
    echo "airlock: raised kernel.pid_max to $PID_MAX (saved in /etc/sysctl.d/60-airlock.conf)"
  else
    echo "airlock: could not raise kernel.pid_max to $PID_MAX; the host holds fewer than ~1,000 sandboxes" >&2
  fi
fi

# The Python SDK, pinned, in a venv under the repo (used by the demo, the tests and the benchmark).
"$(dirname "$0")/python-env.sh" "${AIRLOCK_VENV:-"$(dirname "$0")/../.venv"}" \
  "$(dirname "$0")/../tests/requirements.txt"

# The JavaScript SDK, pinned by tests/js/package-lock.json: the tests drive it with Node.
JS_DIR=$(cd "$(dirname "$0")/../tests/js" && pwd)
want=$(node -p "require('$JS_DIR/package.json').dependencies.e2b")
have=$(node -p "require('$JS_DIR/node_modules/e2b/package.json').version" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
  (cd "$JS_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi
