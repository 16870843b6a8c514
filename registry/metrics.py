"""Metrics (torchmetrics). The harness that evaluates them as a recipe is a DataModule and a LightningModule:
`hubness_sweep` is registered in `data.py`, `metric_eval` in `modules.py` (`data=hubness_sweep module=metric_eval`).
"""

from framework.metrics import GICDM
from framework.registry import METRICS

METRICS.register(
    GICDM, name="gicdm", k=5, correction="none",
    description="Precision/recall/density/coverage, exact and raw by default (= prdc); opt-in hubness corrections "
                "icdm | gicdm_reconstructed (ours, over-corrects: docs/gicdm.md).",
)
