"""Prepared datasets: where the Parquet is, what its columns are, how its row groups split."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sparkddl.data.plan import ShardPlan, folder_table, plan_shards
from sparkddl.data.schema import ColumnSpec
from sparkddl.data.split import Selection
from sparkddl.store import Store
from sparkddl.tables.table import Table


@dataclass(frozen=True)
class Dataset:
    """One split of prepared data: a Parquet directory the readers can open."""

    url: str
    columns: tuple[ColumnSpec, ...]
    row_groups: tuple[int, ...]  # rows per row group, in Petastorm's order
    # a table read in place: the rows of each row group that this split keeps (row_groups
    # count those), and the identity of its data files when planned
    selection: Selection | None = None
    files: tuple[tuple[str, int, int], ...] = ()
    # its files (every data file under ``url`` where none is given)
    table: Table = None  # type: ignore[assignment]  # None: __post_init__ gives the folder's

    def __post_init__(self) -> None:
        if self.table is None:
            object.__setattr__(self, "table", folder_table(self.url))

    @property
    def rows(self) -> int:
        return sum(self.row_groups)

    @property
    def shared_groups(self) -> list[int]:
        """Rows of the row groups the ranks share out: a split by whole row groups leaves
        the other side's out (the readers skip them)."""
        if self.selection is not None and self.selection.groups:
            return [r for r in self.row_groups if r]
        return list(self.row_groups)

    def plan(self, world: int, batch_size: int, **reader: Any) -> ShardPlan:
        return plan_shards(self.url, self.columns, self.shared_groups, world, batch_size,
                           selection=self.selection, files=self.files, table=self.table,
                           **reader)

    def to_json(self, base_url: str = "") -> dict[str, Any]:
        url = self.url[len(base_url):].lstrip("/") if base_url and \
            self.url.startswith(base_url) else self.url
        return {"url": url, "row_groups": list(self.row_groups)}


@dataclass(frozen=True)
class PreparedData:
    train: Dataset
    val: Dataset | None
    # materialized data: its cache key; a Parquet URL: the identity of its files
    fingerprint: str | None = None
    cache_hit: bool = False
    source: str = ""
    in_place: bool = False  # read where the user's table lies: nothing was written
    label_ranges: tuple[tuple[str, int, int], ...] = ()  # integral labels: (name, min, max)

    def label_range(self, name: str) -> tuple[int | None, int | None]:
        for label, low, high in self.label_ranges:
            if label == name:
                return low, high
        return None, None


def write_meta(store: Store, fingerprint: str, data: PreparedData) -> None:
    base = store.data_url(fingerprint)
    meta = {"fingerprint": fingerprint, "created": time.time(), "source": data.source,
            "columns": [c.to_json() for c in data.train.columns],
            "train": data.train.to_json(base),
            "val": data.val.to_json(base) if data.val else None,
            "label_ranges": [list(r) for r in data.label_ranges]}
    # written last: its presence marks the Parquet next to it complete
    store.write_bytes(store.data_url(fingerprint, "meta.json"), json.dumps(meta).encode())


def read_meta(store: Store, fingerprint: str) -> PreparedData | None:
    url = store.data_url(fingerprint, "meta.json")
    if not store.exists(url):
        return None
    meta = json.loads(store.read_bytes(url))
    columns = tuple(ColumnSpec.from_json(c) for c in meta["columns"])
    base = store.data_url(fingerprint)

    def split(d: dict | None) -> Dataset | None:
        if d is None:
            return None
        url = d["url"] if "://" in d["url"] else f"{base}/{d['url']}"
        return Dataset(url, columns, tuple(d["row_groups"]))

    train = split(meta["train"])
    assert train is not None
    return PreparedData(train, split(meta["val"]), fingerprint, cache_hit=True,
                        source=meta.get("source", ""),
                        label_ranges=tuple(tuple(r) for r in meta.get("label_ranges", [])))
