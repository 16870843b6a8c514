from framework.recipe import recipe

recipe(
    "olion_char_lm",
    description="The char_lm workload trained with OLion (orthogonalised Lion); sweep optimizer=olion,muon,adamw,lion.",
    defaults={"data": "byte_corpus", "model": "transformer_lm", "module": "causal_lm", "optimizer": "olion"},
    data={"seq_len": 128, "batch_size": 16},
    model={"dim": 128, "depth": 2, "heads": 4},
    optimizer={"lr": 3e-3},
    scheduler={"warmup_steps": 40},
    trainer={"max_steps": 300, "val_check_interval": 150, "limit_val_batches": 20},
)
