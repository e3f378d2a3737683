"""Runs documentation pages' Python examples as a reader would: in a fresh interpreter, each
page's blocks in page order in one namespace of its own, each block compiled under its page and
line (so a traceback names them). Standard library only: the examples bring their own imports.

    python tests/run_pages.py pages.json results.json

``pages.json`` is a list of [page, [[file name, line, code], ...]]. The pages run one after
another in the same interpreter (one Java and one torch import for all, the costs a reader
pays once per notebook or script), but nothing a page made reaches the next: each starts in
an empty folder of its own with the environment, ``sys.argv`` and ``sys.path`` the process
started with, and the Spark session a page started is stopped after it, so a page that leans
on an earlier page's session, variable, import or folder fails as it would for a reader.
``results.json`` receives, per page, the namespace's final numbers and strings (the README's
``accuracy``, for one) or the traceback that ended it."""
import json
import os
import sys
import tempfile
import traceback


def _stop_spark() -> None:
    """Stop whatever Spark session or context the page left, so the next page starts its own."""
    pyspark = sys.modules.get("pyspark")
    if pyspark is None:
        return
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()


def run_page(blocks: list, folder: str) -> dict:
    environ, argv, path = dict(os.environ), list(sys.argv), list(sys.path)
    os.chdir(folder)
    namespace = {"__name__": "__main__"}  # functions pickled by value, as from a notebook
    try:
        for name, line, code in blocks:
            exec(compile(code, f"{name}:{line}", "exec"), namespace)  # noqa: S102
        found = {k: v for k, v in namespace.items()
                 if not k.startswith("_") and isinstance(v, (int, float, str))}
        outcome = {"ok": True, "found": found}
    except BaseException:  # noqa: BLE001 - the page's failure is the result
        outcome = {"ok": False, "error": traceback.format_exc()}
    finally:
        try:
            _stop_spark()
        except Exception:  # noqa: BLE001
            outcome = {"ok": False, "error": "stopping the page's Spark session failed:\n"
                       + traceback.format_exc()}
        os.environ.clear()
        os.environ.update(environ)
        sys.argv[:], sys.path[:] = argv, path
    return outcome


def main(pages_file: str, results_file: str) -> None:
    results = {}
    with open(pages_file, encoding="utf-8") as f:
        pages = json.load(f)
    for page, blocks in pages:
        print(f"=== {page}", flush=True)
        results[page] = run_page(blocks, tempfile.mkdtemp(prefix="reader-", dir=os.getcwd()))
        with open(results_file, "w", encoding="utf-8") as out:  # what ran so far, each time
            json.dump(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
