from framework.recipe import recipe

# A 3-layer bidirectional MDLM learns the needle task on rows with its designed EOS tails (up to 32), so
# every evaluation with m ≤ 32 appended masks is inside the training lengths (rows ≤ 53 tokens); from step
# `extra_loss_after` on, the mask-agnostic loss (few-mask view k1=2; many-mask view k2 ≤ 16) is added.
# `model.init=torch` (PyTorch's width-scaled defaults) is what makes d = 64 learn: under GPT-2's N(0, 0.02) init the
# same recipe stayed at chance (issue 17; docs/mdlm.md). Clean prompts on every row and LLaDA's response-length
# normalisation are kept from the earlier recipe. max_seq_len 160 fits the mask sweep up to m = 128.
# `init_from=RUN_DIR_OR_REPO` with `module.extra_loss_after=0` fine-tunes an already pretrained model instead.
recipe(
    "mdlm_baseline",
    description="The same MDLM and compute without the mask-agnostic loss (the 'no fine-tuning' arm).",
    defaults={"data": "needle", "model": "transformer_lm", "module": "mdlm", "optimizer": "adamw",
              "callbacks": ["checkpoint", "mask_sweep"]},
    data={"batch_size": 64, "n_train": 20000, "max_eos": 32},
    model={"dim": 64, "depth": 3, "heads": 4, "causal": False, "max_seq_len": 160, "init": "torch"},
    module={"sft_fraction": 1.0, "reduction": "response", "extra_loss_after": 2000},
    optimizer={"lr": 2e-3, "weight_decay": 0.0},
    scheduler={"warmup_steps": 200, "min_lr_ratio": 0.1},
    trainer={"max_steps": 2200, "val_check_interval": 1000, "check_val_every_n_epoch": None, "limit_val_batches": 8},
)

recipe(
    "mdlm_mask_agnostic",
    description="Needle-retrieval MDLM, then fine-tuned with the mask-agnostic loss; accuracy vs appended masks.",
    base="mdlm_baseline",
    defaults={"loss": "mask_agnostic"},
    loss={"k1": 2, "k_max": 16},
)
