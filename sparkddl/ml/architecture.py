"""How a model's architecture is saved: by import where possible, pickled code otherwise.

Loading pickled code runs it, and so does calling a factory function a file names, so both
happen only when asked for explicitly: ``TorchModel.load(path, trusted=True)`` or inside
``with sparkddl.ml.trusted_loading():``. A torch.nn.Module class named by import (the
built-in models, a user's model class whose module is already imported: importing a module
runs it) is rebuilt without trust;
``TorchModel.load(path, model=MyNet())`` needs nothing.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from typing import Any, Callable, Iterator

from sparkddl.errors import SparkDDLError
from sparkddl.train.components import _Copier

_trust = threading.local()


@contextlib.contextmanager
def trusted_loading() -> Iterator[None]:
    """Allow loading pickled architectures (e.g. in ``PipelineModel.load``) in this block.
    Only for files you trust: unpickling runs code."""
    previous = getattr(_trust, "on", False)
    _trust.on = True
    try:
        yield
    finally:
        _trust.on = previous


def is_trusted() -> bool:
    return getattr(_trust, "on", False)


def describe(factory: Callable[[], Any]) -> dict[str, Any]:
    """``{"kind": "import", "target", "kwargs"}`` when the model can be rebuilt by import;
    ``{"kind": "pickle"}`` otherwise."""
    configured = factory.module if isinstance(factory, _Copier) else factory
    if hasattr(configured, "sparkddl_config"):
        target, kwargs = configured.sparkddl_config()  # pyright: ignore[reportFunctionMemberAccess]
        return {"kind": "import", "target": target, "kwargs": kwargs}
    target = importable_name(factory)
    if target is not None:
        return {"kind": "import", "target": target, "kwargs": {}}
    return {"kind": "pickle"}


def importable_name(obj: Any) -> str | None:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is obj else None


def rebuild(arch: dict[str, Any], pickled: Callable[[], bytes], where: str) -> Any:
    """A fresh module from a description; ``pickled`` fetches the pickled factory if needed.

    An import description comes from a file too: without trust it may only name a
    ``torch.nn.Module`` subclass (built-in models, user model classes), never an arbitrary
    callable such as ``os:system``."""
    if arch["kind"] == "import":
        import torch.nn as nn

        from sparkddl.models import import_target
        module_name = str(arch["target"]).partition(":")[0]
        if not is_trusted() and module_name.split(".")[0] != "sparkddl" and \
                module_name not in sys.modules:
            raise SparkDDLError(
                f"the model saved at {where} is rebuilt from {arch['target']!r}, and module "
                f"{module_name!r} is not imported yet; importing it runs its code. Import it "
                "yourself first, pass the module to load the weights into "
                "(TorchModel.load(path, model=MyNet())), or, for files you trust, "
                "TorchModel.load(path, trusted=True)")
        target = import_target(arch["target"])
        if not is_trusted() and not (isinstance(target, type) and issubclass(target, nn.Module)):
            raise SparkDDLError(
                f"the model saved at {where} is rebuilt by calling {arch['target']!r}, which is "
                "not a torch.nn.Module class; calling it runs code named by the file. Pass the "
                "module to load the weights into (TorchModel.load(path, model=MyNet())), or, "
                "for files you trust, TorchModel.load(path, trusted=True)")
        return target(**arch.get("kwargs", {}))
    if not is_trusted():
        raise SparkDDLError(
            f"the model saved at {where} has an architecture defined in a notebook or script, "
            "saved as pickled code; loading it runs that code. Pass the module to load the "
            "weights into (TorchModel.load(path, model=MyNet())), or, for files you trust, "
            "TorchModel.load(path, trusted=True) / with sparkddl.ml.trusted_loading(): ...")
    from pyspark import cloudpickle
    return cloudpickle.loads(pickled())()


def describe_function(fn: Any) -> dict[str, Any]:
    """A transformFn as saved: by import (``{"kind": "import", "target"}``) when it can be,
    else ``{"kind": "pickle"}``."""
    target = importable_name(fn)
    return {"kind": "import", "target": target} if target else {"kind": "pickle"}


def rebuild_function(desc: dict[str, Any], pickled: Callable[[], bytes], where: str) -> Any:
    """A saved transformFn: sparkddl's own by import; any other function runs code named or
    pickled in the file, so it needs trusted loading (or the function given to load)."""
    module, _, attr = str(desc["target"]).partition(":")
    if desc["kind"] == "import" and module == "sparkddl.transforms" and attr.isidentifier():
        import sparkddl.transforms as transforms
        fn = getattr(transforms, attr, None)
        if callable(fn) and getattr(fn, "__module__", "") == "sparkddl.transforms":
            return fn  # a function of sparkddl.transforms itself, nothing reached through it
    if not is_trusted():
        what = f"imports {desc['target']!r}" if desc["kind"] == "import" else \
            "is pickled code"
        raise SparkDDLError(
            f"the model saved at {where} has a transformFn that {what}; loading it runs that "
            "code. Pass the function (TorchModel.load(path, transformFn=fn)), or, for files "
            "you trust, TorchModel.load(path, trusted=True)")
    if desc["kind"] == "import":
        from sparkddl.models import import_target
        return import_target(desc["target"])
    from pyspark import cloudpickle
    return cloudpickle.loads(pickled())
