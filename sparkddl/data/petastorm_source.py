"""Row groups of a sub-shard through Petastorm (the pinned stack: pyarrow 14, numpy 1.26).

Petastorm plans, orders and reads the row groups, shuffling rows inside each; its Arrow
tables go to :mod:`sparkddl.data.reader`, which decodes, re-batches and counts steps the
same way for every source. Nothing here imports Petastorm until a shard is read.
"""
from __future__ import annotations

import collections
import functools
import logging
import posixpath
import threading
import warnings
from typing import Any, Generator

from sparkddl.data.petastorm_check import MODULES, unavailable_reason  # noqa: F401
from sparkddl.data.plan import Piece, ShardPlan, piece_order
from sparkddl.errors import DataError
from sparkddl.store import Store
from sparkddl.store.store import split_uri
from sparkddl.tables.parquet import list_row_groups

# Petastorm 0.13 drives pyarrow 14 through its deprecated legacy API on every row group,
# and logs at INFO that plain Parquet has no Petastorm metadata (expected here)
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\.|$)")
logging.getLogger("petastorm").setLevel(logging.WARNING)


def epoch_seed(plan: ShardPlan, epoch: int, part: int = 0) -> int:
    """Row-group order of an epoch: the same on every attempt, new each epoch; never 0,
    which Petastorm takes as "unseeded"."""
    return (plan.seed * 1_000_003 + epoch * 1_009 + part) % (2**31 - 1) or 1


def read_sub_shard(plan: ShardPlan, rank: int, epoch: int, part: int, parts: int
                   ) -> Generator[Any, None, None]:
    """Arrow tables of the pieces of part ``part`` of ``parts`` of this rank's shard
    (:func:`piece_order`), one pass, in that order. Petastorm is given the row groups to
    read, in that order (its own sharding, ``i % shard_count``, knows whole row groups only),
    and its worker cuts each to the piece's rows. Rows come in file order: the reader
    shuffles them as it batches (a copy it makes anyway), not Petastorm (whose take costs as
    much as reading the row group)."""
    from petastorm.workers_pool import EmptyResultError

    pieces = piece_order(plan, rank, epoch, part, parts)
    if not pieces:
        return
    pool = InlinePool()
    reader = _open_reader(plan.url, plan.names, pool, pieces, seed=epoch_seed(plan, epoch, part),
                          shuffle_row_groups=False, shuffle_rows=False)
    try:
        while True:
            try:
                yield pool.get_results()
            except EmptyResultError:
                return
    finally:
        reader.stop()
        reader.join()


def _open_reader(url: str, columns: list[str], pool: "InlinePool", pieces: list[Piece],
                 **options: Any) -> Any:
    """A Petastorm batch reader (what ``make_batch_reader`` builds, for plain Parquet) over
    ``pool``, reading one pass of ``pieces`` in their order; its row groups are taken from
    the pool."""
    from petastorm.fs_utils import get_filesystem_and_path_or_paths

    # Petastorm would urlparse the whole URL, cutting a folder named 'a#b' at the '#': it
    # gets the filesystem's root, and the path as the store names it
    scheme, netloc, _ = split_uri(url)
    filesystem, _ = get_filesystem_and_path_or_paths(f"{scheme}://{netloc}/")
    store = Store.from_uri(url)
    path = store.fs_path(url.rstrip("/"))
    ranges = {p.group: (p.start, p.stop) for p in pieces}
    worker = type("PieceWorker", (_in_order_worker(),), {"ranges": ranges})
    groups = list_row_groups(store.filesystem(), path)
    expected = {p.group: (posixpath.relpath(groups[p.group].path, path), groups[p.group].index)
                for p in pieces}
    return _piece_reader()(filesystem, path, schema_fields=columns, worker_class=worker,
                           reader_pool=pool, num_epochs=1, is_batched_reader=True,
                           cur_shard=0, shard_count=1, groups=[p.group for p in pieces],
                           expected=expected, url=url, **options)


@functools.lru_cache(maxsize=1)
def _piece_reader() -> type:
    """Petastorm's Reader, sharding by the list of row groups it is given (indexes into its
    list of the dataset's row groups, which is :func:`list_row_groups`'): the plan's."""
    from petastorm.reader import Reader

    class PieceReader(Reader):
        def __init__(self, *args: Any, groups: list[int],
                     expected: dict[int, tuple[str, int]], url: str, **kwargs: Any) -> None:
            self._groups, self._expected, self._url = groups, expected, url
            super().__init__(*args, **kwargs)

        def _partition_row_groups(self, dataset: Any, row_groups: Any, shard_count: Any,
                                  cur_shard: Any, filtered_row_group_indexes: Any,
                                  seed: Any) -> list[int]:
            # Petastorm's list of row groups must be the plan's, group for group: it may
            # differ (a _metadata summary file that lists other files), and a row range of
            # another row group would train on other rows
            for g, (relative, index) in self._expected.items():
                theirs = row_groups[g] if g < len(row_groups) else None
                if theirs is None or theirs.row_group != index or \
                        not theirs.path.rstrip("/").endswith("/" + relative):
                    raise DataError(
                        f"Petastorm lists the row groups of {self._url} otherwise than their "
                        f"footers do (row group {g} is "
                        f"{(theirs.path, theirs.row_group) if theirs else 'missing'}, planned "
                        f"as {(relative, index)}): a _metadata summary file that no longer "
                        "matches the files, or files changed since the fit planned them. "
                        "Use reader='arrow', or remove the stale _metadata file")
            return list(self._groups)

    return PieceReader


@functools.lru_cache(maxsize=1)
def _in_order_worker() -> type:
    """Petastorm's ArrowReaderWorker, less one copy: unshuffled, it still ``take``s every
    row group in natural order (``np.arange``), a full copy that costs as much as reading
    the group (measured: 0.41 s of 0.40 s read per 1 M rows x 64 floats). Rows stay in
    file order here, and sparkddl's batcher gathers them in a seeded order."""
    from petastorm.arrow_reader_worker import ArrowReaderWorker

    class InOrderWorker(ArrowReaderWorker):
        ranges: dict[int, tuple[int, int]] = {}  # row group -> its piece's rows

        def process(self, piece_index: int, *args: Any, **kwargs: Any) -> Any:
            self._piece_index = piece_index
            return super().process(piece_index, *args, **kwargs)

        def _read_with_shuffle_row_drop(self, piece: Any, pq_file: Any, column_names: Any,
                                        shuffle_row_drop_partition: Any) -> Any:
            table = self._read_in_order(piece, pq_file, column_names,
                                        shuffle_row_drop_partition)
            start, stop = self.ranges.get(self._piece_index, (0, table.num_rows))
            return table if (start, stop) == (0, table.num_rows) else \
                table.slice(start, stop - start)

        def _read_in_order(self, piece: Any, pq_file: Any, column_names: Any,
                           shuffle_row_drop_partition: Any) -> Any:
            if self._shuffle_rows or shuffle_row_drop_partition[1] != 1:
                return super()._read_with_shuffle_row_drop(piece, pq_file, column_names,
                                                           shuffle_row_drop_partition)
            with warnings.catch_warnings():  # the legacy dataset Petastorm reads through
                warnings.simplefilter("ignore", FutureWarning)
                # pyarrow's legacy ParquetDataset, which pyright reads as the new one
                partitions = self._dataset.partitions  # pyright: ignore[reportOptionalMemberAccess, reportAttributeAccessIssue]
            names = set(partitions.partition_names) if partitions else set()
            table = piece.read(columns=column_names - names, partitions=partitions)
            extra = set(table.column_names) - set(column_names)
            return table.drop(sorted(extra)) if extra else table

    return InOrderWorker


class InlinePool:
    """Petastorm's worker-pool interface, processing each row group in the calling thread.

    Petastorm's own pools are not used: its ThreadPool can end an epoch early (seen with
    petastorm 0.13.1: 80 of 200 one-worker reads of a 512-row shard returned 256 rows, 2 of
    200 four-worker reads returned none), and its DummyPool sleeps 100 ms whenever its
    ventilator thread has not queued the next row group.

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
