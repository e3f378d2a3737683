"""The performance model's arithmetic (no Spark): link fit, traffic kinds, predictions."""
from __future__ import annotations

import pytest

from sparkddl.perfmodel.predict import Link, Model, comm_time, fit_link

LINK = Link(latency_s=50e-6, bandwidth_Bps=1e9)


def ring(n_bytes: int, world: int, link: Link = LINK) -> float:
    return 2 * (world - 1) * link.latency_s + 2 * (world - 1) / world * n_bytes / \
        link.bandwidth_Bps


def test_link_fit_recovers_latency_and_bandwidth():
    sweep = {n: ring(n, 2) for n in (1 << 14, 1 << 18, 1 << 22, 1 << 24)}
    link = fit_link(sweep, world=2)
    assert link.latency_s == pytest.approx(50e-6, rel=1e-6)
    assert link.bandwidth_Bps == pytest.approx(1e9, rel=1e-6)


def test_traffic_kinds_scale_with_workers_as_their_collectives_do():
    mb = 1 << 20
    assert comm_time("allreduce", mb, 1, 1, LINK) == 0
    assert comm_time("allreduce", mb, 1, 2, LINK) == pytest.approx(ring(mb, 2))
    # a ring allreduce approaches twice the bytes; all-gather grows with every worker
    assert comm_time("allreduce", mb, 1, 64, LINK) < 2.1 * mb / 1e9 + 130 * 50e-6
    assert comm_time("allgather", mb, 1, 64, LINK) == pytest.approx(63 * (50e-6 + mb / 1e9))
    assert comm_time("p2p", mb, 2, 64, LINK) == comm_time("p2p", mb, 2, 4, LINK)
    assert comm_time("server", mb, 1, 8, LINK) == pytest.approx(8 * (50e-6 + mb / 1e9))
    # fsdp: all-gathers and reduce-scatters of what it assembles, (n-1)/n of it per rank
    assert comm_time("sharded", 3 * mb, 5, 4, LINK) == pytest.approx(
        5 * 3 * 50e-6 + 0.75 * 3 * mb / 1e9)
    assert comm_time("sharded", mb, 1, 64, LINK) < comm_time("allreduce", mb, 1, 64, LINK)
    with pytest.raises(ValueError):
        comm_time("broadcast", mb, 1, 2, LINK)


def calibration(step_s: float, backward_s: float, param_bytes: int, reader: float) -> dict:
    sweep = {n: ring(n, 2) for n in (1 << 14, 1 << 20, 1 << 24)}
    comm = ring(param_bytes, 2)
    return {"world": 2, "batch_size": 100, "step_s": step_s, "backward_s": backward_s,
            "allreduce": sweep, "reader_rows_s": reader, "epoch_overhead_s": 0.01,
            "param_bytes": param_bytes,
            "strategies": {
                "allreduce": {"step_s": step_s + max(0, comm - backward_s),
                              "bytes": param_bytes, "calls": 1},
                "allreduce-no-overlap": {"step_s": step_s + comm + 0.001, "bytes": param_bytes,
                                         "calls": 1}}}


def test_compute_bound_model_scales_and_names_compute():
    cal = calibration(step_s=0.1, backward_s=0.06, param_bytes=1 << 16, reader=1e7)
    m = Model(cal)
    one, two = m.predict("allreduce", 1, 100_000), m.predict("allreduce", 2, 100_000)
    assert one.bottleneck == two.bottleneck == "compute"
    assert two.speedup == pytest.approx(2, rel=0.05)
    assert m.codec_s("allreduce") == pytest.approx(0, abs=1e-9)
    assert m.codec_s("allreduce-no-overlap") == pytest.approx(0.001, rel=1e-6)


def test_communication_bound_model_names_communication_and_overlap_helps():
    cal = calibration(step_s=0.002, backward_s=0.001, param_bytes=64 << 20, reader=1e7)
    m = Model(cal)
    p = m.predict("allreduce", 8, 100_000)
    assert p.bottleneck == "communication" and p.speedup < 1
    assert m.predict("allreduce-no-overlap", 8, 100_000).comm_s > p.comm_s


def test_input_bound_model_names_input():
    cal = calibration(step_s=0.001, backward_s=0.0005, param_bytes=1 << 10, reader=1e4)
    assert Model(cal).predict("allreduce", 4, 100_000).bottleneck == "input"


def test_one_worker_uses_the_step_measured_alone():
    cal = calibration(step_s=0.1, backward_s=0.06, param_bytes=1 << 16, reader=1e7)
    cal["step_alone_s"] = 0.08
    m = Model(cal)
    assert m.predict("allreduce", 1, 100_000).compute_s == pytest.approx(0.08)
    assert m.predict("allreduce", 2, 100_000).compute_s == pytest.approx(0.1)


# ---- memory ----

def test_activation_bytes_counts_what_autograd_saves_once_and_not_the_weights():
    torch = pytest.importorskip("torch")
    from torch import nn

    from sparkddl.perfmodel.memory import activation_bytes
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    x = torch.randn(32, 64)
    got = activation_bytes(lambda: model(x), list(model.parameters()))
    # the input (saved by the first Linear), ReLU's output (saved by ReLU and by the second
    # Linear: one buffer) and the output; the pre-activation is not kept
    assert got == (32 * 64 + 32 * 128 + 32 * 10) * 4
    with torch.no_grad():  # nothing is saved for backward
        assert activation_bytes(lambda: model(x), list(model.parameters())) == 32 * 10 * 4


def test_optimizer_and_unit_bytes_are_measured_on_the_real_objects():
    torch = pytest.importorskip("torch")
    from torch import nn

    from sparkddl.perfmodel.memory import optimizer_bytes, unit_bytes
    model = nn.Sequential(nn.Linear(1000, 1000), nn.ReLU(), nn.Linear(1000, 10))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 1000)).sum().backward()
    opt.step()
    n_params = sum(p.numel() for p in model.parameters())
    # exp_avg and exp_avg_sq per parameter (+ a scalar step count each)
    assert optimizer_bytes(opt) == 2 * 4 * n_params + 4 * len(list(model.parameters()))
    # fsdp's rule: the 1000x1000 layer (1,001,000 params) is a unit; the root keeps the rest
    assert unit_bytes(model, 1_000_000) == [1_001_000 * 4, 10_010 * 4]


def footprint(params_mb: float, acts_mb: float = 10.0, checkpoint_every: int = 0) -> dict:
    p = int(params_mb * 1e6)
    return {"runtime_bytes": 300e6, "param_bytes": p, "model_bytes": p, "grad_bytes": p,
            "optimizer_bytes": 2 * p, "activation_bytes": acts_mb * 1e6,
            "temporary_bytes": p, "reader_bytes": 5e6, "checkpoint_every": checkpoint_every,
            "fsdp_units": {"1000000": [p // 4] * 4}, "available_bytes": 8e9}


def parts(m) -> float:
    """What a prediction's peak is made of."""
    return (m.runtime_MB + m.model_MB + m.strategy_MB + m.reader_MB
            + max(m.activations_MB + m.temporaries_MB, m.checkpoint_MB))


def test_memory_prediction_adds_the_parts_and_prices_each_strategy():
    from sparkddl.perfmodel.memory import predict
    fp = footprint(400)
    ar = predict(fp, "allreduce", "allreduce", {}, 2)
    assert ar.peak_MB == pytest.approx(parts(ar))
    assert ar.model_MB == pytest.approx(4 * 400)  # parameters, gradients, Adam's two moments
    assert ar.strategy_MB == pytest.approx(400)  # gradient buckets
    # without checkpoints the epoch's end is the snapshot serialized (800), above the step
    assert ar.peak_MB == pytest.approx(300 + 1600 + 400 + 5 + 800)
    topk = predict(fp, "topk", "allreduce", {"compression": "topk"}, 2)
    # buckets + error-feedback residuals + the candidates' mask
    assert topk.strategy_MB == pytest.approx(900)
    ssp2, ssp8 = (predict(fp, "ssp", "ssp", {}, n) for n in (2, 8))
    assert ssp8.peak_MB > ssp2.peak_MB > ar.peak_MB  # rank 0 serves every worker
    ring, expo = (predict(fp, "g", "gossip", {"topology": t}, 16) for t in ("ring", "exponential"))
    assert expo.strategy_MB > ring.strategy_MB


def test_checkpoints_gather_every_ranks_state_on_rank_0():
    from sparkddl.perfmodel.memory import predict
    fp = footprint(400, checkpoint_every=1)
    plain = predict(fp, "allreduce", "allreduce", {}, 8)
    # the model and Adam's state serialized: 2 x (400 + 800), above the step's 410
    assert plain.checkpoint_MB == pytest.approx(2400)
    assert plain.peak_MB == pytest.approx(parts(plain))
    # top-k's residuals (400 per rank) gathered, read back and serialized: (4n + 3) x 400
    topk = [predict(fp, "topk", "allreduce", {"compression": "topk"}, n) for n in (2, 8)]
    assert topk[0].checkpoint_MB == pytest.approx(2400 + 11 * 400)
    assert topk[1].checkpoint_MB == pytest.approx(2400 + 35 * 400)
    assert predict(footprint(400), "topk", "allreduce", {"compression": "topk"},
                   8).checkpoint_MB == pytest.approx(800)  # no checkpoints: the snapshot


def test_fsdp_shards_the_model_but_rank_0_gathers_it_whole_at_epoch_ends():
    from sparkddl.perfmodel.memory import predict
    fp = footprint(400)
    full = predict(fp, "allreduce", "allreduce", {}, 8)
    sharded = [predict(fp, "fsdp", "fsdp", {}, n) for n in (2, 4, 8)]
    assert all(a.peak_MB > b.peak_MB for a, b in zip(sharded, sharded[1:]))
    assert sharded[-1].peak_MB < 0.7 * full.peak_MB
    # 8 ranks: shards of parameters, gradients, Adam (1600/8) + the root and the largest
    # other unit (100 MB each) gathered with their gradients (400); the epoch's end (the
    # whole model gathered to rank 0 and serialized: 1200) outweighs the step (410)
    steady = sharded[-1]
    assert steady.model_MB == pytest.approx(600) and steady.checkpoint_MB == pytest.approx(1200)
    assert steady.peak_MB == pytest.approx(parts(steady))
    assert predict(fp, "fsdp", "fsdp", {}, 1).model_MB == pytest.approx(4 * 400)
    # checkpoints gather the full model and optimizer state on rank 0 too: no saving there
    ckpt, ar = (predict(footprint(400, checkpoint_every=1), s, s, {}, 8)
                for s in ("fsdp", "allreduce"))
    assert ckpt.checkpoint_MB == pytest.approx(3 * 1200) and ckpt.peak_MB > 0.9 * ar.peak_MB


def test_memory_table_says_whether_it_fits_and_leaves_gpus_open():
    from sparkddl.perfmodel.memory import predict, table
    small, huge = footprint(10), footprint(3000)
    text = table([predict(small, "allreduce", "allreduce", {}, 2),
                  predict(huge, "allreduce", "allreduce", {}, 2)])
    assert "| allreduce | 2 |" in text and "| yes |" in text and "| **no** |" in text
    gpu = predict({**huge, "device": "cuda"}, "allreduce", "allreduce", {}, 2)
    assert gpu.fits is None and gpu.peak_MB == pytest.approx(
        gpu.model_MB + gpu.strategy_MB + max(gpu.activations_MB + gpu.temporaries_MB,
                                             gpu.checkpoint_MB))
