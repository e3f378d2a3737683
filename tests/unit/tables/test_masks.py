"""Delta deletion vectors read in place: the bitmap decoder against pyroaring, tables built by
hand after the Delta protocol (tests/delta_build.py) against deltalake's own scan, and the
damaged cases. Deleted rows carry a poison label (-1), so a reader that ignores a deletion
vector fails loudly."""
from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest

from sparkddl.data import DataSpec
from sparkddl.data.arrow_source import read_sub_shard
from sparkddl.data.local import batches, read_rows
from sparkddl.data.source import prepare_parquet, prepare_table
from sparkddl.errors import DataError
from sparkddl.tables.roaring import decode, z85_decode
from tests.delta_build import DeltaBuilder, serialize, z85_encode

SPEC = DataSpec.of(["x"], ["label"])


@pytest.mark.parametrize("values", [
    [], [0], [5, 3, 70000], list(range(10, 5000)),  # an array container, then a run
    list(range(0, 200000, 3)),  # bitmap containers (over 4096 values in a container)
    [1, 2, (1 << 32) + 7, (3 << 32) + 1],  # several 32-bit bitmaps (keys)
])
def test_bitmaps_decode_as_pyroaring_wrote_them(values):
    got = decode(serialize(values))
    assert got.dtype == np.uint64 and got.tolist() == sorted(set(values))


def test_random_bitmaps_of_every_container_kind_decode():
    rng = np.random.default_rng(1)
    for _ in range(40):
        n = int(rng.integers(1, 20000))
        spread = int(rng.choice([1000, 70000, 1 << 20, 1 << 34]))
        values = (rng.integers(0, spread, n).tolist()
                  + list(range(500, 500 + int(rng.integers(0, 3000)))))
        assert decode(serialize(values)).tolist() == sorted(set(values))


def test_z85_as_delta_encodes_it():
    for data in (b"", b"\x86\x4f\xd2\x6f", bytes(range(16)), bytes(range(37))):
        assert z85_decode(z85_encode(data), len(data)) == data
    assert z85_decode("HelloWorld") == bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])


def table_of(first: int, n: int, poison: set[int] = frozenset()) -> pa.Table:
    ids = np.arange(first, first + n)
    labels = np.where(np.isin(np.arange(n), list(poison)), -1, ids % 10)
    return pa.table({"x": ids.astype(np.float64), "label": labels.astype(np.int64)})


def oracle(path) -> list[float]:
    """deltalake's own reading of the table (it applies deletion vectors)."""
    from deltalake import DeltaTable, QueryBuilder
    result = QueryBuilder().register("t", DeltaTable(str(path))).execute("select x from t")
    return sorted(result.read_all().column("x").to_pylist())


def build(path, partitioned: bool = False, mapping: str | None = None,
          features: tuple[str, ...] | None = None) -> tuple[DeltaBuilder, list[float]]:
    """Four files of several row groups; deletes of every storage type, two bitmaps in one
    deletion-vector file, a file deleted from twice, a file with none."""
    deletes = {0: [0, 3, 5, 40, 99], 1: [7], 2: list(range(60, 90)) + [229], 3: []}
    t = DeltaBuilder(path, partition_columns=("part",) if partitioned else (),
                     column_mapping=mapping, **({"features": features} if features else {}))
    files = [t.add_file(table_of(1000 * k, n, set(deletes[k])), row_group_size=30,
                        partition={"part": k % 2} if partitioned else None)
             for k, n in enumerate([100, 57, 230, 45])]
    t.delete({files[0]: [0, 3, 5], files[1]: [7]}, storage="u")  # one DV file, two bitmaps
    t.delete({files[2]: deletes[2]}, storage="i")
    t.delete({files[0]: [40, 99]}, storage="p")  # merged with the first
    expected = sorted(float(1000 * k + i) for k, n in enumerate([100, 57, 230, 45])
                      for i in range(n) if i not in deletes[k])
    return t, expected


def test_every_storage_type_is_applied_on_the_files_that_carry_one(tmp_path):
    t, expected = build(tmp_path / "d")
    assert oracle(tmp_path / "d") == expected
    data = prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=3, batch_size=4)
    assert data.train.rows == len(expected)
    assert len(data.train.table.masks.by_file) == 3  # the file without deletes: none
    rows = read_rows(data.train)
    assert sorted(rows["x"].tolist()) == expected and (rows["label"] >= 0).all()
    # every rank its own rows, and together every row that is not deleted, once
    plan = data.train.plan(3, 4, seed=5)
    seen = []
    for rank in range(3):
        mine = [x for t_ in read_sub_shard(plan, rank, 0, 0, 1)
                for x in t_.column("x").to_pylist()]
        assert len(mine) == plan.rows_per_rank[rank]
        seen += mine
    assert sorted(seen) == expected
    # the driver's streamed reads (evaluation on the ranks) share the same rows
    shared = [x for r in range(3) for b in batches(data.train, 7, r, 3) for x in b["x"].tolist()]
    assert sorted(shared) == expected
    # labels are measured on the rows that are not deleted (not the footers' -1)
    from sparkddl.tables.delta import delta_table
    table = prepare_table(str(tmp_path / "d"), SPEC, num_workers=3, batch_size=4,
                          validation=None, seed=0, table=delta_table(str(tmp_path / "d")))
    assert table.label_range("label") == (0, 9) and table.train.rows == len(expected)


@pytest.mark.parametrize("v2", [False, True], ids=["classic", "v2-sidecar"])
def test_partitioned_and_checkpointed_tables(tmp_path, v2):
    t, expected = build(tmp_path / "d", partitioned=True,
                        features=("deletionVectors", "v2Checkpoint") if v2 else None)
    t.checkpoint(v2=v2)
    for v in range(t.version + 1):  # only the checkpoint tells what these commits did
        (tmp_path / "d" / "_delta_log" / f"{v:020d}.json").unlink()
    last = [p for p in t.files if p not in t.deleted][0]  # the file without deletes so far
    t.delete({last: [44]}, storage="u")  # a commit after the checkpoint
    expected.remove(3044.0)
    assert oracle(tmp_path / "d") == expected
    data = prepare_parquet(str(tmp_path / "d"), DataSpec.of(["x", "part"], ["label"]),
                           num_workers=2, batch_size=4)
    rows = read_rows(data.train)
    assert sorted(rows["x"].tolist()) == expected
    assert (rows["part"] == (rows["x"] // 1000) % 2).all()


def test_a_validation_split_never_holds_a_deleted_row(tmp_path):
    from sparkddl.tables.delta import delta_table
    _, expected = build(tmp_path / "d")
    listing = delta_table(str(tmp_path / "d"))
    data = prepare_table(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4,
                         validation=0.3, seed=2, table=listing)
    train, val = read_rows(data.train)["x"].tolist(), read_rows(data.val)["x"].tolist()
    assert data.train.rows == len(train) and data.val.rows == len(val)
    assert sorted(train + val) == expected and not set(train) & set(val)


def test_a_delete_changes_the_fingerprint_and_tables_without_deletes_need_none(tmp_path):
    t = DeltaBuilder(tmp_path / "d")  # deletion vectors enabled, none written yet
    f = t.add_file(table_of(0, 50))
    before = prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4)
    assert before.train.table.masks is None and before.train.rows == 50
    t.delete({f: [1, 2]})
    after = prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4)
    assert after.train.rows == 48 and after.fingerprint != before.fingerprint


@pytest.mark.parametrize("damage,match", [
    ("crc", r"CRC-32"),
    ("beyond", r"deletes row 60, beyond the file's 50 rows"),
    ("gone", r"file is gone"),
    ("cardinality", r"deletes 2 rows where the log says 3"),
])
def test_a_deletion_vector_that_cannot_be_read_names_the_file_and_the_vector(tmp_path, damage,
                                                                             match):
    t = DeltaBuilder(tmp_path / "d")
    f = t.add_file(table_of(0, 50))
    dv = t.delete({f: [1, 60] if damage == "beyond" else [1, 2]}, corrupt_crc=damage == "crc",
                  cardinality={f: 3} if damage == "cardinality" else None)[f]
    if damage == "gone":
        next((tmp_path / "d" / "ab").glob("deletion_vector_*.bin")).unlink()
    with pytest.raises(DataError, match=match) as info:
        prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4)
    assert f in str(info.value) and "deletion vector in" in str(info.value)
    assert dv["storageType"] == "u"


def test_reader_features_are_gated_by_an_allow_list(tmp_path):
    t = DeltaBuilder(tmp_path / "a", features=("deletionVectors", "typeWidening"))
    t.add_file(table_of(0, 20))
    with pytest.raises(DataError, match=r"reader feature\(s\) typeWidening.*spark.read.format"):
        prepare_parquet(str(tmp_path / "a"), SPEC, num_workers=2, batch_size=4)
    t = DeltaBuilder(tmp_path / "b", features=("deletionVectors", "timestampNtz",
                                               "vacuumProtocolCheck"))
    t.add_file(table_of(0, 20))
    assert prepare_parquet(str(tmp_path / "b"), SPEC, num_workers=2, batch_size=4).train.rows == 20


def test_a_bitmap_in_another_serialization_is_refused(tmp_path):
    with pytest.raises(ValueError, match="native serialization"):
        decode(struct.pack("<i", 1681511376) + b"\0" * 12)
    with pytest.raises(ValueError, match="magic number"):
        decode(b"\0" * 16)


def test_a_split_by_whole_row_groups_counts_the_rows_not_deleted(tmp_path):
    """From 16 row groups the split goes by whole groups: counted after the deletes, a group
    deleted whole on neither side, the readers' groups aligned with the plan's."""
    from sparkddl.tables.delta import delta_table
    t = DeltaBuilder(tmp_path / "d")
    f = t.add_file(table_of(0, 400, set(range(40, 60)) | {7, 333}), row_group_size=20)
    t.delete({f: list(range(40, 60)) + [7, 333]})  # row group 2 entirely
    expected = oracle(tmp_path / "d")
    data = prepare_table(str(tmp_path / "d"), SPEC, num_workers=3, batch_size=4,
                         validation=0.3, seed=4, table=delta_table(str(tmp_path / "d")))
    assert data.train.selection.groups and data.train.selection.empty
    read = []
    for side in (data.train, data.val):
        plan = side.plan(3, 4, seed=1)
        got = [x for r in range(3) for tb in read_sub_shard(plan, r, 0, 0, 1)
               for x in tb.column("x").to_pylist()]
        assert len(got) == side.rows
        shared = [x for r in range(3) for b in batches(side, 5, r, 3) for x in b["x"].tolist()]
        assert sorted(got) == sorted(shared)
        read += got
    assert sorted(read) == expected


def test_array_widths_are_measured_on_rows_that_are_not_deleted(tmp_path):
    t = DeltaBuilder(tmp_path / "d")
    bad = [[1.0]] * 3 + [[1.0, 2.0]] * 7  # the first rows, deleted, have another width
    f = t.add_file(pa.table({"v": bad, "label": np.arange(10)}))
    t.delete({f: [0, 1, 2]})
    data = prepare_parquet(str(tmp_path / "d"), DataSpec.of(["v"], ["label"]), num_workers=1,
                           batch_size=2)
    assert data.train.columns[0].shape == (2,) and data.train.rows == 7
    assert read_rows(data.train)["v"].shape == (7, 2)


def test_decoded_bitmaps_are_shared_by_reader_threads(tmp_path):
    import threading

    from sparkddl.tables.masks import RowMasks, descriptor
    vectors = {f"f{i}": descriptor({"storageType": "i", "pathOrInlineDv":
                                    z85_encode(serialize([i, i + 1])), "sizeInBytes":
                                    len(serialize([i, i + 1])), "cardinality": 2}, "",
                                   f"f{i}")
               for i in range(40)}
    deletes, errors = RowMasks(vectors), []

    def read() -> None:
        try:
            for i in np.random.default_rng().permutation(40).tolist() * 5:
                assert deletes.deleted(None, f"f{i}", 100).tolist() == [i, i + 1]
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=read) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors


def test_a_file_rewritten_under_the_logs_name_is_refused(tmp_path):
    import pyarrow.parquet as pq
    t = DeltaBuilder(tmp_path / "d")
    f = t.add_file(table_of(0, 50))
    t.delete({f: [3]})
    pq.write_table(table_of(0, 49), tmp_path / "d" / f)  # a row short: indexes shift
    with pytest.raises(DataError, match=rf"{f} .* holds 49 rows where the table's log says 50"):
        prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4)


def test_a_table_whose_rows_are_all_deleted_says_so(tmp_path):
    t = DeltaBuilder(tmp_path / "d")
    f = t.add_file(table_of(0, 50))
    t.delete({f: list(range(50))})
    with pytest.raises(DataError, match="every one of the 50 rows .* is deleted"):
        prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4)


def _rewrite_last_commit(folder, change) -> str:
    """The table's newest commit file, its text passed through ``change``; its path."""
    last = sorted((folder / "_delta_log").glob("*.json"))[-1]
    last.write_text(change(last.read_text()))
    return str(last)


def test_a_damaged_deletion_vector_descriptor_names_the_data_file(tmp_path):
    """A UUID-stored descriptor with a character Z85 does not have: a DataError naming the
    data file, not Z85's ValueError."""
    import json
    t = DeltaBuilder(tmp_path / "d")
    f = t.add_file(table_of(0, 50))
    t.delete({f: [1, 2]})

    def damage(text: str) -> str:
        actions = [json.loads(line) for line in text.splitlines() if line]
        for action in actions:
            dv = action.get("add", {}).get("deletionVector")
            if dv:
                dv["pathOrInlineDv"] = dv["pathOrInlineDv"][:-1] + "~"
        return "\n".join(json.dumps(a) for a in actions) + "\n"
    _rewrite_last_commit(tmp_path / "d", damage)
    with pytest.raises(DataError, match=r"UUID that is not Z85") as info:
        prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4)
    assert f in str(info.value)


def test_a_truncated_delta_commit_names_the_commit_file(tmp_path):
    t = DeltaBuilder(tmp_path / "d")
    t.add_file(table_of(0, 50))
    t.add_file(table_of(50, 50))
    path = _rewrite_last_commit(tmp_path / "d", lambda text: text[:len(text) // 2])
    with pytest.raises(DataError, match="truncated or damaged") as info:
        prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4)
    assert path in str(info.value)
