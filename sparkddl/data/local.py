"""Reading a prepared dataset into memory on the driver (validation data, samples)."""
from __future__ import annotations

import numpy as np

from sparkddl.data.batching import Chunk, decode_arrow
from sparkddl.data.dataset import Dataset
from sparkddl.data.plan import list_row_groups
from sparkddl.store import Store


def read_rows(dataset: Dataset, limit: int | None = None) -> Chunk:
    """All rows (or the first ``limit``) of ``dataset`` as decoded numpy arrays."""
    import pyarrow.parquet as pq

    store = Store.from_uri(dataset.url)
    fs = store.filesystem()
    names = [c.name for c in dataset.columns]
    chunks: list[Chunk] = []
    seen = 0
    for group in list_row_groups(fs, store.fs_path(dataset.url)):
        with fs.open_input_file(group.path) as f:
            table = pq.ParquetFile(f).read_row_group(group.index, columns=names)
        chunks.append({c.name: decode_arrow(c, table.column(c.name)) for c in dataset.columns})
        seen += table.num_rows
        if limit is not None and seen >= limit:
            break
    out = {n: np.concatenate([c[n] for c in chunks]) for n in names}
    return {n: v[:limit] for n, v in out.items()} if limit is not None else out
