"""MLflow run logging from the driver: params, per-epoch metrics, restarts, the outcome, on a
thread of its own (see the package's docstring)."""
from __future__ import annotations

import json
import logging
import queue
import socket
import sys
import threading
import time
from typing import Any, Callable
from urllib.parse import urlparse

from sparkddl.errors import ConfigError
from sparkddl.tracking.flavor import input_example, log_model

log = logging.getLogger("sparkddl.tracking")  # one logger for the wing

SETTINGS = (None, "auto", True, False)
PROBE_TIMEOUT_S = 3.0
DRAIN_TIMEOUT_S = 300.0  # waiting for queued MLflow calls at the end of a fit
ERROR_DRAIN_S = 5.0  # the same after a failed or interrupted fit


def check_setting(value: Any) -> None:
    if not any(value is s or (isinstance(s, str) and value == s) for s in SETTINGS):
        raise ConfigError(f"mlflow={value!r}: use None (log when an MLflow run is active), "
                          "True (start a run if none is) or False (off)")
    if value is True:
        try:
            import mlflow  # noqa: F401
        except ImportError as exc:
            raise ConfigError("mlflow=True but mlflow is not installed; pip install "
                              "mlflow-skinny (sparkddl's mlflow extra), or set mlflow=False"
                              ) from exc


def unreachable(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why an http(s) tracking server cannot be reached (a TCP connect), else None; other
    URIs (files, databases, databricks) and servers behind a proxy are not probed."""
    import urllib.request
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    if parsed.scheme in urllib.request.getproxies() and \
            not urllib.request.proxy_bypass(parsed.hostname):
        return None  # MLflow goes through the proxy; a direct connect says nothing
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"cannot connect to {parsed.hostname}:{port} ({exc})"
    return None


class MlflowTracking:
    """One fit's MLflow logging. ``on_epoch_end`` and ``on_restart`` are Callbacks hooks
    (they run on the driver's evaluator and fit threads); ``begin`` and ``finish`` run on the
    caller's thread. Runs are created and ended through MlflowClient, never MLflow's
    per-thread stack of active runs, so fits on several threads (CrossValidator's pool) and
    the caller's own ``with mlflow.start_run()`` do not disturb each other."""

    def __init__(self, client: Any, run_id: str, started_here: bool):
        self.client = client
        self.run_id, self.started_here = run_id, started_here
        self.failed: str | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sparkddl-mlflow", daemon=True)
        self._thread.start()

    @classmethod
    def begin(cls, setting: Any, params: dict[str, Any]) -> "MlflowTracking | None":
        """Start logging for a fit with these Params, or None when it is off (or MLflow cannot
        be reached: one warning, and the fit goes on).

        With a run active on this thread the fit logs into it, or into a child run of it when
        a fit has logged there already (a loop in a notebook: the params would clash); with
        none, ``setting=True`` creates a run in the current experiment."""
        check_setting(setting)
        if setting is False:
            return None
        if setting is not True and "mlflow" not in sys.modules:
            # a run can be active only where MLflow was imported: the default need not import it
            # (2.5 s of a cold process's first fit)
            return None
        try:
            import mlflow
        except ImportError:
            return None
        active = mlflow.active_run()
        if active is None and setting is not True:
            return None
        uri = mlflow.get_tracking_uri()
        why = unreachable(uri)
        if why is None:
            try:
                from mlflow.tracking import MlflowClient
                client = MlflowClient()
                started = active is None or _has_a_fit(client, active.info.run_id)
                if active is None:
                    run_id = client.create_run(_experiment_id()).info.run_id
                elif started:
                    run_id = client.create_run(active.info.experiment_id, tags={
                        "mlflow.parentRunId": active.info.run_id}).info.run_id
                else:
                    run_id = active.info.run_id
            except Exception as exc:  # noqa: BLE001 - training goes on without MLflow
                why = f"cannot start a run: {type(exc).__name__}: {exc}"
        if why is not None:
            log.warning("MLflow tracking at %s: %s; training goes on without MLflow logging",
                        uri, why)
            return None
        tracking = cls(client, run_id, started)  # pyright: ignore[reportPossiblyUnboundVariable] - bound when why is None
        tracking._submit(lambda c, run: _log_params(c, run, params))
        from importlib.metadata import version  # the installed package's: no import upward
        tracking._submit(lambda c, run: c.set_tag(run, "sparkddl.version", version("sparkddl")))
        return tracking

    # ---- Callbacks hooks ----
    def on_epoch_end(self, row: dict[str, Any]) -> None:
        epoch = int(row.get("epoch", 0))
        stamp = int(time.time() * 1000)
        values = {k: float(v) for k, v in row.items()
                  if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if values:
            self._submit(lambda c, run: _log_metrics(c, run, values, epoch, stamp))

    def on_restart(self, restart: Any) -> None:
        text = (f"{restart.reason} | resumed from epoch {restart.resumed_from_epoch} step "
                f"{restart.resumed_from_step}, {restart.steps_redone} steps redone")
        attempt = restart.attempt
        self._submit(lambda c, run: c.set_tag(run, f"sparkddl.restart.{attempt}", text[:5000]))

    # ---- the end ----
    def finish(self, model: Any = None, dataset: Any = None, error: Any = None) -> str | None:
        """Log the outcome (and the model, when the fit succeeded); end the run if it was
        started here. The model's URI, or None when it was not logged. Training is never
        held up by MLflow, but this waits for what is still queued (up to DRAIN_TIMEOUT_S;
        a few seconds when the fit failed or was interrupted) and for the model's upload."""
        uri = None
        interrupted = error is not None and not isinstance(error, Exception)
        try:
            if model is not None:
                tags = {"sparkddl.run_id": model.run_id,
                        "sparkddl.chosen_epoch": str(model.chosen_epoch),
                        "sparkddl.best_by": model.best_by,
                        "sparkddl.epochs_done": str(model.epochs_done),
                        "sparkddl.stopped_early": str(model.stopped_early),
                        "sparkddl.restarts": str(len(model.restarts))}
                self._submit(lambda c, run: [c.set_tag(run, k, v) for k, v in tags.items()])
            elif error is not None:
                text = f"{type(error).__name__}: {error}"[:5000]
                self._submit(lambda c, run: c.set_tag(run, "sparkddl.error", text))
            self._drain(DRAIN_TIMEOUT_S if error is None else ERROR_DRAIN_S)
            if model is not None and self.failed is None:
                try:
                    uri = log_model(model, self.run_id,
                                    dataset.schema if dataset is not None else None,
                                    input_example(dataset, model._features())
                                    if dataset is not None else None)
                except Exception as exc:  # noqa: BLE001 - the fit itself succeeded
                    log.warning("MLflow: could not log the model to run %s: %s: %s",
                                self.run_id, type(exc).__name__, exc)
        finally:
            if self.started_here:
                self._end_run("FINISHED" if error is None else
                              "KILLED" if interrupted else "FAILED")
        return uri

    def _end_run(self, status: str) -> None:
        """End the run this fit started, unless someone ended it already (its status is
        theirs to keep)."""
        try:
            if self.client.get_run(self.run_id).info.status == "RUNNING":
                self.client.set_terminated(self.run_id, status)
        except Exception as exc:  # noqa: BLE001
            log.warning("MLflow: could not end run %s: %s", self.run_id, exc)

    # ---- the MLflow thread ----
    def _submit(self, call: Callable[[Any, str], Any]) -> None:
        if self.failed is None:
            self._queue.put(call)

    def _drain(self, timeout_s: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive() and self.failed is None:
            self.failed = f"still busy after {timeout_s:.0f} s"
            log.warning("MLflow: run %s was %s; the model is not logged", self.run_id,
                        self.failed)

    def _loop(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            if self.failed is not None:
                continue
            try:
                call(self.client, self.run_id)
            except Exception as exc:  # noqa: BLE001 - one warning, then logging is off
                self.failed = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
                log.warning("MLflow logging to run %s failed (%s); it is off for the rest of "
                            "this fit, and training goes on", self.run_id, self.failed)


def _has_a_fit(client: Any, run_id: str) -> bool:
    """Whether a fit has logged to this run already."""
    return "sparkddl.version" in client.get_run(run_id).data.tags


def _experiment_id() -> str:
    """The experiment a new run goes to: the one set in this process (set_experiment,
    MLFLOW_EXPERIMENT_NAME/ID, a Databricks notebook's own), else the default."""
    from mlflow.tracking import fluent
    try:
        return fluent._get_experiment_id() or "0"
    except Exception:  # noqa: BLE001 - a private helper; the default experiment then
        return "0"


def _log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    """Every Param; one the run already holds with another value (the caller logged it
    before the fit) keeps the run's value, and one warning names them: MLflow refuses to
    change a param, and that must not turn the rest of the logging off."""
    from mlflow.entities import Param
    try:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH as limit  # noqa: N811
    except ImportError:
        limit = 500
    texts = {k: param_text(v)[:limit] for k, v in sorted(params.items())}
    held = client.get_run(run_id).data.params
    clashes = sorted(k for k, v in texts.items() if k in held and held[k] != v)
    if clashes:
        log.warning("MLflow run %s already has the param(s) %s with other values; they keep "
                    "the run's values (this fit's are in its Params)", run_id,
                    ", ".join(clashes))
    items = [Param(k, v) for k, v in texts.items() if k not in held]
    for i in range(0, len(items), 100):  # MLflow's batch limit
        client.log_batch(run_id, params=items[i:i + 100])


def _log_metrics(client: Any, run_id: str, values: dict[str, float], epoch: int,
                 stamp: int) -> None:
    from mlflow.entities import Metric
    client.log_batch(run_id, metrics=[Metric(k, v, stamp, epoch) for k, v in values.items()])


def param_text(value: Any) -> str:
    """A Param's value as MLflow param text: JSON for plain data, else a short description
    (a module's class, a function's name)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return str(value)
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        pass
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if name:
        return f"{getattr(value, '__module__', '')}.{name}".lstrip(".")
    return repr(value) if len(repr(value)) < 500 else type(value).__name__
