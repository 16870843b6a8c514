"""Lightning callbacks (multi-select: `callbacks=[checkpoint,lr_monitor]`, `+callbacks=lr_monitor`)."""

from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint

from framework.callbacks.hub_push import HubPush
from framework.registry import CALLBACKS

CALLBACKS.register(
    ModelCheckpoint,
    name="checkpoint",
    dirpath="${hydra:runtime.output_dir}/checkpoints",
    filename="step{step:06d}",  # no '=' in the name, so `ckpt_path=...` needs no quoting on the command line
    auto_insert_metric_name=False,
    save_last=True,
    monitor="step",  # ranked by step: save_top_k keeps the newest N step checkpoints (-1 keeps them all)
    mode="max",
    save_top_k=3,
    every_n_train_steps=100,
    enable_version_counter=False,  # an in-place resume overwrites its own timeline's files: no last-v1.ckpt
)
CALLBACKS.register(LearningRateMonitor, name="lr_monitor", logging_interval="step")
CALLBACKS.register(EarlyStopping, name="early_stopping", monitor="val/loss", mode="min", patience=3)
CALLBACKS.register(HubPush, name="hub_push")  # `+callbacks=hub_push callbacks.hub_push.repo_id=me/model`

from framework.callbacks.mask_sweep import MaskSweep  # noqa: E402

CALLBACKS.register(MaskSweep, name="mask_sweep", ms=[0, 2, 4, 8, 16, 32, 48, 64], n_per_slot=200)

from framework.callbacks.growth import OrthogonalGrowth  # noqa: E402

CALLBACKS.register(
    OrthogonalGrowth, name="orthogonal_growth", at_step=100, depth_factor=2, width_factor=1,
    description="Grow depth (layer interposition) and/or MoE width (noisy expert copies) mid-training (2510.08008).",
)

from framework.callbacks.selection import DataSelection  # noqa: E402

CALLBACKS.register(
    DataSelection, name="data_selection",
    description="Dynamic data selection: runs the `sampler=` policy (framework.train adds it when one is chosen).",
)
