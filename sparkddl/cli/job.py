"""The spark-submit jobs behind ``sparkddl prepare|train|evaluate`` and jobs/*.py."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Any

from sparkddl.cli import spark_settings
from sparkddl.cli.preset import JobConfig, redacted
from sparkddl.cli.sources import holdout_split, load_source
from sparkddl.errors import ConfigError, StoreError
from sparkddl.fit.inputs import prepare_data
from sparkddl.problems import Problem
from sparkddl.session import cluster_context
from sparkddl.store import Store

log = logging.getLogger(__name__)


def spark_session(cfg: JobConfig) -> Any:
    """The session for a job. Settings from spark-submit (or PYSPARK_SUBMIT_ARGS) and
    spark-defaults.conf win; the preset only fills in what is unset (the master and JVM-level
    settings included), see :mod:`sparkddl.cli.spark_settings`."""
    spark = spark_settings.session(cfg.spark.master, cfg.spark.app_name, cfg.spark.conf)
    context = cluster_context(spark)
    context.set_log_level("ERROR")
    print(f"{context.label} master: {context.master or '?'}")
    return spark


def split_data(spark: Any, cfg: JobConfig) -> tuple[Any, Any]:
    df = load_source(spark, cfg.data.source)
    return holdout_split(df, cfg.data.test_fraction, cfg.data.seed)


def run_prepare(cfg: JobConfig) -> dict[str, Any]:
    spark = spark_session(cfg)
    train_df, _ = split_data(spark, cfg)
    t = cfg.train_config()
    data = prepare_data(train_df, t, Store.from_uri(t.store), t.num_workers)
    out = {"fingerprint": data.fingerprint, "cache_hit": data.cache_hit,
           "train_rows": data.train.rows, "val_rows": data.val.rows if data.val else 0,
           "train_url": data.train.url}
    how = "read in place" if data.in_place else \
        "reused (cache hit)" if data.cache_hit else "materialized"
    print(f"data {how}: "
          f"{out['train_rows']} train / {out['val_rows']} validation rows at {data.train.url}")
    return out


def run_train(cfg: JobConfig) -> dict[str, Any]:
    from sparkddl.ml import TorchEstimator, param_schema

    out_dir = output_store(cfg)
    spark = spark_session(cfg)
    train_df, test_df = split_data(spark, cfg)
    t = cfg.train_config()
    est = TorchEstimator(model=_model(cfg), optimizer=_optimizer(cfg), loss=cfg.loss.name,
                         mlflow=bool(cfg.output.mlflow), **param_schema.param_values(t))
    started = time.perf_counter()
    model = est.fit(train_df)
    fit_s = time.perf_counter() - started
    run_dir = out_dir.url(model.run_id)
    paths = save_run(out_dir, model, cfg)
    metrics = evaluate_model(model, test_df, t.labels[0])
    out_dir.write_bytes(out_dir.url(model.run_id, "metrics.json"), json.dumps(metrics).encode())
    print_metrics(model, metrics, fit_s)
    print(f"run {model.run_id}: model {paths['model']}\n  history {paths['history']}\n"
          f"  curves  {paths['plot']}\n  metrics {run_dir}/metrics.json")
    if model.mlflow_model_uri:
        print(f"  mlflow  {model.mlflow_model_uri}")
    return {"run_id": model.run_id, "metrics": metrics, "fit_s": fit_s,
            "mlflow_model_uri": model.mlflow_model_uri, **paths}


def run_evaluate(cfg: JobConfig, model_path: str | None = None) -> dict[str, Any]:
    from sparkddl.ml import TorchModel

    out_dir = Store.from_uri(cfg.output.dir)
    if model_path is None:
        latest = out_dir.url("LATEST")
        if not out_dir.exists(latest):
            raise StoreError(f"no trained model under {out_dir.root}; run `sparkddl train` first "
                             "or pass --model PATH")
        model_path = out_dir.spark_url(out_dir.read_bytes(latest).decode().strip(), "model")
    spark = spark_session(cfg)
    _, test_df = split_data(spark, cfg)
    # the weights go into the preset's model: a factory function it names is called because
    # the user's preset names it, not the saved file, so no trusted load is needed
    try:
        model = TorchModel.load(model_path, model=_model(cfg))
    except RuntimeError as exc:  # load_state_dict: the weights do not fit that model
        if "state_dict" not in str(exc):
            raise
        raise ConfigError(f"the model at {model_path} does not fit the preset's model "
                          f"{cfg.model.name!r} with {cfg.model.kwargs}; evaluate with the preset "
                          f"it was trained with ({' '.join(str(exc).split())[:300]})") from exc
    metrics = evaluate_model(model, test_df, cfg.train_config().labels[0])
    print_metrics(model, metrics, None)
    return {"run_id": model.run_id, "metrics": metrics, "model": model_path}


def run_plan(cfg: JobConfig, workers: tuple[int, ...]) -> dict[str, Any]:
    """Calibrate on this cluster, predict epoch time, speed-up and each rank's peak memory
    per strategy and worker count, print the tables and write plan.json, plan.md and
    speedup.png."""
    from sparkddl import perfmodel

    out_dir = output_store(cfg)
    spark = spark_session(cfg)
    train_df, _ = split_data(spark, cfg)
    cal, rows = perfmodel.run_calibration(
        spark, train_df, _model(cfg), _optimizer(cfg), cfg.loss.name, cfg.train_config())
    preds = perfmodel.predictions(cal, rows, workers)
    mem = perfmodel.memory_predictions(cal, workers)
    stamp = time.strftime("plan-%Y%m%d-%H%M%S")
    md = (perfmodel.table(preds) + "\n\nPeak memory per rank (rank 0, MB):\n\n"
          + perfmodel.memory_table(mem))
    out_dir.write_bytes(out_dir.url(stamp, "plan.json"),
                        perfmodel.to_json(cal, rows, preds, mem).encode())
    out_dir.write_bytes(out_dir.url(stamp, "plan.md"), md.encode())
    out_dir.write_bytes(out_dir.url(stamp, "speedup.png"), perfmodel.plot(preds))
    print(md)
    print(f"\nplan: {out_dir.url(stamp)} (plan.json, plan.md, speedup.png)")
    return {"dir": out_dir.url(stamp), "predictions": preds, "memory": mem, "calibration": cal}


def _model(cfg: JobConfig) -> Any:
    """The preset's model as a factory that saves by name (built-in or package.module:factory)."""
    from sparkddl.models import NamedModel
    return NamedModel(cfg.model.name, **cfg.model.kwargs)


def _optimizer(cfg: JobConfig) -> Any:
    from sparkddl.train.components import optimizer_recipe
    return optimizer_recipe(cfg.optimizer.name, lr=cfg.optimizer.lr, **cfg.optimizer.kwargs)


def output_store(cfg: JobConfig) -> Store:
    """The output location, checked writable before any work starts."""
    store = Store.from_uri(cfg.output.dir)
    store.check_writable()
    return store


def save_run(out: Store, model: Any, cfg: JobConfig) -> dict[str, str]:
    from sparkddl.cli.plotting import plot_history

    model_url = out.url(model.run_id, "model")
    model.write().overwrite().save(out.spark_url(model.run_id, "model"))  # s3 -> s3a etc.
    history_url = out.url(model.run_id, "history.json")
    out.write_bytes(history_url, json.dumps(model.history, indent=1).encode())
    out.write_bytes(out.url(model.run_id, "config.json"),
                    json.dumps(redacted(asdict(cfg))).encode())
    plot_url = out.url(model.run_id, "curves.png")
    out.write_bytes(plot_url, plot_history(model.history, model.chosen_epoch,
                                           f"run {model.run_id}"))
    out.write_bytes(out.url("LATEST"), model.run_id.encode())
    return {"model": model_url, "history": history_url, "plot": plot_url}


def evaluate_model(model: Any, test_df: Any, label: str) -> dict[str, float]:
    from pyspark.ml.evaluation import (
        BinaryClassificationEvaluator,
        MulticlassClassificationEvaluator,
        RegressionEvaluator,
    )

    pred = model.transform(test_df).cache()
    try:
        metrics: dict[str, float] = {"rows": float(pred.count())}
        if Problem(model.task).is_classifier:
            for name in ("accuracy", "f1", "weightedPrecision", "weightedRecall"):
                metrics[name] = MulticlassClassificationEvaluator(
                    labelCol=label, metricName=name).evaluate(pred)
            if model.task == Problem.BINARY:
                metrics["areaUnderROC"] = BinaryClassificationEvaluator(
                    labelCol=label, rawPredictionCol="rawPrediction").evaluate(pred)
        else:
            for name in ("rmse", "mae", "r2"):
                metrics[name] = RegressionEvaluator(labelCol=label, metricName=name).evaluate(pred)
    finally:
        pred.unpersist()
    return metrics


def print_metrics(model: Any, metrics: dict[str, float], fit_s: float | None) -> None:
    best = next((r for r in model.history if r["epoch"] == model.chosen_epoch), {})
    rows = [("held-out rows", f"{int(metrics['rows'])}")]
    rows += [(f"held-out {k}", f"{v:.4f}") for k, v in metrics.items() if k != "rows"]
    rows += [(f"epoch {model.chosen_epoch} {k}", f"{v:.4f}") for k, v in best.items()
             if k.startswith("val_") and isinstance(v, float)]
    rows.append(("epochs trained", f"{model.epochs_done}"))
    if fit_s is not None:
        rows.append(("fit wall time", f"{fit_s:.1f} s"))
    width = max(len(k) for k, _ in rows)
    print(f"\nrun {model.run_id} ({model.task}, weights of epoch {model.chosen_epoch}, "
          f"chosen by {model.best_by})")
    print(f"{'metric'.ljust(width)}  value\n{'-' * width}  {'-' * 10}")
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
