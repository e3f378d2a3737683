"""Serialize the user's function for the executors, explaining what cannot travel."""
from __future__ import annotations

import types
from typing import Any, Callable, Iterator

from sparkddl.errors import ConfigError


def serialize_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    """cloudpickle ``(fn, args, kwargs)``; on failure name the object that cannot be pickled."""
    from pyspark import cloudpickle

    if not callable(fn):
        raise ConfigError(f"fn must be callable, got {type(fn).__name__}")
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:
        culprit = find_unpicklable(fn, args, kwargs)
        where = f"{culprit[0]} ({culprit[1]}) cannot be pickled" if culprit else \
            "the function or its arguments cannot be pickled"
        raise ConfigError(
            f"cannot ship {_name(fn)} to the executors: {where}: {exc}. Create such objects "
            "inside the function instead of closing over them (SparkSession, SparkContext, "
            "locks, open files and sockets never travel)") from exc


def find_unpicklable(fn: Callable[..., Any], args: tuple, kwargs: dict
                     ) -> tuple[str, str] | None:
    """The first (label, type name) among what fn closes over and its arguments that
    cloudpickle refuses, looking one level into nested functions."""
    from pyspark import cloudpickle

    candidates = [(f"argument {i}", a) for i, a in enumerate(args)]
    candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    candidates += list(_captured(fn, _name(fn)))
    for label, obj in candidates:
        try:
            cloudpickle.dumps(obj)
        except Exception:  # noqa: BLE001 - whatever fails to pickle is the answer
            if isinstance(obj, types.FunctionType):
                inner = find_unpicklable(obj, (), {})
                if inner:
                    return inner
            return label, type(obj).__name__
    return None


def _captured(fn: Any, owner: str) -> Iterator[tuple[str, Any]]:
    fn = getattr(fn, "__func__", fn)  # bound methods: look at the function
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            yield f"variable {name!r} that {owner} closes over", cell.cell_contents
        except ValueError:  # empty cell
            continue
    for name in code.co_names:
        if name in fn.__globals__ and not isinstance(fn.__globals__[name], types.ModuleType):
            yield f"global {name!r} used by {owner}", fn.__globals__[name]
    for i, default in enumerate(fn.__defaults__ or ()):
        yield f"default argument {i} of {owner}", default


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
