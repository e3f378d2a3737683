#!/usr/bin/env bash
# Print the path of a Python X.Y interpreter (scripts/find-python.sh 3.12): pythonX.Y on PATH
# if it runs (a pyenv shim may be on PATH and still refuse), else pyenv's install of it.
set -euo pipefail
want=$1
for cand in "python$want" "$(pyenv root 2>/dev/null)/versions/$want"*/bin/"python$want"; do
  if command -v "$cand" >/dev/null 2>&1 &&
      "$cand" -c "import sys; sys.exit('%d.%d' % sys.version_info[:2] != '$want')" 2>/dev/null; then
    command -v "$cand"
    exit 0
  fi
done
echo "no Python $want found (python$want on PATH or under pyenv); set PYTHON=/path/to/python$want" >&2
exit 1
