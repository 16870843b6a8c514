"""GICDM under DDP: 2 gloo ranks on CPU equal one process on the concatenated features,
including `reset_real_features=False`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: the corrected skewness exists only under a correction (absent under "none", in both the metric and prdc)
KEYS = ("precision", "recall", "density", "coverage", "real_k_occurrence_skewness",
        "real_k_occurrence_skewness_corrected")


def sets() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(300, 32, generator=g), torch.randn(240, 32, generator=g) * 1.1


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    import warnings

    from framework.metrics import GICDM, ReconstructionWarning

    warnings.simplefilter("ignore", ReconstructionWarning)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        real, fake = sets()
        results = {}
        for correction in ("none", "gicdm_reconstructed"):
            metric = GICDM(k=5, correction=correction, reset_real_features=False)
            metric.update(real.chunk(2)[rank], real=True)  # each rank sees half of each set
            metric.update(fake.chunk(2)[rank], real=False)
            results[correction] = {k: float(v) for k, v in metric.compute().items() if k in KEYS}
            metric.reset()  # the real features survive; a second generator is evaluated against them
            metric.update(fake[:120].chunk(2)[rank], real=False)
            results[correction + "_after_reset"] = {k: float(v) for k, v in metric.compute().items() if k in KEYS}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore::framework.metrics.ReconstructionWarning")
def test_two_gloo_ranks_equal_one_process_on_the_concatenated_features():
    from framework.metrics import GICDM, prdc  # noqa: F401  (imported before forking: the ranks inherit it)

    real, fake = sets()
    with tempfile.TemporaryDirectory() as tmp:
        # fork, not spawn: the ranks start in well under a second instead of re-importing torchmetrics
        mp.start_processes(_worker, args=(str(Path(tmp) / "init"), tmp), nprocs=2, join=True, start_method="fork")
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]
    for correction in ("none", "gicdm_reconstructed"):
        single = prdc(real, fake, 5, correction)
        assert ranks[0][correction] == pytest.approx({k: single[k] for k in KEYS if k in single}, abs=1e-6)
        again = prdc(real, fake[:120], 5, correction)
        assert ranks[0][correction + "_after_reset"] == pytest.approx({k: again[k] for k in KEYS if k in again},
                                                                      abs=1e-6)
        assert len(ranks[0][correction]) == (5 if correction == "none" else 6)
