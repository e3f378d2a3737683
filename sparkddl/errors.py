"""One exception hierarchy for everything sparkddl raises on purpose.

Messages say what was seen, what was expected, and how to fix it.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterator


class SparkDDLError(Exception):
    """Base class of every error sparkddl raises deliberately."""


class ConfigError(SparkDDLError, ValueError):
    """An argument, Param or config value is invalid."""


class ClusterError(SparkDDLError, RuntimeError):
    """The Spark cluster cannot run the requested barrier stage as configured (a
    RuntimeError too, as pyspark's TorchDistributor raises for the same causes)."""


class DataError(SparkDDLError, ValueError):
    """The training data is missing, malformed or too small."""


class StoreError(SparkDDLError):
    """A Store location cannot be used (bad URI, not writable, missing files)."""


class UntrustedArtifactError(SparkDDLError, ValueError):
    """A saved file holds what sparkddl never writes there (e.g. code in a torch.export
    program's guards), so it was not loaded and nothing of it ran. For files you trust:
    ``TorchModel.load(path, trusted=True)`` or ``with sparkddl.ml.trusted_loading():``."""


class CheckpointError(SparkDDLError):
    """No usable checkpoint could be written or read."""


class StaleAttemptError(CheckpointError):
    """A rank of an attempt the driver has given up on tried to write a checkpoint (it was
    still running after a cancel or a failure); nothing was written."""


class TransformError(DataError):
    """The transformFn raised, or returned other shapes than on earlier batches. Not retried:
    a relaunch would give it the same rows."""


class NonFiniteLossError(SparkDDLError):
    """A rank's loss was NaN or infinite (onNonFiniteLoss='raise'). Not retried: a relaunch
    from the last checkpoint reaches the same batch with the same weights."""


class JobCancelledError(SparkDDLError):
    """The caller stopped the fit or run: its Spark job was cancelled (``cancelAllJobs``, the
    job group, a notebook's stop button, ``interruptAll`` on Spark Connect) or the driver
    got a KeyboardInterrupt. Never retried; the ranks have ended when it is raised, and the
    last checkpoint stays usable for a resume (``runId``)."""


@dataclass
class RankFailure:
    """What one rank reported when it failed."""

    rank: int
    message: str
    traceback: str = ""
    host: str = ""
    status: dict[str, Any] = field(default_factory=dict)  # where the rank was, if it said
    # what the rank's own report says of its exception ("" where only text is known: a
    # process that died, Spark's error text): the class, module-qualified, and where it was
    # raised (file name and function)
    exception: str = ""
    location: str = ""

    def raised(self, kind: type[BaseException]) -> bool:
        """Whether the rank failed with exactly ``kind``: by class where the rank reported it,
        else by the message's first word."""
        if self.exception:
            return self.exception == f"{kind.__module__}.{kind.__qualname__}"
        return self.message.startswith(f"{kind.__name__}:")


class TrainingFailedError(SparkDDLError, RuntimeError):
    """One or more ranks failed; carries each failing rank's traceback text (a RuntimeError
    too, as pyspark's TorchDistributor raises for a failed run).

    Attributes:
        failures: one ``RankFailure`` per rank that reported an error, in the order the
            reports arrived: the first is usually the cause, later ones its consequences
            (peers whose collectives broke).
        ranks: the failing ranks, sorted.
        spark_error: the error Spark reported for the barrier stage, if any.
        attempts: how many times the barrier stage was launched.
    """

    def __init__(self, failures: list[RankFailure], spark_error: str = "", attempts: int = 1,
                 reason: str = ""):
        self.failures = list(failures)
        self.spark_error = spark_error
        self.attempts = attempts
        self.reason = reason
        super().__init__(self._render())

    def __reduce__(self) -> tuple:
        # Spark, Connect, thread pools and multiprocessing move exceptions by pickling: the
        # default would call __init__ with the rendered message as ``failures``
        return (type(self), (self.failures, self.spark_error, self.attempts, self.reason))

    @property
    def ranks(self) -> list[int]:
        return sorted(f.rank for f in self.failures)

    def _render(self) -> str:
        head = self.reason or "training failed"
        if self.failures:
            head += f" on rank(s) {', '.join(str(r) for r in self.ranks)}"
        if self.attempts > 1:
            head += f" after {self.attempts} attempts"
        parts = [head + "."]
        for i, f in enumerate(self.failures):
            where = f" on {f.host}" if f.host else ""
            first = " (first to fail)" if i == 0 and len(self.failures) > 1 else ""
            parts.append(f"--- rank {f.rank}{where}{first}: {f.message}")
            if f.traceback:
                parts.append(f.traceback.rstrip())
        if self.spark_error and not self.failures:
            parts.append(f"Spark reported: {self.spark_error.strip()}")
        return "\n".join(parts)


@contextlib.contextmanager
def in_callers_words(names: dict[str, str]) -> Iterator[None]:
    """A check's ConfigError, ClusterError or DataError told in the caller's vocabulary: each
    name of ``names`` (a whole word: num_workers) said as its value (numWorkers for an
    Estimator, num_processes for TorchDistributor). The same error is re-raised, its type,
    cause and traceback kept."""
    try:
        yield
    except (ConfigError, ClusterError, DataError) as exc:
        text = str(exc)
        said = re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b",
                      lambda m: names[m.group(1)], text)
        if said != text and len(exc.args) == 1:
            exc.args = (said,)
        raise


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11's); on 3.10, the note kept in ``__notes__`` where
    3.11's tracebacks and pytest look for it, instead of an AttributeError."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)  # pyright: ignore[reportAttributeAccessIssue] - 3.11 and later
        return
    notes = getattr(exc, "__notes__", None)
    try:
        exc.__notes__ = [*(notes or []), note]  # pyright: ignore[reportAttributeAccessIssue]
    except (AttributeError, TypeError):
        pass  # an exception type that takes no attributes: the note is lost, not the error
