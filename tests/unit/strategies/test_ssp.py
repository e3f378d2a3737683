"""The stale-synchronous parameter server on two and three local gloo ranks (no Spark):
workers stay within the staleness bound, dynamic staleness rides out stragglers without
building a lead from jitter, and its messages are raw bytes."""
from __future__ import annotations

import time

import pytest
import torch

from sparkddl.strategies.ssp_wire import store_queue_problem
from tests.unit.dist_harness import run_ranks
from tests.unit.strategies.harness import SPAWN_TIMEOUT_S, TEST_TIMEOUT_S, _run

# ---- rank functions (one spawn each) ----


def _stale_synchronous(rank: int, world: int) -> dict:
    """Rank 1 is slow; rank 0 may run ahead by ``staleness`` steps, never further."""
    out = {}
    for staleness in (0, 2):
        trace: list = []
        run = _run("ssp", {"staleness": staleness}, rank, [0.05] * 3, steps=12,
                   pause_s=0.04 if rank == 1 and staleness else 0.0, trace=trace)
        out[staleness] = {**run, "trace": trace}
    return out


SPIKE_S, STEP_S, SSP_STEPS = 0.1, 0.02, 24


def _steps(rank: int, spikes: bool, jitter_s: float):
    """Every step takes STEP_S +- ``jitter_s``; with ``spikes``, stragglers that come and go:
    each rank in turn is SPIKE_S late on two steps of every epoch (rank 1 at steps 3 and
    15, rank 2 at 6 and 18, rank 0 at 9 and 21)."""
    import random
    jitter = random.Random(rank)
    late = {1: (3, 15), 2: (6, 18), 0: (9, 21)}[rank] if spikes else ()
    return lambda i: STEP_S + jitter.uniform(-jitter_s, jitter_s) + (
        SPIKE_S if i % SSP_STEPS in late else 0.0)


def _dynamic_staleness(rank: int, world: int) -> dict:
    """Fixed staleness 0 and 4 and dynamic 0..4, under stragglers and under jitter alone."""
    configs = {"fixed_low": {"staleness": 0}, "fixed_high": {"staleness": 4},
               "dynamic": {"staleness": 4, "min_staleness": 0}}
    out = {}
    for pattern, spikes, jitter_s, epochs in (("spikes", True, 0.004, 2),
                                              ("jitter", False, 0.012, 3)):
        for label, options in configs.items():
            trace: list = []
            start = time.perf_counter()
            run = _run("ssp", options, rank, [0.05] * epochs, steps=SSP_STEPS,
                       pause_s=_steps(rank, spikes, jitter_s), trace=trace)
            out[pattern, label] = {**run, "trace": trace, "wall_s": time.perf_counter() - start}
    return out


def _dynamic_staleness_three(rank: int, world: int) -> dict:
    """Fixed staleness 0 and dynamic 0..4 on three ranks, each a straggler in turn: the
    slowest is now one of two others, and ties among the slowest come and go."""
    out = {}
    for label, options in (("fixed_low", {"staleness": 0}),
                           ("dynamic", {"staleness": 4, "min_staleness": 0})):
        trace: list = []
        run = _run("ssp", options, rank, [0.05] * 2, steps=SSP_STEPS,
                   pause_s=_steps(rank, True, 0.004), trace=trace)
        out[label] = {**run, "trace": trace}
    return out


# ---- fixtures: one spawn per family of checks ----


@pytest.fixture(scope="module")
def ssp():
    return run_ranks(_stale_synchronous, timeout_s=SPAWN_TIMEOUT_S)


@pytest.fixture(scope="module")
def dynamic_ssp():
    return run_ranks(_dynamic_staleness, timeout_s=SPAWN_TIMEOUT_S)


@pytest.fixture(scope="module")
def dynamic_ssp_three():
    return run_ranks(_dynamic_staleness_three, world_size=3, timeout_s=SPAWN_TIMEOUT_S)


# ---- stale-synchronous parameter server ----

@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch: {store_queue_problem()} "
                    "(tests/integration/test_strategies_spark.py checks the refusal)")
@pytest.mark.parametrize("staleness", [0, 2])
def test_ssp_workers_stay_within_staleness(ssp, staleness):
    for _rank, result in enumerate(ssp):
        run = result[staleness]
        leads = [step + 1 - min(clocks) for step, clocks in
                 enumerate(run["trace"])]
        assert max(leads) <= staleness
        assert all(row["max_lead"] <= staleness for row in run["rows"])
        rows = run["rows"]
        assert rows[-1]["loss"] < 0.7 * rows[0]["loss"], rows
    fast = ssp[0][staleness]
    assert max(row["max_lead"] for row in fast["rows"]) == staleness  # it did run ahead
    torch.testing.assert_close(ssp[0][staleness]["params"], ssp[1][staleness]["params"],
                               rtol=0, atol=0)


def _leads(run: dict) -> list[int]:
    """Each pull's lead over the slowest worker, from the clocks it returned."""
    return [step + 1 - min(clocks) for step, clocks in enumerate(run["trace"])]


def _mean_lead(result: list, key: tuple) -> float:
    leads = [lead for rank_result in result for lead in _leads(rank_result[key])]
    return sum(leads) / len(leads)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch: {store_queue_problem()}")
def test_dynamic_staleness_rides_out_stragglers_within_the_upper_bound(dynamic_ssp):
    """Each rank in turn is 100 ms late on a 20 ms step. Fixed staleness 0 makes the other
    wait it out every time; the dynamic bound (0..4) lets it run ahead instead, never by
    more than 4 steps."""
    for rank, result in enumerate(dynamic_ssp):
        for label, bound in (("fixed_low", 0), ("fixed_high", 4), ("dynamic", 4)):
            run = result["spikes", label]
            assert max(_leads(run)) <= bound, (rank, label)
            assert all(row["max_lead"] <= bound for row in run["rows"]), (rank, label)
            assert run["rows"][-1]["loss"] < run["rows"][0]["loss"], (rank, label)
        waited = {label: sum(row["wait_s"] for row in result["spikes", label]["rows"])
                  for label in ("fixed_low", "dynamic")}
        # fixed 0 waits out the other rank's four 100 ms delays (~0.4 s); dynamic ~0.05 s
        assert waited["dynamic"] < 0.5 * waited["fixed_low"], (rank, waited)
        assert max(_leads(result["spikes", "dynamic"])) > 0  # it did run ahead
    for label in ("fixed_low", "fixed_high", "dynamic"):  # every rank ends on one model
        torch.testing.assert_close(dynamic_ssp[0]["spikes", label]["params"],
                                   dynamic_ssp[1]["spikes", label]["params"], rtol=0, atol=0)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch: {store_queue_problem()}")
def test_dynamic_staleness_on_three_ranks(dynamic_ssp_three):
    """As with two ranks: fixed 0 waits out both others' delays (about 0.8 s per rank);
    dynamic rides them out, never more than 4 steps ahead, and all end on one model."""
    for rank, result in enumerate(dynamic_ssp_three):
        for label, bound in (("fixed_low", 0), ("dynamic", 4)):
            assert max(_leads(result[label])) <= bound, (rank, label)
            assert all(row["max_lead"] <= bound for row in result[label]["rows"]), (rank, label)
        waited = {label: sum(row["wait_s"] for row in result[label]["rows"])
                  for label in ("fixed_low", "dynamic")}
        assert waited["dynamic"] < 0.5 * waited["fixed_low"], (rank, waited)
        assert max(_leads(result["dynamic"])) > 0, rank
    for label in ("fixed_low", "dynamic"):
        for other in dynamic_ssp_three[1:]:
            torch.testing.assert_close(dynamic_ssp_three[0][label]["params"],
                                       other[label]["params"], rtol=0, atol=0)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch: {store_queue_problem()}")
def test_dynamic_staleness_builds_no_lead_from_jitter(dynamic_ssp):
    """Steps of 20 +- 12 ms and no stragglers: a fixed bound of 4 lets whichever rank is
    ahead stay ahead (mean lead about 1.3 here); dynamic holds it for the cheap waits, so
    its mean lead stays well below (about 0.5)."""
    dynamic = _mean_lead(dynamic_ssp, ("jitter", "dynamic"))
    fixed = _mean_lead(dynamic_ssp, ("jitter", "fixed_high"))
    assert dynamic < fixed, (dynamic, fixed)
    assert max(max(_leads(r["jitter", "dynamic"])) for r in dynamic_ssp) <= 4


@pytest.mark.skipif(store_queue_problem() is not None,
                    reason=f"ssp is refused on this torch, so its wire is never used: "
                           f"{store_queue_problem()} (torch 2.7's TCPStore also broke the pipe "
                           "on its multi-MiB chunks once in two runs)")
def test_ssp_messages_are_raw_bytes_and_carry_server_errors():
    from datetime import timedelta

    from torch.distributed import TCPStore

    from sparkddl.errors import SparkDDLError
    from sparkddl.strategies.ssp_wire import (
        CHUNK_BYTES,
        answer_key,
        decode_pull,
        encode_pull,
        pack,
        put_chunks,
        unpack,
    )

    store = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=10))
    # larger than the TCPStore's 8 MiB message limit: it travels in chunks
    tensors = [torch.randn(3, 2), torch.randn(5).to(torch.bfloat16), torch.tensor(2.5),
               torch.randn(3 * CHUNK_BYTES // 4 + 7)]
    chunks = put_chunks(store, answer_key(1), pack(tensors))
    assert chunks == 4
    clocks, payload = decode_pull(encode_pull([4, 2], chunks), 2, store, 1)
    assert clocks == [4, 2]
    for got, want in zip(unpack(payload, tensors), tensors):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert not store.check([f"{answer_key(1)}/0"])  # read once, then gone
    with pytest.raises(SparkDDLError, match="SSP parameter server on rank 0 failed: boom"):
        decode_pull(encode_pull([], 0, b"boom"), 2, store, 1)


@pytest.mark.skipif(store_queue_problem() is None,
                    reason="this torch's TCPStore has queues: ssp runs here (the tests above)")
def test_ssp_is_refused_by_name_on_a_torch_without_store_queues():
    """torch 2.6 and 2.7 (the Databricks LTS ML stacks) have no TCPStore queues."""
    import re

    from sparkddl import strategies
    from sparkddl.errors import ConfigError
    with pytest.raises(ConfigError, match=r"strategy='ssp' needs TCPStore.queue_push/queue_pop, "
                       rf"which torch {re.escape(torch.__version__)} does not have"):
        strategies.create("ssp")
