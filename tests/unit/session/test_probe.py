"""The driver's side of the executors' Python check (sparkddl/session/probe.py): what a
probe's report or failure turns into. The probe itself runs in
tests/integration/test_first_fit.py (classic) and test_connect.py (Connect)."""
from __future__ import annotations

import torch

import sparkddl
from sparkddl.session.probe import _compare, _failure, _probe_function


def test_the_check_compares_versions_with_the_driver():
    same = {"python": "/x/python", "sparkddl": sparkddl.__version__, "torch": torch.__version__}
    assert _compare(same) == []
    older = {**same, "torch": "2.4.1"}
    assert _compare(older) == [f"has torch 2.4.1 where the driver has {torch.__version__}"]
    missing = {**same, "sparkddl": None, "sparkddl_error": "ModuleNotFoundError: no"}
    assert _compare(missing) == ["cannot import sparkddl (ModuleNotFoundError: no)"]


def test_a_probe_that_could_not_run_says_why_in_a_few_words():
    worker = ("org.apache.spark.api.python.PythonException: Traceback (most recent call "
              "last):\n  File \"worker.py\", line 1\nModuleNotFoundError: No module named "
              "'pyarrow'\n\tat org.apache.spark.api.python.BasePythonRunner")
    assert _failure(worker) == "cannot import 'pyarrow'"
    other = "Traceback\n  File x\nRuntimeError: Python in worker has different version 3.10"
    assert _failure(other) == "failed: RuntimeError: Python in worker has different version 3.10"


def test_the_probe_is_sent_by_value_and_reports_what_it_found():
    import json

    from pyspark import cloudpickle
    probe = _probe_function("probe")
    assert probe.__module__ == "sparkddl_executor_probe"
    # by value: unpickling needs no sparkddl module, only the standard library
    assert b"sparkddl.session" not in cloudpickle.dumps(probe)
    [text] = list(probe(iter([0])))
    found = json.loads(text)
    assert found["sparkddl"] == sparkddl.__version__ and found["torch"] == torch.__version__
