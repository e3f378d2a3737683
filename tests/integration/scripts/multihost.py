"""A driver for the several-hosts tests (tests/integration/test_multihost.py), run inside a
network namespace: ``multihost.py MODE MASTER_URL STORE_DIR``; prints one JSON line
``RESULT {...}`` at the end (also on failure: the error's class and message).

``multihost.py serve MASTER_URL STORE_DIR``: one Spark application for many modes, read one a
line from stdin (``MODE [EPOCHS]``; ``ready HOST...`` waits for one executor on each of those
hosts); a ``RESULT`` line after each; ``exit`` or the end of stdin ends it."""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

from tests.integration.digits import accuracy, digits_df, mlp


def allreduce_on_every_rank() -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    out = {"sum": t.item(), "ifname": os.environ.get("GLOO_SOCKET_IFNAME", ""),
           "rank": dist.get_rank()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out)
    dist.destroy_process_group()
    return {"ranks": gathered}


class SlowLoss(torch.nn.Module):
    """10 ms a step: a long fit on a small set, so a host can be lost in the middle;
    ``alone_s`` a step on a single rank (an elastic fit that lost a host), so that its epochs
    on one rank last while the lost host comes back."""

    def __init__(self, alone_s: float = 0.01):
        super().__init__()
        self.alone_s = alone_s

    def forward(self, output, label):
        import torch.distributed as dist
        alone = not dist.is_initialized() or dist.get_world_size() == 1
        time.sleep(self.alone_s if alone else 0.01)
        return torch.nn.functional.cross_entropy(output, label)


class SayEpochs:
    def on_epoch_end(self, row):
        print(f"EPOCH {row['epoch']} at {time.time():.3f}", flush=True)


def estimator(store: str, **params):
    from sparkddl import TorchEstimator
    base = dict(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                loss="cross_entropy", featuresCol="features", labelCol="label", batchSize=32,
                epochs=3, numWorkers=2, validation=0.2, store=store, progress=False)
    return TorchEstimator(**{**base, **params})


def session(master: str, name: str):
    import logging

    from pyspark.sql import SparkSession

    # sparkddl's warnings with wall-clock times, for benchmarks/host_loss.py
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("LOG %(created).3f %(message)s"))
    logging.getLogger("sparkddl").addHandler(handler)
    logging.getLogger("sparkddl").setLevel(logging.INFO)

    host = os.environ["SPARK_LOCAL_IP"]
    return (SparkSession.builder.master(master).appName(f"multihost-{name}")
            .config("spark.driver.host", host).config("spark.driver.bindAddress", host)
            .config("spark.executor.memory", "768m")
            .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.python.worker.reuse", "true").getOrCreate())


def executors(sc) -> tuple[list[str], int, int]:
    """The hosts of the application's live executors (not the driver), from Spark's REST API
    (the JVM's SparkEnv is not reachable through py4j on every Spark: 4.3's BlockManager
    names shaded protobuf classes py4j cannot load), its task slots and its active stages."""
    import urllib.request
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/executors"
    with urllib.request.urlopen(url, timeout=10) as answer:
        found = json.load(answer)
    hosts = sorted(e["hostPort"].rsplit(":", 1)[0] for e in found
                   if e["id"] != "driver" and e.get("isActive", True))
    jsc = sc._jsc.sc()
    return hosts, int(jsc.maxNumConcurrentTasks(
        jsc.resourceProfileManager().defaultResourceProfile())), \
        len(sc.statusTracker().getActiveStageIds())


def ready(spark, want: list[str], timeout_s: float = 120.0) -> dict:
    """Wait until the application has one executor on each host of ``want``, as many task
    slots, and no stage running (an earlier mode's lost executor replaced)."""
    sc, started = spark.sparkContext, time.monotonic()
    while True:
        hosts, slots, active = executors(sc)
        if (hosts == sorted(want) and slots == len(want) and not active) or \
                time.monotonic() - started > timeout_s:
            return {"executors": hosts, "slots": slots, "active_stages": active,
                    "waited_s": time.monotonic() - started}
        time.sleep(0.2)


def main(mode: str, master: str, store: str, spark=None, epochs: int | None = None) -> dict:
    """``epochs``: instead of the mode's own number (lost, elastic, heal)."""
    spark = spark or session(master, mode)
    if mode == "run":
        import sparkddl
        return {"result": sparkddl.run(allreduce_on_every_rank, num_workers=2)}
    if mode == "distributor":
        from sparkddl import TorchDistributor
        return {"result": TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
            allreduce_on_every_rank)}
    df = digits_df(spark)
    if mode == "fit":
        model = estimator(store).fit(df)
        return {"accuracy": accuracy(model.transform(df)), "epochs": len(model.history),
                "restarts": model.restarts}
    if mode in ("lost", "elastic", "heal"):  # the caller cuts host 1 once epochs are reported
        params = dict(loss=SlowLoss(), epochs=40, maxRestarts=2, slotWaitTimeout=10.0,
                      callbacks=[SayEpochs()], watchdogTimeout=None)
        if mode == "elastic":  # the caller may bring host 1 back: the fit grows back
            params.update(minWorkers=1, epochs=20, loss=SlowLoss(alone_s=0.05))
        if mode == "heal":  # host 1 comes back while the driver waits for its slot
            params.update(minWorkers=1, epochs=8, slotWaitTimeout=120.0)
        params.update({"epochs": epochs} if epochs else {})
        model = estimator(store, **params).fit(df)
        return {"history": [{k: r.get(k) for k in ("epoch", "attempt", "world_size",
                                                   "rows_trained", "rows_skipped")}
                            for r in model.history],
                "restarts": model.restarts, "steps_per_rank": model.steps_per_rank,
                "accuracy": accuracy(model.transform(df))}
    raise SystemExit(f"unknown mode {mode}")


def outcome(call) -> None:
    """Print ``call()``'s result, or its error's class and message, as a RESULT line."""
    t0 = time.monotonic()
    try:
        out = {"ok": True, **call()}
    except BaseException as exc:  # noqa: BLE001 - the test reads the outcome
        out = {"ok": False, "error": type(exc).__name__, "message": str(exc),
               "traceback": traceback.format_exc()}
    out["wall_s"], out["ended_at"] = time.monotonic() - t0, time.time()
    print("RESULT " + json.dumps(out, default=str), flush=True)


def serve(master: str, store: str) -> None:
    spark = session(master, "serve")
    print("SERVING", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words == ["exit"]:
            break
        if words[:1] == ["ready"]:
            outcome(lambda: ready(spark, words[1:]))  # noqa: B023 - called right here
        elif words:
            outcome(lambda: main(words[0], master, store, spark,  # noqa: B023 - called now
                                 *map(int, words[1:2])))  # noqa: B023


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(*sys.argv[2:4])
    else:
        outcome(lambda: main(*sys.argv[1:4]))
    os._exit(0)  # do not wait for Spark's shutdown hooks over a cut link
