#!/usr/bin/env bash
# Create or refresh a virtualenv with a pinned stack: constraints.txt (with Petastorm) by default,
# or another constraints-<stack>.txt in SPARKDDL_CONSTRAINTS, into SPARKDDL_VENV. The file names
# its Python ("# python: 3.12", else 3.11) and any build tools ("# build-first: ...").
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
# the stack's Python: "# python: 3.12" in its constraints file (3.11 when it says none)
want_py=$(sed -n 's/^# python: *\([0-9.]*\).*/\1/p' "$constraints" | head -1)
want_py=${want_py:-3.11}
py=${PYTHON:-$("$root/scripts/find-python.sh" "$want_py")}
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
# the stack is tested with 69.5.1 (tests/unit/test_stack.py), so pip's resolver is not asked.
# A stack whose platform ships a package with no wheel for its Python (pandas 1.5.3 on 3.12)
# names its build tools on a "# build-first:" line: they go in first and the set builds
# against them (pip's isolated build of such an old sdist fails); pip's wheel cache keeps the
# result, so only a machine's first build pays for it
build_first=$(sed -n 's/^# build-first: *//p' "$constraints" | head -1)
if [ -n "$build_first" ]; then
  # shellcheck disable=SC2086 # a list of requirement specifiers
  "${pip[@]}" $build_first 2>&1 | quiet
  "${pip[@]}" --no-deps --no-build-isolation -r "$constraints" 2>&1 | quiet
else
  "${pip[@]}" --no-deps -r "$constraints" 2>&1 | quiet
fi
"${pip[@]}" --no-deps --no-build-isolation -e "$root" 2>&1 | quiet
# the Petastorm stack must import it; the other stacks have none
imports="sparkddl, torch, pyspark, pyarrow.dataset"
grep -q '^petastorm==' "$constraints" && imports="$imports, petastorm.reader"
"$venv/bin/python" -c "import $imports" \
  || { echo "the virtualenv at $venv is broken; delete it and retry" >&2; exit 1; }
# a venv inside the checkout (.venv-emr-7) must never be committed
[ -f "$venv/.gitignore" ] || echo '*' > "$venv/.gitignore"
echo "$want" > "$stamp"
