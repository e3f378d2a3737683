"""This process's resident memory: now, its peak, and the host's available memory.

Linux's /proc gives all three, and lets the peak be reset. Elsewhere the current and
available figures read 0 (unknown) and the peak falls back to ``getrusage``, whose
``ru_maxrss`` is in KiB on Linux and in bytes on macOS (Windows has neither: 0).
"""
from __future__ import annotations

import os
import sys


def rss_bytes() -> int:
    """This process's resident memory now (0 where unknown)."""
    return _status_kb("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """This process's peak resident memory since :func:`reset_peak` (or since it started;
    0 where unknown)."""
    hwm = _status_kb("VmHWM")
    if hwm:
        return hwm * 1024
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak() -> bool:
    """Make the peak start from now (Linux's clear_refs 5); False where that is refused.
    A Python worker that Spark reuses keeps the peak of earlier tasks otherwise."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def available_bytes() -> int:
    """The host's available memory (MemAvailable; 0 where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _status_kb(key: str) -> int:
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
