"""A rank's epoch cache (``epochCacheMB``): its decoded pieces kept in memory after the
first epoch, so that later epochs hand over the same rows in the same order without reading
Parquet. :mod:`sparkddl.data.reader` fills it and reads from it."""
from __future__ import annotations

import logging
import sys
import threading

import numpy as np

from sparkddl.data.batching import Chunk
from sparkddl.data.plan import Piece, ShardPlan

log = logging.getLogger(__name__)


class EpochCache:
    """A rank's decoded pieces, kept in memory up to ``plan.cache_bytes`` (sources hand one
    table per piece, in :func:`piece_order`): once it holds them all, later epochs take them
    from here in the order the readers would have read them. Where the shard does not fit,
    it is given up (said once) and every epoch reads Parquet."""

    def __init__(self, plan: ShardPlan, rank: int) -> None:
        self.plan, self.rank = plan, rank
        self.chunks: dict[Piece, Chunk] = {}
        self.nbytes = 0
        self.given_up = False
        self._lock = threading.Lock()
        self._wanted = len(plan.pieces(rank))

    def complete(self) -> bool:
        return not self.given_up and len(self.chunks) == self._wanted

    def add(self, piece: Piece, chunk: Chunk) -> None:
        with self._lock:
            if self.given_up or piece in self.chunks:
                return
            size = sum(chunk_bytes(v) for v in chunk.values())
            if self.nbytes + size > self.plan.cache_bytes:
                self.given_up = True
                self.chunks.clear()
                log.info("rank %d: its share of the data does not fit in epochCacheMB=%d "
                         "(%.0f MiB decoded before it ran out); every epoch reads Parquet",
                         self.rank, self.plan.cache_bytes >> 20, (self.nbytes + size) / 2**20)
                self.nbytes = 0
                return
            # copies of its own: a piece's arrays view the whole row group it was cut from
            self.chunks[piece] = {k: own_copy(v) for k, v in chunk.items()}
            self.nbytes += size


def own_copy(values: np.ndarray) -> np.ndarray:
    """``values`` in memory of its own (the arrays of a ragged column's rows too)."""
    if values.dtype != object:
        return values.copy()
    out = np.empty(len(values), dtype=object)
    out[:] = [v.copy() if isinstance(v, np.ndarray) else v for v in values]
    return out


def chunk_bytes(values: np.ndarray) -> int:
    """Memory a decoded column will hold in the cache: its values, and for object arrays
    (ragged rows, bytes, str) each object's own size."""
    if values.dtype != object:
        return values.nbytes
    return values.nbytes + sum(sys.getsizeof(v) + (v.nbytes if isinstance(v, np.ndarray)
                                                   else 0) for v in values)


# this process's epoch caches, by (plan, rank): a task's, dropped when it ends
# (drop_epoch_caches), since Spark reuses Python workers for later tasks
_caches: dict[tuple[int, int], EpochCache] = {}
_caches_lock = threading.Lock()


def epoch_cache(plan: ShardPlan, rank: int) -> EpochCache | None:
    if not plan.cache_bytes:
        return None
    with _caches_lock:
        cache = _caches.get((id(plan), rank))
        if cache is None or cache.plan is not plan:  # a plan's id is its own while it lives
            cache = _caches[(id(plan), rank)] = EpochCache(plan, rank)
        return cache


def drop_epoch_caches() -> None:
    with _caches_lock:
        _caches.clear()
