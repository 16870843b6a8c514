from framework.recipe import recipe

# Orthogonal growth (arXiv 2510.08008, spec shared/specs/olion_growth.md §2): train a 2-layer, 4-expert top-1 MoE
# LM on bytes, then at step `at_step` grow it to 4 layers (interposition, zero-initialised copies: the function
# is unchanged) and 8 experts top-2 (noisy copies, α = 0.01), and continue. `moe_growth_scratch` is the control:
# the grown size trained from scratch. tools/experiments/moe_growth.py runs all arms and writes docs/growth.md's table.
MOE = dict(
    data={"seq_len": 64, "batch_size": 16},
    optimizer={"lr": 3e-3},
    scheduler={"warmup_steps": 40},
)
SMOKE = ["threads=1", "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=2",
         "trainer.enable_progress_bar=false", "data.max_bytes=60000", "data.seq_len=32", "data.batch_size=8",
         "model.dim=32", "model.depth=1", "model.heads=2", "model.num_experts=2"]

recipe(
    "moe_growth",
    description="Byte-level MoE LM grown mid-training in depth (layer interposition) and width (noisy expert copies).",
    defaults={"data": "byte_corpus", "model": "moe_transformer", "module": "causal_lm", "optimizer": "adamw",
              "callbacks": ["checkpoint", "orthogonal_growth"]},
    model={"dim": 64, "depth": 2, "heads": 4, "num_experts": 4, "top_k": 1},
    callbacks={"orthogonal_growth": {"at_step": 200, "depth_factor": 2, "width_factor": 2, "zero_init_copies": True,
                                     "noise_alpha": 0.01, "measure_batches": 8}},
    trainer={"max_steps": 400, "val_check_interval": 100, "limit_val_batches": 20},
    smoke=[*SMOKE, "callbacks.orthogonal_growth.at_step=2"],
    **MOE,
)

recipe(
    "moe_growth_scratch",
    description="Control for moe_growth: the grown size (4 layers, 8 experts top-2) trained from scratch.",
    defaults={"data": "byte_corpus", "model": "moe_transformer", "module": "causal_lm", "optimizer": "adamw"},
    model={"dim": 64, "depth": 4, "heads": 4, "num_experts": 8, "top_k": 2},
    trainer={"max_steps": 200, "val_check_interval": 100, "limit_val_batches": 20},
    smoke=SMOKE,
    **MOE,
)
