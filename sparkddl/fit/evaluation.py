"""Driver side of snapshots: evaluate each one as it arrives, keep the history, pick the best,
and ask the ranks to stop when the chosen metric stops improving. Across restarts, it rewinds
to what it knew when the checkpoint being resumed from was written.

A BaseException that is not an Exception (a callback's KeyboardInterrupt or SystemExit), or
anything else that ends the evaluator's thread, is fatal: it is kept as :class:`Fatal`, the
running stage is stopped through ``on_fatal``, and the fit raises it once the ranks are gone.
Going on would train blind: no evaluation, no callbacks, no early stopping."""
from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from sparkddl import checkpoint
from sparkddl.channel import messages
from sparkddl.checkpoint.safe import load_plain
from sparkddl.data import Dataset
from sparkddl.data.local import validation_batches
from sparkddl.errors import ConfigError
from sparkddl.fit.callbacks import CallbackInterrupt, Callbacks
from sparkddl.store import Store
from sparkddl.train.components import build_module
from sparkddl.train.evaluate import EVAL_BATCH, RANKS_FROM_ROWS, evaluate
from sparkddl.train.steps import LossFn

log = logging.getLogger(__name__)

# how often drain() checks that the evaluator's thread still runs (a dead one sets nothing)
DRAIN_POLL_S = 0.2


@dataclass
class Snapshot:
    epoch: int
    state: dict[str, Any]


@dataclass
class Fatal:
    """What ended the fit from one of the driver's threads: ``where`` names it (a callback's
    hook, or the evaluator's own work), ``error`` is what was raised, with its traceback."""
    where: str
    error: BaseException


@dataclass
class EvaluationResult:
    history: list[dict[str, Any]]
    best: Snapshot | None
    last: Snapshot | None
    stop_requested_at: int | None = None
    errors: list[str] = field(default_factory=list)
    fatal: Fatal | None = None


@dataclass
class _Submitted:
    snapshot: messages.Snapshot
    payload: bytes
    reply: Callable[[dict[str, Any]], None]


@dataclass
class _RowDone:
    epoch: int
    reply: Callable[[dict[str, Any]], None]


@dataclass
class _Checkpointed:
    epochs_done: int


@dataclass
class _Best:
    snap: Snapshot | None = None
    value: float | None = None
    since: int = 0  # evaluated snapshots without improvement


class SnapshotEvaluator:
    """Runs on a background thread of the driver while training continues.

    ``record_epoch`` takes rank 0's epoch row; ``submit`` takes a snapshot (bytes, or a Store
    URL for large models) with the channel reply to rank 0, used to ask for a stop;
    ``checkpointed`` marks that the ranks wrote a checkpoint after an epoch, and saves what
    the driver knows at that point next to it. Weights are always loaded with
    ``torch.load(weights_only=True)``. The validation split is streamed from its Parquet in
    batches of ``EVAL_BATCH`` rows for every snapshot: the driver never holds all of it.
    ``on_fatal`` stops the running stage once ``fatal`` is set (see :meth:`abort`).
    """

    def __init__(self, model_factory: Callable[[], Any], step: LossFn,
                 metrics: dict[str, Callable[..., Any]], val: Dataset | None,
                 best_by: str, mode: str, patience: int, store: Store, run_id: str,
                 callbacks: Callbacks | None = None, snapshot_every: int = 1,
                 epochs: int = 0, transform: Any = None, transform_shapes: Any = (),
                 remote: Callable[[dict[str, Any], int], dict[str, float]] | None = None,
                 on_fatal: Callable[[], None] = lambda: None,
                 report: Callable[[dict[str, Any]], None] = lambda row: None):
        self.module = build_module(model_factory)
        self.remote = remote  # evaluation="cluster": a Spark job evaluates each snapshot
        self.step, self.metrics = step, metrics
        self.transform, self.transform_shapes = transform, transform_shapes
        self.val = val
        self.callbacks = callbacks or Callbacks([])
        self.snapshot_every, self.epochs = snapshot_every, epochs
        self.best_by, self.mode, self.patience = best_by, mode, patience
        self.store, self.run_id = store, run_id
        self.rows: dict[int, dict[str, Any]] = {}
        self._best = _Best()
        self._last: Snapshot | None = None
        self._stop_at: int | None = None
        self._errors: list[str] = []
        self.on_fatal = on_fatal
        self.report = report  # each epoch's row once complete (the console's epoch line)
        self.fatal: Fatal | None = None  # set once; the thread has ended or is ending
        # driver state last saved for this many epochs done: step checkpoints within an
        # epoch would save the same rows and best weights again
        self._saved_epochs: int | None = None
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="sparkddl-evaluator", daemon=True)
        self._thread.start()

    # ---- called from channel threads ----
    def record_epoch(self, row: dict[str, Any],
                     reply: Callable[[dict[str, Any]], None] = lambda header: None) -> None:
        epoch = int(row["epoch"])
        with self._lock:
            self.rows[epoch] = {**self.rows.get(epoch, {}), **row}
        if epoch % self.snapshot_every and epoch != self.epochs:
            self._queue.put(_RowDone(epoch, reply))  # no snapshot comes for this epoch

    def submit(self, snapshot: messages.Snapshot, payload: bytes,
               reply: Callable[[dict[str, Any]], None]) -> None:
        if self.fatal is None:  # else nobody would take it: do not hold its bytes
            self._queue.put(_Submitted(snapshot, payload, reply))

    def checkpointed(self, epochs_done: int) -> None:
        self._queue.put(_Checkpointed(epochs_done))

    # ---- called by the fit between attempts ----
    def drain(self) -> None:
        """Wait until everything submitted so far has been handled, or the thread ended
        (``fatal`` says why): a dead thread would never set the event."""
        done = threading.Event()
        self._queue.put(done)  # set once everything before it was handled
        while not done.wait(DRAIN_POLL_S):
            if not self._thread.is_alive():
                return

    def restarted(self, restart: Any) -> None:
        """The callbacks' on_restart (on the fit's thread, between attempts); a
        KeyboardInterrupt or SystemExit from it is fatal, as from any hook."""
        try:
            self.callbacks.restart(restart)
        except CallbackInterrupt as exc:
            self.abort(exc.hook, exc.error)

    def abort(self, where: str, error: BaseException,
              reply: Callable[[dict[str, Any]], None] | None = None) -> None:
        """End the fit: ``error`` was raised in ``where`` on one of the driver's threads and
        must not be lost. The first one counts; the running stage is stopped (``on_fatal``)
        and the fit raises it once the ranks have ended. ``reply`` (to a rank of the running
        stage) also asks the ranks to stop at the end of their epoch: Spark's cancel kills
        their Python workers only after spark.python.task.killTimeout, while they train on."""
        with self._lock:
            if self.fatal is not None:
                return
            self.fatal = Fatal(where, error)
        log.error("%s raised %s: stopping the fit", where, type(error).__name__,
                  exc_info=(type(error), error, error.__traceback__))
        # the ranks ignore a Stop's epoch: they stop after the one they are in
        stops = ([functools.partial(reply, messages.Stop(0).header())] if reply else []) + \
            [self.on_fatal]
        for stop in stops:
            try:
                stop()
            except Exception:  # the fit still raises the fatal error
                log.exception("could not stop the running stage after %s", where)

    def rewind(self, epochs_done: int) -> None:
        """Forget epochs after ``epochs_done``: a resumed attempt trains them again."""
        self.drain()
        self._saved_epochs = None
        saved = checkpoint.load_driver_state(self.store, self.run_id, epochs_done)
        with self._lock:
            if saved is not None:
                self.rows = {int(r["epoch"]): dict(r) for r in saved["rows"]}
                snap = Snapshot(saved["best_epoch"], saved["best_model"]) \
                    if saved["best_model"] is not None else None
                self._best = _Best(snap, saved["best_value"], saved["since_best"])
            else:
                self.rows = {e: r for e, r in self.rows.items() if e <= epochs_done}
                if self._best.snap is not None and self._best.snap.epoch > epochs_done:
                    self._best = _Best()
            if self._last is not None and self._last.epoch > epochs_done:
                self._last = None
            self._stop_at = None

    def close(self) -> EvaluationResult:
        """Wait for every submitted snapshot to be evaluated."""
        self._queue.put(None)
        self._thread.join()
        with self._lock:
            history = [self.rows[e] for e in sorted(self.rows)]
        return EvaluationResult(history, self._best.snap, self._last, self._stop_at,
                                self._errors + self.callbacks.errors, self.fatal)

    # ---- the evaluator thread ----
    def _loop(self) -> None:
        item: Any = None
        try:
            # after a fatal error raised elsewhere (abort), nothing more is handled
            while (item := self._queue.get()) is not None and self.fatal is None:
                self._item(item)
        except CallbackInterrupt as exc:  # a KeyboardInterrupt (a cancel) or SystemExit
            self.abort(exc.hook, exc.error, getattr(item, "reply", None))
        except BaseException as exc:  # noqa: BLE001 - nothing may end this thread unseen
            self.abort(f"sparkddl's evaluator thread (handling {_describe(item)})", exc,
                       getattr(item, "reply", None))

    def _item(self, item: Any) -> None:
        try:
            if isinstance(item, _Submitted):
                self._handle(item.snapshot, item.payload, item.reply)
            elif isinstance(item, _RowDone):
                self._epoch_done(item.epoch, item.reply)
            elif isinstance(item, _Checkpointed):
                if item.epochs_done != self._saved_epochs:
                    self._save_state(item.epochs_done)
                    self._saved_epochs = item.epochs_done
            else:
                item.set()
        except Exception as exc:  # a bad snapshot must not kill the fit's bookkeeping
            log.exception("handling a %s on the driver failed", type(item).__name__)
            self._errors.append(f"{type(exc).__name__}: {exc}")

    def _save_state(self, epochs_done: int) -> None:
        with self._lock:
            rows = [self.rows[e] for e in sorted(self.rows) if e <= epochs_done]
            best = self._best
        checkpoint.save_driver_state(self.store, self.run_id, epochs_done, {
            "rows": rows, "best_epoch": best.snap.epoch if best.snap else 0,
            "best_value": best.value, "since_best": best.since,
            "best_model": best.snap.state if best.snap else None})

    def _handle(self, snapshot: messages.Snapshot, payload: bytes,
                reply: Callable[[dict[str, Any]], None]) -> None:
        epoch = snapshot.epoch
        data = self.store.read_bytes(snapshot.url) if snapshot.url else payload
        state = load_plain(data, snapshot.url or f"the snapshot of epoch {epoch} from rank 0",
                           map_location="cpu")
        snap = Snapshot(epoch, state)
        if snapshot.metrics is not None:  # the ranks evaluated it (evaluation="ranks")
            scores = dict(snapshot.metrics)
        elif self.val is not None:
            started = time.perf_counter()
            scores = self.remote(state, epoch) if self.remote else self._evaluate(state)
            scores["val_time_s"] = time.perf_counter() - started
        else:
            scores = {}
        with self._lock:
            row = self.rows.setdefault(epoch, {"epoch": epoch})
            row.update(scores)
            value = row.get(self.best_by)
        self._last = snap
        self.callbacks.snapshot(epoch, state)
        if value is not None:
            self._update_best(snap, float(value), reply)
        self._epoch_done(epoch, reply)

    def _epoch_done(self, epoch: int, reply: Callable[[dict[str, Any]], None]) -> None:
        """The epoch's row is complete (its validation metrics in it): it is reported, and
        the callbacks see it and may ask for a stop."""
        with self._lock:
            row = dict(self.rows.get(epoch, {"epoch": epoch}))
        self.report(row)
        if self.callbacks.epoch_end(row) and self._stop_at is None and epoch != self.epochs:
            self._stop_at = epoch
            log.info("a callback asked to stop after epoch %d; asking the ranks to stop", epoch)
            reply(messages.Stop(epoch).header())

    def _update_best(self, snap: Snapshot, value: float,
                     reply: Callable[[dict[str, Any]], None]) -> None:
        b = self._best
        improved = not math.isnan(value) and (
            b.value is None or (value < b.value if self.mode == "min" else value > b.value))
        if improved:  # NaN is never best: a diverged snapshot only counts against patience
            self._best = _Best(snap, value, 0)
            return
        b.since += 1
        if self.patience and b.since >= self.patience and self._stop_at is None:
            self._stop_at = snap.epoch
            log.info("%s has not improved for %d evaluated snapshots (best %.5g at epoch %d); "
                     "asking the ranks to stop", self.best_by, b.since, b.value,
                     b.snap.epoch if b.snap else -1)
            reply(messages.Stop(snap.epoch).header())

    def _evaluate(self, state: dict[str, Any]) -> dict[str, float]:
        assert self.val is not None
        self.module.load_state_dict(state)
        return evaluate(self.module, self.step, self.metrics,
                        validation_batches(self.val, self.transform, self.transform_shapes,
                                           "the driver", size=EVAL_BATCH))


def _describe(item: Any) -> str:
    if isinstance(item, _Submitted):
        return f"the snapshot of epoch {item.snapshot.epoch}"
    if isinstance(item, _RowDone):
        return f"the end of epoch {item.epoch}"
    if isinstance(item, _Checkpointed):
        return f"the checkpoint after epoch {item.epochs_done}"
    return "its queue"


def evaluation_mode(config: Any, val: Dataset | None) -> str:
    """Where the snapshots are evaluated: "driver", "ranks" (evaluation="ranks", or "auto"
    with a large split) or "cluster" (a Spark job beside the fit: asked for only); a
    ConfigError where "ranks" cannot be done."""
    if val is None or config.evaluation in ("driver", "cluster"):
        return config.evaluation if val is not None else "driver"
    return "ranks" if _on_ranks(config, val) else "driver"


def _on_ranks(config: Any, val: Dataset) -> bool:
    why = ""
    if config.strategy == "fsdp":
        why = "strategy 'fsdp' gathers the whole model on rank 0 only"
    elif val.rows < config.num_workers:
        why = (f"the validation split has {val.rows} row(s) for {config.num_workers} ranks, "
               "and each rank evaluates at least one")
    if config.evaluation == "ranks":
        if why:
            raise ConfigError(f"evaluation='ranks' is not possible here: {why}; use "
                              "evaluation='driver' (or 'auto')")
        return True
    chosen = not why and val.rows >= RANKS_FROM_ROWS
    log.info("evaluation: on the %s (evaluation='auto', %d validation rows%s)",
             "ranks" if chosen else "driver", val.rows, f"; {why}" if why else "")
    return chosen
