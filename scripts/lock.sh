#!/usr/bin/env bash
# Write (or rewrite) the exact pins of a stack: scripts/lock.sh constraints-<stack>.txt
# The file's header is kept: its "# python:" line, its "# core:" line (the platform's own
# versions, which the lock must hold as they are) and any "# build-first:" line. Everything
# else sparkddl and its tests need is resolved by pip around the core, in a scratch venv of
# that Python, and frozen below the header.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
file=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
core=$(sed -n 's/^# core: *//p' "$file" | head -1)
[ -n "$core" ] || { echo "$file has no '# core: ...' line (the platform's own pins)" >&2; exit 1; }
build_first=$(sed -n 's/^# build-first: *//p' "$file" | head -1)
header=$(sed -n '/^#/!q;p' "$file")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
py=$(sed -n 's/^# python: *\([0-9.]*\).*/\1/p' "$file" | head -1)
"$("$root/scripts/find-python.sh" "${py:-3.11}")" -m venv "$scratch/venv"
pip=("$scratch/venv/bin/python" -m pip install -q --disable-pip-version-check)
# shellcheck disable=SC2086 # lists of requirement specifiers
{
  [ -z "$build_first" ] || "${pip[@]}" $build_first
  "${pip[@]}" $(echo "$core" | tr ' ' '\n' | grep '^torch==')
  printf '%s\n' $core $build_first > "$scratch/core.txt"
  "${pip[@]}" ${build_first:+--no-build-isolation} -c "$scratch/core.txt" $core wheel \
    -e "$root[test,connect,mlflow,metrics,delta,iceberg]"
}
{ printf '%s\n' "$header"; "$scratch/venv/bin/python" -m pip freeze --all --exclude-editable | grep -v "^pip==" | sed "s/+cpu$//" | sort -f; } \
  > "$file.new"
mv "$file.new" "$file"
echo "locked $(grep -c '==' "$file") packages in $(basename "$file")"
