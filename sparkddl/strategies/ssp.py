"""Stale-synchronous parallel (Ho et al., 2013): a parameter server on rank 0.

Rank 0 runs a server thread beside its own training loop. After each optimizer step a
worker pushes its update (how far its model moved since its last pull, divided by the
number of ranks, so that one update from every rank moves the server's model like one
synchronous step on the averaged gradient) and then pulls the server's model. The server
applies updates as they arrive and answers a worker whose clock (updates pushed) is c only
once the slowest worker's clock is at least c - ``staleness``: no rank ever computes more
than ``staleness`` steps ahead of the slowest. ``staleness=0`` is bulk-synchronous.

Dynamic staleness (``min_staleness`` set; after Zhao et al., 2019, "Dynamic stale
synchronous parallel"): the bound moves between ``min_staleness`` and ``staleness`` with the
workers' observed speeds. The server times each worker's compute (from its answer to its
next push). A worker more than ``min_staleness`` steps ahead of the slowest is held only
while holding it is cheap: if the slowest worker is expected to push within half of the
waiting worker's own step time, the server waits for that push, at most that long; if the
slowest is expected later, is already late by half of its own step time (a straggler), or
has not pushed when the time is up, the worker goes on. Past ``staleness`` it always waits.
A straggler then costs the others about half of their step once, when it first makes them
wait; after that it is late and they go on at once, until they are ``staleness`` ahead.
Jitter of under half a step builds hardly any lead: with a fixed ``staleness``, every time
one worker is a little behind the others run ahead, and keep that lead. The first push of
an epoch is not timed (its compute includes the epoch's end: statistics, snapshot,
checkpoint).

Transport (:mod:`sparkddl.strategies.ssp_wire`): the run's TCPStore (rank 0 hosts it), with
one queue all workers push into and one queue per worker the server answers on; pops
block, nothing polls. Messages are raw tensor bytes behind a small integer header, never
pickles. CUDA tensors go through host memory. Bytes: a worker counts what it pushes and what
it pulls (the store sends on the
server's behalf). The training loop's epoch-end allreduce still lines all ranks up once per
epoch; asynchrony lives within epochs.

Nothing is checkpointed: clocks count from the start of an attempt, where the server starts
from the restored model.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from sparkddl.errors import ConfigError, SparkDDLError
from sparkddl.strategies.base import Strategy, option
from sparkddl.strategies.ssp_wire import (
    ALARM,
    FINAL,
    PLAIN,
    PUSH_HEADER,
    PUSH_QUEUE,
    UNTIMED,
    _connection,
    answer_key,
    decode_pull,
    encode_pull,
    pack,
    pull_queue,
    put_chunks,
    store_queue_problem,
    take_chunks,
    unpack,
    update_key,
)
from sparkddl.strategies.tensors import broadcast_module, model_state
from sparkddl.task import context

log = logging.getLogger(__name__)

# dynamic mode: a worker past min_staleness waits at most this share of its own step time
GRACE = 0.5


class StaleSynchronous(Strategy):
    name = "ssp"
    @dataclass(frozen=True)
    class Options:
        staleness: int = option(3, "steps a worker may run ahead of the slowest")
        min_staleness: int | None = option(None, "with a value, the bound moves between it "
                                           "and staleness with the workers' speeds")

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.clock = 0
        self.clocks: list[int] = []  # every worker's clock, as of the last pull
        self.max_lead = 0  # since the last end_epoch: own clock - slowest clock, at pulls
        self.wait_s = 0.0  # since the last end_epoch: time blocked on pulls
        self.leads = [0, 0]  # since the last end_epoch: sum of leads at pulls, pulls
        self.server: ParameterServer | None = None
        self.untimed = True  # the next push follows wrap or an epoch's end
        self.store: Any = None  # this rank's own connection to the run's TCPStore
        self.state: list[Any] = []
        self.base: list[Any] = []

    def check_options(self) -> None:
        self.check_int("staleness", 0)
        low = self.options["min_staleness"]
        if low is not None:
            self.check_int("min_staleness", 0)
            if low > self.options["staleness"]:
                raise ConfigError(f"strategy 'ssp' option min_staleness={low} is above "
                                  f"staleness={self.options['staleness']}; the lower bound "
                                  "must be <= staleness (the upper bound)")
        problem = store_queue_problem()
        if problem:
            raise ConfigError(f"strategy='ssp' {problem}; use another strategy (local_sgd "
                              "bounds divergence too) or a newer torch")

    def wrap(self, module: Any) -> Any:
        import torch.distributed as dist

        broadcast_module(module)
        self.state = model_state(module)
        self.base = [t.detach().clone() for t in self.state]  # the model last pulled
        store = context.current().store
        self.store = _connection(store)  # one connection per thread: the server has its own
        if dist.get_rank() == 0:
            low = self.options["min_staleness"]
            self.server = ParameterServer(_connection(store), [t.cpu().clone() for t in self.base],
                                          dist.get_world_size(), self.options["staleness"],
                                          low, None if low is None else _connection(store))
            self.server.start()
        return module

    def step(self, optimizer: Any) -> None:
        import torch

        optimizer.step()
        self.clock += 1
        with torch.no_grad():
            payload = pack([t.detach() - b for t, b in zip(self.state, self.base)])
        self._push(payload, UNTIMED if self.untimed else PLAIN)
        self.untimed = False
        del payload  # not held through the pull, which brings a model of its own
        self._pull()

    def _push(self, payload: bytes, kind: int) -> None:
        import torch.distributed as dist

        rank = dist.get_rank()
        chunks = put_chunks(self.store, update_key(rank, self.clock), payload)
        self.comm.add(PUSH_HEADER.size + len(payload))
        self.store.queue_push(PUSH_QUEUE, PUSH_HEADER.pack(rank, self.clock, kind, chunks))

    def _pull(self) -> None:
        import torch
        import torch.distributed as dist

        start = time.perf_counter()
        with context.collective("a pull from the SSP parameter server (staleness bound)"):
            message = self.store.queue_pop(pull_queue(dist.get_rank()))
        self.wait_s += time.perf_counter() - start
        clocks, payload = decode_pull(message, dist.get_world_size(), self.store,
                                      dist.get_rank())
        self.comm.add(len(message) + len(payload))
        self.clocks = clocks
        lead = self.clock - min(clocks)
        self.max_lead = max(self.max_lead, lead)
        self.leads = [self.leads[0] + lead, self.leads[1] + 1]
        with torch.no_grad():
            for t, b, value in zip(self.state, self.base, unpack(payload, self.base)):
                t.copy_(value)
                b.copy_(value)

    def end_epoch(self) -> dict[str, Any]:
        out = {**self.comm.take(), "max_lead": self.max_lead, "wait_s": self.wait_s,
               "mean_lead": self.leads[0] / max(1, self.leads[1])}
        self.max_lead, self.wait_s, self.leads = 0, 0.0, [0, 0]
        self.untimed = True
        return out

    def finalize(self, module: Any) -> None:
        """Pull the server's model once every update of every rank is in it."""
        self._push(b"", FINAL)
        self._pull()
        if self.server is not None:
            with context.collective("the SSP server's wait for every rank's final update"):
                self.server.join()  # it stops once every rank has had its final model


class ParameterServer(threading.Thread):
    """Rank 0's server: applies updates in arrival order, answers pulls within staleness.

    With ``low`` (min_staleness) set, a pull between ``low`` and ``staleness`` steps ahead
    of the slowest worker is answered by :meth:`_hold_until`'s rule; ``alarm_store`` is the
    connection its wake-up calls are pushed on (they go into the push queue the server
    blocks on, so nothing polls)."""

    def __init__(self, store: Any, params: list[Any], world: int, staleness: int,
                 low: int | None = None, alarm_store: Any = None):
        super().__init__(name="sparkddl-ssp-server", daemon=True)
        self.store, self.params = store, params
        self.world, self.staleness, self.low = world, staleness, low
        self.id = int.from_bytes(os.urandom(7), "little")
        self.alarm = None if low is None else Alarm(alarm_store, self.id)
        now = time.monotonic()
        self.answered = [now] * world  # when each worker was last answered
        self.compute = [0.0] * world  # each worker's step time: answer -> next push (EMA)
        self.timed = [False] * world

    def run(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # reported to every worker, which raise it
            log.exception("SSP parameter server failed")
            self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            if self.alarm is not None:
                self.alarm.stop()

    def _serve(self) -> None:
        clocks = [0] * self.world
        waiting: list[tuple[int, int, bool, float]] = []  # rank, clock, final, arrival
        finished = 0
        if self.alarm is not None:
            self.alarm.start()
        while finished < self.world:
            message = self.store.queue_pop(PUSH_QUEUE)  # blocks up to the store's timeout
            rank, clock, kind, chunks = PUSH_HEADER.unpack_from(message)
            now = time.monotonic()
            if rank == ALARM:
                if clock != self.id:
                    continue  # a wake-up call left by an earlier server on this store
            else:
                payload = take_chunks(self.store, update_key(rank, clock), chunks)
                if kind != FINAL:
                    self._apply(rank, clock, clocks[rank], payload)
                    clocks[rank] = clock
                    if kind == PLAIN:
                        self._time(rank, now)
                del payload
                waiting.append((rank, clock, kind == FINAL, now))
            ready, wake = [], None
            for w in waiting:
                until = self._hold_until(w, clocks, now)
                if until is None:
                    ready.append(w)
                elif until != float("inf"):
                    wake = until if wake is None else min(wake, until)
            if wake is not None and self.alarm is not None:  # a finite hold: dynamic only
                self.alarm.set(wake)
            if ready:
                model = pack(self.params)
                for w in ready:
                    chunks = put_chunks(self.store, answer_key(w[0]), model)
                    self.store.queue_push(pull_queue(w[0]), encode_pull(clocks, chunks))
                    self.answered[w[0]] = time.monotonic()
                finished += sum(w[2] for w in ready)
                waiting = [w for w in waiting if w not in ready]

    def _time(self, rank: int, now: float) -> None:
        step = now - self.answered[rank]
        self.compute[rank] = step if not self.timed[rank] else 0.7 * self.compute[rank] + 0.3 * step
        self.timed[rank] = True

    def _hold_until(self, w: tuple[int, int, bool, float], clocks: list[int],
                    now: float) -> float | None:
        """None: answer ``w`` now; else hold it until that time (inf: until a push)."""
        rank, clock, final, arrived = w
        lead = clock - min(clocks)
        if final:  # a final pull waits for everyone: the model it gets is the finished one
            return None if lead <= 0 else float("inf")
        if lead <= (self.staleness if self.low is None else self.low):
            return None
        if lead > self.staleness:
            return float("inf")
        # dynamic: between the bounds, hold only while the slowest are about to push
        deadline = arrived + GRACE * self.compute[rank]
        slowest = [r for r in range(self.world) if clocks[r] == min(clocks)]
        expected = [self.answered[r] + self.compute[r] for r in slowest]
        late = [e + GRACE * self.compute[r] for e, r in zip(expected, slowest)]
        if now >= deadline or max(expected) > deadline or now > min(late):
            return None  # not all expected in time, or one already late (a straggler): go on
        return min(deadline, min(late))  # look again when one of them would be late

    def _apply(self, rank: int, clock: int, last: int, payload: bytes) -> None:
        if clock != last + 1:
            raise SparkDDLError(f"rank {rank} pushed update {clock} after update {last}; "
                                "updates must arrive in order")
        for p, update in zip(self.params, unpack(payload, self.params)):
            p.add_(update, alpha=1.0 / self.world)

    def _fail(self, reason: str) -> None:
        for rank in range(self.world):
            try:
                self.store.queue_push(pull_queue(rank), encode_pull([], 0, reason.encode()))
            except Exception:  # noqa: BLE001 - the store itself may be gone
                log.warning("could not tell rank %d that the SSP server failed", rank)


class Alarm(threading.Thread):
    """Wakes the server at a set time by pushing an ALARM message into its push queue."""

    def __init__(self, store: Any, server_id: int):
        super().__init__(name="sparkddl-ssp-alarm", daemon=True)
        self.store, self.server_id = store, server_id
        self.due: float | None = None
        self.stopped = False
        self.cond = threading.Condition()

    def set(self, when: float) -> None:
        with self.cond:
            if self.due is None or when < self.due:
                self.due = when
                self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and (self.due is None or self.due > time.monotonic()):
                    self.cond.wait(None if self.due is None else self.due - time.monotonic())
                if self.stopped:
                    return
                self.due = None
            try:
                self.store.queue_push(PUSH_QUEUE, PUSH_HEADER.pack(ALARM, self.server_id, 0, 0))
            except Exception:  # held workers then wait for the next push
                if not self.stopped:
                    log.warning("SSP: the dynamic staleness alarm could not reach the store; "
                                "held workers now wait for the slowest worker's next push",
                                exc_info=True)
                return
