from framework.recipe import recipe

# RLKV on pointer chasing (docs/rlkv.md). Give it a trained base with `init_from=RUN_DIR_OR_REPO` (a
# `pointer_chase_lm` run or its Hub push): the loaded weights are probed as they are. Without init_from the probe
# first pretrains its own base for `module.pretrain_steps` (skipped whenever weights were loaded). The data and
# model sizes are pointer_chase_lm's, so its weights fit (tests/test_conf.py checks they agree).
# Baselines: `module=duo_attention data.train_task=lookup` (distillation on a retrieval proxy), `module=random`.
recipe(
    "rlkv_probe",
    description="RL-probe per-KV-head gates of a pointer-chasing LM; full cache for the top heads, sink+recent else.",
    defaults={"data": "pointer_chase", "model": "transformer_lm", "module": "rlkv", "optimizer": "adamw",
              "scheduler": "constant"},
    data={"n_pairs": 8, "n_symbols": 16, "batch_size": 16},
    model={"dim": 128, "depth": 4, "heads": 4, "max_seq_len": 32, "init": "gpt2"},
    module={"pretrain_steps": 2500, "sparsity": 0.5, "eval_sparsities": [0.25, 0.5, 0.75]},
    optimizer={"lr": 1e-2, "weight_decay": 0.0},
    trainer={"max_steps": 150, "val_check_interval": 50, "check_val_every_n_epoch": None, "limit_val_batches": 2},
)
