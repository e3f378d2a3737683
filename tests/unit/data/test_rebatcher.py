"""The Rebatcher: exact batches, every given row once, shuffled through its buffer, each row
copied once (gathered from the chunk it was decoded into), and bounded in what it holds."""
from __future__ import annotations

import numpy as np
import pytest

from sparkddl.data.batching import Rebatcher, object_rows


def _chunks(seed: int, count: int = 40) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """Chunks of random sizes; row ids count up across them; each with a random subset of
    its rows in a random order (as striding or a selection would give)."""
    rng = np.random.default_rng(seed)
    out, start = [], 0
    for _ in range(count):
        n = int(rng.integers(0, 700))
        ids = np.arange(start, start + n)
        chunk = {"id": ids, "x": np.repeat(ids[:, None], 4, axis=1).astype(np.float32),
                 "var": object_rows([np.full(i % 3, i) for i in ids])}
        rows = rng.permutation(n)[:int(rng.integers(0, n + 1))] if n else np.arange(0)
        out.append((chunk, rows))
        start += n
    return out


def _run(batch: int, buffer: int, chunks: list, seed: int = 0) -> tuple[list, Rebatcher, int]:
    rebatcher = Rebatcher(batch, buffer, np.random.default_rng(seed))
    batches, most_live = [], 0
    for chunk, rows in chunks:
        emitted = list(rebatcher.add(chunk, rows))
        batches += emitted
        if emitted:  # what stays held after an emit: the chunks its pending rows are in
            most_live = max(most_live, len(rebatcher._chunks))
    batches += list(rebatcher.finish())
    return batches, rebatcher, most_live


@pytest.mark.parametrize("buffer", [0, 300, 5000])
@pytest.mark.parametrize("batch", [1, 64, 1000])
def test_every_given_row_once_in_exact_batches_with_its_columns(batch, buffer):
    chunks = _chunks(seed=batch + buffer)
    batches, rebatcher, most_live = _run(batch, buffer, chunks)
    given = np.concatenate([c["id"][rows] for c, rows in chunks])
    got = np.concatenate([b["id"] for b in batches]) if batches else np.arange(0)
    assert all(len(b["id"]) == batch for b in batches)
    assert len(got) == len(given) // batch * batch  # only the last partial batch is dropped
    assert len(set(got.tolist())) == len(got) and set(got.tolist()) <= set(given.tolist())
    for b in batches:  # every column of a row travels with it
        assert (b["x"] == b["id"][:, None]).all() and b["x"].dtype == np.float32
        assert [len(v) for v in b["var"]] == [i % 3 for i in b["id"]]
    if not buffer:  # without the buffer, the order given
        assert got.tolist() == given[:len(got)].tolist()
    assert most_live <= Rebatcher.MAX_LIVE  # what the buffer left behind was compacted
    assert rebatcher.pending == 0 and not rebatcher._chunks


def test_the_buffer_mixes_rows_of_different_chunks_and_is_seeded():
    chunks = [({"id": np.arange(i * 500, (i + 1) * 500)}, None) for i in range(20)]
    batches, _, _ = _run(100, 2000, chunks, seed=1)
    again, _, _ = _run(100, 2000, chunks, seed=1)
    other, _, _ = _run(100, 2000, chunks, seed=2)
    ids = [b["id"].tolist() for b in batches]
    assert ids == [b["id"].tolist() for b in again]
    assert ids != [b["id"].tolist() for b in other]
    assert max(len({i // 500 for i in b}) for b in ids) >= 3  # a batch draws on several
    late = [i for b in ids[-10:] for i in b]
    assert min(late) < 5000  # early rows can still come out late


def test_a_batch_is_its_own_copy_or_a_view_of_consecutive_rows():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    rebatcher = Rebatcher(5, 0, np.random.default_rng(0))
    consecutive = list(rebatcher.add({"x": x}))  # rows in order: slices, nothing copied
    assert all(np.shares_memory(b["x"], x) for b in consecutive)
    shuffled = list(rebatcher.add({"x": x}, np.random.default_rng(0).permutation(20)))
    assert not any(np.shares_memory(b["x"], x) for b in shuffled)
    before = [b["x"].copy() for b in shuffled]
    x[:] = -1  # the chunk's buffer is gone or reused: the batches keep their rows
    assert all((b["x"] == c).all() for b, c in zip(shuffled, before))
    spanning = Rebatcher(6, 0, np.random.default_rng(0))
    out = list(spanning.add({"x": np.arange(4)})) + list(spanning.add({"x": np.arange(4, 8)}))
    assert [b["x"].tolist() for b in out] == [[0, 1, 2, 3, 4, 5]]  # gathered across chunks
