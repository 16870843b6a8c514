"""The project's training entry point (lightning-hydra-template's src/train.py, reduced): every part of the run
is a Hydra `_target_` config under configs/, so the framework's optimizer, selection callback and NaN guard are
added by overrides alone, e.g.

    python tests/template_project/train.py model.optimizer._target_=framework.optim.OLion \\
        +callbacks.selection._target_=framework.callbacks.selection.DataSelection \\
        +callbacks.selection.policy._target_=framework.samplers.InfoBatchPolicy

Writes `metrics.json` (the trainer's final callback metrics) to the run's output directory.
"""

import json
from pathlib import Path

import hydra
import lightning as L
import torch
from omegaconf import DictConfig


def instantiate_callbacks(cfg: DictConfig | None) -> list[L.Callback]:
    """One callback per config that has a `_target_` (the template's `instantiate_callbacks`)."""
    configs = (cfg or {}).values()
    return [hydra.utils.instantiate(cb) for cb in configs if isinstance(cb, DictConfig) and "_target_" in cb]


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
def main(cfg: DictConfig) -> dict[str, float]:
    torch.set_num_threads(1)
    L.seed_everything(cfg.seed, workers=True)
    datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data)
    model: L.LightningModule = hydra.utils.instantiate(cfg.model)
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=instantiate_callbacks(cfg.get("callbacks")))
    trainer.fit(model=model, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    Path(cfg.paths.output_dir, "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
    return metrics


if __name__ == "__main__":
    main()
