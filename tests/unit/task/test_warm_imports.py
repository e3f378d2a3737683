"""Modules a rank imports while it waits in the rendezvous: Petastorm's, where the plan may
read through it; a failing import is left to the code that needs the module."""
from __future__ import annotations

import dataclasses
import sys

from sparkddl.data.choice import reader_modules
from sparkddl.data.petastorm_check import MODULES
from sparkddl.data.plan import plan_shards
from sparkddl.data.schema import ColumnSpec
from sparkddl.task.warm import warm_imports


def test_warm_imports_load_modules_on_a_thread_and_let_failures_be():
    sys.modules.pop("colorsys", None)
    thread = warm_imports(("no_such_module_for_sparkddl", "colorsys"))
    assert thread is not None and thread.daemon
    thread.join(10)
    assert not thread.is_alive() and "colorsys" in sys.modules
    assert warm_imports(()) is None


def test_the_plan_says_which_reader_modules_to_warm():
    plan = plan_shards("file:///data", (ColumnSpec("x", "feature", "scalar", "float32"),),
                       [64, 64], 1, 16)
    assert reader_modules(plan) == MODULES  # auto: Petastorm may be chosen
    assert reader_modules(dataclasses.replace(plan, reader="arrow")) == ()
    assert reader_modules(dataclasses.replace(plan, url="memory://data")) == ()
