"""The workers sparkddl runs in keep what lasts out of the full collection pyspark's daemon
runs after every task (sparkddl.task.frozen), and a scoring worker that drops its model for
another still frees it. Each case runs in a Python of its own: freezing is process-wide."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import gc, io, sys, types, weakref
    import pyarrow as pa
    import torch
    from sparkddl.ml import inference
    from sparkddl.ml.scoring import scorer
    from sparkddl.session.probe import _probe_function

    # the executors' check: what it imported is frozen
    print("probe", list(_probe_function("probe")([])) != [], gc.get_freeze_count() > 100_000)
    gc.unfreeze(); gc.collect()  # (Python 3.12's collector keeps a few hundred of its own frozen)

    class Net(torch.nn.Module):  # a model in a reference cycle: only the collector frees it
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)
            self.lin.owner = [self]

        def forward(self, x):
            return self.lin(x)
    mod = types.ModuleType("sparkddl_frozen_net"); mod.Net = Net; Net.__module__ = mod.__name__
    sys.modules[mod.__name__] = mod

    class Shipped:  # what a broadcast gives a task
        def __init__(self, seed):
            torch.manual_seed(seed)
            buf = io.BytesIO(); torch.save(Net().state_dict(), buf)
            self.value = inference.ModelPayload(
                {"kind": "import", "target": "sparkddl_frozen_net:Net", "kwargs": {}}, b"",
                buf.getvalue())

    attempt = [1]
    inference.task_attempt = lambda: attempt[0]  # the Spark task each call runs in
    score = scorer(Shipped(1), ["f"], "regression", 4, {"f": [3]}, "cpu", False, True)
    rows = lambda n: pa.array([[0.5, 1.0, 2.0]] * n, pa.list_(pa.float32()))
    tracked = len(gc.get_objects())
    score("prediction", (rows(5),))
    print("not in the task that built it", gc.get_freeze_count() < 10_000)
    attempt[0] = 2
    score("prediction", (rows(6),))  # the next task: the model and the imports are frozen
    print("next task", gc.get_freeze_count() > 100_000, len(gc.get_objects()) < tracked // 10)
    first = weakref.ref(inference._models[next(iter(inference._models))])
    gc.collect()
    print("frozen kept", first() is not None)
    other = scorer(Shipped(2), ["f"], "regression", 4, {"f": [3]}, "cpu", False, True)
    other("prediction", (rows(7),))  # another model: the first is freed, cycle and all
    print("dropped freed", first() is None, gc.get_freeze_count() < 10_000)
    other("prediction", (rows(8),))
    print("not again in the task that switched", gc.get_freeze_count() < 10_000)
    attempt[0] = 3
    other("prediction", (rows(9),))
    print("the task after", gc.get_freeze_count() > 100_000)
''')


def test_what_lasts_is_frozen_and_a_dropped_model_is_freed_all_the_same():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:7] == [
        "probe True True", "not in the task that built it True", "next task True True",
        "frozen kept True", "dropped freed True True",
        "not again in the task that switched True", "the task after True"], \
        done.stdout + done.stderr
