"""Driver side of snapshots: evaluate each one as it arrives, keep the history, pick the best,
and ask the ranks to stop when the chosen metric stops improving."""
from __future__ import annotations

import io
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from sparkddl.store import Store
from sparkddl.train.components import build_module

log = logging.getLogger(__name__)

EVAL_BATCH = 1024


@dataclass
class Snapshot:
    epoch: int
    state: dict[str, Any]


@dataclass
class EvaluationResult:
    history: list[dict[str, Any]]
    best: Snapshot | None
    last: Snapshot | None
    stop_requested_at: int | None = None
    errors: list[str] = field(default_factory=list)


class SnapshotEvaluator:
    """Runs on a background thread of the driver while training continues.

    ``record_epoch`` takes rank 0's epoch row; ``submit`` takes a snapshot (bytes, or a Store
    URL for large models) and the channel reply to rank 0, used to ask for a stop. Weights
    are always loaded with ``torch.load(weights_only=True)``.
    """

    def __init__(self, model_factory: Callable[[], Any], loss_fn: Callable[..., Any],
                 metrics: dict[str, Callable[..., Any]], val: dict[str, Any] | None,
                 features: tuple[str, ...], label: str, best_by: str, mode: str,
                 patience: int, store: Store):
        self.module = build_module(model_factory)
        self.loss_fn, self.metrics = loss_fn, metrics
        self.val, self.features, self.label = val, features, label
        self.best_by, self.mode, self.patience = best_by, mode, patience
        self.store = store
        self.rows: dict[int, dict[str, Any]] = {}
        self._best: Snapshot | None = None
        self._best_value: float | None = None
        self._last: Snapshot | None = None
        self._since_best = 0
        self._stop_at: int | None = None
        self._errors: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="sparkddl-evaluator", daemon=True)
        self._thread.start()

    def record_epoch(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.rows.setdefault(int(row["epoch"]), {}).update(row)

    def submit(self, header: dict[str, Any], payload: bytes,
               reply: Callable[[dict[str, Any]], None]) -> None:
        self._queue.put((header, payload, reply))

    def close(self) -> EvaluationResult:
        """Wait for every submitted snapshot to be evaluated."""
        self._queue.put(None)
        self._thread.join()
        with self._lock:
            history = [self.rows[e] for e in sorted(self.rows)]
        return EvaluationResult(history, self._best, self._last, self._stop_at, self._errors)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._handle(*item)
            except Exception as exc:  # a bad snapshot must not kill the fit's bookkeeping
                log.exception("evaluating a snapshot failed")
                self._errors.append(f"{type(exc).__name__}: {exc}")

    def _handle(self, header: dict[str, Any], payload: bytes,
                reply: Callable[[dict[str, Any]], None]) -> None:
        import torch
        epoch = int(header["epoch"])
        data = self.store.read_bytes(header["url"]) if "url" in header else payload
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        snap = Snapshot(epoch, state)
        scores = self._evaluate(state) if self.val is not None else {}
        with self._lock:
            row = self.rows.setdefault(epoch, {"epoch": epoch})
            row.update(scores)
            value = row.get(self.best_by)
        self._last = snap
        if value is None:
            return
        better = self._best_value is None or (
            value < self._best_value if self.mode == "min" else value > self._best_value)
        if better:
            self._best, self._best_value, self._since_best = snap, float(value), 0
            return
        self._since_best += 1
        if self.patience and self._since_best >= self.patience and self._stop_at is None:
            self._stop_at = epoch
            log.info("%s has not improved for %d evaluated snapshots (best %.5g at epoch %d); "
                     "asking the ranks to stop", self.best_by, self._since_best,
                     self._best_value, self._best.epoch if self._best else -1)
            reply({"type": "stop", "epoch": epoch})

    def _evaluate(self, state: dict[str, Any]) -> dict[str, float]:
        import torch
        assert self.val is not None
        self.module.load_state_dict(state)
        self.module.eval()
        n_total = len(self.val[self.label])
        sums = {"val_loss": 0.0, **{f"val_{k}": 0.0 for k in self.metrics}}
        with torch.no_grad():
            for start in range(0, n_total, EVAL_BATCH):
                inputs = [torch.from_numpy(self.val[f][start:start + EVAL_BATCH])
                          for f in self.features]
                target = torch.from_numpy(self.val[self.label][start:start + EVAL_BATCH])
                output = self.module(*inputs)
                n = len(target)
                sums["val_loss"] += float(self.loss_fn(output, target)) * n
                for k, fn in self.metrics.items():
                    sums[f"val_{k}"] += float(fn(output, target)) * n
        return {k: v / n_total for k, v in sums.items()}
