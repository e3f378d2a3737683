"""User callbacks, run on the driver: ``on_fit_start(estimator)``, ``on_epoch_end(row)``
(return True to stop training; the ranks agree on it after the same step, as with early
stopping), ``on_snapshot(epoch, state_dict)``, ``on_restart(restart)`` (a failed attempt,
before the ranks are relaunched; see sparkddl.fit.restarts.Restart) and
``on_fit_end(model)``. A callback may define any subset. One that raises fails the fit with
its name, except ``on_epoch_end``, ``on_snapshot`` and ``on_restart``, which run while the
fit goes on: their errors (an ``Exception``) are kept with the fit's evaluation errors and
logged, and training goes on.

What is not an ``Exception`` ends the fit: from ``on_epoch_end``, ``on_snapshot`` or
``on_restart``, a ``KeyboardInterrupt`` is a cancel (the ranks are stopped and the fit raises
``JobCancelledError``, naming the callback and the checkpoint to resume from, as after
Ctrl-C), and a ``SystemExit`` or another ``BaseException`` stops the ranks and is raised
again by the fit, with a note naming the callback and hook; no later epoch is trained and no
restart starts. From ``on_fit_start`` and ``on_fit_end`` (no ranks run then) it is raised as
it is, with that note."""
from __future__ import annotations

import logging
from typing import Any

from sparkddl.errors import ConfigError, add_note

log = logging.getLogger(__name__)

HOOKS = ("on_fit_start", "on_epoch_end", "on_snapshot", "on_restart", "on_fit_end")


class CallbackInterrupt(BaseException):
    """A hook that runs while the ranks train raised what is not an ``Exception``
    (KeyboardInterrupt, SystemExit): the fit must end. A BaseException itself, so that no
    ``except Exception`` on its way swallows it; ``hook`` names the callback and hook,
    ``error`` is what it raised (also the ``__cause__``)."""

    def __init__(self, hook: str, error: BaseException):
        super().__init__(f"{hook} raised {type(error).__name__}: {error}")
        self.hook, self.error = hook, error


class Callbacks:
    def __init__(self, callbacks: Any):
        if callbacks is None:
            callbacks = []
        elif not isinstance(callbacks, (list, tuple)):
            callbacks = [callbacks]
        for cb in callbacks:
            if not any(callable(getattr(cb, h, None)) for h in HOOKS):
                raise ConfigError(f"callback {cb!r} has none of the hooks {', '.join(HOOKS)}; "
                                  "define at least one as a method")
        self.items = list(callbacks)
        self.errors: list[str] = []  # from hooks that run while the ranks train

    def __bool__(self) -> bool:
        return bool(self.items)

    def _call(self, hook: str, *args: Any, guarded: bool = False) -> list[Any]:
        out = []
        for cb in self.items:
            fn = getattr(cb, hook, None)
            if not callable(fn):
                continue
            name = f"callback {type(cb).__name__}.{hook}"
            if not guarded:  # the user's own error, as raised, with a note naming the hook
                try:
                    out.append(fn(*args))
                except BaseException as exc:
                    add_note(exc, f"(raised by {name}, which sparkddl ran on the driver)")
                    raise
                continue
            try:  # runs while the ranks train: they go on; the fit reports the error
                out.append(fn(*args))
            except Exception as exc:
                log.exception("%s failed", name)
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            except BaseException as exc:  # a cancel or an exit: the fit must end, not go on
                add_note(exc, f"(raised by {name}, which sparkddl ran on the driver while "
                              "the ranks trained; the fit was stopped)")
                raise CallbackInterrupt(name, exc) from exc
        return out

    def fit_start(self, estimator: Any) -> None:
        self._call("on_fit_start", estimator)

    def epoch_end(self, row: dict[str, Any]) -> bool:
        """True when any callback asks to stop."""
        return any(r is True for r in self._call("on_epoch_end", dict(row), guarded=True))

    def snapshot(self, epoch: int, state: dict[str, Any]) -> None:
        self._call("on_snapshot", epoch, state, guarded=True)

    def restart(self, restart: Any) -> None:
        self._call("on_restart", restart, guarded=True)

    def fit_end(self, model: Any) -> None:
        self._call("on_fit_end", model)
