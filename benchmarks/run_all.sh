#!/usr/bin/env bash
# Run every benchmark in benchmarks/ in turn (what `make bench` runs). Each writes JSON, a
# markdown table and a PNG to benchmarks/results/.
#
#   benchmarks/run_all.sh                       every benchmark
#   benchmarks/run_all.sh side_by_side scaling  only these (names without .py)
#   benchmarks/run_all.sh --list                what would run, in order
#
# A benchmark is any benchmarks/*.py with a `__main__` block (common.py is a helper). The
# ones below run first, in this order; any others follow alphabetically. A failing benchmark
# does not stop the others; the exit status is 1 if any failed.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
PY="${PY:-$root/.venv/bin/python}"
# executors must run the same Python as the driver; local runs stay on loopback
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PY}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$PY}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"

first=(run_overhead reader_throughput side_by_side scaling allreduce_bandwidth)

discover() {
    local name
    for name in "${first[@]}"; do
        [[ -f "$here/$name.py" ]] && echo "$name"
    done
    for path in "$here"/*.py; do
        name="$(basename "$path" .py)"
        grep -q '__name__ == "__main__"' "$path" || continue
        [[ " ${first[*]} " == *" $name "* ]] && continue
        echo "$name"
    done
}

if [[ "${1:-}" == "--list" ]]; then
    discover
    exit 0
fi
if [[ $# -gt 0 ]]; then
    names=("$@")
else
    mapfile -t names < <(discover)
fi

failed=()
summary=()
for name in "${names[@]}"; do
    if [[ ! -f "$here/$name.py" ]]; then
        echo "no benchmark named $name (benchmarks/$name.py); run with --list" >&2
        failed+=("$name")
        continue
    fi
    echo "=== $name"
    start=$SECONDS
    if "$PY" "$here/$name.py"; then
        summary+=("$name: $((SECONDS - start)) s")
    else
        summary+=("$name: FAILED after $((SECONDS - start)) s")
        failed+=("$name")
    fi
done

if [[ ${#summary[@]} -gt 0 ]]; then
    echo "=== wall time per benchmark"
    printf '  %s\n' "${summary[@]}"
fi
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
