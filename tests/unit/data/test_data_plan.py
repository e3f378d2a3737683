"""Shard plans, row-group order, decoding and the shuffle buffer: no Spark needed."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from sparkddl.data.batching import Rebatcher, decode_arrow
from sparkddl.data.plan import plan_shards, shard_pieces, shard_rows
from sparkddl.data.schema import ColumnSpec, DataSpec, check_columns, column_spec
from sparkddl.errors import DataError
from sparkddl.tables.parquet import list_row_groups
from tests.stacks import needs_petastorm

COLS = (ColumnSpec("x", "feature", "scalar", "float32"),)


def test_rows_are_shared_equally_to_a_row():
    assert shard_rows([10, 20, 30, 40, 50], 2) == [75, 75]
    assert shard_rows([10, 20, 30], 4) == [15, 15, 15, 15]
    assert shard_rows([10, 20, 31], 3) == [21, 20, 20]


def test_equal_steps_for_uneven_row_groups():
    plan = plan_shards("u", COLS, [64, 50, 64, 64, 20], world=2, batch_size=16)
    assert plan.rows_per_rank == (131, 131)
    assert plan.steps_per_epoch == 131 // 16
    assert plan.rows_per_epoch == 256 and plan.rows_skipped == 262 - 256


# row groups as writers leave them (Spark: one full group + a remainder per file; skewed
# partitions; fewer groups than ranks; a single file), and world sizes of real clusters
PLANNER_LAYOUTS = [[15870, 9130] * 8, [15870, 9130] * 2, [100_000, 1000, 10, 3, 50_000],
                   [200_000], [0, 7, 0, 13], [33] * 350 + [12, 0, 5], [1] * 40]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("layout", range(len(PLANNER_LAYOUTS)))
def test_any_layout_any_world_every_row_in_one_piece(layout, world):
    groups = PLANNER_LAYOUTS[layout]
    total = sum(groups)
    shards = shard_pieces(groups, world, seed=layout)
    assert [sum(p.rows for p in s) for s in shards] == shard_rows(groups, world)
    assert max(shard_rows(groups, world)) - min(shard_rows(groups, world)) <= 1
    owner: dict[tuple[int, int], int] = {}
    for rank, pieces in enumerate(shards):
        shared = 0
        for p in pieces:
            assert 0 <= p.start < p.stop <= groups[p.group]
            if p.rows < groups[p.group]:
                shared += 1
            for row in (p.start, p.stop - 1):  # ranges: their ends are enough with the sum
                assert owner.setdefault((p.group, row), rank) == rank
        assert shared <= 2  # a rank decodes at most two row groups another rank reads too
    assert sum(p.rows for s in shards for p in s) == total
    # pieces of one row group never overlap: sorted by start, each starts where one ended
    by_group: dict[int, list] = {}
    for s in shards:
        for p in s:
            by_group.setdefault(p.group, []).append(p)
    for g, ps in by_group.items():
        ps.sort(key=lambda p: p.start)
        assert ps[0].start == 0 and ps[-1].stop == groups[g]
        assert all(a.stop == b.start for a, b in zip(ps, ps[1:]))
    plan = plan_shards("u", COLS, groups, world=world, batch_size=1)
    assert plan.rows_skipped == total % world  # the ranks with one row more leave it out
    assert plan.rows_per_epoch == total - total % world


def test_the_order_of_row_groups_is_seeded_not_the_file_order():
    """A table sorted by a column (a label) would give each rank one range of it."""
    groups = [10] * 20
    first = [p.group for p in shard_pieces(groups, 2, seed=0)[0]]
    assert sorted(first) != list(range(10))  # not the first half of the files
    assert first == [p.group for p in shard_pieces(groups, 2, seed=0)[0]]  # deterministic
    assert first != [p.group for p in shard_pieces(groups, 2, seed=1)[0]]


def test_fewer_rows_than_one_global_batch_is_a_data_error():
    with pytest.raises(DataError, match=r"30 training rows are fewer than num_workers × "
                                        r"batch_size = 4 × 8"):
        plan_shards("u", COLS, [10, 10, 10], world=4, batch_size=8)


@needs_petastorm
def test_row_group_order_matches_petastorm(tmp_path):
    import warnings

    import pyarrow.parquet as legacy_pq
    from petastorm.etl import dataset_metadata
    from petastorm.fs_utils import get_filesystem_and_path_or_paths

    for name, groups in [("b.parquet", 3), ("a.parquet", 2), ("c.parquet", 1)]:
        t = pa.table({"x": np.arange(groups * 10, dtype=np.float32) + ord(name[0]) * 1000})
        pq.write_table(t, tmp_path / name, row_group_size=10)
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".a.parquet.crc").write_text("")
    ours = [(g.path.rsplit("/", 1)[1], g.index) for g in
            list_row_groups(pafs.LocalFileSystem(), str(tmp_path))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fs, path = get_filesystem_and_path_or_paths(f"file://{tmp_path}")
        ds = legacy_pq.ParquetDataset(path, filesystem=fs, validate_schema=False,
                                      use_legacy_dataset=True)
        theirs = [(p.path.rsplit("/", 1)[1], p.row_group)
                  for p in dataset_metadata.load_row_groups(ds)]
    assert ours == theirs == [("a.parquet", 0), ("a.parquet", 1), ("b.parquet", 0),
                              ("b.parquet", 1), ("b.parquet", 2), ("c.parquet", 0)]


def test_tensor_columns_decode_from_raw_bytes_zero_copy():
    col = ColumnSpec("img", "feature", "tensor", "float32", (2, 3))
    rows = [np.arange(6, dtype="<f4") + i for i in range(5)]
    arr = pa.array([r.tobytes() for r in rows], type=pa.binary()).slice(1, 4)  # offset honoured
    out = decode_arrow(col, pa.chunked_array([arr]))
    assert out.shape == (4, 2, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out[1], rows[2].reshape(2, 3))
    assert not out.flags.owndata  # a view of the Arrow buffer
    with pytest.raises(DataError, match=r"'img': rows of \[23\] bytes, expected 24 bytes"):
        decode_arrow(col, pa.array([b"x" * 23]))


def test_list_columns_decode_and_reject_ragged_rows():
    col = ColumnSpec("v", "feature", "list", "float32", (3,))
    out = decode_arrow(col, pa.array([[1, 2, 3], [4, 5, 6]], type=pa.list_(pa.float64())))
    assert out.dtype == np.float32 and out.shape == (2, 3)
    np.testing.assert_array_equal(out[1], [4, 5, 6])
    with pytest.raises(DataError, match=r"'v' holds arrays of unequal length \[2, 3\]"):
        decode_arrow(col, pa.array([[1.0, 2.0, 3.0], [1.0, 2.0]]))


def test_scalar_columns_cast_and_nulls_are_refused():
    col = ColumnSpec("y", "label", "scalar", "int64")
    assert decode_arrow(col, pa.array([1, 2], type=pa.int32())).dtype == np.int64
    with pytest.raises(DataError, match="'y' has 1 null values"):
        decode_arrow(col, pa.array([1, None]))


def _chunks(n_rows: int, sizes: list[int]):
    start = 0
    for size in sizes:
        yield {"id": np.arange(start, start + size)}
        start += size
    assert start == n_rows


@pytest.mark.parametrize("buffer_rows", [0, 50, 1000])
def test_rebatcher_emits_exact_batches_each_row_at_most_once(buffer_rows):
    reb = Rebatcher(batch_size=16, buffer_rows=buffer_rows, rng=np.random.default_rng(1))
    out = []
    for chunk in _chunks(500, [7, 100, 3, 250, 140]):
        out += list(reb.add(chunk))
    out += list(reb.finish())
    assert all(len(b["id"]) == 16 for b in out)
    seen = np.concatenate([b["id"] for b in out])
    assert len(out) == 500 // 16 and len(set(seen.tolist())) == len(seen)
    if buffer_rows:
        assert not np.array_equal(seen, np.sort(seen))  # shuffled
    else:
        np.testing.assert_array_equal(seen, np.arange(len(seen)))  # order kept


def test_rebatcher_is_deterministic_per_seed():
    def run(seed):
        reb = Rebatcher(8, 64, np.random.default_rng(seed))
        got = [b["id"] for c in _chunks(200, [50, 50, 100]) for b in reb.add(c)]
        return np.concatenate(got + [b["id"] for b in reb.finish()])
    np.testing.assert_array_equal(run(3), run(3))
    assert not np.array_equal(run(3), run(4))


def test_missing_column_lists_available_ones():
    with pytest.raises(DataError, match=r"'feats' not found; the data has id \(bigint\), "
                                        r"features \(vector\)"):
        check_columns(DataSpec.of("feats"), {"id": ("integral", "bigint"),
                                             "features": ("vector", "vector")})


def test_unsupported_type_is_named():
    with pytest.raises(DataError, match=r"'name' \(string\) have unsupported types; supported"):
        check_columns(DataSpec.of("x", "name"), {"x": ("floating", "double"),
                                                 "name": ("unsupported", "string")})


def test_declared_shape_must_match_width():
    assert column_spec("img", "feature", "vector", 64, (1, 8, 8)).shape == (1, 8, 8)
    with pytest.raises(DataError, match=r"'img' has 64 values per row but the declared shape "
                                        r"\(3, 8, 8\) holds 192"):
        column_spec("img", "feature", "vector", 64, (3, 8, 8))


@pytest.mark.parametrize("kind,width,shape", [("vector", 64, (-8, -8)), ("vector", 64, (64, 1.0)),
                                              ("floating", None, (-1, -1))])
def test_declared_shape_needs_positive_whole_dimensions(kind, width, shape):
    # each of these multiplies out to the column's width, so only this check catches them
    with pytest.raises(DataError, match=r"column 'img': declared shape \(.*\) has a dimension "
                                        r"that is not a positive integer"):
        column_spec("img", "feature", kind, width, shape)


def test_scalar_columns_take_only_one_value_shapes():
    assert column_spec("x", "feature", "floating", None, (1,)).shape == (1,)
    with pytest.raises(DataError, match=r"'x' holds one value per row but shape \(2,\)"):
        column_spec("x", "feature", "floating", None, (2,))


def test_label_dtypes_follow_their_kind():
    assert column_spec("y", "label", "integral", None).dtype == "int64"
    assert column_spec("y", "label", "floating", None).dtype == "float32"
    assert column_spec("x", "feature", "integral", None).dtype == "float32"
    assert column_spec("y", "label", "array:floating", 3).dtype == "float32"


def test_dataspec_rejects_duplicates_and_stray_shapes():
    with pytest.raises(DataError, match="named twice"):
        DataSpec.of("a", "a")
    with pytest.raises(DataError, match="not a feature column"):
        DataSpec.of("a", "b", shapes={"b": (2,)})


def test_reader_threads_hold_fewer_large_row_groups():
    from sparkddl.data.reader import QUEUE_BYTES, QUEUE_DEPTH, queue_depth
    wide = (ColumnSpec("v", "feature", "tensor", "float32", (64,)),)
    small = plan_shards("u", wide, [1000] * 4, world=2, batch_size=10)
    assert queue_depth(small) == QUEUE_DEPTH
    rows = QUEUE_BYTES // 256  # one row group of QUEUE_BYTES: one held at a time
    large = plan_shards("u", wide, [rows] * 4, world=2, batch_size=10)
    assert queue_depth(large) == 1


def test_partition_folders_named_with_an_underscore_are_data_as_pyarrow_and_spark_say(
        tmp_path):
    """pyarrow's dataset (which Petastorm reads through) and Spark skip folders starting with
    '_' or '.' unless they are partition folders: the plan must list the same files."""
    for folder in ("_k=1", "k=2", "_tmp", ".hidden"):
        (tmp_path / folder).mkdir()
        pq.write_table(pa.table({"x": np.arange(3, dtype=np.float32)}),
                       tmp_path / folder / "part-0.parquet")
    paths = {g.path for g in list_row_groups(pafs.LocalFileSystem(), str(tmp_path))}
    assert paths == {str(tmp_path / "_k=1" / "part-0.parquet"),
                     str(tmp_path / "k=2" / "part-0.parquet")}
