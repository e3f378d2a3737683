#!/usr/bin/env bash
# Create or refresh .venv-lint (ruff, pyright and the Node.js pyright runs on) from
# constraints-lint.txt, the exact pins, installed with --no-deps; a no-op when the pins have not
# changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv-lint
stamp="$venv/.sparkddl-stamp"
want=$(sha256sum "$root/constraints-lint.txt" | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/ruff" ]; then
  exit 0
fi
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || py=python3
echo "setting up $venv (linters from constraints-lint.txt)" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  -r "$root/constraints-lint.txt" 2>&1 | grep -v "is ignored: it is neither" || true
"$venv/bin/ruff" --version >/dev/null && "$venv/bin/pyright" --version >/dev/null \
  || { echo "the virtualenv at $venv is broken; delete it and retry" >&2; exit 1; }
[ -f "$venv/.gitignore" ] || echo '*' > "$venv/.gitignore"
echo "$want" > "$stamp"
