"""Imports a rank makes ahead of need, on a thread of its own while it waits in the
rendezvous (a socket wait, without the GIL): a first fit's Petastorm costs ~2 s."""
from __future__ import annotations

import importlib
import logging
import threading

log = logging.getLogger(__name__)


def warm_imports(modules: tuple[str, ...]) -> threading.Thread | None:
    """Import ``modules`` on a daemon thread; a module that fails to import is left to
    whoever needs it (which says why). The rendezvous waits on sockets, without the GIL."""
    if not modules:
        return None

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # reported by the code that uses it
                log.debug("warm import of %s failed", name, exc_info=True)

    thread = threading.Thread(target=run, daemon=True, name="sparkddl-warm-imports")
    thread.start()
    return thread
