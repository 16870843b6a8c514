from framework.recipe import recipe

recipe(
    "char_lm",
    description="Byte-level causal transformer LM on CPython's documentation (the foundation's workload).",
    defaults={"data": "byte_corpus", "model": "transformer_lm", "module": "causal_lm", "optimizer": "adamw"},
    data={"seq_len": 128, "batch_size": 16},
    model={"dim": 128, "depth": 2, "heads": 4, "init": "gpt2"},
    optimizer={"lr": 3e-3},
    scheduler={"warmup_steps": 40},
    trainer={"max_steps": 300, "val_check_interval": 150, "limit_val_batches": 20},
)
