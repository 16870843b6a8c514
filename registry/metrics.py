"""Metrics (torchmetrics), and the evaluation harness that runs them as a recipe (data + module).

`hubness_sweep` and `metric_eval` are a DataModule and a LightningModule, registered here next to the metric they
exist for; they live in the DATA and MODULES groups (`data=hubness_sweep module=metric_eval`).
"""

from framework.data.hubness import HubnessSweep
from framework.metrics import GICDM
from framework.modules.metric_eval import MetricEval
from framework.registry import DATA, METRICS, MODULES

METRICS.register(
    GICDM, name="gicdm", k=5, correction="none",
    description="Precision/recall/density/coverage, exact and raw by default (= prdc); opt-in hubness corrections "
                "icdm | gicdm_reconstructed (ours, over-corrects: docs/gicdm.md).",
)
DATA.register(
    HubnessSweep, name="hubness_sweep", n=2000, dims=[2, 16, 64, 256, 1024, 2048], seeds=3, seed=None,
    description="Hubness experiments as validation data: Gaussian dimension sweep, OOD fraction, digits + noise.",
)
MODULES.register(
    MetricEval, name="metric_eval", k=5, corrections=["none", "icdm", "gicdm_reconstructed"],
    description="Trains nothing; evaluates P/R/D/C raw and with each correction listed on each validation "
                "configuration (the comparison gicdm_eval exists for).",
)
