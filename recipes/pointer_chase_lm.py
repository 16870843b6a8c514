from framework.recipe import SMOKE_RUN, recipe

# The base model RLKV probes (docs/rlkv.md): a 4-layer causal transformer taught pointer chasing by next-token
# prediction on the answer tokens (the prompt is not scored: with it the look-up is learnt far later, measured).
# `recipe=rlkv_probe init_from=THIS_RUN_DIR` probes it; both recipes share these sizes so the weights fit.
# Changing data.n_pairs needs module.prompt_length=2*n_pairs+3.
CHASE_DATA = {"n_pairs": 8, "n_symbols": 16}
PROMPT_LENGTH = 2 * CHASE_DATA["n_pairs"] + 3
CHASE_MODEL = {"dim": 128, "depth": 4, "heads": 4, "max_seq_len": 32}
SMOKE_MODEL = ["data.n_train=256", "data.n_val=32", "data.batch_size=8", "data.val_batch_size=16", "model.dim=32",
               "model.depth=2", "model.heads=2"]

recipe(
    "pointer_chase_lm",
    description="Causal transformer taught multi-hop pointer chasing (the base model that rlkv_probe probes).",
    smoke=[*SMOKE_RUN, *SMOKE_MODEL],
    defaults={"data": "pointer_chase", "model": "transformer_lm", "module": "causal_lm", "optimizer": "adamw"},
    data={**CHASE_DATA, "batch_size": 64},
    model=CHASE_MODEL,
    module={"prompt_length": PROMPT_LENGTH},
    optimizer={"lr": 1e-3, "betas": [0.9, 0.98], "weight_decay": 0.0},
    scheduler={"warmup_steps": 100, "min_lr_ratio": 0.1},
    trainer={"max_steps": 2500, "val_check_interval": 500, "check_val_every_n_epoch": None, "limit_val_batches": 4},
)
