"""The restart policy of a fit: relaunch or stop, decided from the failure (no Spark)."""
from __future__ import annotations

import time

from sparkddl.errors import RankFailure, TrainingFailedError
from sparkddl.fit.restarts import RestartPolicy, signature, will_repeat


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


def test_a_failure_that_repeats_ends_the_fit_at_its_first_repeat():
    """Same type, place and message once ranks, addresses, ports and paths are masked."""
    p = policy(max_restarts=5)
    first = RankFailure(1, "RuntimeError: Gloo connectFullMesh failed, remote=[10.78.0.2]:5521",
                        traceback='  File "/a/torch/c10d.py", line 9, in init\n', status={})
    again = RankFailure(0, "RuntimeError: Gloo connectFullMesh failed, remote=[10.78.0.1]:4107",
                        traceback='  File "/b/torch/c10d.py", line 9, in init\n', status={})
    assert p.final_error(0, failed(first)) is None
    final = p.final_error(1, failed(again))
    assert final is not None and final.attempts == 2
    assert "not retried: attempt 0 failed the same way" in str(final)


def test_different_failures_and_silent_deaths_are_not_repeats():
    p = policy(max_restarts=5)
    assert p.final_error(0, failed(report(1, "RuntimeError: injected at step 3", 3))) is None
    assert p.final_error(1, failed(report(1, "ValueError: another bug", 5))) is None
    silent = RankFailure(1, "its connection to the driver closed without a report")
    assert p.final_error(2, failed(silent)) is None
    assert p.final_error(3, failed(silent)) is None  # a lost machine twice is no bug


def test_the_signature_masks_what_differs_between_attempts():
    a = RankFailure(1, "DataError: rank 1 cannot read /data/t/part-0007-9f3ab2c1d4.parquet",
                    traceback='  File "/x/reader.py", line 40, in open_file\n')
    b = RankFailure(0, "DataError: rank 0 cannot read /data/t/part-0002-0c1d2e3f4a.parquet",
                    traceback='  File "/y/reader.py", line 41, in open_file\n')
    assert signature(a) == signature(b) == "DataError at reader.py:open_file: rank <n> " \
                                           "cannot read <path>"


def test_a_hang_is_retried_once():
    p = policy(max_restarts=5)
    hang = TrainingFailedError([], reason="watchdog: no progress for 60s; likely cause: rank 1")
    assert p.final_error(0, hang) is None
    final = p.final_error(1, hang)
    assert final is not None and "a hang is retried once" in str(final)


def test_a_ranks_own_report_is_compared_by_its_class_and_place_not_its_text():
    """The rank says what it raised (class, module-qualified; file and function): the
    signature uses that, and 'is it a TransformError' is a question of class, not of the
    message's first word."""
    from sparkddl.errors import TransformError
    a = RankFailure(1, "DataError: rank 1 cannot read /t/part-0007.parquet",
                    traceback="(text the rank clipped)", status={"steps": 0},
                    exception="sparkddl.errors.DataError", location="reader.py:open_file")
    b = RankFailure(0, "DataError: rank 0 cannot read /t/part-0002.parquet",
                    traceback="Traceback ...", status={"steps": 0},
                    exception="sparkddl.errors.DataError", location="reader.py:open_file")
    assert signature(a) == signature(b) == \
        "sparkddl.errors.DataError at reader.py:open_file: rank <n> cannot read <path>"
    # the same error on every rank before a step, its messages naming each rank: a repeat
    assert will_repeat(failed(a, b), 2)
    user = RankFailure(0, "TransformError: my own text", exception="builtins.ValueError")
    assert not user.raised(TransformError)
    assert RankFailure(0, "TransformError: bad rows",
                       exception="sparkddl.errors.TransformError").raised(TransformError)
    assert RankFailure(0, "TransformError: bad rows").raised(TransformError)  # text only


def test_a_rank_that_finds_the_store_full_or_read_only_is_not_relaunched_into_it():
    full = RankFailure(0, "StoreError: cannot write 4.0 MiB to file:///s/runs/r/checkpoints/"
                          "ckpt-00003.tmp: ENOSPC (No space left on device)",
                       traceback="Traceback ...", status={"steps": 40},
                       exception="sparkddl.errors.StoreError")
    assert will_repeat(failed(full), 2)
    assert policy().final_error(0, failed(full)) is not None
    # the store's own error leads, with when it came: two epochs had trained, which is no
    # rank that failed "before its first step"
    full.status.update(epoch=3, phase="writing a checkpoint")
    hint = "The last checkpoint (2 epoch(s) done) is kept: fit again with runId='r' to resume."
    final = str(policy().final_error(0, failed(full), hint)).splitlines()[0]
    assert final.startswith("rank 0 could not write to the store while writing a checkpoint "
                            "in epoch 3 (step 40 of the run): cannot "
                            "write 4.0 MiB to file:///s/runs/r/checkpoints/ckpt-00003.tmp: "
                            "ENOSPC (No space left on device) (not retried: a relaunch would "
                            "meet the same store) " + hint), final
    assert "before its first step" not in final
    # a store that could not be reached is another matter: it may come back
    gone = RankFailure(0, "StoreError: cannot open store s3://b/p: connection reset",
                       traceback="Traceback ...", status={"steps": 40},
                       exception="sparkddl.errors.StoreError")
    assert not will_repeat(failed(gone), 2)
