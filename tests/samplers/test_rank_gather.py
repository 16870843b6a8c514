"""`RankGather` (issue 34): a step's per-sample fields cross 2 gloo ranks in one collective, each in its own dtype and
bitwise (the bytes travel, not float64 copies), in rank order."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from framework.samplers.step import RankGather

ROWS = 5


def local_fields(rank: int) -> dict[str, torch.Tensor]:
    """What one rank's step reports, in the dtypes a bf16-mixed fit has; a NaN, a -0.0 and a subnormal included."""
    g = torch.Generator().manual_seed(rank)
    losses = torch.randn(ROWS, generator=g)
    losses[:3] = torch.tensor([float("nan"), -0.0, 1e-40])
    return {"index": torch.arange(ROWS) + ROWS * rank, "losses": losses,
            "logits": torch.randn(ROWS, 3, generator=g).bfloat16(),
            "features": torch.randn(ROWS, 4, generator=g).half(),
            "targets": torch.randint(0, 3, (ROWS,), generator=g, dtype=torch.int32),
            "kept": torch.rand(ROWS, generator=g) > 0.5}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        sent: list[torch.Tensor] = []

        def all_gather(t: torch.Tensor) -> torch.Tensor:
            sent.append(t)
            parts = [torch.empty_like(t) for _ in range(2)]
            dist.all_gather(parts, t)
            return torch.stack(parts)

        got = RankGather(all_gather, rank, 2)(local_fields(rank))
        shapes = [(str(t.dtype), tuple(t.shape)) for t in sent]
        torch.save({"got": got, "sent": shapes}, Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_fields_cross_ranks_in_their_own_dtype_bitwise_in_one_collective():
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(str(Path(tmp) / "init"), tmp), nprocs=2, join=True, start_method="fork")
        ranks = [torch.load(Path(tmp, f"rank{r}.pt"), weights_only=True) for r in range(2)]
    expected = {k: torch.cat([local_fields(0)[k], local_fields(1)[k]]) for k in local_fields(0)}
    for result in ranks:
        assert set(result["got"]) == set(expected)
        for key, value in expected.items():
            got = result["got"][key]
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert torch.equal(bits(got), bits(value)), key  # NaN, -0.0 and the subnormal included
        # one collective; a row is 8 + 4 + 3·2 + 4·2 + 4 + 1 = 31 bytes (as float64: 11 values · 8 = 88 bytes)
        assert result["sent"] == [("torch.uint8", (ROWS, 31))]


def test_one_rank_is_the_identity():
    fields = local_fields(0)
    got = RankGather()(fields)
    assert all(got[k] is fields[k] for k in fields)
