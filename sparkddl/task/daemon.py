"""A Python worker daemon that has torch imported before it forks the workers: with
``spark.python.daemon.module=sparkddl.task.daemon`` (set when the session starts), every
Python worker of the application (the ranks', the scoring UDFs', the checks') begins with
torch and what a rank imports first already loaded, shared copy-on-write, instead of each
importing them itself (about a second per worker on two cores). Opt-in: the daemon's own
start takes that second once per executor, and each worker holds torch's modules.

Nothing here starts a thread before the fork (importing torch starts none); pyarrow is not
imported, so no allocator state crosses the fork."""
from __future__ import annotations

import importlib

# what the daemon imports before it serves: torch, and what torch.optim's first optimizer
# loads (torch._dynamo); sparkddl's own rank modules are small and import on use
PRELOADED = ("torch", "torch._dynamo")


def main() -> None:
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a worker that needs it says why
            pass
    # the workers fork with it out of the collection pyspark runs after each task, and
    # no collection writes to the pages they share (sparkddl.task.frozen)
    import gc
    gc.freeze()
    from pyspark.daemon import manager
    manager()


if __name__ == "__main__":
    main()
