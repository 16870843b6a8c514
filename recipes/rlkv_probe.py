from framework.recipes.pointer_chase_lm import CHASE_DATA, CHASE_MODEL, SMOKE_MODEL

from framework.recipe import SMOKE_RUN, recipe

# RLKV on pointer chasing (docs/rlkv.md). Give it a trained base with `init_from=RUN_DIR_OR_REPO` (a
# `pointer_chase_lm` run or its Hub push): the loaded weights are probed as they are. Without init_from the probe
# first pretrains its own base for `module.pretrain_steps` (skipped whenever weights were loaded).
# Baselines: `module=duo_attention data.train_task=lookup` (distillation on a retrieval proxy), `module=random`.
recipe(
    "rlkv_probe",
    description="RL-probe per-KV-head gates of a pointer-chasing LM; full cache for the top heads, sink+recent else.",
    smoke=[*SMOKE_RUN, *SMOKE_MODEL, "module.pretrain_steps=4", "module.pretrain_batch_size=8",
           "module.group_size=2"],
    defaults={"data": "pointer_chase", "model": "transformer_lm", "module": "rlkv", "optimizer": "adamw",
              "scheduler": "constant"},
    data={**CHASE_DATA, "batch_size": 16},
    model=CHASE_MODEL,
    module={"pretrain_steps": 2500, "sparsity": 0.5, "eval_sparsities": [0.25, 0.5, 0.75]},
    optimizer={"lr": 1e-2, "weight_decay": 0.0},
    trainer={"max_steps": 150, "val_check_interval": 50, "check_val_every_n_epoch": None, "limit_val_batches": 2},
)
