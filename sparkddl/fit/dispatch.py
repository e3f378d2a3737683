"""What the driver does with a fit's messages from its ranks: the evaluator and the progress
display get theirs; when training resumes after a restart, when every rank said hello and
when rank 0 took its first step are noted (the fit's phases)."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from sparkddl.channel import messages as m
from sparkddl.channel.server import Message
from sparkddl.fit.evaluation import SnapshotEvaluator
from sparkddl.fit.progress import Progress
from sparkddl.fit.restarts import Restart
from sparkddl.launch.monitor import Handlers
from sparkddl.launch.phases import Arrivals, Phases

log = logging.getLogger(__name__)


class Dispatch:
    """The fit's message handlers: the evaluator and the progress display; notes when
    training resumes after a restart and how far the failed attempt had got."""

    def __init__(self, evaluator: SnapshotEvaluator, progress: Progress):
        self.evaluator, self.progress = evaluator, progress
        self.steps = 0  # rank 0's latest global step count
        self.pending: Restart | None = None
        self.attempt = 0  # the current attempt: what earlier ones still send is dropped
        self.recancelled = -1  # the attempt cancelled again after a fatal error
        # an elastic fit on fewer ranks: epoch -> whether to stop and relaunch wider now
        self.grow: Callable[[int], bool] | None = None
        # when this attempt's ranks said hello, and when rank 0 reported its first step
        # (time.perf_counter(); None: not yet)
        self.arrivals = Arrivals()
        self.first_step_at: float | None = None

    def attempt_started(self, world: int) -> None:
        self.arrivals.reset(world)
        self.first_step_at = None

    def handlers(self, attempt: int) -> Handlers:
        """The handlers of ``attempt``'s stage; they do nothing once it is not current."""
        self.attempt = attempt

        def fenced(handler: Any) -> Any:
            def handle(msg: Message, body: Any) -> None:
                if self.attempt != attempt:
                    return
                try:
                    handler(msg, body)
                except Exception:  # the channel logs it and goes on reading
                    raise
                except BaseException as exc:  # noqa: BLE001 - would end the thread reading this rank
                    self.evaluator.abort(f"the driver's handler of {type(body).__name__} "
                                         f"messages from rank {msg.rank}", exc, msg.reply)
            return handle

        return {kind: fenced(h) for kind, h in (
            (m.Hello, self.arrivals), (m.Progress, self._progress), (m.Heartbeat, self._heartbeat),
            (m.Epoch, self._epoch), (m.Snapshot, self._snapshot),
            (m.Checkpoint, self._checkpoint))}

    def _progress(self, msg: Message, body: m.Progress) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.perf_counter()
        if self.pending is not None:
            self.pending.resumed_at, self.pending = time.monotonic(), None
        self.progress.update(body.epoch, body.step, body.loss)

    def _heartbeat(self, msg: Message, body: m.Heartbeat) -> None:
        if self.evaluator.fatal is not None and self.recancelled != self.attempt:
            self.recancelled = self.attempt  # a stage submitted just after the fatal error's
            self.evaluator.on_fatal()  # cancel (which only reaches running jobs): once

        if msg.rank == 0:
            self.steps = int(body.steps)

    def _epoch(self, msg: Message, body: m.Epoch) -> None:
        self.evaluator.record_epoch(body.row, msg.reply)  # it reports the row once complete
        epoch = int(body.row["epoch"])
        if self.grow is not None and self.grow(epoch):
            self.grow = None  # asked once per attempt
            log.info("the slots for every rank are back: the ranks stop after epoch %d, "
                     "checkpoint, and are relaunched on all of them", epoch + 1)
            msg.reply(m.Stop(epoch, regrow=True).header())

    def _snapshot(self, msg: Message, body: m.Snapshot) -> None:
        self.evaluator.submit(body, msg.payload, msg.reply)

    def _checkpoint(self, msg: Message, body: m.Checkpoint) -> None:
        self.evaluator.checkpointed(body.epoch)


def attempt_phases(phases: Phases, hook: Dispatch) -> None:
    """An attempt's stage, in three: ``launch`` until every rank said hello (the tasks
    scheduled, their Python workers up), ``start`` until rank 0's first step (rendezvous,
    the model built and wrapped, the first batch read), ``training`` to the stage's end."""
    phases.end("launch", hook.arrivals.all_up_at)
    phases.end("start", hook.first_step_at)
    phases.end("training")
