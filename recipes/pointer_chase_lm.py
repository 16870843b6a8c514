from framework.recipe import recipe

# The base model RLKV probes (docs/rlkv.md): a 4-layer causal transformer taught pointer chasing by next-token
# prediction on the answer tokens (the prompt is not scored: with it the look-up is learnt far later, measured).
# `recipe=rlkv_probe init_from=THIS_RUN_DIR` probes it; rlkv_probe states the same data and model sizes so the
# weights fit (tests/test_conf.py checks they agree). module.prompt_length = 2 * data.n_pairs + 3.
recipe(
    "pointer_chase_lm",
    description="Causal transformer taught multi-hop pointer chasing (the base model that rlkv_probe probes).",
    defaults={"data": "pointer_chase", "model": "transformer_lm", "module": "causal_lm", "optimizer": "adamw"},
    data={"n_pairs": 8, "n_symbols": 16, "batch_size": 64},
    model={"dim": 128, "depth": 4, "heads": 4, "max_seq_len": 32, "init": "gpt2"},
    module={"prompt_length": 19},
    optimizer={"lr": 1e-3, "betas": [0.9, 0.98], "weight_decay": 0.0},
    scheduler={"warmup_steps": 100, "min_lr_ratio": 0.1},
    trainer={"max_steps": 2500, "val_check_interval": 500, "check_val_every_n_epoch": None, "limit_val_batches": 4},
)
