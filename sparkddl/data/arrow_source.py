"""Row groups of a sub-shard read with pyarrow alone: the reader for stacks where
Petastorm cannot load (pyarrow >= 15, numpy 2, Spark >= 4.1).

It keeps Petastorm's contract: the row groups are those of :func:`list_row_groups` (files in
path order, Petastorm's rule for which files are data), row group i belongs to sub-shard
``i % count``; each epoch reads every row group of the sub-shard once, in a seeded order,
with the rows of each in a seeded order. The permutations are not Petastorm's, but depend
only on the seed, the epoch, the rank and the sub-shard, so a resumed run reads the same
order. Decoding, re-batching and step counting are :mod:`sparkddl.data.reader`'s.
"""
from __future__ import annotations

from typing import Any, Generator

import numpy as np

from sparkddl.data.plan import ShardPlan, list_row_groups, sub_shard
from sparkddl.store import Store


def read_sub_shard(plan: ShardPlan, rank: int, epoch: int, part: int, parts: int
                   ) -> Generator[Any, None, None]:
    """Arrow tables of the row groups of part ``part`` of ``parts`` of this rank's shard,
    one pass, rows shuffled inside each; striding, every row group in file order,
    unshuffled (the reader keeps this rank's rows)."""
    import pyarrow.parquet as pq

    store = Store.from_uri(plan.url)
    filesystem = store.filesystem()
    groups = list_row_groups(filesystem, store.fs_path(plan.url))
    rng = np.random.default_rng([plan.seed, epoch, rank, part])
    if not plan.stride:
        shard, count = sub_shard(plan, rank, part, parts)
        groups = [g for i, g in enumerate(groups) if i % count == shard]
        groups = [groups[i] for i in rng.permutation(len(groups))]
    handles: list[Any] = []
    files: dict[str, Any] = {}  # each file opened, and its footer parsed, once per pass
    try:
        for group in groups:
            if group.path not in files:
                handles.append(filesystem.open_input_file(group.path))
                files[group.path] = pq.ParquetFile(handles[-1])
            table = files[group.path].read_row_group(group.index, columns=plan.names)
            yield table if plan.stride else table.take(rng.permutation(table.num_rows))
    finally:
        for handle in handles:  # ParquetFile.close() leaves a file it was handed open
            handle.close()
