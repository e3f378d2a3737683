"""Runs one documentation page's Python examples as a reader would: in a fresh interpreter,
the blocks in page order in one namespace, each compiled under its page and line (so a
traceback names them). Standard library only: the examples bring their own imports.

    python tests/run_page.py blocks.json results.json

``blocks.json`` is a list of [file name, line, code]; ``results.json`` receives the
namespace's final numbers and strings (the README's ``accuracy``, for one)."""
import json
import sys


def main(blocks_file: str, results_file: str) -> None:
    namespace = {"__name__": "__main__"}  # functions pickled by value, as from a notebook
    for name, line, code in json.loads(open(blocks_file, encoding="utf-8").read()):
        exec(compile(code, f"{name}:{line}", "exec"), namespace)  # noqa: S102
    found = {k: v for k, v in namespace.items()
             if not k.startswith("_") and isinstance(v, (int, float, str))}
    with open(results_file, "w", encoding="utf-8") as out:
        json.dump(found, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
