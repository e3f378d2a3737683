"""The numeric kernels of the top-k and sign codecs (sparkddl.strategies.compression): top-k
selection through a sampled threshold, sign bits with their mean magnitude, bit packing, and
the decode of every rank's signs; on the CPU in cache-sized chunks through numpy, elsewhere
in torch."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SAMPLE = 16_384  # entries sampled to find a threshold just below the top k: for 1 %, about
# 330 of them lie above it, so the candidates' count is 2k within about 11 % (1 sigma)


def top_k_indices(x: "torch.Tensor", k: int,
                  above: "torch.Tensor | None" = None) -> "torch.Tensor":
    """The indices of the ``k`` entries of largest magnitude, as ``x.abs().topk`` finds
    them, but fast on large buckets: a threshold from a sample keeps about ``2k`` candidates
    and ``topk`` runs on those alone (every top-k entry is at or above a threshold that at
    least ``k`` entries reach); where the sample misjudges, the whole bucket is searched.
    86 ms -> 6 ms for 1 % of 4.7 M entries on one CPU thread. ``above``: a bool buffer
    shaped like ``x`` for the candidates' mask (else a fresh one)."""
    import torch

    n = x.numel()
    if n <= 4 * SAMPLE or k * 4 > n:
        return x.abs().topk(k, sorted=False).indices
    # one entry from each of SAMPLE equal strata: unbiased, and read front to back
    stride = n // SAMPLE
    generator = torch.Generator(device=x.device).manual_seed(n)
    picks = torch.randint(0, stride, (SAMPLE,), generator=generator, device=x.device)
    picks += torch.arange(0, SAMPLE * stride, stride, device=x.device)
    position = max(1, int(SAMPLE * (1 - 2 * k / n)))
    threshold = x.index_select(0, picks).abs_().kthvalue(position).values
    # a bucket of mostly zeros (unused embeddings, dead units) gives 0: then the nonzero
    # entries are the candidates, not the whole bucket
    sparse = bool(threshold == 0)
    if above is None:
        above = torch.empty(x.shape, dtype=torch.bool, device=x.device)
    if _numpy_can(x):  # numpy, in chunks: no bucket-sized magnitudes; and flatnonzero 2 ms
        import numpy as np  # where nonzero took 6
        compare = np.greater if sparse else np.greater_equal
        for part, mask, scratch in _chunks(x, above):
            compare(np.abs(part, out=scratch), threshold.item(), out=mask)
        candidates = torch.from_numpy(np.flatnonzero(above.numpy()))
    else:
        compare = torch.gt if sparse else torch.ge
        candidates = compare(x.abs(), threshold, out=above).nonzero().squeeze(1)
    if candidates.numel() < k:
        if sparse:  # fewer nonzero entries than k: all of them, and zeros to make up k
            zeros = above.logical_not().nonzero().squeeze(1)[:k - candidates.numel()]
            return torch.cat([candidates.to(zeros.device), zeros])
        return x.abs().topk(k, sorted=False).indices
    # index_select: 0.1 ms where indexing with [] took 0.3 for the same entries
    chosen = x.index_select(0, candidates).abs_().topk(k, sorted=False).indices
    return candidates.index_select(0, chosen)


def sign_and_mean_magnitude(x: "torch.Tensor", negative: "torch.Tensor") -> "torch.Tensor":
    """Fill the bool tensor ``negative`` with ``x``'s sign bits (-0.0 counts as negative,
    as in copysign) and return ``x``'s mean magnitude as a float32 scalar tensor on ``x``'s
    device (what is sent; summed in float32 whatever ``x``'s type: no fp16 overflow). On
    the CPU in one pass of chunks that stay in cache (numpy's signbit: 0.5 ms for 4.7 M
    entries where torch's took 2.6); elsewhere without a sync with the host."""
    import torch

    if not _numpy_can(x):
        torch.signbit(x, out=negative)
        return x.abs().sum(dtype=torch.float32).div_(x.numel())
    import numpy as np
    total = 0.0
    for part, mask, scratch in _chunks(x, negative):
        np.signbit(part, out=mask)
        total += float(np.abs(part, out=scratch).sum(dtype=np.float32))
    return torch.tensor(total / x.numel(), dtype=torch.float32)


def subtract_signed(x: "torch.Tensor", scale: "torch.Tensor") -> None:
    """``x -= copysign(scale, x)`` in place, with ``scale`` (a float32 scalar tensor) in
    ``x``'s type as the decode will have it (on the CPU chunk by chunk: no bucket-sized
    temporary)."""
    import torch

    if not _numpy_can(x):
        x.sub_(torch.copysign(scale.to(x.dtype), x))
        return
    import numpy as np
    signed = x.numpy().dtype.type(scale.item())
    for part, _, scratch in _chunks(x):
        np.subtract(part, np.copysign(signed, part, out=scratch), out=part)


CHUNK = 1 << 16  # entries per step of the CPU passes: 256 KiB of float32, within L2


def _chunks(x: "torch.Tensor", mask: "torch.Tensor | None" = None) -> Any:
    """``x`` (1-D, CPU) and ``mask`` as numpy arrays, CHUNK entries at a time, with a
    scratch array of the chunk's size for an intermediate. One pass over chunks does what
    whole-tensor operations would need a bucket-sized temporary and several passes through
    memory for: with two ranks on two cores, 6.8 ms against 8.3 for sign's encoding of
    4.7 M entries."""
    import numpy as np

    values = x.numpy()
    bits = mask.numpy() if mask is not None else None
    scratch = np.empty(min(CHUNK, len(values)), dtype=values.dtype)
    for i in range(0, len(values), CHUNK):
        part = values[i:i + CHUNK]
        yield part, bits[i:i + CHUNK] if bits is not None else None, scratch[:len(part)]


PAIR_TABLE_BYTES = 1 << 16  # packed bytes per rank from which pairs of ranks share a table


def signed_mean(packed: "torch.Tensor", scales: "torch.Tensor",
                out: "torch.Tensor") -> "torch.Tensor":
    """The mean over ranks of ``∓scale`` per entry (a set bit is negative), from each rank's
    packed bits, written into ``out`` (1-D, of the entries' count): one lookup per byte and
    pair of ranks, in a 65536 x 8 table of the pair's summed values, instead of unpacking
    every bit. Every replica adds the same values in the same order, so they agree bit for
    bit. 50 ms (every bit unpacked) -> 8 ms (a table per rank) -> about 3 ms for 4.7 M
    entries and 2 ranks on one CPU thread."""
    import torch

    world, n = len(packed), out.numel()
    bits = ((torch.arange(256, dtype=torch.uint8, device=packed.device).unsqueeze(-1)
             >> _shifts(packed.device)) & 1).bool()
    scales = scales.to(out.dtype) / world
    tables = [torch.where(bits, -s, s) for s in scales]  # 256 x 8 values per rank
    whole = n // 8  # bytes whose 8 entries are all in out; the last byte may be padding
    rows = out[:whole * 8].view(whole, 8)
    pairs = whole >= PAIR_TABLE_BYTES  # else building a pair's 2 MB table costs more
    for first in range(0, world, 2 if pairs else 1):
        if pairs and first + 1 < world:  # table[a * 256 + b] = rank first's a + next's b
            table = (tables[first].unsqueeze(1) + tables[first + 1].unsqueeze(0)).view(-1, 8)
            index = packed[first].int().mul_(256).add_(packed[first + 1])
        else:
            table, index = tables[first], packed[first].int()
        if first == 0:
            torch.index_select(table, 0, index[:whole], out=rows)
        else:
            rows.add_(table.index_select(0, index[:whole]))
        if whole * 8 < n:  # the last, partial byte
            tail = table[index[whole]][:n - whole * 8]
            out[whole * 8:] = tail if first == 0 else out[whole * 8:] + tail
    return out


def pack_bits(mask: "torch.Tensor") -> "torch.Tensor":
    """A 1-D bool tensor as uint8, eight entries per byte, first entry in the high bit.
    On the CPU numpy's packbits does it in one pass (4.7 M entries: 0.3 ms against 9.6 ms
    for the shifts and sums below, which CUDA tensors keep)."""
    import torch
    import torch.nn.functional as F

    if mask.device.type == "cpu":
        import numpy as np
        return torch.from_numpy(np.packbits(mask.contiguous().numpy()))

    bits = F.pad(mask.to(torch.uint8), (0, -mask.numel() % 8)).view(-1, 8)
    return (bits << _shifts(mask.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: "torch.Tensor", n: int) -> "torch.Tensor":
    """Inverse of :func:`pack_bits` along the last dimension, keeping the first ``n`` bits."""
    bits = (packed.unsqueeze(-1) >> _shifts(packed.device)) & 1
    return bits.flatten(-2)[..., :n].bool()


def _column_bytes(rows: "torch.Tensor", start: int, stop: int | None) -> "torch.Tensor":
    """Bytes ``start:stop`` of every row, as a new contiguous tensor, which another dtype
    may view: a slice of the gathered rows may not (its rows' stride, or with one rank its
    offset, need not be a multiple of that dtype's size)."""
    import torch

    return rows[:, start:stop].clone(memory_format=torch.contiguous_format)


def _numpy_can(t: "torch.Tensor") -> bool:
    """Whether numpy can work on ``t`` in place: a CPU tensor of a type numpy has (not
    bfloat16)."""
    import torch

    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64, torch.float16)


def _shifts(device: "torch.device") -> "torch.Tensor":
    import torch

    return torch.arange(7, -1, -1, dtype=torch.uint8, device=device)
