"""Job presets: TOML files in conf/, typed ``--set section.key=value`` overrides, and the
schema they are checked against (unknown keys and wrong types name the key and the options).

A preset has the sections spark, data, model, optimizer, loss, train and output; see
conf/digits.toml for every key. With no preset, jobs run the embedded default,
sparkddl/presets/digits.toml (shipped in the package; conf/digits.toml is a copy of it).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package (setup.cfg requires it there)
    import tomli as tomllib  # pyright: ignore[reportMissingImports] - not in 3.11's venv

from sparkddl.config import TrainConfig
from sparkddl.errors import ConfigError


@dataclass
class SparkSection:
    master: str = "local[2]"  # used only when spark-submit / spark-defaults set no master
    app_name: str = "sparkddl"
    conf: dict[str, Any] = field(default_factory=dict)  # applied only where not already set


def _section_from_config(name: str, extra: list[tuple[str, Any, Any]]) -> type:
    """A preset section: the job-only keys in ``extra`` (name, type, field), then every
    TrainConfig field whose option lives in this section, with its preset default and type.
    Adding an option to TrainConfig adds its preset key here."""
    fields = list(extra)
    for f in dataclasses.fields(TrainConfig):
        meta = f.metadata
        if meta["preset"] != name:
            continue
        hint = meta["preset_type"] or typing.get_type_hints(TrainConfig)[f.name]
        default = meta["preset_default"]
        if isinstance(default, tuple):
            default = list(default)
        made = (field(default_factory=lambda d=default: type(d)(d))
                if isinstance(default, (dict, list)) else field(default=default))
        fields.append((f.name, hint, made))
    return dataclasses.make_dataclass(f"{name.capitalize()}Section", fields)


DataSection = _section_from_config("data", [
    ("source", str, field(default="sklearn:digits")),  # sklearn:<name> | table: | parquet: | path
    ("test_fraction", float, field(default=0.2)),  # held out for evaluate
])


@dataclass
class ModelSection:
    name: str = "mlp"  # mlp | cnn | package.module:factory
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimizerSection:
    name: str = "adam"
    lr: float = 1e-3
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossSection:
    name: str = "cross_entropy"


TrainSection = _section_from_config("train", [])


@dataclass
class OutputSection:
    dir: str = "runs"  # each run writes <dir>/<run id>/
    mlflow: bool = False  # log to MLflow (TorchEstimator's mlflow=True)


@dataclass
class JobConfig:
    spark: SparkSection = field(default_factory=SparkSection)
    # (DataSection and TrainSection are made by _section_from_config)
    data: DataSection = field(default_factory=DataSection)  # pyright: ignore[reportInvalidTypeForm]
    model: ModelSection = field(default_factory=ModelSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    loss: LossSection = field(default_factory=LossSection)
    train: TrainSection = field(default_factory=TrainSection)  # pyright: ignore[reportInvalidTypeForm]
    output: OutputSection = field(default_factory=OutputSection)

    def train_config(self) -> TrainConfig:
        values = {**dataclasses.asdict(self.data), **dataclasses.asdict(self.train)}
        return TrainConfig.from_values(values)


_SECRET = re.compile(r"secret|password|passwd|token|credential|access.?key|private|auth",
                     re.IGNORECASE)


def redacted(value: Any, key: str = "") -> Any:
    """A copy of a config (nested dicts/lists) with the values of secret-looking keys replaced,
    for anything written to logs, history or run outputs."""
    if isinstance(value, dict):
        return {k: redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, key) for v in value]
    return "***" if key and _SECRET.search(key) and value not in (None, "") else value


# tables whose keys are free-form (passed on as keyword arguments or Spark conf): their own
# keys are not checked against the schema, and an override may name a key with dots in it
_FREE_FORM = {("spark", "conf"), ("model", "kwargs"), ("optimizer", "kwargs"),
              ("train", "strategy_options"), ("data", "feature_shapes"),
              ("train", "lr_scheduler_options")}


DEFAULT_PRESET = "digits"


def default_preset_text() -> str:
    """The embedded default preset (sparkddl/presets/digits.toml, package data), used when
    no preset is given, so that the defaults are the same wherever sparkddl is installed."""
    resource = importlib.resources.files("sparkddl") / "presets" / f"{DEFAULT_PRESET}.toml"
    return resource.read_text(encoding="utf-8")


def load(path: str | Path | None, overrides: Sequence[str] = ()) -> JobConfig:
    """Read a preset (or the embedded default) and apply ``section.key=value`` overrides."""
    if path is None:
        raw = _parse(default_preset_text(), "the embedded default preset")
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"preset {str(path)!r} not found; give the path of a TOML "
                              "preset, or none for the embedded default (a clone of the "
                              "repository has examples in conf/)")
        raw = _parse(p.read_text(encoding="utf-8"), f"preset {str(path)!r}")
        try:  # the file alone first, so that a typo in it names the file
            from_dict(raw)
        except ConfigError as exc:
            raise ConfigError(f"preset {str(path)!r}: {exc}") from None
    for item in overrides:
        _apply_override(raw, item)
    return from_dict(raw)


def _parse(text: str, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} is not valid TOML: {exc}") from None


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if len(parts) > 2 and (parts[0], parts[1]) in _FREE_FORM:  # spark.conf.spark.x.y=...
        parts = [parts[0], parts[1], ".".join(parts[2:])]
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(f"override {item!r} must look like section.key=value, "
                          "e.g. train.epochs=5")
    try:  # a TOML literal (5, 0.1, true, [1, 2], "x"); anything else is a plain string
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a section")
    node[parts[-1]] = value


def from_dict(raw: dict[str, Any]) -> JobConfig:
    sections = {f.name: f.type for f in dataclasses.fields(JobConfig)}
    hints = typing.get_type_hints(JobConfig)
    built = {}
    for name, values in raw.items():
        if name not in sections:
            raise ConfigError(f"unknown section [{name}]; sections: {', '.join(sections)}"
                              f"{_did_you_mean(name, sections)}")
        if not isinstance(values, dict):
            raise ConfigError(f"[{name}] must be a table of keys")
        built[name] = _section(name, hints[name], values)
    return JobConfig(**built)


def _section(name: str, cls: type, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"unknown key '{name}.{key}'; keys of [{name}]: "
                              f"{', '.join(hints)}{_did_you_mean(key, hints)}")
        if not _matches(value, hints[key]):
            raise ConfigError(f"'{name}.{key}' must be {_describe(hints[key])}, got "
                              f"{value!r} ({type(value).__name__})")
        if (name, key) == ("data", "feature_shapes"):
            _check_shapes(value)
    return cls(**values)


def _did_you_mean(name: str, valid: Any) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_shapes(shapes: dict[str, Any]) -> None:
    for column, shape in shapes.items():
        if not (isinstance(shape, list) and shape and
                all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise ConfigError(f"'data.feature_shapes.{column}' must be a list of positive "
                              f"integers such as [1, 8, 8], got {shape!r}")


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (inner,) = typing.get_args(hint)
        return isinstance(value, list) and all(_matches(v, inner) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "unset (omit the key)"
    if origin is list:
        return f"a list of {_describe(typing.get_args(hint)[0])}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            dict: "a table"}.get(hint, getattr(hint, "__name__", str(hint)))
