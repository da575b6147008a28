#!/usr/bin/env bash
# Usage: scripts/python-env.sh VENV REQUIREMENTS
# Makes VENV a Python venv with exactly the `name==version` pins of REQUIREMENTS: created when
# missing, and installed again when any pin differs from what it holds (so a changed pin never
# leaves an old SDK in place).
set -euo pipefail
venv=$1 requirements=$2
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" - "$requirements" <<'PY'
import importlib.metadata as metadata, sys
for line in open(sys.argv[1]):
    name, _, version = line.split("#")[0].strip().partition("==")
    if name:
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            sys.exit(1)
        if installed != version:
            sys.exit(1)
PY
then
  echo "airlock: installing $(tr '\n' ' ' < "$requirements")into $venv"
  "$venv/bin/pip" install -q -r "$requirements"
fi
