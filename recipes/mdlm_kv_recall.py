from framework.recipe import recipe

# The needle task's harder variant: key-value recall `BOS k1 v1 .. k8 v8 SEP kq [vq] EOS^p` with the needle recipe's
# MDLM. The CPU default (300 steps, 1-2 min) only proves the wiring: d=64 with 3 layers stays at
# chance (0.06) at 300 and 600 steps (docs/mdlm.md). `size=gpu` is the size that learns it
# (>= 20k steps, as advised; conf/preset/mdlm_kv_recall/gpu.yaml).
recipe(
    "mdlm_kv_recall",
    description="Key-value recall MDLM, accuracy vs appended masks; the CPU default is a smoke size (learn on a GPU).",
    defaults={"data": "kv_recall", "model": "transformer_lm", "module": "mdlm", "optimizer": "adamw",
              "callbacks": ["checkpoint", "mask_sweep"]},
    data={"batch_size": 64, "n_train": 20000},
    model={"dim": 64, "depth": 3, "heads": 4, "causal": False, "max_seq_len": 128, "init": "gpt2"},
    module={"sft_fraction": 0.5},
    optimizer={"lr": 2e-3, "weight_decay": 0.0},
    scheduler={"warmup_steps": 50, "min_lr_ratio": 0.1},
    trainer={"max_steps": 300, "val_check_interval": 150, "check_val_every_n_epoch": None, "limit_val_batches": 8},
)
