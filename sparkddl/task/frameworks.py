"""What training libraries leave behind in a reused Python worker, and whether a run's ranks
really trained together.

Spark runs the next task in the same Python worker. Libraries keep process-wide state that
describes the process group of the run that created it: accelerate's ``PartialState`` (a
singleton) still says "distributed, rank r of N" after sparkddl ended the group, so the next
``Accelerator(cpu=True)`` in the same worker fails in ``prepare``. That state is reset when a
rank's task ends, as is every environment variable the function set (Lightning's
``PL_GLOBAL_SEED``, accelerate's ``ACCELERATE_*``...).

A function whose ranks never form one process group of the run's size trains N copies of the
model that never exchange anything, and reports success: a bare ``Accelerator()`` on CPU, a
Lightning ``Trainer()`` without ``num_nodes``. :class:`GroupWatch` notes the largest default
process group a rank formed, and the driver warns (:class:`UnsyncedTrainingWarning`) when the
ranks formed none of the run's size.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

log = logging.getLogger(__name__)


class UnsyncedTrainingWarning(UserWarning):
    """A multi-rank run whose ranks never formed a process group spanning all of them. Make
    it an error with ``warnings.simplefilter("error", UnsyncedTrainingWarning)``."""


def unsynced_message(world: int, formed: int, caller: str) -> str:
    """The driver's warning, in the user's terms, with the usual fixes."""
    seen = (f"its ranks trained in groups of {formed} at most" if formed
            else "no rank called torch.distributed.init_process_group")
    return (f"{caller} ran {world} ranks, but {seen}: if they trained a model, they trained "
            f"{world} separate copies that never exchanged gradients. Form one group of "
            f"{world}: torch.distributed.init_process_group() (or sparkddl.init_process_group"
            "()); with accelerate, Accelerator(cpu=True) on CPU; with Lightning, "
            f"Trainer(devices=1, num_nodes={world}, strategy='ddp'). Ranks that are meant to "
            "work apart can silence this with warnings.filterwarnings('ignore', category="
            "sparkddl.UnsyncedTrainingWarning).")


def warn_unsynced(world: int, groups: list[int], caller: str, stacklevel: int = 4) -> None:
    """On the driver: warn when a multi-rank run's ranks (those that said: -1 is unknown)
    never formed one process group of all of them."""
    known = [g for g in groups if g >= 0]
    if world > 1 and known and max(known) < world:
        message = unsynced_message(world, max(known), caller)
        log.warning("%s", message)
        warnings.warn(message, UnsyncedTrainingWarning, stacklevel=stacklevel)


class GroupWatch:
    """While a rank's function runs, the size of the largest default process group it
    initialized (through torch's ``_update_default_pg``, present from torch 1.x to 2.13, or
    still initialized when the function returns)."""

    def __init__(self) -> None:
        self.largest = 0

    def note(self) -> None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            self.largest = max(self.largest, dist.get_world_size())

    @contextmanager
    def watching(self) -> Iterator["GroupWatch"]:
        import torch.distributed.distributed_c10d as c10d
        # init_process_group installs its group through this module-level helper, looked up
        # at call time: seen however the function imported init_process_group (the DDP
        # tutorial's `from torch.distributed import init_process_group` included)
        update = c10d._update_default_pg

        def _update_default_pg(pg: Any) -> Any:
            out = update(pg)
            if pg is not None:
                self.largest = max(self.largest, int(pg.size()))
            return out

        c10d._update_default_pg = _update_default_pg
        try:
            yield self
            self.note()
            used = _accelerate_processes()
            if used is not None:  # accelerate formed a group it does not train with
                self.largest = min(self.largest, used)
        finally:
            c10d._update_default_pg = update


def _accelerate_processes() -> int | None:
    """How many processes accelerate's state trains with, if the function made one: a bare
    ``Accelerator()`` on CPU initializes the run's gloo group and then trains alone."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None) or {}
    value = shared.get("num_processes")
    return value if isinstance(value, int) else None


def reset_library_state() -> None:
    """Forget the run's process group in the libraries that cache it process-wide (only
    those the function imported: nothing is imported here)."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        for name, args in (("AcceleratorState", (True,)), ("GradientState", ()),
                           ("PartialState", ())):
            reset = getattr(getattr(state, name, None), "_reset_state", None)
            try:
                if reset is not None:
                    reset(*args)
            except Exception as exc:  # noqa: BLE001 - a private API: never fail the run
                log.warning("could not reset accelerate's %s (%s: %s); a later run in this "
                            "Python worker may see this run's state", name,
                            type(exc).__name__, exc)


@contextmanager
def restored_environ() -> Iterator[None]:
    """``os.environ`` as it was, whatever the function set, changed or removed."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k not in saved]:
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
