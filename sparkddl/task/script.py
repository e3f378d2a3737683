"""A Python file run as ``__main__`` on every rank, torchrun-style: ``sparkddl.run(path,
"--lr", "0.1")``.

The driver reads and compiles the file (a missing file or a syntax error fails there) and
ships its text, so executors need no copy of it; its directory is put first on ``sys.path``
where it exists on the executor (sibling modules import as under torchrun). On the rank the
code runs with ``sys.argv = [path, *args]``, ``__name__ == "__main__"`` and the torchrun
environment; ``sys.exit(0)`` is success, any other exit status or exception fails the rank
with its traceback (the script's own lines included). With more than one rank, a script
that never calls ``torch.distributed.init_process_group`` is an error: its ranks would have
trained N unrelated copies.
"""
from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkddl.errors import ConfigError


class ScriptError(RuntimeError):
    """The script exited with a non-zero status, or ran without a process group."""


@dataclass
class Script:
    path: str  # as the user named it (absolute), for argv[0], __file__ and tracebacks
    source: str
    argv: tuple[str, ...]

    def __call__(self) -> None:
        import torch.distributed as dist

        code = compile(self.source, self.path, "exec")
        # tracebacks show the script's lines even where the file is not on this host
        linecache.cache[self.path] = (len(self.source), None,
                                      self.source.splitlines(keepends=True), self.path)
        folder = os.path.dirname(self.path)
        saved_argv, saved_path, saved_main = sys.argv, list(sys.path), sys.modules["__main__"]
        calls = []
        real_init = dist.init_process_group

        def recording_init(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return real_init(*args, **kwargs)

        module = type(sys)("__main__")
        module.__dict__.update(__file__=self.path, __builtins__=__builtins__)
        sys.argv = [self.path, *self.argv]
        if os.path.isdir(folder):
            sys.path.insert(0, folder)
        sys.modules["__main__"] = module  # pickle and multiprocessing find its classes
        dist.init_process_group = recording_init
        try:
            exec(code, module.__dict__)  # noqa: S102 - the user's script, run as python runs it
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise ScriptError(f"script {self.path} exited with status {exc.code!r}") from exc
        finally:
            dist.init_process_group = real_init
            sys.argv, sys.path[:] = saved_argv, saved_path
            sys.modules["__main__"] = saved_main
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 and not calls and not dist.is_initialized():
            raise ScriptError(
                f"script {self.path} finished without calling "
                "torch.distributed.init_process_group, so its "
                f"{world} ranks ran as {world} unrelated copies; call "
                "dist.init_process_group() (or sparkddl.init_process_group()) in it, or run it "
                "with num_workers=1")


def script(path: Any, args: tuple[Any, ...]) -> Script:
    """Check and read the script on the driver."""
    file = Path(path).expanduser()
    if not file.is_file():
        hint = " (it is a folder)" if file.is_dir() else ""
        raise ConfigError(f"script {str(path)!r} not found{hint}; give the path of a Python "
                          f"file on the driver (relative to {os.getcwd()})")
    bad = [a for a in args if not isinstance(a, str)]
    if bad:
        raise ConfigError(f"a script's arguments are command-line strings, as with torchrun; "
                          f"got {', '.join(repr(a) for a in bad)}: pass str(value)")
    source = file.read_text(encoding="utf-8")
    resolved = str(file.resolve())
    try:
        compile(source, resolved, "exec")
    except SyntaxError as exc:
        raise ConfigError(f"script {resolved} is not valid Python: {exc.msg} (line "
                          f"{exc.lineno})") from exc
    return Script(resolved, source, tuple(args))
