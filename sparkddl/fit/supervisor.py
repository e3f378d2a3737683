"""Driver side of a fit: check everything, prepare the data, run the ranks (relaunching them
from the last good checkpoint after a failure), collect the snapshots, and return the
chosen weights with the history."""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from sparkddl import checkpoint, strategies
from sparkddl.config import TrainConfig
from sparkddl.data import PreparedData
from sparkddl.data.choice import reader_modules
from sparkddl.errors import (
    JobCancelledError,
    TrainingFailedError,
    add_note,
)
from sparkddl.fit import runlock
from sparkddl.fit.bounded import bounded_jobs
from sparkddl.fit.callbacks import Callbacks
from sparkddl.fit.checks import ProblemInfo
from sparkddl.fit.cluster_eval import ClusterEvaluator, check_free_slots, cluster_parts
from sparkddl.fit.dispatch import Dispatch, attempt_phases
from sparkddl.fit.elastic import check_elastic, resized
from sparkddl.fit.evaluation import EvaluationResult, Fatal, SnapshotEvaluator, evaluation_mode
from sparkddl.fit.inputs import (
    Components,
    check_best_by_early,
    fit_components,
    fit_inputs,
    look_at_data,
    shard_plan,
)
from sparkddl.fit.progress import Progress
from sparkddl.fit.records import record_phases, record_run, resume_hint, write_history
from sparkddl.fit.restarts import Restart, RestartPolicy, record_restart, store_fault
from sparkddl.fit.slots import forget_lost_executors, slots_back, world_after_failure
from sparkddl.launch import preflight
from sparkddl.launch.jobs import CallerScope, new_tag
from sparkddl.launch.launcher import launch_ranks, new_run_id
from sparkddl.launch.phases import Phases
from sparkddl.session import cluster_context
from sparkddl.session.probe import FIT_IMPORTS
from sparkddl.store import Store
from sparkddl.train.loop import train
from sparkddl.train.metrics import best_mode, per_batch
from sparkddl.train.spec import TrainSpec

log = logging.getLogger(__name__)


@dataclass
class FitResult:
    run_id: str
    model_factory: Callable[[], Any]
    state: dict[str, Any]  # the chosen weights (best or last)
    chosen_epoch: int
    history: list[dict[str, Any]]
    problem: ProblemInfo  # what the model predicts
    best_by: str
    epochs_done: int
    stopped_early: bool
    steps_per_rank: list[int]
    fit_time_s: float
    data: PreparedData
    restarts: list[Restart] = field(default_factory=list)
    # snapshots the driver could not evaluate (the weights were chosen among the others)
    evaluation_errors: list[str] = field(default_factory=list)
    # seconds by phase (checks, data, launch, start, training, evaluation, end): the fit's
    # wall clock, in order
    phases: dict[str, float] = field(default_factory=dict)


def fit(spark: Any, df: Any, model: Any, optimizer: Any, loss: Any, config: TrainConfig,
        callbacks: Callbacks | None = None) -> FitResult:
    """``callbacks`` run on the driver (on_fit_start and on_fit_end are the caller's)."""
    started = time.perf_counter()
    phases = Phases(started=started)
    check_best_by_early(config)
    check_elastic(config)
    sc = cluster_context(spark)
    # the executors' Python is checked by a small job while the driver builds and checks the
    # model and optimizer; nothing reaches the store or the data before it has passed
    checked = preflight.start_cluster_checks(sc, config.num_workers, config.use_gpu,
                                             FIT_IMPORTS)
    if config.evaluation == "cluster" and config.validation:
        check_free_slots(sc, config.num_workers)
    # unknown names and options; what the installed torch cannot run on these devices
    strategies.create(config.strategy, config.strategy_options).check_device(
        "cuda" if config.use_gpu else "cpu")
    parts = fit_components(model, optimizer, loss, config)
    phases.end("checks")
    # what writes nothing goes on beside the check too: the data validated, and a table read
    # in place listed and planned; an error of its own waits for the check, whose comes first
    # (a cancel does not wait)
    failed: Exception | None = None
    looked: PreparedData | str = ""
    try:
        with bounded_jobs(sc, config.timeout_s, "while looking at the data"):
            looked = look_at_data(df, config)
    except JobCancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - raised below, once the check has passed
        failed = exc
    if failed is not None:
        checked()  # outside the handler: its error stands alone, not chained to this one
        raise failed
    phases.end("data")
    checked()
    run_id = config.run_id or new_run_id()  # held even when new: a resume may name it
    with runlock.holding(Store.from_uri(config.store), run_id):
        return _fit(spark, df, parts, config, callbacks, run_id, phases, looked)


def _fit(spark: Any, df: Any, parts: Components, config: TrainConfig,
         callbacks: Callbacks | None, run_id: str, phases: Phases,
         looked: PreparedData | str) -> FitResult:
    """The fit of run ``run_id``, once the driver's checks have passed."""
    sc = cluster_context(spark)
    phases.end("checks")
    with bounded_jobs(sc, config.timeout_s, "while preparing the data"):
        inputs = fit_inputs(df, parts, config, looked)
    store, data = inputs.store, inputs.data
    plan = shard_plan(data, config, config.num_workers, inputs.transform_shapes)
    record_run(store, run_id, data, config, plan.steps_per_epoch)
    phases.end("data")  # listing, deciding in place or copy, materializing, planning
    mode = evaluation_mode(config, data.val)
    on_ranks = mode == "ranks"
    spec = TrainSpec(config, run_id=run_id, model_factory=inputs.factory,
                     optimizer=inputs.optimizer, loss=inputs.loss,
                     metrics=per_batch(inputs.metrics),
                     plan=plan, store_root=store.root, scheduler=inputs.scheduler,
                     step_fn=inputs.step_fn, strategies=strategies.registered(),
                     val=data.val if on_ranks else None,
                     eval_metrics=dict(inputs.metrics) if on_ranks else {})
    progress = Progress(config.epochs, plan.steps_per_epoch, enabled=config.progress,
                        samples_per_step=config.batch_size * config.num_workers)
    evaluator = SnapshotEvaluator(inputs.factory, inputs.step_fn, inputs.metrics, data.val,
                                  inputs.best_by, best_mode(inputs.best_by, config.best_mode),
                                  config.early_stopping_patience, store, run_id,
                                  callbacks=callbacks, snapshot_every=config.snapshot_every,
                                  epochs=config.epochs, transform=config.transform_fn,
                                  transform_shapes=inputs.transform_shapes,
                                  remote=_cluster_evaluator(spark, sc, inputs, data.val, config,
                                                            run_id) if mode == "cluster"
                                  else None, report=progress.epoch)
    log.info("fit %s: %d workers x batch %d, %d steps per epoch, %d epochs, strategy %s",
             run_id, config.num_workers, config.batch_size, plan.steps_per_epoch, config.epochs,
             config.strategy)
    policy = RestartPolicy(config.max_restarts, config.timeout_s, phases.started,
                           config.num_workers, config.use_gpu)
    def replan(resized: TrainConfig) -> Any:
        return shard_plan(data, resized, resized.num_workers, inputs.transform_shapes)

    try:
        with _stoppable(sc, run_id, evaluator):
            summary, restarts = _attempts(sc, spec, config, store, evaluator, progress,
                                          policy, replan, phases)
    finally:
        progress.close()
        evaluated = evaluator.close()
        phases.end("evaluation")  # what the driver still evaluated after the ranks ended
        write_history(store, run_id, evaluated.history)
    _end_if_fatal(evaluated.fatal, store, run_id)  # it came after the ranks' last message
    if evaluated.errors:
        log.warning("fit %s: %d snapshot(s) could not be evaluated on the driver: %s", run_id,
                    len(evaluated.errors), "; ".join(evaluated.errors))
    chosen = _choose(evaluated, config.final_weights, run_id)
    phases.end("end")
    record_phases(store, run_id, phases)
    return FitResult(run_id=run_id, model_factory=inputs.factory, state=chosen.state,
                     chosen_epoch=chosen.epoch, history=evaluated.history, problem=inputs.problem,
                     best_by=inputs.best_by, epochs_done=summary["epochs_done"],
                     stopped_early=summary["stopped_early"],
                     steps_per_rank=summary["steps_per_rank"],
                     fit_time_s=phases.total_s, data=data, restarts=restarts,
                     evaluation_errors=evaluated.errors, phases=phases.rounded())


def _cluster_evaluator(spark: Any, sc: Any, inputs: Any, val: Any, config: TrainConfig,
                       run_id: str) -> ClusterEvaluator:
    """evaluation="cluster": a Spark job per snapshot on the slots the fit leaves free."""
    parts = cluster_parts(sc, config.num_workers, val)
    log.info("evaluation: each snapshot by a Spark job of %d task(s) beside the fit "
             "(evaluation='cluster', %d validation rows)", parts, val.rows)
    return ClusterEvaluator(spark, sc, inputs.factory, inputs.step_fn, inputs.metrics, val,
                            config.transform_fn, inputs.transform_shapes, parts,
                            CallerScope.capture(sc), new_tag(run_id))


def _attempts(sc: Any, base: TrainSpec, config: TrainConfig, store: Store,
              evaluator: SnapshotEvaluator, progress: Progress, policy: RestartPolicy,
              replan: Callable[[TrainConfig], Any], phases: Phases
              ) -> tuple[dict[str, Any], list[Restart]]:
    """Launch the ranks; after a failure, relaunch from the last good checkpoint (or from the
    start) while the policy allows, on fewer ranks if the slots are gone and minWorkers
    allows; its final error names every attempt."""
    restarts: list[Restart] = []
    hook = Dispatch(evaluator, progress)
    attempt, spec, resized_from = 0, base, None
    while True:
        _end_if_fatal(evaluator.fatal, store, spec.run_id)  # no attempt starts after it
        # a checkpoint inside an epoch belongs to the old world's shards
        ref = checkpoint.latest_good(store, spec.run_id, epoch_end=resized_from is not None)
        if ref is not None or attempt > 0:  # forget what a failed attempt did after it
            evaluator.rewind(ref.epoch if ref else 0)
        if ref is not None:
            log.info("attempt %d resumes run %s from %s (epoch %d done, step %d)", attempt,
                     spec.run_id, ref.url, ref.epoch, ref.step)
        hook.steps = ref.epoch * spec.plan.steps_per_epoch + ref.step if ref else 0
        # the previous attempt's ranks have ended (run_stage waits for them); should one
        # still run, the fence keeps it from writing over this attempt's checkpoints
        fence = f"{attempt}-{new_run_id()}"
        checkpoint.set_fence(store, spec.run_id, fence)
        hook.attempt_started(spec.config.num_workers)
        try:
            hook.grow = _grow_check(sc, config) if spec is not base else None
            summary = launch_ranks(
                sc, train, (dataclasses.replace(spec, resume_url=ref.url if ref else None,
                                                fence=fence),),
                num_workers=spec.config.num_workers, run_id=spec.run_id,
                use_gpu=config.use_gpu,
                timeout_s=policy.remaining(), attempt=attempt, handlers=hook.handlers(attempt),
                watchdog_s=config.watchdog_s, warm_imports=reader_modules(spec.plan),
                slot_wait_s=_slot_wait(config, policy),
                description=f"sparkddl fit {spec.run_id} attempt {attempt}")
            attempt_phases(phases, hook)
            if not summary.get("regrow"):
                return summary, restarts
            restarts.append(Restart(attempt, f"grew back from {spec.config.num_workers} to "
                                    f"{config.num_workers} ranks", summary["epochs_done"], 0,
                                    0, time.monotonic(), world_size=config.num_workers))
            hook.pending = restarts[-1]
            resized_from, spec = spec.config.num_workers, base
        except JobCancelledError as exc:
            attempt_phases(phases, hook)
            hook.attempt = -1  # nothing the cancelled ranks still send counts
            _end_if_fatal(evaluator.fatal, store, spec.run_id)  # it cancelled the stage
            raise JobCancelledError(f"{exc} {resume_hint(store, spec.run_id)}") from exc
        except TrainingFailedError as exc:
            attempt_phases(phases, hook)
            hook.attempt = -1
            _end_if_fatal(evaluator.fatal, store, spec.run_id)  # its cancel broke the ranks
            hint = resume_hint(store, spec.run_id) if store_fault(exc) else ""
            final = policy.final_error(attempt, exc, hint)
            if final is not None:
                raise final from exc
            world = _world_after(sc, exc, config, policy)
            resized_from = spec.config.num_workers if world != spec.config.num_workers \
                else None
            spec = resized(base, world, replan)
            restarts.append(record_restart(attempt, exc, store, spec.run_id,
                                           spec.plan.steps_per_epoch, hook.steps, world,
                                           epoch_end=resized_from is not None))
            evaluator.restarted(restarts[-1])
            hook.pending = restarts[-1]
        attempt += 1


@contextmanager
def _stoppable(sc: Any, run_id: str, evaluator: SnapshotEvaluator) -> Iterator[None]:
    """The fit's barrier stages carry a job tag of the fit's own (a stage's thread takes the
    tags of the thread that launches it), so that a fatal error on a driver thread
    (``evaluator.abort``) cancels the running stage exactly as a user's cancel does."""
    tag = new_tag(run_id)
    sc.addJobTag(tag)
    evaluator.on_fatal = functools.partial(sc.cancelJobsWithTag, tag)
    try:
        yield
    finally:
        sc.removeJobTag(tag)


def _end_if_fatal(fatal: Fatal | None, store: Store, run_id: str) -> None:
    """Raise what ends the fit after a fatal error on a driver thread (the ranks have ended):
    a KeyboardInterrupt is a cancel, as Ctrl-C is (JobCancelledError, with the checkpoint to
    resume from); anything else (SystemExit, ...) is raised again, with a note saying where
    it came from."""
    if fatal is None:
        return
    hint = resume_hint(store, run_id)
    if isinstance(fatal.error, KeyboardInterrupt):
        raise JobCancelledError(f"fit {run_id} was cancelled: {fatal.where} raised "
                                "KeyboardInterrupt, which sparkddl takes as a cancel; the "
                                f"ranks were stopped and have ended. {hint}") from fatal.error
    add_note(fatal.error, f"fit {run_id} was stopped because {fatal.where} raised this; the "
                          f"ranks were stopped and have ended. {hint}")
    fatal.error.__suppress_context__ = True  # the cancel of the stage it caused is no news
    raise fatal.error


def _slot_wait(config: TrainConfig, policy: RestartPolicy) -> float:
    """How long a launch may wait for its task slots: slotWaitTimeout, within timeout."""
    remaining = policy.remaining()
    return config.slot_wait_s if remaining is None else min(remaining, config.slot_wait_s)


def _world_after(sc: Any, exc: TrainingFailedError, config: TrainConfig,
                 policy: RestartPolicy) -> int:
    """The next attempt's ranks: lost executors handed back to Spark, then a bounded wait for
    the slots (minWorkers decides whether fewer will do)."""
    forget_lost_executors(sc, exc.failures)
    return world_after_failure(
        sc, config.num_workers, config.min_workers or config.num_workers,
        _slot_wait(config, policy), config.use_gpu, exc.failures)


def _grow_check(sc: Any, config: TrainConfig) -> Callable[[int], bool]:
    """For an attempt on fewer ranks: after an epoch, whether to relaunch on all of them (an
    epoch is left after the next one, where the ranks stop, and the slots are there)."""
    def grow(epoch: int) -> bool:
        return epoch + 1 < config.epochs and \
            slots_back(sc, config.num_workers, config.use_gpu)
    return grow


def _choose(evaluated: EvaluationResult, final_weights: str, run_id: str) -> Any:
    chosen = evaluated.best if final_weights == "best" else evaluated.last
    chosen = chosen or evaluated.last
    if chosen is None:
        detail = "; ".join(evaluated.errors) or "no snapshot arrived"
        raise TrainingFailedError([], reason=f"fit {run_id} finished without a usable snapshot "
                                             f"({detail})")
    return chosen
