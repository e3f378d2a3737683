#!/usr/bin/env bash
# Create or refresh a virtualenv with a pinned stack: constraints.txt (with Petastorm) by default,
# or another file in SPARKDDL_CONSTRAINTS (constraints-current.txt), into SPARKDDL_VENV.
# Idempotent: a stamp of the dependency files makes it a no-op when nothing changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SPARKDDL_VENV:-$root/.venv}
constraints=${SPARKDDL_CONSTRAINTS:-$root/constraints.txt}
stamp="$venv/.sparkddl-stamp"
want=$(cat "$constraints" "$root/setup.cfg" "$root/pyproject.toml" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
py=${PYTHON:-}
if [ -z "$py" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      py=$cand; break
    fi
  done
fi
[ -n "$py" ] || { echo "sparkddl needs Python 3.11 (python3.11 not found); set PYTHON=/path/to/python3.11" >&2; exit 1; }
command -v java >/dev/null || { echo "Spark needs Java 17 (java not found on PATH)" >&2; exit 1; }
echo "setting up $venv (pinned stack from $(basename "$constraints"))" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# (a refresh of an existing venv: torch's install first lifts setuptools past petastorm's <70,
# which the pinned set's install right after puts back to 69.5.1)
quiet() { grep -v -E "is ignored: it is neither|dependency resolver does not|requires setuptools(>=77|<70)" || true; }
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build
"${pip[@]}" "$(grep -E '^torch==' "$constraints")" 2>&1 | quiet
# then the exact pinned set, as a lock: torch declares setuptools>=77 while petastorm needs <70;
# the stack is tested with 69.5.1 (tests/unit/test_stack.py), so pip's resolver is not asked
"${pip[@]}" --no-deps -r "$constraints" 2>&1 | quiet
"${pip[@]}" --no-deps --no-build-isolation -e "$root" 2>&1 | quiet
# the Petastorm stack must import it; the current stack (constraints-current.txt) has none
imports="sparkddl, torch, pyspark, pyarrow.dataset"
grep -q '^petastorm==' "$constraints" && imports="$imports, petastorm.reader"
"$venv/bin/python" -c "import $imports" \
  || { echo "the virtualenv at $venv is broken; delete it and retry" >&2; exit 1; }
# a venv inside the checkout (.venv-current) must never be committed
[ -f "$venv/.gitignore" ] || echo '*' > "$venv/.gitignore"
echo "$want" > "$stamp"
