"""Executor side: a rank's shard of Parquet -> fixed-size tensor batches.

A source reads the pieces (row ranges of row groups) of one sub-shard as Arrow data: Petastorm
(:mod:`sparkddl.data.petastorm_source`) or ``pyarrow.parquet.ParquetFile``
(:mod:`sparkddl.data.arrow_source`), chosen by ``plan.reader`` on each rank. Everything
else happens here, the same for both: reader threads and their round-robin order, decoding,
the seeded shuffle buffer, exactly ``steps_per_epoch`` batches (or, for evaluation, every
row of the shard), and closing.
"""
from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Generator, Iterator

import numpy as np

from sparkddl.config import POOL_TYPES
from sparkddl.data import arrow_source, petastorm_source
from sparkddl.data.batching import Chunk, Rebatcher, decode_arrow, to_tensors
from sparkddl.data.choice import resolve_reader
from sparkddl.data.epoch_cache import epoch_cache
from sparkddl.data.plan import ShardPlan, piece_order
from sparkddl.data.transform import Shapes, ahead
from sparkddl.errors import DataError
from sparkddl.tables.parquet import check_unchanged, read_errors, unreadable

log = logging.getLogger(__name__)

# (plan, rank, epoch, part, parts) -> Arrow tables or record batches of that sub-shard's
# pieces, in its seeded order; closing the generator releases them
Source = Callable[[ShardPlan, int, int, int, int], Generator[Any, None, None]]
SOURCES: dict[str, Source] = {"petastorm": petastorm_source.read_sub_shard,
                              "arrow": arrow_source.read_sub_shard}

# "thread": row groups are read and decoded by background threads, ahead of training;
# "dummy": read inline in the training thread
QUEUE_DEPTH = 2  # decoded row groups buffered per reader thread, at most...
QUEUE_BYTES = 64 << 20  # ...and not more than this (at least one): large groups hold memory
# how long a stopped epoch waits for its reader threads; one stuck in I/O is left behind
# (they are daemons) so that training, or the error being raised, goes on
JOIN_TIMEOUT_S = 10.0
BATCHES_AHEAD = 4  # batches the batcher thread keeps ready for the training thread


def epoch_batches(plan: ShardPlan, rank: int, epoch: int, drop_last: bool = True
                  ) -> Generator[dict[str, Any], None, None]:
    """``rank``'s batches of one epoch: exactly ``plan.steps_per_epoch`` batches of
    ``plan.batch_size`` rows, the same count on every rank (what training needs).

    With ``drop_last=False`` (evaluation): every row of the rank's shard, so that across the
    ranks every row of the plan's dataset (its split, without deleted rows) is read exactly
    once; batches of ``plan.batch_size`` rows but the rank's last, which may be smaller. The
    ranks' shards differ by at most one row, so their batch counts by at most one: a
    collective per batch (an allreduce of each batch's loss) would wait forever on a rank
    that has run out. Sum locally and reduce once after the loop:

    ```python
    sums = torch.zeros(2)  # [rows, sum of losses]
    for batch in epoch_batches(plan, rank, 0, drop_last=False):
        sums += torch.tensor([len(batch["label"]), loss_sum(batch)])
    dist.all_reduce(sums)  # every rank, once
    ```

    One pass over the shard per epoch: every row is read at most once per epoch, and the
    order depends only on the seed, the epoch and the rank, so a resumed run reads the same
    order (with ``drop_last=False``, the same batches, then the rest). Readers are stopped on
    every exit path, including when the consumer stops early.
    """
    if plan.reader_pool not in POOL_TYPES:
        raise DataError(f"unknown reader pool {plan.reader_pool!r}; choose one of "
                        f"{', '.join(POOL_TYPES)}")
    source = SOURCES[resolve_reader(plan.reader, f"rank {rank}", plan.selection is not None,
                                    plan.url, plan.raw_in_place, plan.table.listed)]
    _check_files(plan, f"rank {rank}, epoch {epoch}")
    rng = np.random.default_rng([plan.seed, epoch, rank])
    rebatcher = Rebatcher(plan.batch_size, plan.shuffle_buffer, rng,
                          private=plan.cache_bytes > 0, partial_last=not drop_last)
    emitted = rows = 0
    # read-ahead threads where the rank has a core for them; on one core the same sub-shards
    # are read in turn by the training thread (same order, no threads fighting it)
    threaded = plan.reader_pool == "thread" and usable_cpus() > 1
    if threaded:
        groups = _prefetched(source, plan, rank, epoch)
    elif plan.reader_pool == "thread":
        groups = _in_turn(source, plan, rank, epoch)
    else:
        groups = _decoded(source, plan, rank, epoch, 0, 1)
    convert = (lambda batch: batch) if plan.transform is not None else to_tensors
    batches: Iterator[Any] = _batcher(groups, rebatcher, convert, rank) if threaded else \
        map(convert, _rebatched(groups, rebatcher))
    tensors: Iterator[dict[str, Any]]
    if plan.transform is not None:
        tensors = ahead(plan.transform, batches, plan.reader_workers,
                        lambda i: f"rank {rank}, epoch {epoch}, batch {i}",
                        Shapes(plan.transform_shapes))
    else:
        tensors = batches
    try:
        for batch in tensors:
            if not drop_last:
                rows += len(next(iter(batch.values()))) if batch else 0
            yield batch
            emitted += 1
            if drop_last and emitted == plan.steps_per_epoch:
                _fill_cache(source, plan, rank, epoch)
                return
    finally:
        if hasattr(tensors, "close"):
            tensors.close()  # pyright: ignore[reportAttributeAccessIssue] - checked above
        if hasattr(batches, "close"):
            batches.close()  # pyright: ignore[reportAttributeAccessIssue] - checked above
        groups.close()
    changed = f"the dataset at {plan.url} changed after it was planned; prepare it again"
    if drop_last:
        raise DataError(f"rank {rank} got {emitted} batches in epoch {epoch}, expected "
                        f"{plan.steps_per_epoch}: {changed}")
    if rows != plan.rows_per_rank[rank]:
        raise DataError(f"rank {rank} got {rows} rows in epoch {epoch}, expected "
                        f"{plan.rows_per_rank[rank]}: {changed}")


def _rebatched(chunks: Iterator[tuple[Chunk, Any]], rebatcher: Rebatcher
               ) -> Generator[Chunk, None, None]:
    for chunk, rows in chunks:
        yield from rebatcher.add(chunk, rows)
    yield from rebatcher.finish()


def _batcher(groups: Generator[tuple[Chunk, Any], None, None], rebatcher: Rebatcher,
             convert: Callable[[Chunk], Any], rank: int) -> Generator[Any, None, None]:
    """Batches cut (and gathered: the one copy of each row) on a thread of their own, up to
    ``BATCHES_AHEAD`` ahead, so that the training thread only takes them."""
    out: queue.Queue = queue.Queue(BATCHES_AHEAD)
    stop = threading.Event()

    def batches() -> Generator[Any, None, None]:
        cut = _rebatched(groups, rebatcher)
        try:
            yield from map(convert, cut)
        finally:
            cut.close()
            groups.close()  # its reader threads stop here, on the thread that ran it

    thread = threading.Thread(target=_fill, args=(batches, out, stop), daemon=True,
                              name="sparkddl-batcher")
    thread.start()
    try:
        while True:
            item = out.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while not out.empty():  # unblock the batcher waiting on a full queue
            out.get_nowait()
        _join([thread], rank)


def _decoded(source: Source, plan: ShardPlan, rank: int, epoch: int, part: int, parts: int
             ) -> Generator[tuple[Chunk, np.ndarray], None, None]:
    """Decoded pieces of part ``part`` of ``parts`` of this rank's shard, without per-row
    Python objects (views of Arrow's buffers where the layout allows), each with the rows
    to use, in order: a seeded permutation (it depends on the seed, the epoch, the rank,
    the part and the piece's place in the pass), nothing copied yet. With an epoch cache
    that holds the whole shard, the same pieces in the same order from memory."""
    cache = epoch_cache(plan, rank)
    order = piece_order(plan, rank, epoch, part, parts)
    if cache is not None and cache.complete():
        for i, piece in enumerate(order):
            chunk = cache.chunks[piece]
            n = len(next(iter(chunk.values())))
            yield chunk, np.random.default_rng([plan.seed, epoch, rank, part, i]).permutation(n)
        return
    tables = _named_failures(source(plan, rank, epoch, part, parts), plan,
                             f"rank {rank}, epoch {epoch}")
    try:
        for i, table in enumerate(tables):
            chunk = {c.name: decode_arrow(c, table.column(c.name)) for c in plan.columns}
            if cache is not None and i < len(order):
                cache.add(order[i], chunk)
            rows = np.random.default_rng([plan.seed, epoch, rank, part, i]).permutation(
                table.num_rows)
            yield chunk, rows
    finally:
        tables.close()


def _fill_cache(source: Source, plan: ShardPlan, rank: int, epoch: int) -> None:
    """After an epoch that trained its last batch before the readers reached some pieces
    (those of the rows left over): read the sub-shards holding them into the epoch cache,
    once, so that it holds the whole shard."""
    cache = epoch_cache(plan, rank)
    if cache is None or cache.given_up or cache.complete():
        return
    parts = reader_threads(plan, rank)
    for part in range(parts):
        if all(p in cache.chunks for p in piece_order(plan, rank, epoch, part, parts)):
            continue
        for _ in _decoded(source, plan, rank, epoch, part, parts):
            if cache.given_up:
                return


def _check_files(plan: ShardPlan, where: str) -> None:
    """A table read in place: DataError if its files are not those planned."""
    if plan.files:
        from sparkddl.store import Store
        store = Store.from_uri(plan.url)
        check_unchanged(store.filesystem(), store.fs_path(plan.url), plan.files, where,
                        plan.table)


def _named_failures(tables: Generator[Any, None, None], plan: ShardPlan, where: str
                    ) -> Generator[Any, None, None]:
    """``tables``, with a file the source cannot read (Petastorm names it in its message
    only) as a DataError naming it, or naming the files that changed under the fit."""
    try:
        yield from tables
    except read_errors() as exc:
        _check_files(plan, where)
        path = getattr(exc, "filename", None)
        if path is None and type(exc) is OSError:  # the filesystem's own error: as it is
            raise
        raise unreadable(path or f"(one of {plan.url})", exc, where) from exc


_DONE = object()


def _prefetched(source: Source, plan: ShardPlan, rank: int, epoch: int
                ) -> Generator[tuple[Chunk, np.ndarray], None, None]:
    """Row groups read and decoded ahead by ``reader_workers`` threads, one sub-shard each,
    taken round-robin so the order does not depend on thread timing."""
    parts = reader_threads(plan, rank)
    stop = threading.Event()
    queues = [queue.Queue(queue_depth(plan)) for _ in range(parts)]
    threads = [threading.Thread(
        target=_fill, args=(functools.partial(_decoded, source, plan, rank, epoch, k, parts),
                            q, stop), daemon=True, name=f"sparkddl-reader-{k}")
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
        _join(threads, rank)


def usable_cpus() -> int:
    """The CPUs this process may run on (a rank is pinned to its share of its host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _in_turn(source: Source, plan: ShardPlan, rank: int, epoch: int
             ) -> Generator[tuple[Chunk, np.ndarray], None, None]:
    """What :func:`_prefetched` yields, in the same order, read in the calling thread."""
    parts = reader_threads(plan, rank)
    readers = [_decoded(source, plan, rank, epoch, k, parts) for k in range(parts)]
    try:
        live = list(range(parts))
        while live:
            for k in list(live):
                item = next(readers[k], None)
                if item is None:
                    live.remove(k)
                else:
                    yield item
    finally:
        for r in readers:
            r.close()


def reader_threads(plan: ShardPlan, rank: int) -> int:
    """Reader threads (sub-shards) of ``rank``: ``reader_workers``, at most one per piece
    of its shard."""
    return max(1, min(plan.reader_workers, len(plan.pieces(rank))))


def queue_depth(plan: ShardPlan) -> int:
    """Decoded row groups each reader thread may hold ready: ``QUEUE_DEPTH``, fewer when
    the largest row group would make that more than ``QUEUE_BYTES``."""
    group_bytes = max(plan.row_groups, default=0) * sum(c.nbytes for c in plan.columns)
    return max(1, min(QUEUE_DEPTH, QUEUE_BYTES // max(group_bytes, 1)))


def _join(threads: list[threading.Thread], rank: int) -> None:
    """Wait for the reader threads, at most ``JOIN_TIMEOUT_S`` for all of them together."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            log.warning("rank %d: reader thread %s is still busy %g s after its epoch stopped "
                        "(blocked in I/O?); leaving it behind, it ends with the process",
                        rank, t.name, JOIN_TIMEOUT_S)


def _fill(make: Callable[[], Generator[Any, None, None]], out: queue.Queue,
          stop: threading.Event) -> None:
    """On a producer thread: what ``make()`` yields into ``out``, then _DONE (or the
    exception, which the consumer re-raises); stops when the consumer has gone away."""
    items = make()
    try:
        for item in items:
            if not _put(out, item, stop):
                return
        _put(out, _DONE, stop)
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
        _put(out, exc, stop)
    finally:
        items.close()


def _put(out: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put unless the consumer has gone away; False if it has."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
