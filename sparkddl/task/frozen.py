"""What a Python worker keeps for good (its imports, a scoring worker's model) taken out of
the full garbage collection that pyspark's daemon runs after every task.

A reused Python worker runs ``gc.collect()`` after each task (pyspark's ``daemon.py``). That
full collection walks every object the cyclic collector tracks, and a worker that has
imported torch tracks about 330,000 of them: 0.15-0.18 s of CPU after every task (Python
3.11, torch 2.13; measured), a quarter of the Python workers' CPU while ``transform``
scored 1 M rows on local[2] (3 tasks a pass). ``gc.freeze()`` moves the objects tracked now
to a permanent generation that no collection walks; reference counting frees them as
before, so only what is frozen and later dropped inside a reference cycle stays in memory
(until :func:`thaw`, or the worker's end).

So the workers sparkddl runs in freeze where what is alive is meant to last: the executors'
check once it has imported sparkddl, torch and what the ranks import first; a rank's task
once it has imported torch, before it unpickles the user's code (once per worker); a scoring
task, before it unpickles a transformFn, where the worker keeps a model an earlier task built
(it thaws, and collects once, when it drops that model for another); the opt-in worker
daemon (:mod:`sparkddl.task.daemon`) before it forks.
"""
from __future__ import annotations

import gc

_once = [False]  # this process froze at a task's start already (freeze_once)


def freeze() -> None:
    """Take every object tracked now out of the collector's walks (see the module)."""
    gc.freeze()


def freeze_once() -> None:
    """:func:`freeze`, the first time this process calls it: early in a rank's task, where
    what is alive besides the imports is pyspark's and sparkddl's own for the task."""
    if not _once[0]:
        _once[0] = True
        gc.freeze()


def thaw() -> None:
    """Give the frozen objects back to the collector, and collect once: what was frozen and
    has been dropped since (a scoring worker's previous model) is freed now."""
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()
