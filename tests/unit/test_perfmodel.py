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
