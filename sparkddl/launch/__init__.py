"""Driver side of a run: preflight checks, barrier stage submission, failure handling."""
from sparkddl.launch.runner import run

__all__ = ["run"]
