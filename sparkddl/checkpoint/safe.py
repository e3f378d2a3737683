"""Reading ``torch.save`` bytes without trust: tensors and plain values only.

``torch.load(weights_only=True)`` refuses anything else, but its error tells the reader to
retry with ``weights_only=False`` or to allowlist the class it met: advice that runs whatever
the file says. Every load of stored or received weights goes through :func:`load_plain`,
whose error names the file and drops that advice (it is not chained either).
"""
from __future__ import annotations

import io
import pickle
import re
import struct
from typing import Any

from sparkddl.errors import CheckpointError, SparkDDLError

# the part of torch's weights_only error that says what it refused: "Unsupported global:
# GLOBAL os.system was not an allowed global...", "Trying to load unsupported GLOBAL
# posix.system whose module posix is blocked", "Unsupported operand 103"; torch's advice
# (which would run the file's code) starts at "Please use"
_FACT = re.compile(r"((?:Unsupported|Trying to load unsupported)\b[^\n]*?)\s*(?:Please use|$)",
                   re.MULTILINE)


def load_plain(data: bytes, where: str, error: type[SparkDDLError] = CheckpointError,
               map_location: Any = None) -> Any:
    """``torch.load(weights_only=True)`` of ``data``, read from ``where``; ``error`` (naming
    ``where``) if it holds anything but tensors and plain values, or is not torch.save data."""
    import torch
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location=map_location)
    except pickle.UnpicklingError as exc:
        # "from None": torch's text, with its weights_only=False advice, stays out of the
        # traceback too
        raise error(f"{where} holds objects other than tensors and plain values "
                    f"({refused(exc)}), so it was not loaded: sparkddl never unpickles code "
                    "from a file or the network. If it is not a file sparkddl wrote, or was "
                    "changed since, delete it (a checksum beside a file defends against "
                    "accidents, not tampering)") from None
    except (RuntimeError, EOFError, ValueError, IndexError, KeyError, TypeError,
            AttributeError, struct.error) as exc:  # what random bytes make torch raise
        raise error(f"{where} is not readable torch.save data ({type(exc).__name__}: "
                    f"{_first_line(str(exc))}); delete it or write it again") from None


def refused(exc: BaseException) -> str:
    """The one line of torch's weights_only error that says what it refused."""
    found = _FACT.search(str(exc))
    detail = found.group(1).strip().rstrip(".")[:300] if found else ""
    if not detail or "weights_only" in detail or "globals" in detail:  # advice, not a fact
        return "torch's safe loader refused its contents"
    return detail


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else "no detail"
