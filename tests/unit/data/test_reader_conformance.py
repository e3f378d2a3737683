"""One contract, both readers: Petastorm and pyarrow's ParquetFile read shards the same way.

Parquet written with pyarrow, no Spark. Row ids count up through the files in path order,
so the row ranges each rank reads can be checked against the plan's pieces.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from pyarrow import fs as pafs

from sparkddl.data import arrow_source, petastorm_source
from sparkddl.data import reader as reader_module
from sparkddl.data.choice import resolve_reader
from sparkddl.data.epoch_cache import drop_epoch_caches
from sparkddl.data.plan import ShardPlan, plan_shards
from sparkddl.data.reader import epoch_batches
from sparkddl.data.schema import ColumnSpec
from sparkddl.errors import ConfigError, DataError
from sparkddl.tables.parquet import list_row_groups
from tests.stacks import needs_petastorm

GROUP, FILES, GROUPS_PER_FILE = 32, 2, 8  # 512 rows in 16 row groups
COLUMNS = (ColumnSpec("id", "extra", "scalar", "int64"),
           ColumnSpec("x", "feature", "scalar", "float32"),
           ColumnSpec("img", "feature", "tensor", "float32", (2, 3)),
           ColumnSpec("v", "feature", "list", "float32", (3,)),
           ColumnSpec("label", "label", "scalar", "int64"))
READERS = [pytest.param("petastorm", marks=needs_petastorm), "arrow"]


def _table(ids: np.ndarray) -> pa.Table:
    img = (ids[:, None] + np.arange(6)).astype("<f4")
    return pa.table({
        "id": ids, "x": ids / 2,
        "img": pa.array([row.tobytes() for row in img], type=pa.binary()),
        "v": pa.array([[i, -i, 1.0] for i in ids.tolist()], type=pa.list_(pa.float64())),
        "label": (ids % 10).astype(np.int32)})


def _write(root, sizes_per_file: list[list[int]]) -> str:
    """Files part-0, part-1, ... with row groups of the given sizes; ids count up."""
    start = 0
    for f, sizes in enumerate(sizes_per_file):
        with pq.ParquetWriter(root / f"part-{f}.parquet", _table(np.arange(1)).schema) as w:
            for size in sizes:
                w.write_table(_table(np.arange(start, start + size)), row_group_size=size)
                start += size
    (root / "_SUCCESS").write_text("")  # not data, for either reader
    return f"file://{root}"


def _plan(url: str, **options) -> ShardPlan:
    root = url[len("file://"):]
    rows = [g.rows for g in list_row_groups(pafs.LocalFileSystem(), root)]
    options.setdefault("world", 2)
    options.setdefault("batch_size", 16)
    return plan_shards(url, COLUMNS, rows, **options)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    return _write(tmp_path_factory.mktemp("even"), [[GROUP] * GROUPS_PER_FILE] * FILES)


def _ids(plan: ShardPlan, rank: int, epoch: int) -> list[int]:
    return torch.cat([b["id"] for b in epoch_batches(plan, rank, epoch)]).tolist()


@pytest.mark.parametrize("pool", ["thread", "dummy"])
@pytest.mark.parametrize("reader", READERS)
def test_every_row_once_per_epoch_in_its_ranks_pieces(dataset, reader, pool):
    plan = _plan(dataset, seed=3, reader=reader, reader_pool=pool)
    assert plan.steps_per_epoch == 16  # 256 rows per rank, none skipped
    for epoch in range(2):
        by_rank = [_ids(plan, rank, epoch) for rank in range(2)]
        for rank, ids in enumerate(by_rank):
            assert sorted(ids) == _planned(plan, rank)  # its pieces' rows, no other's
        everyone = by_rank[0] + by_rank[1]
        assert len(everyone) == 512 and sum(everyone) == 511 * 512 // 2
        assert sorted(everyone) == list(range(512))


@pytest.mark.parametrize("shuffle_buffer", [0, 100])
@pytest.mark.parametrize("reader", READERS)
def test_order_is_reseeded_each_epoch_and_repeatable(dataset, reader, shuffle_buffer):
    plan = _plan(dataset, seed=5, reader=reader, shuffle_buffer=shuffle_buffer)
    first = _ids(plan, 0, 0)
    assert _ids(plan, 0, 0) == first  # a resumed run reads the same order
    assert _ids(plan, 0, 1) != first
    assert _ids(dataclasses.replace(plan, seed=6), 0, 0) != first
    assert first != sorted(first)  # rows are shuffled even without the shuffle buffer


@pytest.mark.parametrize("reader", READERS)
def test_exact_steps_of_fixed_size_batches_with_dtypes_and_shapes(tmp_path, reader):
    url = _write(tmp_path, [[50, 50, 50, 50, 50, 50], [50, 50, 50, 30]])  # 250 vs 230 rows
    plan = _plan(url, reader=reader)
    assert plan.steps_per_epoch == 240 // 16  # 480 rows, 240 per rank whatever the files
    batches = list(epoch_batches(plan, 0, 0))
    assert len(batches) == plan.steps_per_epoch
    want = {"id": (torch.int64, ()), "x": (torch.float32, ()), "img": (torch.float32, (2, 3)),
            "v": (torch.float32, (3,)), "label": (torch.int64, ())}
    for b in batches:
        assert {k: (t.dtype, tuple(t.shape[1:])) for k, t in b.items()} == want
        assert all(len(t) == 16 for t in b.values())
    b = batches[0]
    ids = b["id"].double()
    torch.testing.assert_close(b["x"].double(), ids / 2)
    torch.testing.assert_close(b["img"][:, 1, 2].double(), ids + 5)
    torch.testing.assert_close(b["v"][:, 1].double(), -ids)
    assert b["label"].tolist() == (b["id"] % 10).tolist()


def _planned(plan: ShardPlan, rank: int) -> list[int]:
    """The ids of ``rank``'s pieces, sorted: ids count up through the row groups."""
    starts = np.concatenate([[0], np.cumsum(plan.row_groups)])
    return sorted(i for p in plan.pieces(rank)
                  for i in range(starts[p.group] + p.start, starts[p.group] + p.stop))


# layouts Spark and other writers leave: one full row group + a remainder per file, fewer
# row groups than ranks, skewed files, one file of one row group
LAYOUTS = {"full+remainder": [[150, 86]] * 3, "fewer groups than ranks": [[400], [391]],
           "skewed": [[700, 50], [9], [31, 3]], "one group": [[797]]}


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("reader", READERS)
def test_any_layout_is_shared_by_row_ranges_every_row_once(tmp_path, reader, layout, world):
    url = _write(tmp_path, LAYOUTS[layout])
    plan = _plan(url, world=world, batch_size=10, reader=reader, reader_workers=2, seed=1)
    total = sum(map(sum, LAYOUTS[layout]))
    assert max(plan.rows_per_rank) - min(plan.rows_per_rank) <= 1
    assert plan.steps_per_epoch == total // world // 10
    assert 0 <= plan.rows_skipped == total - plan.rows_per_epoch < world * 10
    for epoch in range(2):
        by_rank = [_ids(plan, rank, epoch) for rank in range(world)]
        for rank, ids in enumerate(by_rank):
            assert len(ids) == plan.steps_per_epoch * 10 == len(set(ids))
            assert set(ids) <= set(_planned(plan, rank))  # no rank reads another's rows
        seen = [i for ids in by_rank for i in ids]
        assert len(seen) == len(set(seen)) == total - plan.rows_skipped  # each row once


@pytest.mark.parametrize("reader", READERS)
def test_a_shard_that_delivers_too_little_is_a_data_error(dataset, reader):
    plan = _plan(dataset, reader=reader)
    greedy = dataclasses.replace(plan, steps_per_epoch=plan.steps_per_epoch + 1)
    with pytest.raises(DataError, match=r"rank 1 got 16 batches in epoch 0, expected 17"):
        list(epoch_batches(greedy, 1, 0))


@pytest.mark.parametrize("reader", READERS)
def test_closing_early_stops_every_reader_thread(dataset, reader):
    plan = _plan(dataset, batch_size=4, reader=reader, shuffle_buffer=0)
    before = set(threading.enumerate())
    batches = epoch_batches(plan, 0, 0)
    next(batches)  # the reader threads now wait on full queues
    assert len(set(threading.enumerate()) - before) >= 2
    batches.close()
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_a_reader_thread_stuck_in_io_does_not_hold_up_the_error(dataset, monkeypatch, caplog):
    release = threading.Event()

    def source(plan, rank, epoch, part, parts):
        if part == 0:
            raise OSError("disk gone")
        release.wait(30)  # a read that never returns
        yield from arrow_source.read_sub_shard(plan, rank, epoch, part, parts)

    monkeypatch.setitem(reader_module.SOURCES, "arrow", source)
    monkeypatch.setattr(reader_module, "JOIN_TIMEOUT_S", 0.2)
    plan = _plan(dataset, reader="arrow", reader_workers=2)
    try:
        with pytest.raises(OSError, match="disk gone"):
            list(epoch_batches(plan, 0, 0))
        assert "rank 0: reader thread sparkddl-reader-1 is still busy" in caplog.text
    finally:
        release.set()


@pytest.fixture
def no_petastorm(monkeypatch):
    """This Python as if Petastorm could not be imported (the answer is cached per process:
    forget it before and after)."""
    for name in ("petastorm", *petastorm_source.MODULES):
        monkeypatch.setitem(sys.modules, name, None)
    petastorm_source.unavailable_reason.cache_clear()
    yield
    petastorm_source.unavailable_reason.cache_clear()


def test_asking_for_petastorm_where_it_cannot_load_says_why_and_how_to_fix(no_petastorm):
    with pytest.raises(ConfigError, match=r"reader='petastorm' but Petastorm cannot be used "
                       r"here \(rank 1\): importing petastorm.reader failed: "
                       r"ModuleNotFoundError.*install the pinned stack of constraints.txt.*"
                       r"choose reader='arrow'"):
        resolve_reader("petastorm", "rank 1")


def test_auto_reads_through_arrow_without_petastorm(no_petastorm, dataset, caplog):
    with caplog.at_level(logging.DEBUG, logger="sparkddl.data.choice"):
        plan = _plan(dataset, reader="auto")
        ids = _ids(plan, 0, 0)  # importing Petastorm anywhere on this path would fail
    assert len(ids) == 256
    assert "driver: using the arrow reader: reader='auto' and Petastorm cannot be used " \
           "here (importing petastorm.reader failed" in caplog.text
    assert "rank 0: using the arrow reader" in caplog.text
    # off the Petastorm stack this is the usual case: DEBUG, not a line per rank at INFO
    assert {r.levelno for r in caplog.records
            if "Petastorm cannot be used" in r.getMessage()} == {logging.DEBUG}


@needs_petastorm
def test_auto_prefers_petastorm_where_it_loads(caplog):
    with caplog.at_level(logging.DEBUG, logger="sparkddl.data.choice"):
        assert resolve_reader("auto") == "petastorm"
    assert "driver: using the petastorm reader: reader='auto' and Petastorm loads here" \
        in caplog.text


def test_unknown_reader_lists_the_choices():
    with pytest.raises(ConfigError, match=r"unknown reader 'arow'; choose one of auto, "
                                          r"petastorm, arrow"):
        plan_shards("file:///nowhere", COLUMNS, [64, 64], world=2, batch_size=16, reader="arow")


def test_ranks_read_an_fsspec_store_with_the_arrow_reader(dataset):
    """Data on a filesystem Petastorm cannot open (here fsspec's memory://) is read by the
    Arrow reader through the store's pyarrow-wrapped filesystem; asking for Petastorm says
    why not."""
    from sparkddl.store import Store
    store = Store.from_uri("memory://sparkddl-reader/data")
    fs, root = store.filesystem(), store.fs_path(store.url())
    local = dataset[len("file://"):]
    for f in range(FILES):
        fs.create_dir(root, recursive=True)
        with open(f"{local}/part-{f}.parquet", "rb") as src, \
                fs.open_output_stream(f"{root}/part-{f}.parquet") as dst:
            dst.write(src.read())
    try:
        rows = [g.rows for g in list_row_groups(fs, root)]
        plan = plan_shards(store.url(), COLUMNS, rows, world=2, batch_size=16)
        assert resolve_reader("auto", url=store.url()) == "arrow"
        ids = sorted(_ids(plan, 0, 1) + _ids(plan, 1, 1))
        assert ids == list(range(GROUP * GROUPS_PER_FILE * FILES))
        with pytest.raises(ConfigError, match=r"reader='petastorm' cannot read memory://"):
            plan_shards(store.url(), COLUMNS, rows, world=2, batch_size=16,
                        reader="petastorm")
    finally:
        store.delete(store.url())


@pytest.mark.parametrize("reader", READERS)
def test_a_rank_on_one_cpu_reads_the_same_order_without_threads(dataset, reader, monkeypatch):
    """readerPool=thread reads ahead on threads where the rank has cores for them; on one
    CPU the training thread reads the same sub-shards in turn, so the order does not depend
    on where the rank runs (a resumed run skips the steps it did)."""
    plan = _plan(dataset, seed=7, reader=reader, reader_workers=2, shuffle_buffer=50)
    assert reader_module.reader_threads(plan, 1) == 2
    threaded = _ids(plan, 1, 0)
    monkeypatch.setattr(reader_module, "usable_cpus", lambda: 1)
    before = set(threading.enumerate())
    batches = epoch_batches(plan, 1, 0)
    first = next(batches)
    assert set(threading.enumerate()) - before == set()  # nothing started
    rest = [b["id"] for b in batches]
    assert torch.cat([first["id"], *rest]).tolist() == threaded


@pytest.mark.parametrize("reader", READERS)
def test_the_epoch_cache_reads_parquet_once_and_keeps_the_order(dataset, reader, monkeypatch):
    """epochCacheMB: after an epoch that read a rank's whole shard, later epochs read no
    Parquet and hand over exactly the rows, in exactly the order, that reading would (a
    resumed run, whose cache is empty, reads the same); a budget the shard does not fit in
    gives the cache up and reads every epoch."""
    plain = _plan(dataset, seed=9, reader=reader, reader_workers=2, shuffle_buffer=40)
    want = {(rank, epoch): _ids(plain, rank, epoch) for rank in range(2) for epoch in range(3)}
    calls = []
    source = reader_module.SOURCES[reader]

    def counting(*args):
        calls.append(args[1:3])  # (rank, epoch)
        yield from source(*args)
    monkeypatch.setitem(reader_module.SOURCES, reader, counting)
    try:
        for budget, reads_later in ((1 << 30, False), (4 << 10, True)):
            cached = dataclasses.replace(plain, cache_bytes=budget)
            calls.clear()
            for epoch in range(3):
                for rank in range(2):
                    assert _ids(cached, rank, epoch) == want[rank, epoch]
            assert {e for _, e in calls} == ({0, 1, 2} if reads_later else {0})
            caches = [reader_module.epoch_cache(cached, rank) for rank in range(2)]
            assert all(c.given_up == reads_later for c in caches)
            if not reads_later:  # every row of the shard, decoded once
                assert sum(len(c["id"]) for c in caches[0].chunks.values()) == 256
            drop_epoch_caches()
    finally:
        drop_epoch_caches()


@pytest.mark.parametrize("reader", READERS)
def test_batches_edited_in_place_do_not_change_the_cached_epochs(dataset, reader):
    """A train step or transformFn may edit its batch in place (one row per batch is a view
    of its chunk without the cache): with the cache, later epochs still hand over the rows
    as read."""
    plain = _plan(dataset, seed=2, reader=reader, batch_size=1, shuffle_buffer=0)
    want = [_ids(plain, 0, epoch) for epoch in range(3)]
    cached = dataclasses.replace(plain, cache_bytes=1 << 30)
    try:
        for epoch in range(3):
            got = []
            for b in epoch_batches(cached, 0, epoch):
                got += b["id"].tolist()
                b["id"].add_(10_000)  # in place, as a careless train step might
            assert got == want[epoch]
        assert reader_module.epoch_cache(cached, 0).complete()
    finally:
        drop_epoch_caches()


@pytest.mark.parametrize("reader", READERS)
def test_the_cache_holds_the_pieces_past_the_last_batch_after_one_epoch(tmp_path, reader,
                                                                       monkeypatch):
    """An epoch ends after its last full batch; pieces the readers had not reached by then
    are read into the cache as the epoch closes, so later epochs read no Parquet."""
    url = _write(tmp_path, [[96, 8]])  # one rank: 104 rows, 3 batches of 32, 8 left over
    monkeypatch.setattr(reader_module, "usable_cpus", lambda: 1)  # sub-shards in turn
    plan = _plan(url, world=1, batch_size=32, shuffle_buffer=0, reader=reader,
                 reader_workers=2, seed=3, cache_bytes=1 << 30)
    try:
        first = _ids(plan, 0, 0)
        cache = reader_module.epoch_cache(plan, 0)
        assert cache.complete() and sum(len(c["id"]) for c in cache.chunks.values()) == 104
        uncached = dataclasses.replace(plan, cache_bytes=0)
        assert first == _ids(uncached, 0, 0) and _ids(plan, 0, 1) == _ids(uncached, 0, 1)
    finally:
        drop_epoch_caches()


@needs_petastorm
def test_petastorm_listing_other_row_groups_than_the_footers_is_refused(tmp_path):
    """A _metadata summary file that no longer matches the files makes Petastorm list other
    row groups: reading the plan's row ranges from them would train on other rows."""
    url = _write(tmp_path, [[64, 64], [64, 64]])
    collector = []
    pq.read_table(tmp_path / "part-1.parquet")  # the summary lists part-1 only, as part-0
    meta = pq.read_metadata(tmp_path / "part-1.parquet")
    meta.set_file_path("part-0.parquet")
    collector.append(meta)
    pq.write_metadata(meta.schema.to_arrow_schema(), tmp_path / "_metadata",
                      metadata_collector=collector)
    plan = _plan(url, reader="petastorm", reader_pool="dummy")
    with pytest.raises(DataError, match=r"Petastorm lists the row groups of .* otherwise than "
                                        r"their footers do .*Use reader='arrow'"):
        for rank in range(2):
            _ids(plan, rank, 0)
    arrow = dataclasses.replace(plan, reader="arrow")
    assert sorted(_ids(arrow, 0, 0) + _ids(arrow, 1, 0)) == list(range(256))
