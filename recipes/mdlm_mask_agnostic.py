from framework.recipe import recipe

# Spec 1.4: a 3-layer bidirectional MDLM learns the needle task; from step `extra_loss_after` on, the
# mask-agnostic loss (few-mask view k1=2, the smallest in-distribution tail; many-mask view k2 ≤ 16) is added.
# `init_from=RUN_DIR_OR_REPO` with `module.extra_loss_after=0` fine-tunes an already pretrained model instead.
NEEDLE_MDLM = dict(
    defaults={"data": "needle", "model": "transformer_lm", "module": "mdlm", "optimizer": "adamw",
              "callbacks": ["checkpoint", "mask_sweep"]},
    data={"batch_size": 64, "n_train": 20000},
    model={"dim": 64, "depth": 3, "heads": 4, "causal": False, "max_seq_len": 128},
    module={"sft_fraction": 0.5, "extra_loss_after": 3000},
    optimizer={"lr": 2e-3, "weight_decay": 0.0},
    scheduler={"warmup_steps": 200, "min_lr_ratio": 0.1},
    trainer={"max_steps": 3200, "val_check_interval": 1000, "check_val_every_n_epoch": None, "limit_val_batches": 8},
)

recipe(
    "mdlm_mask_agnostic",
    description="Needle-retrieval MDLM, then fine-tuned with the mask-agnostic loss; accuracy vs appended masks.",
    **{**NEEDLE_MDLM, "defaults": {**NEEDLE_MDLM["defaults"], "loss": "mask_agnostic"}},
    loss={"k1": 2, "k_max": 16},
)

recipe(
    "mdlm_baseline",
    description="The same MDLM and compute without the mask-agnostic loss (the 'no fine-tuning' arm).",
    **NEEDLE_MDLM,
)
