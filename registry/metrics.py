"""Metrics (torchmetrics), and the evaluation harness that runs them as a recipe (data + module).

`hubness_sweep` and `metric_eval` are a DataModule and a LightningModule, registered here next to the metric they
exist for; they live in the DATA and MODULES groups (`data=hubness_sweep module=metric_eval`).
"""

from framework.data.hubness import HubnessSweep
from framework.metrics import GICDM
from framework.modules.metric_eval import MetricEval
from framework.registry import DATA, METRICS, MODULES

METRICS.register(
    GICDM, name="gicdm", k=5, correction="gicdm",
    description="Precision/recall/density/coverage with hubness correction (none | icdm | gicdm, reconstructed).",
)
DATA.register(
    HubnessSweep, name="hubness_sweep", n=2000, dims=[2, 16, 64, 256, 1024, 2048], seeds=3, seed=None,
    description="Hubness experiments as validation data: Gaussian dimension sweep, OOD fraction, digits + noise.",
)
MODULES.register(
    MetricEval, name="metric_eval", k=5, corrections=["none", "icdm", "gicdm"],
    description="Trains nothing; evaluates P/R/D/C raw and corrected on each validation configuration.",
)
