"""TorchModel: the fitted model as a Spark ML Transformer (its files: ml/persistence.py)."""
from __future__ import annotations

import io
import logging
import uuid
from typing import TYPE_CHECKING, Any, Callable

from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable, MLWriter

from sparkddl.config import TrainConfig, per_row_shape
from sparkddl.errors import ConfigError, DataError
from sparkddl.export import program as exported
from sparkddl.ml import architecture
from sparkddl.ml.generated_params import HasTorchModelParams
from sparkddl.ml.inference import ModelPayload, check_device, exported_eval, udf_function
from sparkddl.ml.inplace import InPlace, sources
from sparkddl.ml.persistence import ModelReader, ModelWriter
from sparkddl.ml.scoring import (
    PREDICTION,
    PROBABILITY,
    RAW,
    column_udfs,
    packed,
    packed_names,
    return_types,
    scorer,
)
from sparkddl.problems import Problem
from sparkddl.session import cluster_context

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql._typing import (  # pyright: ignore[reportMissingModuleSource] - a stub
        UserDefinedFunctionLike,
    )


class TorchModel(Model, HasTorchModelParams, MLReadable, MLWritable):
    """A fitted PyTorch model. ``transform`` adds ``predictionCol`` (and, for classifiers,
    ``probabilityCol`` and ``rawPredictionCol`` as Vectors), computed on the executors.

    Saving also stores the model as a ``torch.export`` program (batch dimension dynamic), so
    ``TorchModel.load`` and ``PipelineModel.load`` need neither the model's code nor trusted
    loading, and ``transform`` runs that program on the executors.

    Attributes:
        history (list[dict]): one dict per epoch (the history columns).
        run_id (str): the fit's run id (``runId=`` resumes it).
        chosen_epoch (int): the epoch whose weights these are.
        best_by (str): the metric that chose them.
        task (str): multiclass, binary or regression.
        epochs_done (int): epochs trained.
        stopped_early (bool): whether early stopping or a callback ended the fit.
        steps_per_rank (list[int]): optimizer steps each rank took.
        fit_time_s (float): the fit's wall-clock seconds.
        phases (dict[str, float]): where those seconds went, in order: ``checks`` (the
            session, the executors' Python, the model and optimizer; the data is looked
            at beside the executors' check, so part of ``data`` runs before the wait for
            it ends), ``data`` (validating, listing, materializing, planning), ``launch``
            (until every rank's task has started),
            ``start`` (until rank 0's first step), ``training``, ``evaluation`` (what the
            driver still evaluated after the ranks ended) and ``end``.
        restarts (list[dict]): one dict per failed attempt: reason, checkpoint resumed from,
            steps redone, recovery_s.
        input_specs (tuple): the model's inputs per row.
        export_error (str): why the model could not be saved as a torch.export program, or "".
        mlflow_model_uri (str | None): where the fit logged the model to MLflow, or None.
    """

    def __init__(self) -> None:
        super().__init__()
        self._factory: Callable[[], Any] | None = None
        self._state: dict[str, Any] = {}
        self._arch: dict[str, Any] = {"kind": "pickle"}
        self.history: list[dict[str, Any]] = []
        self.run_id = ""
        self.chosen_epoch = 0
        self.best_by = ""
        self.task: str = Problem.REGRESSION
        self.output_width = 1
        self.epochs_done = 0
        self.stopped_early = False
        self.steps_per_rank: list[int] = []
        self.fit_time_s = 0.0
        self.phases: dict[str, float] = {}
        self.restarts: list[dict[str, Any]] = []
        self.input_specs: tuple[exported.InputSpec, ...] = ()
        self._program: exported.Program | None = None
        self.export_error = ""
        self._export_tried = False
        self.trained_on_gpu = False  # inferenceDevice="auto" runs transform on CUDA if so
        self.mlflow_model_uri: str | None = None  # where the fit logged it to MLflow, if it did
        self._transform_fn: Any = None  # the fit's transformFn: runs before the forward pass
        self._input_columns: dict[str, Any] = {}  # feature -> ColumnSpec JSON, as trained

    # ---- the model itself ----
    def module(self) -> Any:
        """A fresh torch module holding these weights (eval mode)."""
        module = self._build()
        module.load_state_dict(self._state)
        return exported_eval(module)

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def historyDataFrame(self, spark: SparkSession | None = None  # noqa: N802 - Spark ML's
                         ) -> DataFrame:
        """The history as a Spark DataFrame, e.g. for ``display()``."""
        from pyspark.sql import SparkSession
        spark = spark or SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        keys = list(dict.fromkeys(k for row in self.history for k in row))
        rows = [tuple(_plain(row.get(k)) for k in keys) for row in self.history]
        return spark.createDataFrame(rows, schema=keys)

    def _build(self) -> Any:
        if self._factory is not None:
            from sparkddl.train.components import build_module
            return build_module(self._factory)
        if self._program is not None:
            return exported.load(self._program, self._state)
        raise RuntimeError("TorchModel has no architecture; load it with TorchModel.load")

    def program(self) -> "exported.Program | None":
        """The model as a torch.export program (exported once, on first use), or None with
        ``export_error`` saying why it cannot be."""
        if self._program is None and not self._export_tried and self._factory is not None:
            self._export_tried = True
            try:
                self._program = exported.export(self.module(), self.input_specs)
            except exported.ExportFailed as exc:
                self.export_error = str(exc)
        return self._program

    def _features(self) -> list[str]:
        """The feature columns, in the model's input order."""
        return list(TrainConfig.from_values({"features": self.getFeaturesCol()}).features)

    # ---- transform ----
    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F
        from pyspark.sql.functions import pandas_udf

        features = self._features()
        check_device(self.getOrDefault(self.inferenceDevice))
        types = {f.name: type(f.dataType).__name__ for f in dataset.schema.fields}
        _check_features(features, list(types))
        if self._transform_fn is None:
            _check_numeric(features, dataset.schema)
        if self._factory is None and self._program is None:
            raise ConfigError("this TorchModel has no model to run: get one from "
                              "TorchEstimator.fit or TorchModel.load")
        rows = self.getOrDefault(self.inferenceBatchSize)
        if not isinstance(rows, int) or rows < 1:
            raise ConfigError(f"inferenceBatchSize must be an integer >= 1 (rows per forward "
                              f"pass), got {rows!r}")
        inputs = []
        for name in features:
            col = F.col(f"`{name}`")
            if types.get(name) == "VectorUDT":
                col = vector_to_array(col, "float32")
            elif types.get(name) == "ArrayType" and self._transform_fn is not None and \
                    self._input_columns.get(name, {}).get("dtype") == "int64":
                col = col.cast("array<bigint>")  # ragged integers stay integers
            elif types.get(name) == "ArrayType":
                col = col.cast("array<float>")
            elif types.get(name) in ("BinaryType", "StringType") and \
                    self._transform_fn is not None:
                pass  # as they are: the transformFn reads them
            else:
                col = col.cast("float")
            inputs.append(col.alias(name))
        # a broadcast; on Spark Connect, which has none, the weights travel inside the UDF
        context = cluster_context(dataset.sparkSession)
        payload = context.ship(self._payload())
        fields = self._output_fields()
        device = self.getOrDefault(self.inferenceDevice)
        if self._transform_fn is None:  # one UDF per output column, Arrow where it can be
            spark_types = return_types(self.task, self.output_width)
            shapes = self._feature_shapes(features)

            def scored(files: "InPlace | None", args: list[Any]) -> Any:
                score = scorer(payload, features, self.task, rows, shapes, device,
                               self.trained_on_gpu, context.arrow_udfs, files)
                packs = {} if context.arrow_udfs else packed(self.task, self.output_width,
                                                             fields)
                udfs = column_udfs(score, {f: spark_types[f] for f in fields},
                                   context.arrow_udfs, packs)
                if not packs:
                    return dataset.withColumns({name: _as_vector(field, udfs[field](*args))
                                                for field, name in fields.items()})
                # every UDF in one projection (one Python runner: one forward pass a batch),
                # the packed structs made arrays again above it
                tag = uuid.uuid4().hex[:8]  # no user's column
                tmp = {field: f"__sparkddl_{field}_{tag}" for field in fields}
                inner = dataset.withColumns({tmp[f]: udfs[f](*args) for f in fields})
                return inner.withColumns({name: _as_vector(field, _unpacked(
                    F.col(tmp[field]), packs.get(field))) for field, name in fields.items()}
                ).drop(*tmp.values())
            where = sources(dataset, features)  # the features read where they lie?
            log.debug("transform: features %s: %s", "in place" if where.files else
                      "from Spark", where.why)
            if where.files is not None:
                where.files.check_widths(shapes)  # a whole column of another width
                try:
                    return scored(where.files, where.files.args())
                except Exception as exc:  # noqa: BLE001 - Spark could not name the rows' files
                    log.debug("transform: features from Spark: %s", exc)
            return scored(None, inputs)
        fn = udf_function(payload, features, self.task, rows, {}, device, self.trained_on_gpu)
        udf = pandas_udf(fn, returnType=self._output_schema())  # type: ignore[call-overload]
        tmp = "__sparkddl_out"
        out = dataset.withColumn(tmp, udf(F.struct(*inputs)))
        return out.withColumns({name: _as_vector(field, F.col(f"{tmp}.{field}"))
                                for field, name in fields.items()}).drop(tmp)

    def udf(self, output: str = PREDICTION, spark: SparkSession | None = None
            ) -> UserDefinedFunctionLike:
        """A Spark UDF of one of the model's outputs, taking its feature columns (arrays or
        numbers, in the model's input order) as arguments: for SQL
        (``spark.udf.register("score", model.udf())``, then ``SELECT score(features) FROM
        t``), ``selectExpr`` and Structured Streaming's ``foreachBatch``. ``output`` is
        ``prediction``, or for classifiers ``probability`` or ``raw`` (arrays of doubles).
        It runs as ``transform`` runs: the model built once per Python worker, Arrow UDFs on
        Spark 4.1 and later; models with a ``transformFn`` have no UDF (use ``transform``)."""
        from pyspark.sql import SparkSession

        spark_types = return_types(self.task, self.output_width)
        if output not in spark_types:
            raise ConfigError(f"output={output!r}: this {self.task} model gives "
                              f"{', '.join(spark_types)}")
        if self._transform_fn is not None:
            raise ConfigError("this model reads its columns through a transformFn, which a "
                              "UDF of numeric columns cannot run: use transform(df)")
        if self._factory is None and self._program is None:
            raise ConfigError("this TorchModel has no model to run: get one from "
                              "TorchEstimator.fit or TorchModel.load")
        session = spark or SparkSession.getActiveSession()
        if session is None:
            raise ConfigError("udf() needs a Spark session: start one, or pass spark=")
        context = cluster_context(session)
        features = self._features()
        score = scorer(context.ship(self._payload()), features, self.task,
                       self.getOrDefault(self.inferenceBatchSize),
                       self._feature_shapes(features), self.getOrDefault(self.inferenceDevice),
                       self.trained_on_gpu, context.arrow_udfs)
        return column_udfs(score, {output: spark_types[output]}, context.arrow_udfs)[output]

    def _output_fields(self) -> dict[str, str]:
        """The output fields transform computes and their columns: the prediction, and for
        classifiers the probability and raw prediction where their columns are set (an empty
        ``probabilityCol`` or ``rawPredictionCol`` is not computed, as in pyspark.ml)."""
        fields = {PREDICTION: self.getOrDefault(self.predictionCol)}
        if Problem(self.task).is_classifier:
            fields[PROBABILITY] = self.getOrDefault(self.probabilityCol)
            fields[RAW] = self.getOrDefault(self.rawPredictionCol)
        return {field: name for field, name in fields.items() if name}

    def _feature_shapes(self, features: list[str]) -> dict[str, list[int]]:
        """Each feature's per-row shape: declared (featureShapes), else as trained, so that
        a column of another width is named with the column (not torch's shape error)."""
        declared = {k: list(per_row_shape(v))
                    for k, v in self.getOrDefault(self.featureShapes).items()}
        trained = {name: list(self._input_columns.get(name, {}).get("shape") or [])
                   for name in features}
        return {**{k: v for k, v in trained.items() if v}, **declared}

    def _output_schema(self) -> str:
        if Problem(self.task).is_classifier:
            return "prediction double, probability array<double>, raw array<double>"
        return "prediction double" if self.output_width == 1 else "prediction array<double>"

    def _payload(self) -> ModelPayload:
        import torch
        from pyspark import cloudpickle
        buf = io.BytesIO()
        torch.save(self._state, buf)
        program = self.program()
        transform = cloudpickle.dumps(self._transform_fn) if self._transform_fn else b""
        columns = dict(self._input_columns) or None
        if program is not None:  # executors need no model code
            return ModelPayload({"kind": "exported"}, b"", buf.getvalue(), program, transform,
                                columns)
        pickled = cloudpickle.dumps(self._factory) if self._arch["kind"] == "pickle" else b""
        return ModelPayload(self._arch, pickled, buf.getvalue(), None, transform, columns)

    # ---- persistence ----
    def write(self) -> MLWriter:
        return ModelWriter(self)

    @classmethod
    def read(cls) -> ModelReader:
        return ModelReader(cls)

    @classmethod
    def load(cls, path: str, model: Any = None, trusted: bool = False,
             transformFn: Any = None) -> "TorchModel":  # noqa: N803 - the Param's name
        """Load a saved model. Weights are read with ``torch.load(weights_only=True)``.

        Without ``model``, the model's torch.export program is used where it was saved with
        one (``module()`` is then that program, a torch.fx GraphModule); otherwise a model
        saved from a built-in or importable factory is rebuilt by import, and one defined in a
        notebook or script needs ``trusted=True`` (or ``with trusted_loading():``), since
        unpickling its architecture runs code.

        The torch.export program is checked against what sparkddl's export writes before
        torch reads it (torch would compile guard code and evaluate expressions a tampered
        file holds).

        Args:
            path: the folder ``model.save(path)`` wrote.
            model: a module to load the weights into (no code is unpickled).
            trusted: allow unpickling the architecture and skip the program check (torch
                then reads the program as it is). Only for files you trust.
            transformFn: the fit's transformFn, needed back for a model fitted with one
                (or trusted loading, when it is not one of sparkddl's own).

        Raises:
            UntrustedArtifactError: a file holds what sparkddl's export never writes; it
                names the file and the field.
        """
        reader = ModelReader(cls, model=model, transform=transformFn)
        if trusted:
            with architecture.trusted_loading():
                return reader.load(path)
        return reader.load(path)

    def copy(self, extra: Any = None) -> "TorchModel":
        that = super().copy(extra)
        that.history = list(self.history)
        return that


def _as_vector(field: str, col: Any) -> Any:
    """A classifier's probability and raw prediction as ML Vectors, as pyspark.ml gives them."""
    from pyspark.ml.functions import array_to_vector
    return array_to_vector(col) if field in (PROBABILITY, RAW) else col


def _unpacked(col: Any, width: int | None) -> Any:
    """A packed output (a struct of ``width`` doubles) as its array again."""
    from pyspark.sql import functions as F
    return col if width is None else F.array(*[col[n] for n in packed_names(width)])


def _plain(value: Any) -> Any:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else value


def _check_features(features: list[str], present: list[str]) -> None:
    """DataError naming the feature columns the DataFrame lacks (Spark's own error would come
    as an AnalysisException, or only at an action on Spark Connect). Case-insensitive, as
    Spark resolves names by default."""
    have = {name.lower() for name in present}
    missing = [name for name in features if name.lower() not in have]
    if missing:
        raise DataError(f"transform: the DataFrame has no column {', '.join(map(repr, missing))}"
                        f" (the model's featuresCol: {', '.join(features)}); its columns are "
                        f"{', '.join(present) or 'none'}. Select or rename the columns the "
                        "model was trained on, or set featuresCol to the ones that hold them")


def _check_numeric(features: list[str], schema: Any) -> None:
    """DataError naming the feature columns that hold no numbers (a string column would be
    cast to null, or fail on the executors); a transformFn may read anything."""
    from pyspark.sql.types import ArrayType, BooleanType, NumericType
    fields = {f.name.lower(): f for f in schema.fields}
    for name in features:
        kind = fields[name.lower()].dataType
        inner = kind.elementType if isinstance(kind, ArrayType) else kind
        if isinstance(inner, ArrayType):
            inner = inner.elementType
        if isinstance(inner, (NumericType, BooleanType)) or type(inner).__name__ == "VectorUDT":
            continue
        raise DataError(f"transform: feature column {name!r} is {kind.simpleString()}; the "
                        "model takes numbers (a numeric column, an array of numbers or a "
                        "vector). Convert it first (e.g. F.col(name).cast('array<float>')), or "
                        "fit with a transformFn that decodes it")
