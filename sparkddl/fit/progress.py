"""Driver-side progress: a tqdm bar on a terminal, plain log lines otherwise."""
from __future__ import annotations

import logging
import sys
import time
from typing import Any

log = logging.getLogger("sparkddl.progress")


class _Unconfigured(logging.StreamHandler):
    """Prints progress only while the application has configured no logging (no handler on
    the root logger): the lines are then visible without any setup, and once logging is
    set up they go through the application's handlers instead, never twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            self.stream = sys.stderr  # looked up now: notebooks and test captures swap it
            super().emit(record)


if not any(isinstance(h, _Unconfigured) for h in log.handlers):
    _handler = _Unconfigured()
    _handler.setFormatter(logging.Formatter("%(asctime)s sparkddl: %(message)s", "%H:%M:%S"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)

LOG_EVERY_S = 10.0


class Progress:
    """``samples_per_step`` (batch size x workers) turns step counts into samples/s."""

    def __init__(self, epochs: int, steps_per_epoch: int, enabled: bool = True,
                 samples_per_step: int = 0):
        self.epochs, self.steps = epochs, steps_per_epoch
        self.enabled = enabled
        self.samples_per_step = samples_per_step
        self._bar: Any = None
        self._last_log = 0.0
        self._mark: tuple[float, int] | None = None  # (time, steps done) the rate counts from
        self._rate: float | None = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=epochs * steps_per_epoch, unit="step", dynamic_ncols=True)

    def _samples_per_s(self, now: float, done: int) -> float | None:
        """Over the last second or more; restarts when a resumed run goes back."""
        if self._mark is None or done < self._mark[1]:
            self._mark, self._rate = (now, done), None
        elif now - self._mark[0] >= 1.0:
            self._rate = (done - self._mark[1]) * self.samples_per_step / (now - self._mark[0])
            self._mark = (now, done)
        return self._rate

    def update(self, epoch: int, step: int, loss: float) -> None:
        if not self.enabled:
            return
        done = (epoch - 1) * self.steps + step
        now = time.monotonic()
        rate = self._samples_per_s(now, done)
        if self._bar is not None:
            self._bar.n = done
            self._bar.set_description(f"epoch {epoch}/{self.epochs}")
            self._bar.set_postfix(loss=f"{loss:.4f}",
                                  **({"samples/s": f"{rate:,.0f}"} if rate else {}))
            return
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.info("epoch %d/%d step %d/%d loss %.4f%s", epoch, self.epochs, step, self.steps,
                     loss, f" samples/s {rate:,.0f}" if rate else "")

    def epoch(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        parts = [f"{k} {v:.4g}" for k, v in row.items()
                 if isinstance(v, float) and k not in ("epoch_time_s",)]
        text = f"epoch {row['epoch']}/{self.epochs}: " + ", ".join(parts)
        if self._bar is not None:
            self._bar.write(text)
        else:
            log.info("%s", text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
