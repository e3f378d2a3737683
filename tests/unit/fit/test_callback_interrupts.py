"""A KeyboardInterrupt or SystemExit from a callback (or anything that ends one of the
driver's threads) ends the fit: it is recorded with its traceback, the running stage is
stopped, nothing waits on the dead thread, and no attempt starts after it. Without Spark."""
from __future__ import annotations

import dataclasses
import io
import time
from types import SimpleNamespace

import pytest
import torch

from sparkddl.channel import messages as m
from sparkddl.channel.server import Message
from sparkddl.errors import JobCancelledError, TrainingFailedError
from sparkddl.fit import supervisor as fit_module
from sparkddl.fit.callbacks import CallbackInterrupt, Callbacks
from sparkddl.fit.dispatch import Dispatch
from sparkddl.fit.evaluation import SnapshotEvaluator
from sparkddl.fit.progress import Progress
from sparkddl.fit.restarts import RestartPolicy
from sparkddl.launch.phases import Phases
from sparkddl.store import Store
from sparkddl.train.steps import LossFn

BOUND_S = 5.0  # drain/close of a dead evaluator must return long before this


def weights() -> bytes:
    buf = io.BytesIO()
    torch.save({"weight": torch.eye(2), "bias": torch.zeros(2)}, buf)
    return buf.getvalue()


class RaiseAt:
    """on_epoch_end / on_snapshot / on_restart raising ``error`` at ``epoch``; what it saw."""

    def __init__(self, error: BaseException, epoch: int = 2, hook: str = "on_epoch_end"):
        self.error, self.epoch, self.hook = error, epoch, hook
        self.seen: list[tuple[str, int]] = []

    def on_epoch_end(self, row):
        self._hear("on_epoch_end", row["epoch"])

    def on_snapshot(self, epoch, state):
        self._hear("on_snapshot", epoch)

    def on_restart(self, restart):
        self._hear("on_restart", 0)

    def _hear(self, hook: str, epoch: int) -> None:
        self.seen.append((hook, epoch))
        if hook == self.hook and epoch == self.epoch:
            raise self.error


def evaluator(tmp_path, callbacks, stops: list) -> SnapshotEvaluator:
    """Without a validation split: only the callbacks and the bookkeeping run."""
    return SnapshotEvaluator(lambda: torch.nn.Linear(2, 2),
                             LossFn(("x",), ("y",), (torch.nn.CrossEntropyLoss(),)), {}, None,
                             "train_loss", "min", 0, Store.from_uri(tmp_path), "run1",
                             callbacks=Callbacks(callbacks), epochs=8,
                             on_fatal=lambda: stops.append(time.monotonic()))


def feed(ev: SnapshotEvaluator, epochs: range, replies: list | None = None) -> None:
    """What rank 0 sends for each epoch; what the driver replies goes to ``replies``."""
    reply = (lambda header: None) if replies is None else replies.append
    for epoch in epochs:
        ev.record_epoch({"epoch": epoch, "train_loss": 1.0}, reply)
        ev.submit(m.Snapshot(epoch), weights(), reply)
        ev.checkpointed(epoch)


def unwrapped_fails(fn):
    """Call ``fn`` on this (the main) thread: a bare KeyboardInterrupt escaping it would end
    the test session, so it fails the test instead."""
    try:
        return fn()
    except (CallbackInterrupt, JobCancelledError):
        raise
    except BaseException as exc:  # noqa: BLE001
        pytest.fail(f"{type(exc).__name__} escaped without being handled: {exc!r}")


def bounded(fn):
    started = time.monotonic()
    out = fn()
    assert time.monotonic() - started < BOUND_S, f"{fn.__name__} hung on a dead evaluator"
    return out


def test_a_guarded_hook_that_raises_a_base_exception_is_not_swallowed():
    cb = RaiseAt(KeyboardInterrupt(), epoch=2)
    cbs = Callbacks([cb])
    assert cbs.epoch_end({"epoch": 1}) is False
    with pytest.raises(CallbackInterrupt) as info:
        unwrapped_fails(lambda: cbs.epoch_end({"epoch": 2}))
    assert info.value.hook == "callback RaiseAt.on_epoch_end"
    assert isinstance(info.value.error, KeyboardInterrupt)
    assert info.value.__cause__ is info.value.error
    assert "callback RaiseAt.on_epoch_end" in info.value.error.__notes__[0]
    assert cbs.errors == []  # not an error to report beside a fit that went on


@pytest.mark.timeout(30)
@pytest.mark.parametrize("error, hook", [(KeyboardInterrupt(), "on_epoch_end"),
                                         (SystemExit(3), "on_snapshot")])
def test_a_callback_interrupt_is_fatal_stops_the_stage_and_nothing_waits_for_it(
        tmp_path, error, hook):
    stops: list[float] = []
    cb = RaiseAt(error, epoch=2, hook=hook)
    ev = evaluator(tmp_path, [cb], stops)
    replies: list[dict] = []
    feed(ev, range(1, 4), replies)
    bounded(ev.drain)  # the dead thread never sets drain's event
    assert ev.fatal is not None and ev.fatal.error is error
    assert ev.fatal.where == f"callback RaiseAt.{hook}"
    assert error.__traceback__ is not None  # kept to be raised with the fit
    assert len(stops) == 1, "the running stage was not stopped"
    assert replies == [m.Stop(0).header()]  # the ranks stop at their epoch's end meanwhile
    assert ("on_epoch_end", 3) not in cb.seen and ("on_snapshot", 3) not in cb.seen
    feed(ev, range(4, 6))  # what the ranks still send before they are gone
    bounded(lambda: ev.rewind(2))
    result = bounded(ev.close)
    assert result.fatal is ev.fatal and result.errors == []
    assert len(stops) == 1


@pytest.mark.timeout(30)
def test_an_exception_from_a_callback_still_lets_training_go_on(tmp_path):
    stops: list[float] = []
    cb = RaiseAt(ValueError("boom"), epoch=2)
    ev = evaluator(tmp_path, [cb], stops)
    feed(ev, range(1, 4))
    result = ev.close()
    assert result.fatal is None and stops == []
    assert result.errors == ["callback RaiseAt.on_epoch_end: ValueError: boom"]
    assert ("on_epoch_end", 3) in cb.seen


@pytest.mark.timeout(30)
def test_anything_that_ends_the_evaluator_thread_is_fatal(tmp_path, monkeypatch):
    stops: list[float] = []
    ev = evaluator(tmp_path, [], stops)

    def dies(epochs_done: int) -> None:
        raise SystemExit("the driver's own bug")

    monkeypatch.setattr(ev, "_save_state", dies)
    feed(ev, range(1, 3))
    bounded(ev.drain)
    assert ev.fatal is not None and isinstance(ev.fatal.error, SystemExit)
    assert ev.fatal.where == ("sparkddl's evaluator thread (handling the checkpoint after "
                              "epoch 1)")
    assert len(stops) == 1
    assert bounded(ev.close).fatal is ev.fatal


@pytest.mark.timeout(30)
def test_on_restart_raising_keyboard_interrupt_is_fatal(tmp_path):
    stops: list[float] = []
    ev = evaluator(tmp_path, [RaiseAt(KeyboardInterrupt(), epoch=0, hook="on_restart")], stops)
    unwrapped_fails(lambda: ev.restarted(object()))
    assert ev.fatal is not None and ev.fatal.where == "callback RaiseAt.on_restart"
    assert len(stops) == 1
    ev.close()


def test_a_keyboard_interrupt_ends_the_fit_as_a_cancel_with_the_resume_hint(tmp_path):
    error = KeyboardInterrupt()
    fatal = fit_module.Fatal("callback StopNow.on_epoch_end", error)
    with pytest.raises(JobCancelledError) as info:
        fit_module._end_if_fatal(fatal, Store.from_uri(tmp_path), "run1")
    text = str(info.value)
    assert "callback StopNow.on_epoch_end raised KeyboardInterrupt" in text
    assert "No checkpoint was written yet." in text
    assert info.value.__cause__ is error


def test_a_system_exit_is_raised_again_naming_the_callback(tmp_path):
    error = SystemExit(3)
    fatal = fit_module.Fatal("callback Quit.on_snapshot", error)
    with pytest.raises(SystemExit) as info:
        fit_module._end_if_fatal(fatal, Store.from_uri(tmp_path), "run1")
    assert info.value is error and info.value.code == 3
    assert "callback Quit.on_snapshot raised this" in info.value.__notes__[-1]
    fit_module._end_if_fatal(None, Store.from_uri(tmp_path), "run1")  # nothing: no raise


@pytest.mark.timeout(30)
def test_a_base_exception_in_a_fit_handler_is_fatal_and_keeps_the_channel_reading(tmp_path):
    stops: list[float] = []
    ev = evaluator(tmp_path, [], stops)
    dispatch = Dispatch(ev, Progress(8, 10, enabled=False))

    def grow(epoch: int) -> bool:
        raise KeyboardInterrupt

    dispatch.grow = grow
    handlers = dispatch.handlers(0)
    row = m.Epoch({"epoch": 1, "train_loss": 1.0})
    # must not raise into the channel's thread
    unwrapped_fails(lambda: handlers[m.Epoch](Message(0, row.header()), row))
    assert ev.fatal is not None and isinstance(ev.fatal.error, KeyboardInterrupt)
    assert ev.fatal.where == "the driver's handler of Epoch messages from rank 0"
    beat = m.Heartbeat(steps=3)
    handlers[m.Heartbeat](Message(0, beat.header()), beat)
    assert len(stops) == 2  # a stage that was submitted after the first cancel is stopped too
    ev.close()


@dataclasses.dataclass
class FakeSpec:
    run_id: str
    config: object
    plan: object
    resume_url: str | None = None
    fence: str | None = None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stage_raises", ["cancelled", "failed", "restart_hook"])
def test_no_attempt_starts_after_a_fatal_error(tmp_path, monkeypatch, stage_raises):
    """The stage ends as the cancel left it (cancelled, or failed: the ranks' collectives
    broke first), or a failure's on_restart raises: the fit cancels, it never relaunches."""
    stops: list[float] = []
    hook = "on_restart" if stage_raises == "restart_hook" else "on_epoch_end"
    ev = evaluator(tmp_path, [RaiseAt(KeyboardInterrupt(), epoch=0 if hook == "on_restart"
                                      else 2, hook=hook)], stops)
    launches = []

    def launch_ranks(*args, **kwargs):
        launches.append(kwargs["attempt"])
        if stage_raises != "restart_hook":
            feed(ev, range(1, 3))  # the callback raises at epoch 2
            ev.drain()
        if stage_raises == "cancelled":
            raise JobCancelledError("run run1 was cancelled: its Spark job was cancelled")
        raise TrainingFailedError([], reason="the barrier stage failed")

    monkeypatch.setattr(fit_module, "launch_ranks", launch_ranks)
    monkeypatch.setattr(fit_module, "_world_after", lambda *args: 2)
    monkeypatch.setattr(fit_module, "reader_modules", lambda plan: ())
    config = SimpleNamespace(num_workers=2, watchdog_s=None, use_gpu=False, slot_wait_s=120.0)
    spec = FakeSpec("run1", config, SimpleNamespace(steps_per_epoch=10))
    policy = RestartPolicy(max_restarts=3, timeout_s=None, started=time.perf_counter(),
                           num_workers=2)
    with pytest.raises(JobCancelledError, match="raised KeyboardInterrupt") as info:
        unwrapped_fails(lambda: fit_module._attempts(
            None, spec, config, Store.from_uri(tmp_path), ev, Progress(8, 10, enabled=False),
            policy, lambda c: None, Phases()))
    assert launches == [0], "an attempt started after the fatal error"
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    ev.close()
