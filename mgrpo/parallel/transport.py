"""Named tensors between rank 0 and the other ranks of a role's group, in buckets: a bucket's tensors
(in name order, up to `bucket_mb` of them) are packed into one flat buffer and sent point to point.
One message per bucket instead of one collective per tensor: gloo's fixed cost per call dominated
the megatron backend's weight sync (0.15–0.32 of a raw broadcast's bandwidth with a gather per
tensor), and its `gather` was half as fast as sends (`bench/ranks_bench.py`).

Every rank must call `gather` or `scatter` with the same dtype; a rank's names and shapes are its
`layout_of(rank)` (one layout for all when not given: tensor-parallel shards; pipeline stages hold
different layers, so rank 0 is told each rank's). `all_reduce_in_buckets` sums tensors over a group
the same way, a bucket per call (the megatron backend's data-parallel gradients)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist


def buckets(layout: Mapping[str, torch.Size], itemsize: int, bucket_mb: float) -> list[list[str]]:
    """The names of `layout` in sorted order, cut into groups of at least `bucket_mb` MB (the last one
    smaller); every name is in exactly one group."""
    out: list[list[str]] = [[]]
    size = 0
    for name in sorted(layout):
        if size >= bucket_mb * 1e6:
            out.append([])
            size = 0
        out[-1].append(name)
        size += layout[name].numel() * itemsize
    return [b for b in out if b]


def _unpack(buf: torch.Tensor, names: list[str], layout: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for name in names:
        n = layout[name].numel()
        out[name] = buf[at : at + n].view(layout[name])
        at += n
    return out


def _pack(buf: torch.Tensor, tensors: Mapping[str, torch.Tensor], names: list[str]) -> None:
    at = 0
    for name in names:
        t = tensors[name].detach().reshape(-1)
        buf[at : at + t.numel()] = t
        at += t.numel()


class Transport:
    """Bucketed moves for one group (`dist` initialised); keeps `gather`'s receive buffers between
    calls (no page faults on every weight sync)."""

    def __init__(
        self, bucket_mb: float = 256.0, layout_of: Callable[[int], Mapping[str, torch.Size]] | None = None
    ) -> None:
        """`layout_of(r)`: rank r's names and shapes, asked on rank 0 only; None: every rank's are the
        caller's own."""
        self.bucket_mb = bucket_mb
        self.layout_of = layout_of
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}

    def _layout(self, r: int, own: Mapping[str, torch.Size]) -> Mapping[str, torch.Size]:
        return self.layout_of(r) if self.layout_of is not None else own

    def _kept(self, key: tuple[int, int], like: torch.Tensor, numel: int) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.numel() != numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._buffers[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf

    def gather(
        self,
        local: Mapping[str, torch.Tensor],
        put: Callable[[int, dict[str, torch.Tensor]], None],
        layout_of: Callable[[int], Mapping[str, torch.Size]] | None = None,
    ) -> None:
        """Every rank: its tensors. On rank 0, `put(r, part)` is called with every rank's tensors: its
        own first, whole, while the others' arrive (its copies overlap the transfer), then each other
        rank's bucket by bucket, as views of buffers the next `gather` overwrites. `layout_of`: each
        rank's names and shapes here, when not the transport's."""
        layout = {name: t.shape for name, t in local.items()}
        like = next(iter(local.values()))
        groups = buckets(layout, like.element_size(), self.bucket_mb)
        sizes = [sum(layout[n].numel() for n in names) for names in groups]
        if self.rank > 0:  # pack the next bucket while the last one is on its way
            reqs = []
            for i, (names, numel) in enumerate(zip(groups, sizes, strict=True)):
                buf = self._kept((i, self.rank), like, numel)
                _pack(buf, local, names)
                reqs.append(dist.isend(buf, dst=0))
            for req in reqs:
                if req is not None:
                    req.wait()
            return
        theirs = {r: layout_of(r) if layout_of else self._layout(r, layout) for r in range(1, self.world)}
        cuts = {r: buckets(theirs[r], like.element_size(), self.bucket_mb) for r in theirs}
        pending = [  # bucket by bucket, each rank's i-th in turn: the order they arrive in
            (r, names, buf, dist.irecv(buf, src=r))
            for i in range(max((len(c) for c in cuts.values()), default=0))
            for r, c in cuts.items()
            if i < len(c)
            for names in [c[i]]
            for buf in [self._kept((i, r), like, sum(theirs[r][n].numel() for n in names))]
        ]
        put(0, dict(local))
        for r, names, buf, req in pending:
            if req is not None:
                req.wait()
            put(r, _unpack(buf, names, theirs[r]))

    def scatter(
        self,
        shard_of: Callable[[int], Mapping[str, torch.Tensor]] | None,
        layout: Mapping[str, torch.Size],
        like: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """Every rank: the names and shapes of its share (`layout`) and a tensor of the dtype and
        device to receive in (`like`). Rank 0 passes `shard_of(r)`, rank r's tensors,
        asked one rank at a time so rank 0 never holds more than one other rank's share. Every rank
        gets its own share, in fresh memory."""
        if self.rank > 0:
            out: dict[str, torch.Tensor] = {}
            for names in buckets(layout, like.element_size(), self.bucket_mb):
                buf = torch.empty(sum(layout[n].numel() for n in names), dtype=like.dtype, device=like.device)
                dist.recv(buf, src=0)
                out |= _unpack(buf, names, layout)
            return out
        assert shard_of is not None, "rank 0 must pass every rank's share"
        for r in range(1, self.world):
            shard, theirs = shard_of(r), self._layout(r, layout)
            if {n: t.shape for n, t in shard.items()} != dict(theirs):
                raise ValueError(f"rank {r}'s share does not have the layout rank {r} expects")
            for names in buckets(theirs, like.element_size(), self.bucket_mb):
                buf = torch.empty(sum(theirs[n].numel() for n in names), dtype=like.dtype, device=like.device)
                _pack(buf, shard, names)
                dist.send(buf, dst=r)
        return {n: t.detach().to(like.device, like.dtype).clone() for n, t in shard_of(0).items()}


def all_reduce_in_buckets(
    tensors: list[torch.Tensor], group: dist.ProcessGroup, bucket_mb: float = 64.0
) -> None:
    """Sum each tensor over `group` in place, one all-reduce per bucket of up to `bucket_mb` MB of one
    dtype (flattened, reduced, copied back), not one per tensor."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for same in by_dtype.values():
        named = {f"{i:08d}": t for i, t in enumerate(same)}  # names that sort in the tensors' order
        layout = {n: t.shape for n, t in named.items()}
        for names in buckets(layout, same[0].element_size(), bucket_mb):
            flat = same[0].new_empty(sum(layout[n].numel() for n in names))
            _pack(flat, named, names)
            dist.all_reduce(flat, group=group)
            for n, summed in _unpack(flat, names, layout).items():
                named[n].copy_(summed)
