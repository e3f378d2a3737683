"""Checkpoints in the Store: atomic, checksummed, the last k kept, loaded without running code.

File format: one line ``SPARKDDL-CHECKPOINT 1 <sha256 hex> <payload bytes>\\n`` followed by
the payload (``torch.save`` of a dict of tensors and plain values). The file is written in
one atomic step (temp + rename, or one PUT on object stores); a truncated or corrupted file
fails its checksum and is skipped, with a warning, in favour of the previous good one.
"""
from __future__ import annotations

import hashlib
import io
import logging
import re
from dataclasses import dataclass
from typing import Any, Iterator

from sparkddl.checkpoint.safe import load_plain
from sparkddl.errors import CheckpointError, StaleAttemptError, StoreError
from sparkddl.store import Store

log = logging.getLogger(__name__)

MAGIC = b"SPARKDDL-CHECKPOINT"
VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{5})-(\d{8})\.pt$")


@dataclass(frozen=True)
class CheckpointRef:
    url: str
    epoch: int  # epochs completed when it was written
    step: int  # steps completed within the next epoch (0 at epoch boundaries)


def checkpoint_dir(store: Store, run_id: str) -> str:
    return store.run_url(run_id, "checkpoints")


def encode(payload: dict[str, Any]) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(payload, buf)
    body = buf.getvalue()
    head = b"%s %d %s %d\n" % (MAGIC, VERSION, hashlib.sha256(body).hexdigest().encode(),
                                len(body))
    return head + body


def decode(data: bytes, where: str) -> dict[str, Any]:
    """Verify and load; CheckpointError says what is wrong with the file."""
    return load_plain(verify(data, where), where, map_location="cpu")


def verify(data: bytes, where: str) -> bytes:
    """The payload, if the header, length and checksum are right."""
    head, sep, body = data.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 4 or parts[0] != MAGIC or not parts[1].isdigit() or \
            not parts[3].isdigit():
        raise CheckpointError(f"{where} is not a sparkddl checkpoint (bad header)")
    if int(parts[1]) != VERSION:
        raise CheckpointError(f"{where} has format version {int(parts[1])}, expected {VERSION}")
    if len(body) != int(parts[3]):
        raise CheckpointError(f"{where} is truncated: {len(body)} of {int(parts[3])} bytes")
    if hashlib.sha256(body).hexdigest().encode() != parts[2]:
        raise CheckpointError(f"{where} is corrupted: its checksum does not match")
    return body


def save(store: Store, run_id: str, epoch: int, step: int, payload: dict[str, Any],
         keep: int, fence: str | None = None, protect: str | None = None) -> CheckpointRef:
    """Write a checkpoint atomically, then delete all but the newest ``keep``, never
    ``protect`` (the checkpoint the attempt resumed from). With ``fence`` (the writer's
    attempt token), an attempt that is no longer the run's current one writes and deletes
    nothing: StaleAttemptError."""
    url = f"{checkpoint_dir(store, run_id)}/ckpt-{epoch:05d}-{step:08d}.pt"
    check_fence(store, run_id, fence)
    try:
        store.write_bytes(url, encode(payload))  # all or nothing: temp + rename
    except StoreError as exc:
        raise StoreError(f"the checkpoint at epoch {epoch}, step {step} of run {run_id} was "
                         f"not written (nothing of it is left): {exc}. The checkpoints written "
                         "before it are intact; once the store can be written again, a fit "
                         f"with runId={run_id!r} resumes from the newest") from exc
    check_fence(store, run_id, fence)  # a relaunch may have begun while this one wrote
    for old in listing(store, run_id)[:-keep] if keep > 0 else []:
        if old.url != protect:
            store.delete(old.url)
    return CheckpointRef(url, epoch, step)


# ---- attempts: only the current one writes ----

def _fence_url(store: Store, run_id: str) -> str:
    return store.run_url(run_id, "attempt")


def set_fence(store: Store, run_id: str, token: str) -> None:
    """Make ``token`` the run's current attempt; the driver calls it before each launch,
    once the previous attempt's ranks have ended."""
    store.write_bytes(_fence_url(store, run_id), token.encode())


def check_fence(store: Store, run_id: str, token: str | None) -> None:
    """StaleAttemptError if the run's current attempt is not ``token`` (None: unfenced)."""
    if token is None:
        return
    url = _fence_url(store, run_id)
    current = store.read_bytes(url).decode() if store.exists(url) else token
    if current != token:
        raise StaleAttemptError(
            f"attempt {token} of run {run_id} is no longer current (the driver launched "
            f"{current}); it writes no checkpoint (this rank belongs to a cancelled or "
            "failed attempt that was still running)")


def listing(store: Store, run_id: str) -> list[CheckpointRef]:
    """Checkpoints of a run, oldest first."""
    base = checkpoint_dir(store, run_id)
    refs = []
    for name in store.listdir(base):
        m = _NAME.match(name)
        if m:
            refs.append(CheckpointRef(f"{base}/{name}", int(m.group(1)), int(m.group(2))))
    return sorted(refs, key=lambda r: (r.epoch, r.step))


def latest_good(store: Store, run_id: str, epoch_end: bool = False) -> CheckpointRef | None:
    """The newest checkpoint that passes its checksum (with ``epoch_end``, among those
    written at an epoch's end), warning about each one skipped."""
    for ref, body, why in _newest_first(store, run_id, epoch_end):
        if body is not None:
            return ref
        log.warning("skipping checkpoint %s; trying the previous one", why)
    return None


def _newest_first(store: Store, run_id: str, epoch_end: bool = False
                  ) -> Iterator[tuple[CheckpointRef, bytes | None, str]]:
    """Each checkpoint, newest first, with its payload if it passes its checksum, else
    None and what is wrong with it (naming it)."""
    for ref in reversed(listing(store, run_id)):
        if epoch_end and ref.step:
            continue
        try:
            yield ref, verify(store.read_bytes(ref.url), ref.url), ""
        except CheckpointError as exc:
            yield ref, None, str(exc)
        except OSError as exc:
            yield ref, None, f"{ref.url} cannot be read ({type(exc).__name__}: {exc})"


def check_resumable(store: Store, run_id: str) -> CheckpointRef | None:
    """Before a fit resumes ``run_id`` (its ``runId``): the checkpoint it will resume from,
    loaded here once so that a tampered one stops the fit before anything runs; None if the
    run wrote none (it starts at epoch 1). CheckpointError when it wrote some and none is
    usable: the resume would silently train from the start."""
    skipped = []
    for ref, body, why in _newest_first(store, run_id):
        if body is not None:
            _tensors_only(body, ref.url, run_id, "the previous checkpoint")
            load_driver_state(store, run_id, ref.epoch)
            return ref
        skipped.append(f"  {why}")
    if not skipped:
        return None
    raise CheckpointError(
        f"run {run_id} cannot be resumed: none of its {len(skipped)} checkpoint(s) is "
        "usable, so the fit would train from epoch 1:\n" + "\n".join(skipped) +
        f"\nDelete them (the folder {checkpoint_dir(store, run_id)}) to train run {run_id} "
        "from the start, or leave runId unset (or choose a new one) for a new run")


# ---- the driver's side of a checkpoint: history, best snapshot, early-stopping count ----

def driver_state_url(store: Store, run_id: str, epoch: int) -> str:
    return f"{checkpoint_dir(store, run_id)}/driver-{epoch:05d}.pt"


def save_driver_state(store: Store, run_id: str, epoch: int, state: dict[str, Any]) -> None:
    """What the driver knew when the ranks' checkpoint after ``epoch`` epochs was written, so a
    resumed run (even by a restarted driver) continues with the same history and best."""
    store.write_bytes(driver_state_url(store, run_id, epoch), encode(state))
    kept = {ref.epoch for ref in listing(store, run_id)}
    for name in store.listdir(checkpoint_dir(store, run_id)):
        m = re.match(r"^driver-(\d{5})\.pt$", name)
        if m and int(m.group(1)) not in kept and int(m.group(1)) != epoch:
            store.delete(f"{checkpoint_dir(store, run_id)}/{name}")


def load_driver_state(store: Store, run_id: str, epoch: int) -> dict[str, Any] | None:
    """What :func:`save_driver_state` wrote after ``epoch`` epochs; None (with a warning) if
    it is missing or damaged: the fit goes on without the history before it. A file that
    passes its checksum yet holds more than tensors and plain values was not written by
    sparkddl as it is: CheckpointError, the resume stops."""
    url = driver_state_url(store, run_id, epoch)
    if not store.exists(url):
        return None
    try:
        body = verify(store.read_bytes(url), url)
    except (CheckpointError, OSError) as exc:
        log.warning("ignoring the driver state %s: %s; the history and best snapshot before "
                    "epoch %d are not restored", url, exc, epoch + 1)
        return None
    return _tensors_only(body, url, run_id, f"no history of its first {epoch} epoch(s)")


def _tensors_only(body: bytes, url: str, run_id: str, without_it: str) -> dict[str, Any]:
    """The payload of a file that passed its checksum; CheckpointError if it holds more than
    tensors and plain values: it was changed since sparkddl wrote it, and is not resumed
    from (``without_it``: what a resume without the file starts from)."""
    try:
        return load_plain(body, url, map_location="cpu")
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}. Run {run_id} is not resumed from it: delete it (the "
                              f"resume then starts with {without_it}) or start a new run "
                              "(leave runId unset)") from None
