"""sparkddl.horovod.torch on two real ranks (gloo on 127.0.0.1, no Spark): one launch of two
processes runs every check (tests/unit/horovod/hvd_checks.py) and each test reads its part;
training is compared with the same steps taken in one process on the ranks' batches
together. Plus a world of one in this process, as outside any launcher."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.unit.horovod import hvd_checks as checks

ROOT = Path(__file__).resolve().parents[3]
WORLD = 2
LAUNCH_TIMEOUT_S = 120
LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "SPARKDDL_LOCAL_RANK",
                 "SPARKDDL_LOCAL_WORLD_SIZE", "SPARKDDL_NODE_RANK", "SPARKDDL_USE_GPU")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Both ranks' results. The ranks get TorchDistributor's contract (LOCAL_RANK 0, each a
    node of its own) with sparkddl's host-local values under SPARKDDL_*, which hvd prefers;
    the test process owns the store on port 0 (no port race)."""
    import torch.distributed as dist
    folder = tmp_path_factory.mktemp("hvd")
    store = dist.TCPStore("127.0.0.1", 0, WORLD + 1, is_master=True, wait_for_workers=False)
    base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_KEYS}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.unit.horovod.hvd_checks", str(folder)], cwd=ROOT,
        env={**base, "RANK": str(r), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
             "TORCHELASTIC_RESTART_COUNT": "0",  # torch 2.4 reads it with the agent store
             "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(r),
             "SPARKDDL_LOCAL_RANK": str(r), "SPARKDDL_LOCAL_WORLD_SIZE": str(WORLD),
             "SPARKDDL_NODE_RANK": "0", "OMP_NUM_THREADS": "1",
             "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(WORLD)]
    try:
        outputs = [p.communicate(timeout=LAUNCH_TIMEOUT_S)[0].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    results = []
    for r, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{text}"
        results.append(torch.load(folder / f"rank{r}.pt", weights_only=False))
        assert results[-1]["errors"] == {}, results[-1]["errors"]
    return results


def close(a: dict, b: dict, atol: float = 1e-6) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol) for k in a)


def test_rank_layout_prefers_sparkddl_s_host_values(ranks):
    assert [r["layout"] for r in ranks] == [(0, 2, 0, 2, 0, 1), (1, 2, 1, 2, 0, 1)]


def test_allreduce_ops(ranks):
    for r in ranks:  # rank 0 has [1, -2], rank 1 [2, -4]
        assert r["average"].tolist() == [1.5, -3.0]
        assert r["sum"].tolist() == r["sum_old"].tolist() == r["in_place"].tolist() == [3, -6]
        assert r["min"].tolist() == [1, -4] and r["max"].tolist() == [2, -2]
        assert r["product"].tolist() == [2, 8]
        assert r["scaled"].tolist() == [3, -6] and r["async"].tolist() == [3, -6]
        assert r["int_average"].tolist() == [2]  # (1 + 4) // 2
        assert [t.tolist() for t in r["grouped"]] == [[3, -6], [1, 20]]
    assert ranks[0]["x_after"].tolist() == [1, -2]  # allreduce returns a new tensor


def test_fp16_compression_travels_as_float16(ranks):
    for r in ranks:  # 1.0001 is 1.0 in float16; the result is float32 again
        assert r["fp16_allreduce"].dtype == torch.float32
        assert r["fp16_allreduce"].tolist() == [1.0]


def test_allgather_concatenates_uneven_first_dimensions(ranks):
    for r in ranks:
        assert r["allgather"].tolist() == [[0, 0], [1, 1], [1, 1]]
        assert r["allgather_empty"].shape == (2, 3)


def test_broadcasts(ranks):
    for r in ranks:
        assert r["broadcast"].tolist() == [1, 1, 1]
        assert r["broadcast_object"] == {"from": 1}
        assert r["allgather_object"] == ["rank0", "rank1"]
        assert r["join"] == 1 and r["after_shutdown"] is False
    assert close(ranks[0]["by_state"], ranks[1]["by_state"])
    assert close(ranks[1]["by_state"], checks.params(checks.net(seed=0)))
    assert close(ranks[0]["by_name"], checks.params(checks.net(seed=1)))


def test_broadcast_optimizer_state(ranks):
    sent = [r["stateful"] for r in ranks]
    assert sent[1]["param_groups"][0]["lr"] == pytest.approx(0.01)  # rank 0's
    assert sent[1]["state"].keys() == sent[0]["state"].keys() != set()
    for key, state in sent[0]["state"].items():
        assert torch.equal(state["momentum_buffer"], sent[1]["state"][key]["momentum_buffer"])
    assert ranks[1]["fresh"]["param_groups"][0]["lr"] == pytest.approx(0.1)


def reference(passes: int = 1) -> dict:
    """The training of hvd_checks.train in one process, on both ranks' batches at once."""
    model = checks.net()
    opt = torch.optim.SGD(model.parameters(), lr=checks.LR, momentum=0.9)
    for step in range(checks.STEPS):
        opt.zero_grad()
        rank_batches = [checks.batch(step, r) for r in range(WORLD)]
        for part in range(passes):
            x = torch.cat([b[0][part::passes] for b in rank_batches])
            y = torch.cat([b[1][part::passes] for b in rank_batches])
            checks.loss(model, x, y).backward()
        opt.step()
    return checks.params(model)


def test_distributed_optimizer_trains_like_one_process_on_the_whole_batch(ranks):
    expected = reference()
    assert not close(expected, checks.params(checks.net()))  # it did train
    for r in ranks:
        assert r["is_sgd"] and r["has_momentum"]
        assert close(r["sgd"], expected)


def test_backward_passes_per_step_sums_the_passes_then_averages(ranks):
    expected = reference(passes=2)
    assert not close(expected, reference())
    for r in ranks:
        assert close(r["two_passes"], expected)
        assert "backward_passes_per_step=1" in r["too_many_passes"]


def test_fp16_gradients_train_close_to_float32(ranks):
    expected = reference()
    for r in ranks:
        assert close(r["fp16"], expected, atol=1e-3)
    assert close(ranks[0]["fp16"], ranks[1]["fp16"])


def test_synchronize_then_skip_synchronize(ranks):
    assert torch.equal(ranks[0]["synced_grad"], ranks[1]["synced_grad"])
    assert [r["skip_warnings"] for r in ranks] == [0, 0]
    assert close(ranks[0]["after_clip"], ranks[1]["after_clip"])


def test_a_gradient_only_one_rank_computed_is_averaged_with_zeros(ranks):
    assert close(ranks[0]["unused"], ranks[1]["unused"])
    assert not close(ranks[0]["unused"], checks.params(checks.linear()))  # rank 0's moved


@pytest.fixture
def world_of_one(monkeypatch):
    import sparkddl.horovod.torch as hvd
    for key in LAUNCHER_KEYS:
        monkeypatch.delenv(key, raising=False)
    assert not hvd.is_initialized()
    hvd.init()
    try:
        yield hvd
    finally:
        hvd.shutdown()


def test_outside_any_launcher_init_gives_a_world_of_one(world_of_one):
    hvd = world_of_one
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
            hvd.cross_size()) == (0, 1, 0, 1, 0, 1)
    x = torch.tensor([[1.0, 2.0]])
    assert torch.equal(hvd.allreduce(x), x) and torch.equal(hvd.allgather(x), x)
    assert hvd.broadcast_object("hi") == "hi" and hvd.allgather_object(3) == [3]
    model, plain = checks.net(), checks.net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=checks.LR))
    ref = torch.optim.SGD(plain.parameters(), lr=checks.LR)
    for m, o in ((model, opt), (plain, ref)):
        checks.loss(m, *checks.batch(0, 0)).backward()
        o.step()
    assert close(checks.params(model), checks.params(plain))


def test_refusals(world_of_one):
    hvd = world_of_one
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.ones(1), op=hvd.Adasum)
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.allreduce(torch.ones(1), op=42)
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(torch.ones(1), root_rank=1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(checks.net().parameters(), lr=0.1))
    with pytest.raises(ValueError, match="already"):
        hvd.DistributedOptimizer(opt)
    model = checks.net()
    with pytest.raises(ValueError, match="leaves out"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=list(model.named_parameters())[:1])


def test_rank_before_init_says_to_call_init():
    import sparkddl.horovod.torch as hvd
    with pytest.raises(ValueError, match="hvd.init"):
        hvd.rank()
