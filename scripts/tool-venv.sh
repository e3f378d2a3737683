#!/usr/bin/env bash
# Create or refresh a tool's virtualenv, .venv-NAME, from constraints-NAME.txt (the exact pins,
# installed with --no-deps); a no-op when the pins have not changed and BINARY is there.
#   scripts/tool-venv.sh NAME BINARY CHECK...   (CHECK: a command run in the venv's bin/ after
#   installing, which must succeed, e.g. `python -c "import mkdocs"`)
set -euo pipefail
name=$1 binary=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv-$name
pins=$root/constraints-$name.txt
stamp="$venv/.sparkddl-stamp"
want=$(sha256sum "$pins" | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/$binary" ]; then
  exit 0
fi
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || py=python3
echo "setting up $venv ($name tools from $(basename "$pins"))" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$pins" 2>&1 \
  | grep -v "is ignored: it is neither" || true
(cd "$venv/bin" && PATH="$venv/bin:$PATH" "$@" >/dev/null) \
  || { echo "the virtualenv at $venv is broken; delete it and retry" >&2; exit 1; }
[ -f "$venv/.gitignore" ] || echo '*' > "$venv/.gitignore"
echo "$want" > "$stamp"
