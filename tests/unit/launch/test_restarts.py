"""The restart policy of a fit: relaunch or stop, decided from the failure (no Spark)."""
from __future__ import annotations

import time

from sparkddl.errors import RankFailure, TrainingFailedError
from sparkddl.launch.restarts import RestartPolicy, will_repeat


def failed(*failures: RankFailure) -> TrainingFailedError:
    return TrainingFailedError(list(failures), reason="training failed")


def report(rank: int, message: str, steps: int) -> RankFailure:
    return RankFailure(rank, message, traceback="Traceback ...", status={"steps": steps})


def policy(max_restarts: int = 2, timeout_s: float | None = None) -> RestartPolicy:
    return RestartPolicy(max_restarts, timeout_s, time.perf_counter(), num_workers=2)


def test_a_rank_failure_mid_training_is_relaunched_until_the_attempts_run_out():
    exc = failed(report(1, "RuntimeError: injected", 12), report(0, "gloo: peer closed", 12))
    assert policy().final_error(0, exc) is None
    assert policy().final_error(1, exc) is None
    final = policy().final_error(2, exc)
    assert final is not None and final.attempts == 3
    assert "failed on every one of 3 attempts" in str(final)


def test_no_time_left_ends_the_fit_at_once():
    exc = failed(report(1, "RuntimeError: injected", 3))
    expired = RestartPolicy(2, 1.0, time.perf_counter() - 5, num_workers=2)
    assert expired.remaining() == 0
    assert expired.final_error(0, exc) is not None


def test_the_same_error_on_every_rank_before_any_step_is_not_retried():
    exc = failed(report(0, "AttributeError: module has no attribute 'x'", 0),
                 report(1, "AttributeError: module has no attribute 'x'", 0))
    assert will_repeat(exc, 2)
    final = policy().final_error(0, exc)
    assert final is not None and final.attempts == 1
    assert "not retried: every rank failed the same way before its first step" in str(final)


def test_failures_that_may_not_recur_are_retried():
    same = "AttributeError: x"
    # one rank only; different errors; after progress; a rank that died without a report
    assert not will_repeat(failed(report(0, same, 0)), 2)
    assert not will_repeat(failed(report(0, same, 0), report(1, "OSError: y", 0)), 2)
    assert not will_repeat(failed(report(0, same, 5), report(1, same, 5)), 2)
    assert not will_repeat(failed(report(0, same, 0), RankFailure(1, same)), 2)
