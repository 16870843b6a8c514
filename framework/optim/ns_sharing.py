"""Sharing OLion's Newton–Schulz work across ranks (DDP) and gathering sharded matrices (FSDP2 / DTensor).

The unit of work is a run of at most `ns_batch` same-shape matrices (one batched NS call); which units exist depends
only on the parameters and `ns_batch`, never on the world size, so a rank computes a unit's result exactly as a
single process would. Each unit gets an owner rank by greedy longest-processing-time on its NS cost (`ns_cost`);
owners broadcast their results, one flat buffer per owner and wire dtype (the sign step's ±1/0 travel as int8).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

try:  # builds without torch.distributed have no DTensor
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover
    DTensor = Replicate = Shard = None

DISTRIBUTED_MODES = ("round_robin", "redundant")


def ns_cost(shape: Sequence[int], gram: bool = False) -> int:
    """Newton–Schulz multiply-adds of one (m, n) matrix per 5 steps, up to a constant: s²·(10·l + 5·s) in the
    standard form, s²·(4·l + 14·s) in the Gram form (`gram_newton_schulz5`, one restart), s/l the short/long side.
    A 3-D shape is a stack of MoE experts (E, out, in): E matrices."""
    if len(shape) == 3:
        return shape[0] * ns_cost(shape[1:], gram)
    m, n = shape[0], math.prod(shape[1:])
    s, long = min(m, n), max(m, n)
    return s * s * (4 * long + 14 * s if gram else 10 * long + 5 * s)


def assign_owners(costs: Sequence[int], world: int) -> list[int]:
    """Greedy longest-processing-time: the costliest unit first, each to the least-loaded rank (ties: lowest)."""
    load, owners = [0] * world, [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owners[i] = r
        load[r] += costs[i]
    return owners


def make_units(keys: Sequence[Hashable], batch: Sequence[int]) -> list[list[int]]:
    """Indices with equal keys, in order of first appearance, cut into runs of at most batch[i] each."""
    open_runs: dict[Hashable, list[int]] = {}
    units: list[list[int]] = []
    for i, key in enumerate(keys):
        run = open_runs.get(key)
        if run is None or len(run) >= batch[i]:
            run = []
            open_runs[key] = run
            units.append(run)
        run.append(i)
    return units


def is_dtensor(p: Tensor) -> bool:
    return DTensor is not None and isinstance(p, DTensor)


def check_dtensor_layout(label: str, p: Tensor) -> None:
    """NotImplementedError unless `p` is sharded (Shard(d)) or replicated on a 1-D device mesh (FSDP2's layout)."""
    if not is_dtensor(p):
        return
    placements = tuple(p.placements)
    if p.device_mesh.ndim != 1 or not isinstance(placements[0], (Shard, Replicate)):
        raise NotImplementedError(
            f"OLion got {label} as a DTensor on a {p.device_mesh.ndim}-D mesh with placements {placements}; "
            "valid: a 1-D mesh with Shard(dim) or Replicate() (FSDP2's fully_shard). Route it to AdamW with "
            "the predicate otherwise."
        )


def process_group(params: Sequence[Tensor]) -> tuple[Any, int, int]:
    """(group, rank in it, its size): the DTensors' 1-D mesh group, else the default group, else (None, 0, 1)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, 0, 1
    meshes = {p.device_mesh for p in params if is_dtensor(p)}
    if len(meshes) > 1:
        raise NotImplementedError(f"OLion's matrices live on {len(meshes)} device meshes; valid: one mesh")
    group = meshes.pop().get_group(0) if meshes else dist.group.WORLD
    return group, dist.get_rank(group), dist.get_world_size(group)


def _shard_sizes(size: int, world: int) -> list[int]:
    """Per-rank lengths of torch.chunk(size, world) padded with empty chunks: DTensor's Shard(d) layout."""
    step = -(-size // world) if size else 0
    return [max(0, min(step, size - r * step)) for r in range(world)]


def shard_of(full: Tensor, p: Tensor, rank: int, world: int) -> Tensor:
    """This rank's part of `full` (shaped like the global `p`) under p's placement."""
    if not is_dtensor(p) or isinstance(p.placements[0], Replicate):
        return full
    dim = p.placements[0].dim
    sizes = _shard_sizes(full.shape[dim], world)
    return full.narrow(dim, sum(sizes[:rank]), sizes[rank])


def gather_full(
    locals_: Sequence[Tensor], params: Sequence[Tensor], group: Any, world: int, dst: Sequence[int] | None = None
) -> list[Tensor]:
    """Whole matrices from the ranks' local shards of DTensor `params`: matrix i on rank dst[i] only (one gather
    per owner and dtype), or on every rank when `dst` is None (one all-gather per dtype). Elsewhere the local
    shard is returned unchanged."""
    rank = dist.get_rank(group)
    out: list[Tensor] = list(locals_)
    buckets: dict[tuple[int | None, torch.dtype], list[int]] = {}
    for i, (loc, p) in enumerate(zip(locals_, params, strict=True)):
        if is_dtensor(p) and isinstance(p.placements[0], Shard):
            buckets.setdefault((None if dst is None else dst[i], loc.dtype), []).append(i)
    for (owner, dtype), idxs in sorted(buckets.items(), key=lambda kv: (-1 if kv[0][0] is None else kv[0][0],
                                                                        str(kv[0][1]))):
        # lengths[r][j]: numel of rank r's shard of matrix idxs[j]
        lengths = [[_shard_sizes(params[i].shape[_dim(params[i])], world)[r] * _row_numel(params[i]) for i in idxs]
                   for r in range(world)]
        width = max(sum(row) for row in lengths)
        flat = torch.zeros(width, dtype=dtype, device=locals_[idxs[0]].device)
        if sum(lengths[rank]):
            flat[: sum(lengths[rank])] = torch.cat([locals_[i].reshape(-1) for i in idxs])
        if owner is None:
            bufs = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(bufs, flat, group=group)
        else:
            bufs = [torch.empty_like(flat) for _ in range(world)] if owner == rank else None
            dist.gather(flat, gather_list=bufs, dst=dist.get_global_rank(group, owner), group=group)
            if owner != rank:
                continue
        for j, i in enumerate(idxs):
            p, dim = params[i], _dim(params[i])
            pieces = []
            for r in range(world):
                start = sum(lengths[r][:j])
                shape = list(p.shape)
                shape[dim] = _shard_sizes(p.shape[dim], world)[r]
                pieces.append(bufs[r][start : start + lengths[r][j]].view(shape))
            out[i] = torch.cat(pieces, dim=dim)
    return out


def _dim(p: Tensor) -> int:
    return p.placements[0].dim


def _row_numel(p: Tensor) -> int:
    """Elements per index of the sharded dim."""
    size = p.shape[_dim(p)]
    return p.numel() // size if size else 0


def broadcast_results(
    units: Sequence[Sequence[int]],
    owners: Sequence[int],
    results: list[Tensor | None],
    shapes: Sequence[torch.Size],
    wire: Sequence[torch.dtype],
    device: torch.device,
    group: Any,
    rank: int,
    world: int,
    ws: Callable[[str, tuple[int, ...], torch.dtype], Tensor] | None = None,
) -> None:
    """Fill `results` on every rank: each owner broadcasts its units' results, one flat buffer per wire dtype
    (taken from `ws`, a `Workspace`, when given: the received results are views into it until its next use)."""
    for r in range(world):
        by_dtype: dict[torch.dtype, list[int]] = {}
        for unit, owner in zip(units, owners, strict=True):
            if owner == r:
                for i in unit:
                    by_dtype.setdefault(wire[i], []).append(i)
        for dtype in sorted(by_dtype, key=str):
            idxs = by_dtype[dtype]
            sizes = [math.prod(shapes[i]) for i in idxs]
            out = None if ws is None else ws(f"wire{r}", (sum(sizes),), dtype)
            if r == rank:
                buf = torch.cat([results[i].reshape(-1).to(dtype) for i in idxs], out=out)  # type: ignore[union-attr]
            else:
                buf = torch.empty(sum(sizes), dtype=dtype, device=device) if out is None else out
            dist.broadcast(buf, src=dist.get_global_rank(group, r), group=group)
            if r != rank:
                for i, piece in zip(idxs, buf.split(sizes), strict=True):
                    results[i] = piece.view(shapes[i])
