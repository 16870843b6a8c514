from framework.recipe import SMOKE_RUN, recipe

# Byte-level masked diffusion LM (MDLM, spec 1.1) on CPython's docs: the same data and backbone size as
# `char_lm`, bidirectional. Sample from it with `python -m framework.generate RUN_DIR --prompt "..."`.
# GPU size: `model.dim=512 model.depth=8 model.heads=8 data.seq_len=256 data.batch_size=64
# trainer.max_steps=50000 trainer.val_check_interval=2000 trainer.accelerator=gpu module.ema_decay=0.9999`.
recipe(
    "mdlm_text",
    description="Byte-level masked diffusion LM (MDLM) on CPython's docs; sample with `python -m framework.generate`.",
    smoke=[*SMOKE_RUN, "data.max_bytes=60000", "data.seq_len=32", "data.batch_size=8", "model.dim=32", "model.depth=1",
           "model.heads=2"],
    defaults={"data": "byte_corpus", "model": "transformer_lm", "module": "mdlm", "optimizer": "adamw"},
    data={"seq_len": 128, "batch_size": 16},
    model={"dim": 128, "depth": 2, "heads": 4, "causal": False, "max_seq_len": 512},
    module={"ema_decay": 0.99},
    optimizer={"lr": 3e-3, "weight_decay": 0.0},
    scheduler={"warmup_steps": 40},
    trainer={"max_steps": 300, "val_check_interval": 150, "limit_val_batches": 20},
)
