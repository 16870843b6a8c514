from framework.recipe import SMOKE_RUN, recipe

recipe(
    "char_lm",
    description="Byte-level causal transformer LM on CPython's documentation (the foundation's workload).",
    smoke=[*SMOKE_RUN, "data.max_bytes=60000", "data.seq_len=32", "data.batch_size=8", "model.dim=32", "model.depth=1",
           "model.heads=2"],
    defaults={"data": "byte_corpus", "model": "transformer_lm", "module": "causal_lm", "optimizer": "adamw"},
    data={"seq_len": 128, "batch_size": 16},
    model={"dim": 128, "depth": 2, "heads": 4},
    optimizer={"lr": 3e-3},
    scheduler={"warmup_steps": 40},
    trainer={"max_steps": 300, "val_check_interval": 150, "limit_val_batches": 20},
)
