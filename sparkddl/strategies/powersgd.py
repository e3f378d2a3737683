"""PowerSGD (Vogels et al., 2019): rank-r gradient compression by one step of power iteration.

Each matrix-shaped gradient M (n x m, trailing dimensions folded into m) is sent as
P = M Q (n x r) and Q = M^T P (m x r): two allreduces per bucket instead of one of n*m
values. Q is warm-started from the previous step; what the approximation misses is kept
as a residual (error feedback). Vectors, and matrices too small to gain, are averaged
exactly, in the same allreduce as the P factors.

Written for sparkddl's codec interface rather than torch's ``powerSGD_hook`` so that the
same code serves both the DDP hook and the no-overlap path, the bytes are counted where
they are sent, and the state is keyed by parameter (checkpointable, independent of DDP's
bucket layout).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkddl.strategies.comm import CommStats, tensor_bytes
from sparkddl.strategies.compression import ErrorFeedback, cpu_copies
from sparkddl.strategies.tensors import flatten

if TYPE_CHECKING:
    import torch
    from torch.futures import Future

Q_SEED = 20190527  # every rank must draw the same initial Q for P = sum_i M_i Q to hold


class PowerSGD(ErrorFeedback):
    def __init__(self, comm: CommStats, rank: int):
        super().__init__(comm)
        self.rank = rank
        self.q: dict[int, "torch.Tensor"] = {}

    def compressible(self, shape: "torch.Size") -> bool:
        """Worth sending as factors: a matrix whose factors are smaller than itself."""
        if len(shape) < 2:
            return False
        n, m = shape[0], shape.numel() // shape[0]
        return n * m > (n + m) * self.rank

    def exchange(self, flat: "torch.Tensor", keys: list[int],
                 shapes: list["torch.Size"]) -> "Future":
        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        self.add_residual(flat, keys, shapes)  # residuals exist for compressed matrices only
        parts = flat.split([s.numel() for s in shapes])
        low = [i for i, s in enumerate(shapes) if self.compressible(s)]
        exact = [parts[i] for i, s in enumerate(shapes) if not self.compressible(s)]
        matrices = [parts[i].view(shapes[i][0], -1) for i in low]
        ps = [m @ self._q(keys[i], m) for i, m in zip(low, matrices)]
        first = flatten(exact + ps)
        self.comm.add(tensor_bytes(first))
        dist.all_reduce(first)  # waited for here: Q = M^T P needs the summed P
        first.div_(world)
        pieces = first.split([t.numel() for t in exact + ps])
        for part, piece in zip(exact, pieces):
            part.copy_(piece)
        ps = [_orthonormal(piece.view_as(p)) for p, piece in zip(ps, pieces[len(exact):])]
        if not low:
            done = torch.futures.Future()
            done.set_result(flat)
            return done
        second = flatten([m.t() @ p for m, p in zip(matrices, ps)])
        self.comm.add(tensor_bytes(second))
        fut = dist.all_reduce(second, async_op=True).get_future()  # pyright: ignore[reportOptionalMemberAccess] - async_op: a Work

        def decode(_: Any) -> "torch.Tensor":
            qs = second.div_(world).split([m.shape[1] * self.rank for m in matrices])
            for i, m, p, q in zip(low, matrices, ps, qs):
                q = q.view(m.shape[1], self.rank)
                approx = p @ q.t()
                self.residual[keys[i]] = (m - approx).reshape(-1)
                m.copy_(approx)
                self.q[keys[i]] = q.clone()  # q is a view of this step's buffer
            return flat

        return fut.then(decode)

    def _q(self, key: int, matrix: "torch.Tensor") -> "torch.Tensor":
        import torch

        if key not in self.q:
            gen = torch.Generator().manual_seed(Q_SEED + key)
            self.q[key] = torch.randn(matrix.shape[1], self.rank, generator=gen)
        return self.q[key].to(device=matrix.device, dtype=matrix.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "q": cpu_copies(self.q)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.q = dict(state["q"])


def _orthonormal(p: "torch.Tensor") -> "torch.Tensor":
    """Orthonormal columns spanning ``p`` (QR in float32: no half-precision QR on CPU)."""
    import torch

    return torch.linalg.qr(p.float()).Q.to(p.dtype)
