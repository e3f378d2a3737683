"""Horovod's Spark estimator API (``horovod.spark.torch.TorchEstimator``) over sparkddl.

Code written for Horovod's estimator runs here after changing its imports::

    from sparkddl.horovod.spark.torch import TorchEstimator
    from sparkddl.horovod.spark.common.store import Store

Each Horovod keyword is mapped onto a sparkddl Param (:data:`RENAMED`, or converted where the
value's form differs); the first use of each Horovod name in a process says the sparkddl
name once (a FutureWarning). A keyword sparkddl cannot honour is refused with a ConfigError
saying what to do (:data:`REFUSED`); one that only tunes speed or file layout here is
accepted with a note that it has no effect (:data:`NO_EFFECT`). Nothing that changes results
is dropped silently. sparkddl's own Param names are accepted as well. Defaults are Horovod's
where they differ (``epochs=1``). The fitted model is sparkddl's TorchModel: ``transform``
writes ``prediction`` (and for classifiers ``probability`` and ``rawPrediction``), not
Horovod's ``<label>__output`` column.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

from sparkddl.config import per_row_shape
from sparkddl.errors import ConfigError
from sparkddl.ml import TorchEstimator as _CoreEstimator
from sparkddl.ml import TorchModel, param_schema

__all__ = ["TorchEstimator", "TorchModel", "translate", "RENAMED", "REFUSED", "NO_EFFECT"]

# MiB of decoded rows each rank may keep when Horovod's inmemory_cache_all=True
CACHE_ALL_MB = 8192

SAME = ("model", "optimizer", "loss", "validation", "epochs", "callbacks", "store", "metrics")
RENAMED = {"num_proc": "numWorkers", "feature_cols": "featuresCol", "label_cols": "labelCol",
           "sample_weight_col": "sampleWeightCol", "batch_size": "batchSize",
           "shuffle_buffer_size": "shuffleBufferSize", "use_gpu": "useGpu",
           "train_reader_num_workers": "readerWorkers", "random_seed": "seed",
           "backward_passes_per_step": "backwardPassesPerStep", "run_id": "runId",
           "train_steps_per_epoch": "trainStepsPerEpoch"}
REFUSED = {
    "validation_steps_per_epoch": "every snapshot is evaluated on the whole validation split "
    "(exact metrics); hold out fewer rows with a smaller validation fraction instead",
    "transformation_fn": "sparkddl's transformFn takes a dict column -> numpy array per "
    "batch (not a pandas row or DataFrame) and returns a dict; rewrite the function that "
    "way and pass transformFn=",
    "train_minibatch_fn": "pass trainStep=fn(model, batch) -> loss instead (batch maps each "
    "column to a tensor; the optimizer step is sparkddl's)",
    "backend": "sparkddl runs its ranks in one Spark barrier stage of its own; drop backend= "
    "and set num_proc",
}
NO_EFFECT = {
    "val_batch_size": "validation runs in batches of 1024 rows, and the metrics do not "
    "depend on that batch size",
    "partitions_per_process": "sparkddl sizes the Parquet row groups it writes itself, so "
    "that every rank gets equal steps",
    "val_reader_num_workers": "validation is read by the driver or the ranks' evaluation, "
    "not by a reader pool of its own",
    "train_async_data_loader_queue_size": "each rank keeps 4 batches ready ahead",
    "val_async_data_loader_queue_size": "validation is read in streamed batches",
    "mp_start_method": "sparkddl starts no data-loader processes",
}

_noted: set[str] = set()


def _note(name: str, text: str) -> None:
    """Say ``text`` once per process for each Horovod keyword ``name``."""
    if name not in _noted:
        _noted.add(name)
        warnings.warn(text, FutureWarning, stacklevel=4)


@dataclass
class WeightedLoss:
    """Horovod's loss_weights: ``weight * loss(output, label)``."""

    loss: Callable[..., Any]
    weight: float

    def __call__(self, output: Any, label: Any) -> Any:
        return self.weight * self.loss(output, label)

    @property
    def class_loss(self) -> Callable[..., Any]:
        """The loss it weights (whether it takes class indices: sparkddl.train.steps)."""
        return self.loss


def _features(kwargs: dict[str, Any]) -> list[str]:
    cols = kwargs.get("feature_cols") or kwargs.get("featuresCol") or "features"
    return [cols] if isinstance(cols, str) else list(cols)


def _input_shapes(value: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    cols = _features(kwargs)
    if len(value) != len(cols):
        raise ConfigError(f"input_shapes has {len(value)} shapes for {len(cols)} feature "
                          f"column(s) {cols}; give one shape per feature column")
    return {"featureShapes": {c: list(per_row_shape(s)) for c, s in zip(cols, value)}}


def _label_shapes(value: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    for shape in value:
        if len(per_row_shape(shape)) > 1:
            raise ConfigError(f"label_shapes={value!r}: sparkddl hands each label as stored, "
                              "one value or one flat array per row; reshape it in the loss "
                              "(label.view(-1, ...)) or in trainStep, and drop label_shapes")
    return {}


def _loss_constructors(value: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    if kwargs.get("loss") is not None:
        raise ConfigError("give loss= or loss_constructors=, not both")
    losses = [make() for make in value]
    return {"loss": losses[0] if len(losses) == 1 else losses}


def _compression(value: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    from sparkddl.horovod.collectives import Compression
    name = value if isinstance(value, str) else getattr(value, "__name__", type(value).__name__)
    if value is Compression.none or "none" in name.lower():  # Horovod's NoneCompressor
        return {}
    # from the first step, as Horovod compresses
    if value is Compression.fp16 or "fp16" in name.lower():
        return {"strategyOptions": {"compression": "fp16", "warmup_steps": 0}}
    raise ConfigError(f"gradient_compression={value!r}: sparkddl's allreduce compresses with "
                      "fp16, bf16, powersgd, topk or sign; pass strategyOptions="
                      "{'compression': ...} instead")


def _pool(value: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    if value not in ("thread", "process", "dummy"):
        raise ConfigError(f"reader_pool_type={value!r}: choose thread, process or dummy")
    return {"readerPool": "dummy" if value == "dummy" else "thread"}


def _nan(value: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"onNonFiniteLoss": "raise"} if value else {}


# Horovod keyword -> (its conversion to sparkddl Params, the note said once)
CONVERTED: dict[str, tuple[Callable[[Any, dict[str, Any]], dict[str, Any]], str]] = {
    "input_shapes": (_input_shapes, "input_shapes= is Horovod's name; sparkddl calls it "
                     "featureShapes, a dict feature column -> per-row shape (a leading -1 "
                     "is dropped)"),
    "label_shapes": (_label_shapes, "label_shapes= has no sparkddl Param: labels reach the "
                     "loss as stored, one value or one flat array per row"),
    "loss_constructors": (_loss_constructors, "loss_constructors= is Horovod's name; sparkddl "
                          "takes the losses themselves: loss=[...], one per label column"),
    "loss_weights": (lambda v, kw: {}, "loss_weights= has no sparkddl Param: each loss is "
                     "wrapped as weight * loss (loss=[...] sums the losses of several labels)"),
    "inmemory_cache_all": (lambda v, kw: {"epochCacheMB": CACHE_ALL_MB} if v else {},
                           f"inmemory_cache_all= is Horovod's name; sparkddl calls it "
                           f"epochCacheMB, a bound in MiB (True: {CACHE_ALL_MB}; a rank whose "
                           "share does not fit reads every epoch)"),
    "verbose": (lambda v, kw: {"progress": bool(v)}, "verbose= is Horovod's name; sparkddl "
                "calls it progress (True/False)"),
    "gradient_compression": (_compression, "gradient_compression= is Horovod's name; sparkddl "
                             "calls it strategyOptions={'compression': 'fp16'} (allreduce)"),
    "reader_pool_type": (_pool, "reader_pool_type= is Horovod's name; sparkddl calls it "
                         "readerPool (thread or dummy; 'process' reads with threads)"),
    "terminate_on_nan": (_nan, "terminate_on_nan= is Horovod's name; sparkddl calls it "
                         "onNonFiniteLoss: 'raise' (its default) stops the fit, 'skip_batch' "
                         "skips the step; it never trains on with a non-finite loss"),
}


def translate(kwargs: dict[str, Any]) -> dict[str, Any]:
    """sparkddl's Params for Horovod's keywords ``kwargs`` (sparkddl's own names pass)."""
    own = {p.name for p in param_schema.all_params()}
    params: dict[str, Any] = {"epochs": 1}  # Horovod's default
    for name, value in kwargs.items():
        target = RENAMED.get(name)
        if target is not None and target in kwargs:
            raise ConfigError(f"{name}= and {target}= name the same thing; give one")
        if name in own or name in SAME:
            params[name] = value
        elif name == "num_proc" and value is None:
            _note(name, "num_proc=None: sparkddl trains on numWorkers=2 ranks by default "
                  "(Horovod: every task slot); set num_proc")
        elif value is None or name not in {*RENAMED, *REFUSED, *NO_EFFECT, *CONVERTED}:
            if value is not None:
                raise ConfigError(f"unknown argument {name}=; TorchEstimator takes Horovod's "
                                  "keywords and sparkddl's Params (see explainParams())")
        elif target is not None:
            _note(name, f"{name}= is Horovod's name; sparkddl calls it {target}")
            params[target] = value
        elif name in REFUSED:
            raise ConfigError(f"{name}= is not supported: {REFUSED[name]}")
        elif name in NO_EFFECT:
            _note(name, f"{name}= has no effect in sparkddl: {NO_EFFECT[name]}")
        else:
            convert, text = CONVERTED[name]
            _note(name, text)
            params.update(convert(value, kwargs))
    if kwargs.get("loss_weights") is not None:
        params["loss"] = _weighted(params.get("loss"), list(kwargs["loss_weights"]), kwargs)
    return params


def _weighted(loss: Any, weights: list[float], kwargs: dict[str, Any]) -> Any:
    from sparkddl.train.components import resolve_loss
    labels = kwargs.get("label_cols") or kwargs.get("labelCol") or "label"
    n = 1 if isinstance(labels, str) else len(labels)
    losses = list(loss) if isinstance(loss, (list, tuple)) else [loss] * n
    if loss is None or len(weights) != len(losses):
        raise ConfigError(f"loss_weights has {len(weights)} weights for {len(losses)} "
                          f"loss(es) over {n} label column(s); give one weight per label")
    out = [WeightedLoss(resolve_loss(fn), float(w)) for fn, w in zip(losses, weights)]
    return out[0] if len(out) == 1 else out


class TorchEstimator(_CoreEstimator):
    """sparkddl's TorchEstimator taking Horovod's ``horovod.spark.torch.TorchEstimator``
    keywords (and sparkddl's own Param names); see this module's docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**translate(kwargs))
