#!/usr/bin/env bash
# What the integration tests need beyond what Airlock needs (scripts/install-deps.sh): a real OCI
# registry (Debian's `docker-registry`, the CNCF distribution registry) and real OCI tools to
# make images and push them to it (`umoci`, `skopeo`), `htpasswd` (apache2-utils) for a registry
# that needs credentials, musl's compiler for an image with no glibc in it, and a headless
# Chromium that drives the web dashboard, and PostgreSQL (Debian's server, run by
# scripts/postgres.sh in a directory of its own) for the store's PostgreSQL tests, and s3s-fs
# (crates.io, built once by scripts/s3.sh) as a real S3 server for the object storage's tests,
# and kubectl (Debian's `kubernetes-client`, unless one is on PATH already) to render
# deploy/kubernetes for tests/deploy, and openssl, which makes the certificates of the cluster
# tests' TLS-only PostgreSQL.
# Safe to run again: it only installs what is missing.
set -euo pipefail

missing=()
for pkg in docker-registry skopeo umoci musl-tools apache2-utils chromium postgresql openssl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
command -v kubectl >/dev/null || missing+=(kubernetes-client)
if [ ${#missing[@]} -gt 0 ]; then
  echo "airlock: installing ${missing[*]} (for the tests)"
  apt-get update -qq
  # The packages would start a registry on :5000 and PostgreSQL's own cluster; the tests
  # start their own.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian's package also makes a cluster of its own and enables it at boot; the tests never
  # use it, so it stays off.
  if [[ " ${missing[*]} " == *" postgresql "* ]] && command -v systemctl >/dev/null; then
    systemctl disable --quiet postgresql 2>/dev/null || true
  fi
fi

# The older SDKs the suite also runs with (see test.sh), in a venv of their own.
"$(dirname "$0")/python-env.sh" "$(dirname "$0")/../.venv-compat" \
  "$(dirname "$0")/../tests/requirements-compat.txt"

# A real S3 server (built once, about 2 minutes, then cached under /var/cache/airlock/tools).
"$(dirname "$0")/s3.sh" install
