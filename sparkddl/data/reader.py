"""Executor side: a rank's shard of Parquet -> fixed-size tensor batches, through Petastorm."""
from __future__ import annotations

import logging
import warnings
import collections
import queue
import threading
from typing import Any, Generator, Iterator

import numpy as np

from sparkddl.data.batching import Chunk, Rebatcher, decode_arrow, to_tensors
from sparkddl.data.plan import ShardPlan
from sparkddl.errors import DataError

log = logging.getLogger(__name__)

# "thread": row groups are read and decoded by background threads, ahead of training;
# "dummy": read inline in the training thread. Petastorm's own pools are not used: its
# ThreadPool can end an epoch early (seen here with petastorm 0.13.1: 80 of 200 one-worker
# reads of a 512-row shard returned 256 rows, 2 of 200 four-worker reads returned none), and
# its DummyPool sleeps 100 ms whenever its ventilator thread has not queued the next row group.
POOL_TYPES = ("thread", "dummy")
QUEUE_DEPTH = 2  # decoded row groups buffered per reader thread

# Petastorm 0.13 drives pyarrow 14 through its deprecated legacy API on every row group,
# and logs at INFO that plain Parquet has no Petastorm metadata (expected here)
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\.|$)")
logging.getLogger("petastorm").setLevel(logging.WARNING)


def epoch_seed(plan: ShardPlan, epoch: int, part: int = 0) -> int:
    """Row-group order of an epoch: the same on every attempt, new each epoch."""
    return (plan.seed * 1_000_003 + epoch * 1_009 + part) % (2**31 - 1) or 1


def epoch_batches(plan: ShardPlan, rank: int, epoch: int) -> Iterator[dict[str, Any]]:
    """Exactly ``plan.steps_per_epoch`` batches of ``plan.batch_size`` rows for ``rank``.

    One pass over the shard per epoch (Petastorm readers with ``num_epochs=1``): every row is
    read at most once per epoch, and the order depends only on the seed, the epoch and the
    rank, so a resumed run reads the same order. Readers are stopped on every exit path,
    including when the consumer stops early.
    """
    if plan.reader_pool not in POOL_TYPES:
        raise DataError(f"unknown reader pool {plan.reader_pool!r}; choose one of "
                        f"{', '.join(POOL_TYPES)}")
    rng = np.random.default_rng([plan.seed, epoch, rank])
    rebatcher = Rebatcher(plan.batch_size, plan.shuffle_buffer, rng)
    emitted = 0
    groups = _prefetched(plan, rank, epoch) if plan.reader_pool == "thread" else \
        _sub_shard(plan, rank, epoch, 0, 1)
    try:
        for batch in _rebatched(groups, rebatcher):
            yield to_tensors(batch)
            emitted += 1
            if emitted == plan.steps_per_epoch:
                return
    finally:
        groups.close()
    raise DataError(f"rank {rank} got {emitted} batches in epoch {epoch}, expected "
                    f"{plan.steps_per_epoch}: the dataset at {plan.url} changed after it was "
                    "planned; prepare it again")


def _rebatched(chunks: Iterator[Chunk], rebatcher: Rebatcher) -> Iterator[Chunk]:
    for chunk in chunks:
        yield from rebatcher.add(chunk)
    yield from rebatcher.finish()


def _sub_shard(plan: ShardPlan, rank: int, epoch: int, part: int, parts: int
               ) -> Generator[Chunk, None, None]:
    """Decoded row groups of part ``part`` of ``parts`` of this rank's shard.

    Petastorm gives row group i to shard i % count; shards ``rank + world*k`` of
    ``world*parts`` for k = 0..parts-1 together hold exactly the row groups of shard ``rank``
    of ``world``. Petastorm plans, orders and reads the row groups (shuffling rows inside
    each); the Arrow tables it reads are decoded here without per-row Python objects.
    Striding, one reader walks every row group in file order and keeps this rank's rows.
    """
    from petastorm.workers_pool import EmptyResultError

    shard = {} if plan.stride else {"cur_shard": rank + plan.world * part,
                                    "shard_count": plan.world * parts}
    pool = InlinePool()
    reader = _open_reader(plan.url, plan.names, pool, seed=epoch_seed(plan, epoch, part),
                          shuffle_row_groups=not plan.stride, shuffle_rows=not plan.stride,
                          **shard)
    try:
        offset = 0
        while True:
            try:
                table = pool.get_results()
            except EmptyResultError:
                return
            chunk = {c.name: decode_arrow(c, table.column(c.name)) for c in plan.columns}
            n = table.num_rows
            if plan.stride:
                keep = np.arange((rank - offset) % plan.world, n, plan.world)
                chunk = {k: v[keep] for k, v in chunk.items()}
            offset += n
            yield chunk
    finally:
        reader.stop()
        reader.join()


_DONE = object()


def _prefetched(plan: ShardPlan, rank: int, epoch: int) -> Generator[Chunk, None, None]:
    """Row groups read and decoded ahead by ``reader_workers`` threads, taken round-robin
    so the order does not depend on thread timing."""
    # every sub-shard must hold a row group: Petastorm refuses more shards than row groups
    parts = 1 if plan.stride else max(1, min(plan.reader_workers,
                                             len(plan.row_groups) // plan.world))
    stop = threading.Event()
    queues = [queue.Queue(QUEUE_DEPTH) for _ in range(parts)]
    threads = [threading.Thread(target=_fill, args=(plan, rank, epoch, k, parts, q, stop),
                                daemon=True, name=f"sparkddl-reader-{k}")
               for k, q in enumerate(queues)]
    for t in threads:
        t.start()
    try:
        live = list(range(parts))
        while live:
            for k in list(live):
                item = queues[k].get()
                if item is _DONE:
                    live.remove(k)
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
    finally:
        stop.set()
        for q in queues:  # unblock producers waiting on a full queue
            while not q.empty():
                q.get_nowait()
        for t in threads:
            t.join()


def _fill(plan: ShardPlan, rank: int, epoch: int, part: int, parts: int, out: queue.Queue,
          stop: threading.Event) -> None:
    groups = _sub_shard(plan, rank, epoch, part, parts)
    try:
        for chunk in groups:
            if not _put(out, chunk, stop):
                return
        _put(out, _DONE, stop)
    except BaseException as exc:  # handed to the consumer, which re-raises it
        _put(out, exc, stop)
    finally:
        groups.close()


def _put(out: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put unless the consumer has gone away; False if it has."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _open_reader(url: str, columns: list[str], pool: "InlinePool", **options: Any) -> Any:
    """A Petastorm batch reader (what ``make_batch_reader`` builds, for plain Parquet) over
    ``pool``, reading one pass of the dataset; its row groups are taken from the pool."""
    from petastorm.arrow_reader_worker import ArrowReaderWorker
    from petastorm.fs_utils import get_filesystem_and_path_or_paths, normalize_dir_url
    from petastorm.reader import Reader

    filesystem, path = get_filesystem_and_path_or_paths(normalize_dir_url(url))
    return Reader(filesystem, path, schema_fields=columns, worker_class=ArrowReaderWorker,
                  reader_pool=pool, num_epochs=1, is_batched_reader=True, **options)


class InlinePool:
    """Petastorm's worker-pool interface, processing each row group in the calling thread.

    The Reader's ventilator thread queues row-group work items; ``get_results`` takes the
    next one, waking as soon as one is queued. ``workers_count`` only sizes the ventilation
    queue, which is made large enough that the ventilator never throttles itself (its
    items are tiny descriptions of row groups)."""

    workers_count = 1024

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._results: list[Any] = []
        self._ready = threading.Condition()
        self._ventilator: Any = None
        self._worker: Any = None

    def start(self, worker_class: Any, worker_args: Any = None, ventilator: Any = None) -> None:
        self._worker = worker_class(0, self._results.append, worker_args)
        self._ventilator = ventilator
        if ventilator is not None:
            ventilator.start()

    def ventilate(self, *args: Any, **kwargs: Any) -> None:
        with self._ready:
            self._items.append((args, kwargs))
            self._ready.notify()

    def get_results(self) -> Any:
        from petastorm.workers_pool import EmptyResultError

        while not self._results:
            with self._ready:
                while not self._items:
                    # completed() turns true only after the last item was queued
                    if self._ventilator is None or self._ventilator.completed():
                        raise EmptyResultError()
                    self._ready.wait(0.01)
                args, kwargs = self._items.popleft()
            self._worker.process(*args, **kwargs)
            if self._ventilator is not None:
                self._ventilator.processed_item()
        return self._results.pop(0)

    def stop(self) -> None:
        if self._ventilator is not None:
            self._ventilator.stop()

    def join(self) -> None:
        pass

    def results_qsize(self) -> int:
        return len(self._results)

    @property
    def diagnostics(self) -> dict[str, int]:
        return {"output_queue_size": len(self._results)}
