"""What a fit keeps of itself in the store, under runs/<id>/: run.json (what the run trains on
and how it is laid out, so a resume can check both; the latest fit's phases), history.json
(the epochs evaluated), and what to tell a user about resuming it."""
from __future__ import annotations

import json
import logging
import time
from typing import Any

from sparkddl import checkpoint
from sparkddl.config import TrainConfig
from sparkddl.data import PreparedData
from sparkddl.errors import CheckpointError, ConfigError
from sparkddl.launch.phases import Phases
from sparkddl.store import Store

log = logging.getLogger(__name__)


def record_phases(store: Store, run_id: str, phases: Phases) -> None:
    """The fit's phases, logged in one line and kept in runs/<id>/run.json ("phases": the
    latest fit's of this run id)."""
    log.info("fit %s in %s", run_id, phases.line())
    url = store.run_url(run_id, "run.json")
    try:
        record = json.loads(store.read_bytes(url))
        record["phases"] = phases.rounded()
        store.write_bytes(url, json.dumps(record).encode())
    except Exception as exc:  # noqa: BLE001 - the fit's outcome stands without it
        log.warning("could not record the phases of run %s: %s", run_id, exc)


def resume_hint(store: Store, run_id: str) -> str:
    ref = checkpoint.latest_good(store, run_id)
    if ref is None:
        return "No checkpoint was written yet."
    return (f"The last checkpoint ({ref.epoch} epoch(s) done) is kept: fit again with "
            f"runId={run_id!r} to resume from it.")


def record_run(store: Store, run_id: str, data: PreparedData, config: TrainConfig,
                steps_per_epoch: int) -> None:
    """runs/<id>/run.json: what the run trains on and how it is laid out, so a resume by run
    id can check both (a checkpoint's position and per-rank state fit only that layout)."""
    url = store.run_url(run_id, "run.json")
    layout = {"fingerprint": data.fingerprint, "num_workers": config.num_workers,
              "batch_size": config.batch_size, "steps_per_epoch": steps_per_epoch}
    if not store.exists(url):
        store.write_bytes(url, json.dumps({"run_id": run_id, "created": time.time(),
                                           **layout}).encode())
        return
    try:
        previous = json.loads(store.read_bytes(url))
        if not isinstance(previous, dict):
            raise ValueError(f"a JSON {type(previous).__name__}, not an object")
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"run {run_id}: {url} is not the JSON sparkddl writes ({exc}), so "
                              "the run cannot be checked for resuming; delete that file (this "
                              "fit then records its setup again and resumes from the run's "
                              "checkpoints), or leave runId unset to start a new run") from None
    changed = {k: (previous.get(k), v) for k, v in layout.items() if previous.get(k) != v}
    if changed:
        what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
        raise ConfigError(f"run {run_id} cannot be resumed with a different setup ({what}); "
                          "use the same data, numWorkers and batchSize, or leave runId unset "
                          "to start a new run")


def write_history(store: Store, run_id: str, history: list[dict[str, Any]]) -> None:
    """runs/<id>/history.json, also when the fit failed: what was evaluated so far."""
    try:
        store.write_bytes(store.run_url(run_id, "history.json"),
                          json.dumps(history, indent=1, default=str).encode())
    except Exception as exc:  # noqa: BLE001 - never mask the fit's own outcome
        log.warning("could not write the history of run %s: %s", run_id, exc)
