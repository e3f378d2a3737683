"""Training batches moved to the device while the previous step computes.

``batch[k].to(cuda, non_blocking=True)`` from ordinary (pageable) host memory is a
synchronous copy: the GPU idles while the host copies. :class:`DeviceFeed` does that work
ahead in a background thread: each batch is copied into one of a small ring of reused
pinned host buffers, sent to the device on a side stream, and handed to the training thread
with an event its stream waits on, so neither the GPU nor the training thread waits for a
copy that could have been done earlier. On the CPU the batches pass through untouched.

The thread is the only one that iterates the source, so it is also the one that closes it
(a generator cannot be closed from another thread while it runs); closing the feed stops the
thread and waits for it, on every exit path of the training loop.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any, Iterable, Iterator

from sparkddl.errors import ConfigError

log = logging.getLogger(__name__)

Batch = dict[str, Any]

AHEAD = 2  # batches copied ahead of the one training uses
# how long close() waits for the thread; one stuck in the source (I/O) is left behind (a
# daemon) and closes the source when it returns
JOIN_TIMEOUT_S = 10.0

_DONE = object()


class DeviceFeed:
    """The batches of ``batches`` (dicts of CPU tensors, batch dimension first) on ``device``,
    in source order, copied up to ``ahead`` batches ahead.

    ``threaded`` (default: ``device`` is CUDA) runs the background thread; without it the
    source's batches pass through unchanged. ``pin`` (default: ``device`` is CUDA) stages
    through pinned host buffers. On a CPU device the threaded mode copies each batch (the
    stand-in for the host-to-device copy), so the pipeline can be exercised without a GPU.
    Values that are not tensors pass through. Use as a context manager or with
    :func:`contextlib.closing`; an error of the source or of a copy is raised by ``next``
    where its batch would have come.
    """

    def __init__(self, batches: Iterable[Batch], device: Any, *, ahead: int = AHEAD,
                 pin: bool | None = None, threaded: bool | None = None):
        import torch

        self._closed = True  # until fully set up, so __del__ has nothing to do
        if ahead < 1:
            raise ConfigError(f"ahead={ahead}, but a device feed needs at least 1 batch ahead")
        device = torch.device(device)
        cuda = device.type == "cuda"
        self.device = _CudaCopies.resolve(device) if cuda else device
        self.wait_s = 0.0  # seconds next() waited for batches: the data plane's share
        self._source = iter(batches)
        self._thread: threading.Thread | None = None
        if cuda if threaded is None else threaded:
            copies = _CudaCopies(self.device) if cuda else _HostCopies()
            self._producer = _Producer(self._source, copies, cuda if pin is None else pin, ahead)
            self._thread = threading.Thread(target=self._producer.run, daemon=True,
                                            name="sparkddl-feed")
            self._thread.start()
        self._closed = False

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        start = time.perf_counter()
        try:
            if self._thread is None:
                return next(self._source)
            item = self._producer.out.get()
        finally:
            self.wait_s += time.perf_counter() - start
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item  # the same object, with the thread's traceback
        batch, event = item
        self._producer.copies.hand_over(batch, event)
        return batch

    def close(self) -> None:
        """Stop the thread and close the source; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()
            return
        self._producer.stop.set()
        self._producer.drain()  # a put blocked on a full queue returns and sees the stop
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("device feed thread still busy %g s after it was stopped (blocked "
                            "in the source?); leaving it behind, it ends with the process",
                            JOIN_TIMEOUT_S)
        self._producer.drain()  # the batch, if any, it put after the first drain

    def __enter__(self) -> DeviceFeed:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class _Producer:
    """The background thread's side. It holds no reference to its DeviceFeed, so a feed that
    is dropped without being closed is collected, and its ``__del__`` stops the thread."""

    def __init__(self, source: Iterator[Batch], copies: _HostCopies, pin: bool, ahead: int):
        self.source, self.copies, self.pin = source, copies, pin
        self.out: queue.Queue = queue.Queue(ahead)
        self.stop = threading.Event()
        # one slot per batch that may be queued, plus the one being staged: the copy that last
        # read a slot was issued ``ahead`` batches before, so waiting for it rarely blocks
        self.slots = [_Slot() for _ in range(ahead + 1)]

    def run(self) -> None:
        try:
            for n, batch in enumerate(self.source):
                self.out.put(self._transfer(batch, self.slots[n % len(self.slots)]))
                if self.stop.is_set():
                    return
            self.out.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self.out.put(exc)
        finally:
            self._close_source()

    def _transfer(self, batch: Batch, slot: _Slot) -> tuple[Batch, Any]:
        """``batch`` staged in ``slot`` and sent to the device; (device batch, its event)."""
        import torch

        self.copies.wait_host(slot.event)  # the copy that last read this slot is done
        staged = {k: slot.stage(k, v, self.pin) if isinstance(v, torch.Tensor) else v
                  for k, v in batch.items()}
        with self.copies.side():
            out = {k: self.copies.to_device(v) if isinstance(v, torch.Tensor) else v
                   for k, v in staged.items()}
            slot.event = self.copies.record()
        return out, slot.event

    def drain(self) -> None:
        while True:
            try:
                self.out.get_nowait()
            except queue.Empty:
                return

    def _close_source(self) -> None:
        close = getattr(self.source, "close", None)
        if close is None:
            return
        try:
            close()
        except Exception:  # the consumer has stopped or has its own error; keep that one
            log.warning("closing the batch source of a device feed failed", exc_info=True)


class _Slot:
    """One ring slot: a reused host buffer per key and the event of the copy that read them."""

    def __init__(self) -> None:
        self.buffers: dict[str, Any] = {}
        self.event: Any = None

    def stage(self, key: str, value: Any, pin: bool) -> Any:
        """``value`` copied into this slot's buffer for ``key``, grown if it is too small."""
        import torch

        buf = self.buffers.get(key)
        if buf is None or not _fits(buf, value):
            buf = self.buffers[key] = torch.empty(value.shape, dtype=value.dtype,
                                                  pin_memory=pin)
        view = buf[:len(value)] if value.dim() else buf
        view.copy_(value)
        return view


def _fits(buf: Any, value: Any) -> bool:
    """Whether ``value`` fits in the leading rows of ``buf`` (a smaller last batch does)."""
    return (buf.dtype == value.dtype and buf.dim() == value.dim()
            and buf.shape[1:] == value.shape[1:]
            and (value.dim() == 0 or buf.shape[0] >= value.shape[0]))


class _HostCopies:
    """Threaded mode on a CPU device: a copy stands in for the host-to-device copy (the
    staged view is reused by a later batch), and nothing needs streams or events."""

    def side(self) -> Any:
        return contextlib.nullcontext()

    def to_device(self, staged: Any) -> Any:
        return staged.clone()

    def record(self) -> Any:
        return None

    def wait_host(self, event: Any) -> None:
        pass

    def hand_over(self, batch: Batch, event: Any) -> None:
        pass


class _CudaCopies(_HostCopies):
    """Copies on a side stream of a CUDA device, ordered before the consumer's work by events."""

    def __init__(self, device: Any):
        import torch
        self.device = device
        self.stream = torch.cuda.Stream(device)

    @staticmethod
    def resolve(device: Any) -> Any:
        """``device`` with its index: a bare ``cuda`` means the caller's current device,
        which the feed's thread (whose current device is its own) would not see."""
        import torch
        if device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return device

    def side(self) -> Any:
        import torch
        return torch.cuda.stream(self.stream)

    def to_device(self, staged: Any) -> Any:
        return staged.to(self.device, non_blocking=True)

    def record(self) -> Any:
        import torch
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait_host(self, event: Any) -> None:
        if event is not None:
            event.synchronize()

    def hand_over(self, batch: Batch, event: Any) -> None:
        """Order the consumer's stream after the copies, without blocking the host, and tell
        the allocator the tensors (allocated on the side stream) are used on it."""
        import torch
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                value.record_stream(stream)
