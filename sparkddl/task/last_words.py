"""How a rank died, told to the driver also when Python gets no chance to raise.

- ``sys.exit(n)`` in the function: a SystemExit, reported like any error, as "exited with
  code n" (:func:`exit_message`).
- ``os._exit(n)``: while the function runs, ``os._exit`` reports first, then exits
  (:func:`reported_exits`).
- a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL): Python's faulthandler writes
  every thread's stack into a second authenticated connection to the driver, kept open for
  nothing else (:func:`fatal_signals`); the driver makes it the rank's failure
  (:func:`failure`).

The task leaves the reused Python worker as it found it: ``os._exit`` and faulthandler are
restored when it ends, and processes forked meanwhile (DataLoader workers) drop both.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import re
import signal
import socket
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NoReturn

from sparkddl.errors import RankFailure

log = logging.getLogger(__name__)

# faulthandler's names of the signals it handles ("Fatal Python error: Segmentation fault")
FATAL_SIGNALS = {"Segmentation fault": signal.SIGSEGV, "Bus error": signal.SIGBUS,
                 "Floating-point exception": signal.SIGFPE,
                 "Floating point exception": signal.SIGFPE, "Aborted": signal.SIGABRT,
                 "Illegal instruction": signal.SIGILL}
_FATAL = re.compile(r"Fatal Python error: ([^\n]+)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')

# True while a task's faulthandler writes to its last-words connection: a forked child
# must not (its own crash is not the rank's death)
_state = {"active": False, "hooked": False}


def exit_message(exc: BaseException) -> str | None:
    """The report of a SystemExit that ends the function with a failure, else None."""
    if not isinstance(exc, SystemExit):
        return None
    code = exc.code if isinstance(exc.code, int) else 1  # sys.exit("text") exits with 1
    return f"SystemExit: exited with code {code} (sys.exit({exc.code!r}) in the rank's code)"


@contextmanager
def reported_exits(report: Callable[[str, str], None]) -> Iterator[None]:
    """While the function runs, ``os._exit(n)`` in this process first sends
    ``report(message, stack)`` (flushed), then exits as asked."""
    real, pid = os._exit, os.getpid()

    def _exit(code: int) -> NoReturn:
        if os.getpid() == pid:  # not in a forked child: it exits as it always did
            report(f"called os._exit({code}) in the rank's code: its process ended at once, "
                   "with no exception to report", _stack())
        real(code)

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = real


def _stack() -> str:
    """The calling thread's stack from the task's entry on (what Spark runs before it is
    the same in every task), as a traceback shows it."""
    frames = traceback.extract_stack()[:-2]  # not _stack and _exit
    entry = next((i for i, f in enumerate(frames) if f.name == "barrier_entry"), 0)
    return "Stack (most recent call last):\n" + "".join(
        traceback.format_list(frames[entry:]))


@contextmanager
def fatal_signals(open_socket: Callable[[], socket.socket] | None) -> Iterator[None]:
    """faulthandler writes into the socket ``open_socket`` opens while the task runs. Left
    alone where something else enabled it already (Spark's own
    ``spark.python.worker.faulthandler.enabled``: its file reaches Spark's error)."""
    sock = _opened(open_socket) if open_socket and not faulthandler.is_enabled() else None
    if sock is None:
        yield
        return
    _hook_forks()
    faulthandler.enable(file=sock.fileno(), all_threads=True)
    _state["active"] = True
    try:
        yield
    finally:
        _state["active"] = False
        faulthandler.disable()
        sock.close()


def _opened(open_socket: Callable[[], socket.socket]) -> socket.socket | None:
    try:
        return open_socket()
    except OSError as exc:  # the rank still runs; only a crash would go unexplained
        log.warning("could not open the last-words connection to the driver (%s); a crash "
                    "of this rank will be reported without its Python stacks", exc)
        return None


def _hook_forks() -> None:
    if not _state["hooked"]:  # once per process: at-fork hooks cannot be removed
        os.register_at_fork(after_in_child=_forget_in_child)
        _state["hooked"] = True


def _forget_in_child() -> None:
    if _state["active"]:
        _state["active"] = False
        faulthandler.disable()


def failure(rank: int, text: str, host: str, beat: Any = None) -> RankFailure:
    """The failure of a rank whose last words are ``text`` (faulthandler's report);
    ``beat``: its last heartbeat, saying where it was."""
    found = _FATAL.search(text)
    name = found.group(1).strip() if found else "unknown"
    sig = FATAL_SIGNALS.get(name)
    stacks, frame = _crashed_first(text)
    what = f"killed by signal {sig.name} ({int(sig)})" if sig else "died of a fatal error"
    message = (f"{what}{f' in {frame}' if frame else ''} (Fatal Python error: {name}); the "
               "Python stacks of its threads follow, the crashing one first")
    status = {"steps": beat.steps, "epoch": beat.epoch, "step": beat.step,
              "phase": beat.phase} if beat is not None else {}
    return RankFailure(rank, message, stacks, host=host, status=status)


def _crashed_first(text: str) -> tuple[str, str]:
    """faulthandler's stacks with the crashing thread's first, from the task's entry on,
    without the list of extension modules; and that thread's innermost frame
    ("fn (file:line)"), or ""."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([line])
        elif blocks and line.strip() and not line.startswith("Extension modules:") and \
                not blocks[-1][-1].endswith(" in barrier_entry"):  # below: Spark's worker
            blocks[-1].append(line)
    blocks.sort(key=lambda b: not b[0].startswith("Current thread"))
    frame = _FRAME.search("\n".join(blocks[0])) if blocks else None
    where = f"{frame.group(3)} ({frame.group(1)}:{frame.group(2)})" if frame else ""
    return "\n".join("\n".join(b) for b in blocks) or text.strip(), where
