"""The jobs and the ``sparkddl`` command: spark-submit scripts (jobs/) and presets (conf/)
run through :func:`main`. main.py parses the command line, preset.py the presets and their
overrides, job.py runs prepare/train/evaluate/plan on a session spark_settings.py makes,
sources.py names the data sources, plotting.py draws the curves."""
from __future__ import annotations

from sparkddl.cli.main import main

__all__ = ["main"]
