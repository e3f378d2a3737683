"""DeviceFeed: batches copied ahead by a thread, in order, closed on every path. The threaded
machinery runs on the CPU here (plain buffers, a copy for the device copy); the CUDA path
(pinned ring, side stream, events) runs in the tests marked ``gpu``."""
from __future__ import annotations

import contextlib
import inspect
import threading
import time
import traceback
from typing import Any, Iterator

import pytest
import torch

from sparkddl.errors import ConfigError
from sparkddl.train.feed import DeviceFeed
from tests.stacks import needs_gpu

# row counts that grow and shrink (the ring's buffers are re-allocated and viewed), with a
# smaller last batch
SIZES = [8, 8, 5, 12, 8, 1, 16, 8, 8, 3] * 5
SIZES[-1] = 2


def _batch(i: int, n: int) -> dict[str, Any]:
    """Batch ``i`` with ``n`` rows; every value tells which batch and row it came from."""
    x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + 1000 * i
    return {"x": x, "y": torch.full((n,), i, dtype=torch.int64)}


def _source(sizes: list[int], log: dict[str, Any] | None = None, fail_at: int | None = None
            ) -> Iterator[dict[str, Any]]:
    """Fresh batches; ``log`` records how many were made and whether the ``finally`` ran."""
    log = {} if log is None else log
    log.update(made=0, closed=False)
    try:
        for i, n in enumerate(sizes):
            if i == fail_at:
                raise ValueError(f"bad row group {i}")
            log["made"] += 1
            yield _batch(i, n)
    finally:
        log["closed"] = True


def _feed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sparkddl-feed"]


def _threaded(batches: Any, **kw: Any) -> DeviceFeed:
    return DeviceFeed(batches, torch.device("cpu"), threaded=True, pin=False, **kw)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("consumer_delay_s", [0.0, 0.002])
def test_order_and_values_survive_ring_reuse(consumer_delay_s):
    got = []
    with _threaded(_source(SIZES), ahead=2) as feed:
        for batch in feed:
            got.append(batch)
            time.sleep(consumer_delay_s)
    assert len(got) == len(SIZES)
    # checked only once every batch is held: later batches went through the same buffers
    for i, (batch, n) in enumerate(zip(got, SIZES)):
        want = _batch(i, n)
        assert batch.keys() == want.keys()
        for k in want:
            assert batch[k].dtype == want[k].dtype and torch.equal(batch[k], want[k]), (i, k)
    storages = {b["x"].untyped_storage().data_ptr() for b in got}
    assert len(storages) == len(got)  # each batch owns its memory, none is a ring view
    assert not _feed_threads()


@pytest.mark.timeout(30)
def test_cpu_device_passes_the_same_tensors_through():
    batches = [_batch(i, n) for i, n in enumerate(SIZES[:5])]
    before = len(_feed_threads())
    feed = DeviceFeed(iter(batches), torch.device("cpu"))
    assert len(_feed_threads()) == before  # no thread, no copies
    got = list(feed)
    assert len(got) == len(batches)
    for b, g in zip(batches, got):
        assert g is b and all(g[k] is b[k] for k in b)
    assert isinstance(feed.wait_s, float)


@pytest.mark.timeout(30)
def test_values_that_are_not_tensors_pass_through():
    meta = {"part": 3}
    with _threaded(iter([{"x": torch.ones(2), "name": "a", "meta": meta}])) as feed:
        (batch,) = list(feed)
    assert batch["name"] == "a" and batch["meta"] is meta
    assert torch.equal(batch["x"], torch.ones(2))


@pytest.mark.timeout(30)
def test_source_error_is_raised_where_its_batch_would_come():
    log: dict[str, Any] = {}
    feed = _threaded(_source(SIZES, log, fail_at=3))
    got = [next(feed) for _ in range(3)]
    with pytest.raises(ValueError, match="bad row group 3") as info:
        next(feed)
    assert [int(b["y"][0]) for b in got] == [0, 1, 2]
    # the source's own exception, raised with the frames of the thread that saw it
    assert "_source" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert log["closed"] and not _feed_threads()
    with pytest.raises(StopIteration):
        next(feed)


@pytest.mark.timeout(30)
def test_failing_step_under_closing_stops_the_thread_and_the_source():
    log: dict[str, Any] = {}
    source = _source([4] * 1000, log)
    with pytest.raises(RuntimeError, match="step failed"):
        with contextlib.closing(_threaded(source, ahead=2)) as feed:
            for step, _ in enumerate(feed):
                if step == 2:
                    raise RuntimeError("step failed")
    assert not _feed_threads()
    assert log["closed"] and inspect.getgeneratorstate(source) == inspect.GEN_CLOSED
    assert log["made"] < 10  # it read ahead by a few batches, not the whole source


@pytest.mark.timeout(30)
def test_close_while_the_thread_waits_on_a_full_queue():
    log: dict[str, Any] = {}
    feed = _threaded(_source([4] * 1000, log), ahead=2)
    deadline = time.monotonic() + 10
    while log["made"] < 3 and time.monotonic() < deadline:  # 2 queued, 1 waiting to be put
        time.sleep(0.01)
    assert log["made"] == 3
    feed.close()
    feed.close()  # a second close does nothing
    assert not _feed_threads() and log["closed"]
    with pytest.raises(StopIteration):
        next(feed)


@pytest.mark.timeout(30)
def test_close_before_the_first_batch():
    source = _source(SIZES)
    feed = _threaded(source)
    feed.close()
    assert not _feed_threads()
    assert inspect.getgeneratorstate(source) == inspect.GEN_CLOSED
    assert list(feed) == []


@pytest.mark.timeout(30)
def test_dropped_feed_stops_its_thread():
    log: dict[str, Any] = {}
    feed = _threaded(_source([4] * 1000, log))
    next(feed)
    del feed  # nothing else refers to it: __del__ closes it
    assert not _feed_threads() and log["closed"]


@pytest.mark.timeout(30)
def test_empty_source():
    log: dict[str, Any] = {}
    feed = _threaded(_source([], log))
    assert list(feed) == []
    assert not _feed_threads() and log["closed"]


@pytest.mark.timeout(30)
def test_wait_is_measured():
    def slow() -> Iterator[dict[str, Any]]:
        for i in range(3):
            time.sleep(0.05)
            yield _batch(i, 2)

    feed = _threaded(slow())
    assert len(list(feed)) == 3
    assert feed.wait_s >= 0.1  # the source took 0.15 s and the consumer waited for it


def test_ahead_must_be_positive():
    with pytest.raises(ConfigError, match="ahead=0"):
        _threaded(iter([]), ahead=0)


@needs_gpu
@pytest.mark.timeout(60)
def test_cuda_feed_copies_through_pinned_ring_on_a_side_stream():
    dev = torch.device("cuda", torch.cuda.current_device())
    got = []
    with DeviceFeed(_source(SIZES), torch.device("cuda"), ahead=2) as feed:
        for batch in feed:
            assert batch["x"].device == dev and batch["y"].device == dev
            batch["x"].mul_(2)  # work on the consumer's stream, ordered after the copy
            got.append(batch)
        slots = feed._producer.slots
        assert len(slots) == 3 and slots[0].buffers["x"].is_pinned()
    torch.cuda.synchronize()
    for i, (batch, n) in enumerate(zip(got, SIZES)):
        want = _batch(i, n)
        assert torch.equal(batch["x"].cpu(), want["x"] * 2), i
        assert torch.equal(batch["y"].cpu(), want["y"]), i
    assert not _feed_threads()


@needs_gpu
@pytest.mark.timeout(60)
def test_cuda_feed_on_a_consumer_stream_and_early_close():
    log: dict[str, Any] = {}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), DeviceFeed(_source([64] * 1000, log), "cuda") as feed:
        for i, batch in enumerate(feed):
            total = batch["y"].sum()  # on ``stream``, which waits for the copy's event
            assert int(total) == 64 * i
            if i == 5:
                break
    assert not _feed_threads() and log["closed"]
