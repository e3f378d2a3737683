"""Every strategy trains digits with 2 workers on real Spark to held-out accuracy >= 0.93,
and its history says what it cost."""
from __future__ import annotations

import pytest
import torch

from sparkddl import ConfigError, TorchEstimator
from sparkddl.strategies.fsdp import fsdp_problem
from sparkddl.strategies.ssp_wire import store_queue_problem
from tests.integration.digits import accuracy, digits_df, mlp

CASES = {
    "allreduce": ("allreduce", {}),
    "allreduce-no-overlap": ("allreduce", {"overlap": False}),
    "fp16": ("allreduce", {"compression": "fp16"}),
    "bf16": ("allreduce", {"compression": "bf16"}),
    "powersgd": ("allreduce", {"compression": "powersgd", "rank": 4}),
    "topk": ("allreduce", {"compression": "topk", "ratio": 0.1}),
    "sign": ("allreduce", {"compression": "sign"}),
    "local_sgd": ("local_sgd", {"period": 4}),
    "dynamic_averaging": ("dynamic_averaging", {"threshold": 0.01, "check_every": 4}),
    "gossip": ("gossip", {"topology": "ring"}),
    "ssp": ("ssp", {"staleness": 2}),
    "fsdp": ("fsdp", {"min_params": 1000}),  # each Linear a shard unit of its own
}


@pytest.fixture
def digits_split(spark_local):
    df = digits_df(spark_local)
    return df.filter("split != 0"), df.filter("split = 0")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_strategy_trains_digits(spark_local, digits_split, tmp_path, case):
    name, options = CASES[case]
    train, test = digits_split
    refused = {"ssp": (store_queue_problem(), "strategy='ssp' needs TCPStore.queue_push"),
               "fsdp": (fsdp_problem("cpu"), r"strategy='fsdp' runs on CUDA only with torch")}
    problem, message = refused.get(name, (None, ""))
    if problem:  # the oldest stack's torch
        with pytest.raises(ConfigError, match=message):
            TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                           loss=torch.nn.CrossEntropyLoss(), numWorkers=2, store=str(tmp_path),
                           strategy=name, strategyOptions=options, progress=False).fit(train)
        return
    model = TorchEstimator(
        model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
        loss=torch.nn.CrossEntropyLoss(), batchSize=32, epochs=15, numWorkers=2,
        validation=0.2, store=str(tmp_path), strategy=name, strategyOptions=options,
        progress=False).fit(train)  # finalWeights="best": mid-training snapshots count too
    assert accuracy(model.transform(test)) >= 0.93
    assert all(r["comm_bytes"] > 0 and r["comm_calls"] > 0 for r in model.history)
    if name == "dynamic_averaging":
        assert all("syncs" in r for r in model.history)
    if name == "gossip":
        assert all(r["consensus_distance"] >= 0 for r in model.history)


@pytest.mark.timeout(300)
def test_a_strategy_defined_in_a_notebook_trains_on_the_executors(spark_local, digits_split,
                                                                   tmp_path):
    """A class defined in a function (as in a notebook cell) is pickled by value: the fit
    ships it, so the ranks, which cannot import it, register and run it."""
    from sparkddl import strategies
    from sparkddl.strategies.tensors import average_, broadcast_module, model_state

    class EpochAverage(strategies.Strategy):
        """Ranks train alone and average their models at each epoch's end."""
        name = "epoch_average"
        replicas_differ = True

        def wrap(self, module):
            broadcast_module(module)
            self.state = model_state(module)
            return module

        def end_epoch(self):
            average_(self.state, self.comm)
            return super().end_epoch()

        def finalize(self, module):
            average_(self.state, self.comm)

    train, test = digits_split
    before = dict(strategies.REGISTRY)
    strategies.register(EpochAverage)
    try:
        model = TorchEstimator(
            model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
            loss=torch.nn.CrossEntropyLoss(), batchSize=32, epochs=6, numWorkers=2,
            store=str(tmp_path), strategy="epoch_average", progress=False).fit(train)
    finally:
        strategies.REGISTRY.clear()
        strategies.REGISTRY.update(before)
    assert accuracy(model.transform(test)) >= 0.9
    assert all(r["comm_calls"] > 0 for r in model.history)  # it averaged every epoch
