"""The Params of TorchEstimator and TorchModel, derived from one schema.

Every training option is a field of :class:`sparkddl.config.TrainConfig` (name, default, doc,
Param name, converter); the few Params that are not training options (the model, optimizer
and loss objects; the output columns of ``transform``) are declared below. From both,
``python -m sparkddl.ml.param_schema`` writes ``sparkddl/ml/generated_params.py``: the Param
attributes, the defaults, explicit ``setX``/``getX`` methods and the estimator's keyword-only
signature, as plain code that editors and type checkers see. Params pyspark itself declares
(``predictionCol``, ``probabilityCol``, ``rawPredictionCol``, ``seed``) come from its
``Has*`` mixins, so pyspark's own tooling recognizes them; only their defaults and setters
are generated. A unit test fails when the generated file is stale.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkddl.config import TrainConfig
from sparkddl.errors import in_callers_words

GENERATED = Path(__file__).with_name("generated_params.py")


def features(value: Any) -> Any:
    """featuresCol: one column name, or a list of them."""
    from pyspark.ml.param import TypeConverters
    return value if isinstance(value, str) else TypeConverters.toListString(value)


def labels(value: Any) -> Any:
    """labelCol: one column name, or a list of them."""
    return features(value)


def store(value: Any) -> str:
    """store: a path or URL, or a Store-like object with a ``prefix_path`` (Horovod's
    ``LocalStore``/``HDFSStore``, sparkddl.horovod.spark's): its path."""
    from pyspark.ml.param import TypeConverters
    return TypeConverters.toString(getattr(value, "prefix_path", value))


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any
    doc: str
    convert: str | None  # a pyspark TypeConverters function, or a converter of this module
    model: bool  # on TorchModel too (else the estimator only)
    field: str | None = None  # the TrainConfig field it sets
    required: bool = False  # a fit refuses to start without it (a ConfigError)


# Params that are not training options
MODEL_PARAMS = (
    ParamSpec("predictionCol", "prediction", "prediction column name", "toString", True),
    ParamSpec("probabilityCol", "probability", "class probabilities column (classifiers)",
              "toString", True),
    ParamSpec("rawPredictionCol", "rawPrediction", "raw model output column (classifiers)",
              "toString", True),
    ParamSpec("inferenceBatchSize", 1024, "rows per forward pass in transform", "toInt", True),
    ParamSpec("inferenceDevice", "auto", "device for transform's forward passes: auto (CUDA "
              "where the model was trained with useGpu and the executor has a GPU), cpu or cuda",
              "toString", True),
)
OBJECT_PARAMS = (
    ParamSpec("model", None, "torch.nn.Module, zero-argument factory returning one, or a name "
              "(mlp, cnn, package.module:factory)", None, False, required=True),
    ParamSpec("optimizer", None, "factory taking the model's parameters, a torch optimizer "
              "instance (rebuilt on the workers with all its settings) or a name", None, False,
              required=True),
    ParamSpec("loss", None, "loss module, callable (output, label) -> scalar, or a name "
              "(cross_entropy, mse, bce_with_logits, ...)", None, False, required=True),
    ParamSpec("callbacks", None, "objects with any of on_fit_start(estimator), "
              "on_epoch_end(row) -> bool (True stops training), on_snapshot(epoch, state_dict), "
              "on_fit_end(model), on_restart(restart); they run on the driver, and a "
              "KeyboardInterrupt raised in one cancels the fit", None, False),
    ParamSpec("mlflow", None, "log params, per-epoch metrics, restarts and the model to MLflow "
              "from the driver: None logs when an MLflow run is active, True also starts a "
              "run when none is, False turns it off", None, False),
)


def config_params() -> tuple[ParamSpec, ...]:
    """One Param per TrainConfig field that declares one."""
    out = []
    for f in dataclasses.fields(TrainConfig):
        meta = f.metadata
        if meta["param"] is None:
            continue
        default = (f.default if f.default is not dataclasses.MISSING
                   else f.default_factory())  # pyright: ignore[reportCallIssue] - option's
        if isinstance(default, tuple):  # Params hold what users pass: a string or a list
            default = default[0] if len(default) == 1 else list(default)
        out.append(ParamSpec(meta["param"], default, meta["doc"], meta["convert"],
                             meta["model_param"], f.name))
    return tuple(out)


def all_params() -> tuple[ParamSpec, ...]:
    return OBJECT_PARAMS + config_params() + MODEL_PARAMS


def in_param_words() -> Any:
    """A check's error in an Estimator user's vocabulary: the Params' names (numWorkers,
    batchSize) where the message names the config's fields (num_workers, batch_size); only
    snake_case names, as "features" or "label" are words of the messages too."""
    # (config_params' specs all name their field: never None here, nor below)
    return in_callers_words({p.field: p.name  # pyright: ignore[reportArgumentType]
                             for p in config_params() if "_" in p.field})  # pyright: ignore[reportOperatorIssue]


def train_config(values: dict[str, Any]) -> TrainConfig:
    """The typed config from Param values by Param name."""
    return TrainConfig.from_values({p.field: values[p.name]  # pyright: ignore[reportArgumentType]
                                    for p in config_params() if p.name in values})


def param_values(config: TrainConfig) -> dict[str, Any]:
    """A config as Param values by Param name (tuples as lists): what ``train_config``
    turns back into the same config."""
    return {p.name: _plain(getattr(config, p.field))  # pyright: ignore[reportArgumentType]
            for p in config_params()}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ---- code generation ----

_HEADER = '''"""Generated by `python -m sparkddl.ml.param_schema` from sparkddl/config.py and
sparkddl/ml/param_schema.py; do not edit (tests/unit/ml/test_params.py checks it is current)."""
# flake8: noqa
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasPredictionCol, HasProbabilityCol, HasRawPredictionCol,
                                     HasSeed)

from sparkddl.ml import param_schema as _p

if TYPE_CHECKING:  # annotations only (Python 3.10 has no typing.Self)
    from typing_extensions import Self
'''


# what a Param holds (what users pass) by its converter, where no TrainConfig field says
_BY_CONVERTER = {"toInt": "int", "toFloat": "float", "toString": "str", "toBoolean": "bool"}


def value_type(p: ParamSpec) -> str:
    """The type of ``p``'s value, as the generated code annotates it: the TrainConfig field's
    type with lists for tuples (Params hold what users pass, and a column list may be one
    name), else the converter's type; ``Any`` for objects (model, optimizer, ...)."""
    if p.convert in ("features", "labels"):
        return "str | list[str]"
    if p.field is not None:
        kind = str(next(f.type for f in dataclasses.fields(TrainConfig) if f.name == p.field))
        kind = re.sub(r"tuple\[(\w+), \.\.\.\]", r"list[\1]", kind)
    else:
        kind = _BY_CONVERTER.get(p.convert or "", "Any")
    if p.default is None and kind != "Any" and "None" not in kind:
        kind += " | None"
    return kind


def _converter(name: str | None) -> str:
    if name is None:
        return "TypeConverters.identity"
    return f"TypeConverters.{name}" if name.startswith("to") else f"_p.{name}"


# Params pyspark declares itself: its mixin holds the Param and its getter
PYSPARK_MIXINS = {"predictionCol": "HasPredictionCol", "probabilityCol": "HasProbabilityCol",
                  "rawPredictionCol": "HasRawPredictionCol", "seed": "HasSeed"}


def _class(name: str, base: str, specs: tuple[ParamSpec, ...], doc: str) -> list[str]:
    mixins = [PYSPARK_MIXINS[p.name] for p in specs if p.name in PYSPARK_MIXINS]
    bases = ", ".join(([] if base == "Params" and mixins else [base]) + mixins)
    lines = ["", "", f"class {name}({bases}):", f'    """{doc}"""', ""]
    for p in specs:
        if p.name in PYSPARK_MIXINS:
            continue
        lines += [f"    {p.name}: Param[{value_type(p)}] = Param(",
                  f"        Params._dummy(), {p.name!r},",
                  f"        {p.doc!r},", f"        typeConverter={_converter(p.convert)})"]
    defaults = ", ".join(f"{p.name}={p.default!r}" for p in specs)
    lines += ["", "    def __init__(self) -> None:", "        super().__init__()",
              f"        self._setDefault({defaults})"]
    for p in specs:
        cap = p.name[0].upper() + p.name[1:]
        lines += ["", f"    def set{cap}(self, value: {value_type(p)}) -> Self:",
                  f'        """Sets {p.name}: {p.doc}"""',
                  f"        return self._set({p.name}=value)"]
        if p.name in PYSPARK_MIXINS:
            continue
        lines += ["", f"    def get{cap}(self) -> {value_type(p)}:",
                  f'        """{p.name}: {p.doc}"""',
                  f"        return self.getOrDefault(self.{p.name})"]
    return lines


def generate() -> str:
    """The text of generated_params.py."""
    specs = all_params()
    model = tuple(p for p in specs if p.model)
    estimator = tuple(p for p in specs if not p.model)
    signature = ", ".join(f"{p.name}: {value_type(p)} = {p.default!r}" for p in specs)
    lines = _HEADER.rstrip("\n").splitlines()
    lines += _class("HasTorchModelParams", "Params", model,
                    "Params shared by the estimator and the model it produces.")
    lines += _class("HasTorchEstimatorParams", "HasTorchModelParams", estimator,
                    "Params of the estimator only: the training options.")
    lines += ["", "", "class TorchEstimatorBase(Estimator, HasTorchEstimatorParams):",
              '    """TorchEstimator\'s constructor and setParams: every Param, by keyword."""',
              "", "    @keyword_only", f"    def __init__(self, *, {signature}) -> None:",
              "        super().__init__()",
              "        self._set(**self._input_kwargs)"
              "  # pyright: ignore[reportAttributeAccessIssue] - keyword_only sets it",
              "", "    @keyword_only", f"    def setParams(self, *, {signature}) -> Self:",
              '        """Sets the given Params; the others keep their values."""',
              "        return self._set(**self._input_kwargs)"
              "  # pyright: ignore[reportAttributeAccessIssue] - keyword_only sets it"]
    return _wrap("\n".join(lines) + "\n")


def _wrap(text: str, width: int = 100) -> str:
    """Break the long signature and defaults lines after commas between parameters (not
    those inside a type's brackets; the values hold no comma-space), so the file stays
    readable."""
    out = []
    for line in text.splitlines():
        indent = " " * (len(line) - len(line.lstrip()) + 8)
        wrappable = line.lstrip().startswith(("def ", "self._setDefault("))
        while wrappable and len(line) > width and (cut := _last_break(line[:width])):
            out.append(line[:cut])
            line = indent + line[cut:].lstrip()
        out.append(line)
    return "\n".join(out) + "\n"


def _last_break(head: str) -> int:
    """Where to break ``head``: just after its last ", " outside square brackets (0: none)."""
    depth, best = 0, 0
    for i, ch in enumerate(head):
        depth += (ch == "[") - (ch == "]")
        if depth == 0 and head.startswith(", ", i):
            best = i + 1
    return best


if __name__ == "__main__":
    GENERATED.write_text(generate(), encoding="utf-8")
    print(f"wrote {GENERATED}", file=sys.stderr)
