"""The driver's optimizer check leaves torch._dynamo unloaded (about a second of CPU on a cold
fit, while the executors' check imports torch on the same cores) and puts torch's wrappers
back as they were. In a fresh interpreter: which modules are loaded is process-wide."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import json, sys
    import torch
    from sparkddl.errors import ConfigError
    from sparkddl.fit.inputs import fit_components
    from sparkddl import TorchEstimator

    out = {}
    model = torch.nn.Linear(4, 2)
    est = TorchEstimator(model=model, optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
                         loss="mse", featuresCol="x", labelCol="y", numWorkers=2,
                         store="file:///tmp/unused", lrScheduler="step",
                         lrSchedulerOptions={"step_size": 1})
    fit_components(model, est.getOrDefault(est.optimizer), "mse", est.train_config())
    out["loaded_after_check"] = "torch._dynamo" in sys.modules
    wrapped = torch.optim.Optimizer.add_param_group.__wrapped__
    out["left_set"] = getattr(wrapped, "__dynamo_disable", None) is not None
    try:
        fit_components(model, lambda p: torch.optim.SGD(p, lr=-1.0), "mse", est.train_config())
        out["bad"] = ""
    except ConfigError as exc:
        out["bad"] = str(exc)
    out["left_set_after_error"] = getattr(wrapped, "__dynamo_disable", None) is not None
    torch.optim.SGD(model.parameters(), lr=0.1).zero_grad()  # the user's own, after
    out["loaded_after_users"] = "torch._dynamo" in sys.modules
    out["cached_after_users"] = getattr(wrapped, "__dynamo_disable", None) not in (None, wrapped)
    print(json.dumps(out))
""")


@pytest.mark.timeout(120)
def test_the_optimizer_check_leaves_dynamo_unloaded_and_torch_as_it_was():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=100, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["loaded_after_check"] is False
    assert out["left_set"] is False and out["left_set_after_error"] is False
    assert "could not be built" in out["bad"] and "Invalid learning rate" in out["bad"]
    # the user's own optimizer afterwards: torch's wrapper imports dynamo and caches as before
    assert out["loaded_after_users"] is True and out["cached_after_users"] is True
