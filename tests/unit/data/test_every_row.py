"""Evaluation reads every row once: ``epoch_batches(..., drop_last=False)``, no Spark.

The invariant: the planner's shards (:func:`shard_pieces`) hold every row of the dataset in
exactly one piece of one rank, ``total // world`` rows a rank or one more; an epoch with
``drop_last=False`` reads a rank's whole shard, in batches of ``batch_size`` rows but the
rank's last (shorter, where the shard is not a multiple of the batch), so the ranks'
batch counts differ by at most one. Its first ``steps_per_epoch`` batches are the default's
(``drop_last=True``, which is unchanged), the rest follow.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sparkddl.data.batching import Rebatcher
from sparkddl.data.plan import shard_pieces, shard_rows
from sparkddl.data.reader import epoch_batches
from sparkddl.data.schema import DataSpec
from sparkddl.data.source import prepare_table
from sparkddl.errors import DataError
from tests.unit.data.test_reader_conformance import READERS, _plan, _write
from tests.unit.data.test_split import table_dir

# row groups per file: uneven groups, fewer groups than ranks, a single row, fewer rows
# than ranks, empty groups, k * batch * world rows exactly (batch 4, world 3, k 2: 24) and
# one more
SHARD_LAYOUTS = [[[37, 5, 64], [1, 90]], [[50]], [[1]], [[2]], [[0, 3], [0]], [[10, 14]],
                 [[10, 14], [1]]]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("layout", range(len(SHARD_LAYOUTS)))
def test_the_shards_hold_every_row_once_whatever_the_layout_and_world(layout, world):
    groups = [n for sizes in SHARD_LAYOUTS[layout] for n in sizes]
    shards = shard_pieces(groups, world, seed=layout)
    rows = [(p.group, r) for s in shards for p in s for r in range(p.start, p.stop)]
    assert sorted(rows) == [(g, r) for g, n in enumerate(groups) for r in range(n)]
    counts = [sum(p.rows for p in s) for s in shards]
    assert counts == shard_rows(groups, world) and max(counts) - min(counts) <= 1


def _ids(plan, rank: int, epoch: int, drop_last: bool) -> list[list[int]]:
    return [b["id"].tolist() for b in epoch_batches(plan, rank, epoch, drop_last=drop_last)]


# (row groups per file, world, batch): planning needs world × batch rows at least
READ_LAYOUTS = [([[37, 5, 64], [1, 90]], 3, 16), ([[50]], 4, 7), ([[3]], 3, 1),
                ([[10, 14]], 3, 4), ([[10, 14], [1]], 3, 4), ([[10, 14], [1]], 5, 2),
                ([[1] * 13, [2]], 4, 3)]


@pytest.mark.parametrize("pool", ["thread", "dummy"])
@pytest.mark.parametrize("buffer", [0, 40])
@pytest.mark.parametrize("layout", range(len(READ_LAYOUTS)))
def test_every_row_once_across_ranks_last_batches_partial(tmp_path, layout, buffer, pool):
    files, world, batch = READ_LAYOUTS[layout]
    total = sum(n for sizes in files for n in sizes)
    plan = _plan(_write(tmp_path, files), world=world, batch_size=batch, seed=layout,
                 shuffle_buffer=buffer, reader="arrow", reader_pool=pool)
    for epoch in range(2):
        everyone = []
        for rank in range(world):
            full = _ids(plan, rank, epoch, drop_last=True)
            every = _ids(plan, rank, epoch, drop_last=False)
            assert every[:plan.steps_per_epoch] == full  # the default's batches, then more
            sizes = [len(b) for b in every]
            assert sum(sizes) == plan.rows_per_rank[rank]
            assert all(n == batch for n in sizes[:-1]) and 0 < sizes[-1] <= batch
            assert len(every) == -(-plan.rows_per_rank[rank] // batch)
            everyone += [i for b in every for i in b]
        assert sorted(everyone) == list(range(total))


@pytest.mark.parametrize("reader", READERS)
def test_both_readers_and_the_epoch_cache_read_the_leftover_rows(tmp_path, reader):
    url = _write(tmp_path, [[37, 5, 64], [1, 90]])  # 197 rows
    plan = _plan(url, world=3, batch_size=16, reader=reader, reader_workers=2)
    cached = dataclasses.replace(plan, cache_bytes=1 << 30)
    want = [_ids(plan, rank, 0, drop_last=False) for rank in range(3)]
    assert sorted(i for ids in want for b in ids for i in b) == list(range(197))
    assert plan.rows_skipped == 197 - 3 * 4 * 16 == 5
    from sparkddl.data.epoch_cache import drop_epoch_caches
    try:
        for _ in range(2):  # the second time from memory
            assert [_ids(cached, rank, 0, drop_last=False) for rank in range(3)] == want
    finally:
        drop_epoch_caches()


def test_a_transform_sees_the_short_last_batch(tmp_path):
    url = _write(tmp_path, [[10, 14], [1]])  # 25 rows, 3 ranks: 9, 8, 8 rows
    plan = _plan(url, world=3, batch_size=4, reader="arrow",
                 transform=lambda b: {"id": b["id"] * 2})
    sizes = [[len(b["id"]) for b in epoch_batches(plan, r, 0, drop_last=False)]
             for r in range(3)]
    assert sizes == [[4, 4, 1], [4, 4], [4, 4]]
    ids = [i for r in range(3) for b in epoch_batches(plan, r, 0, drop_last=False)
           for i in b["id"].tolist()]
    assert sorted(ids) == list(range(0, 50, 2))


def test_a_shard_that_reads_short_is_a_data_error(tmp_path):
    url = _write(tmp_path, [[10, 14]])
    plan = _plan(url, world=2, batch_size=4, reader="arrow")
    short = dataclasses.replace(plan, rows_per_rank=(13, 12))  # the table lost a row
    with pytest.raises(DataError, match="rank 0 got 12 rows in epoch 0, expected 13"):
        list(epoch_batches(short, 0, 0, drop_last=False))


@pytest.mark.parametrize("validation", [0.3, "flag"])
def test_the_split_sides_read_every_row_once_between_them(tmp_path, validation):
    """A table split in place: the training side's rows and the validation side's, each
    read with drop_last=False at 3 ranks, are the table's rows once each."""
    url = table_dir(tmp_path, files=3, rows=90, group=25)  # 270 rows, uneven groups
    data = prepare_table(url, DataSpec.of("x", extra="id"), num_workers=3, batch_size=4,
                         validation=validation, seed=4)
    seen = []
    for side in (data.train, data.val):
        plan = side.plan(3, 4, seed=1, reader="arrow")
        ids = [i for r in range(3) for b in epoch_batches(plan, r, 0, drop_last=False)
               for i in b["id"].tolist()]
        assert len(ids) == side.rows
        seen += ids
    assert sorted(seen) == list(range(270))


def test_the_rebatcher_hands_the_short_batch_over_last_only_when_asked():
    chunks = [{"id": np.arange(i * 7, (i + 1) * 7)} for i in range(3)]  # 21 rows
    for partial, sizes in ((False, [5] * 4), (True, [5] * 4 + [1])):
        for buffer in (0, 8):
            r = Rebatcher(5, buffer, np.random.default_rng(0), partial_last=partial)
            out = [b for c in chunks for b in r.add(c)] + list(r.finish())
            assert [len(b["id"]) for b in out] == sizes
            got = torch.as_tensor(np.concatenate([b["id"] for b in out])).tolist()
            assert len(set(got)) == len(got) == sum(sizes)
            assert r.pending == 0 and not r._chunks
