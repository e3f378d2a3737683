"""A rank's Python stacks, every thread, for the driver's watchdog report: where a stuck rank
is, not only which phase it said it was in."""
from __future__ import annotations

import sys
import threading
import traceback

MAX_CHARS = 32_000


def python_stacks() -> str:
    """Every thread's stack, the main thread first, sparkddl's own helper threads last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()  # the documented way to see other threads

    def order(ident: int) -> tuple[int, str]:
        name = names.get(ident, "?")
        return (0 if name == "MainThread" else 2 if name.startswith("sparkddl-") else 1, name)

    parts = []
    for ident in sorted(frames, key=order):
        if ident == threading.get_ident():
            continue  # this thread is only answering the request
        stack = "".join(traceback.format_stack(frames[ident]))
        parts.append(f'Thread "{names.get(ident, "?")}":\n{stack}')
    text = "\n".join(parts)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "\n... [cut]"
