"""Generative-model metrics on features: exact chunked P/R/D/C (raw by default), hubness diagnostics, ICDM and our
GICDM reconstruction (opt-in: `correction="gicdm_reconstructed"`).

`GICDM` (the torchmetrics Metric) is imported on first use, so the functional form and the CLI
(`python -m framework.metrics real.npy fake.npy`) do not pay for importing torchmetrics.
"""

from typing import Any

from framework.metrics.functional import CORRECTIONS, NEIGHBOURS, ReconstructionWarning, prdc
from framework.metrics.icdm import hubness, icdm

__all__ = ["CORRECTIONS", "GICDM", "NEIGHBOURS", "ReconstructionWarning", "hubness", "icdm", "prdc"]


def __getattr__(name: str) -> Any:
    if name == "GICDM":
        from framework.metrics.gicdm import GICDM

        return GICDM
    raise AttributeError(f"module 'framework.metrics' has no attribute {name!r}")
