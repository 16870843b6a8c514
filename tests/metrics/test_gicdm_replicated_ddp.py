"""GICDM under DDP with a reference set that every rank loads whole (issue 34): with `real_replicated=True` the reals
count once, so 2 gloo ranks, each with the same reals and its own generated shard, equal one process on (the reals
once, all generated features); without it the reals are concatenated once per rank (torchmetrics' `cat`), which
shrinks every k-NN radius, and a warning names the option; a rank holding other reals is refused."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

KEYS = ("precision", "recall", "density", "coverage", "real_k_occurrence_skewness")


def sets() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(200, 16, generator=g), torch.randn(160, 16, generator=g) * 1.2, torch.randn(80, 16, generator=g)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    from framework.metrics import GICDM

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        real, fake, other = sets()
        results: dict[str, object] = {}
        metric = GICDM(k=5, real_replicated=True, reset_real_features=False)
        metric.update(real, real=True)  # every rank loads the whole reference
        metric.update(fake.chunk(2)[rank], real=False)
        results["replicated"] = {k: float(v) for k, v in metric.compute().items() if k in KEYS}
        results["n_real"] = metric.info["n_real"]
        metric.reset()  # the reals stay; a second generator, sharded
        metric.update(other.chunk(2)[rank], real=False)
        results["after_reset"] = {k: float(v) for k, v in metric.compute().items() if k in KEYS}
        plain = GICDM(k=5)
        plain.update(real, real=True)
        plain.update(fake.chunk(2)[rank], real=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results["plain"] = {k: float(v) for k, v in plain.compute().items() if k in KEYS}
        results["plain_warning"] = [str(w.message) for w in caught if "real_replicated" in str(w.message)]
        wrong = GICDM(k=5, real_replicated=True)
        wrong.update(real[: 150 + 50 * rank], real=True)  # not a replicated set: rank 1 holds more
        wrong.update(fake, real=False)
        try:
            wrong.compute()
            results["refused"] = None
        except ValueError as error:
            results["refused"] = str(error)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_a_reference_every_rank_loads_counts_once_with_real_replicated():
    from framework.metrics import prdc

    real, fake, other = sets()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(str(Path(tmp) / "init"), tmp), nprocs=2, join=True, start_method="fork")
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    once, twice = prdc(real, fake, 5), prdc(torch.cat([real, real]), fake, 5)
    for rank, result in enumerate(ranks):
        assert result["n_real"] == 200
        assert result["replicated"] == pytest.approx({k: once[k] for k in KEYS}, abs=1e-6), rank
        assert result["after_reset"] == pytest.approx({k: prdc(real, other, 5)[k] for k in KEYS}, abs=1e-6), rank
        # without the option the reals are there twice: what one process computes on the doubled set
        assert result["plain"] == pytest.approx({k: twice[k] for k in KEYS}, abs=1e-6), rank
        assert result["plain"]["precision"] != pytest.approx(once["precision"], abs=1e-3)  # the radii shrank
        assert "real_replicated=True" in result["refused"] and "rank(s) [1]" in result["refused"]
    assert len(ranks[0]["plain_warning"]) == 1 and "same 200 real features" in ranks[0]["plain_warning"][0]
