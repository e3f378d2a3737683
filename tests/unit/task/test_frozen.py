"""The workers sparkddl runs in keep what lasts out of the full collection pyspark's daemon
runs after every task (sparkddl.task.frozen), and a scoring worker that drops its model for
another still frees it. Each case runs in a Python of its own: freezing is process-wide."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import gc, io, sys, types, weakref
    import torch
    from sparkddl.ml.inference import ModelPayload, settle
    from sparkddl.session.probe import _probe_function

    # the executors' check: what it imported is frozen
    print("probe", list(_probe_function("probe")([])) != [], gc.get_freeze_count() > 100_000)
    gc.unfreeze(); gc.collect()

    class Net(torch.nn.Module):  # a model in a reference cycle: only the collector frees it
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)
            self.lin.owner = [self]

        def forward(self, x):
            return self.lin(x)
    mod = types.ModuleType("sparkddl_frozen_net"); mod.Net = Net; Net.__module__ = mod.__name__
    sys.modules[mod.__name__] = mod

    def payload(seed):
        torch.manual_seed(seed)
        buf = io.BytesIO(); torch.save(Net().state_dict(), buf)
        return ModelPayload({"kind": "import", "target": "sparkddl_frozen_net:Net",
                             "kwargs": {}}, b"", buf.getvalue())

    tracked = len(gc.get_objects())
    first = payload(1).module()
    first(torch.ones(4, 3))
    settle()  # after its first batch: what is alive now is frozen
    print("settled", gc.get_freeze_count() > 100_000, len(gc.get_objects()) < tracked // 10)
    gone = weakref.ref(first); del first
    gc.collect()
    print("frozen kept", gone() is not None)
    second = payload(2).module()  # another model: the first is freed, cycle and all
    # (Python 3.12's collector keeps a few hundred objects of its own frozen)
    print("dropped freed", gone() is None, gc.get_freeze_count() < 10_000)
    settle(); settle()
    print("settled again", gc.get_freeze_count() > 100_000)
''')


def test_what_lasts_is_frozen_and_a_dropped_model_is_freed_all_the_same():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:5] == [
        "probe True True", "settled True True", "frozen kept True", "dropped freed True True",
        "settled again True"], done.stdout + done.stderr
