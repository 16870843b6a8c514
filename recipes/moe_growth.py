from framework.recipe import recipe

# Orthogonal growth (arXiv 2510.08008, docs/growth.md): train a 2-layer, 4-expert top-1 MoE
# LM on bytes, then at step `at_step` grow it to 4 layers (interposition, zero-initialised copies: the function
# is unchanged) and 8 experts top-2 (noisy copies, α = 0.01), and continue. `moe_growth_scratch` is the control:
# the grown size trained from scratch. tools/experiments/moe_growth.py runs all arms and writes docs/growth.md's table.
recipe(
    "moe_growth_scratch",
    description="Control for moe_growth: the grown size (4 layers, 8 experts top-2) trained from scratch.",
    defaults={"data": "byte_corpus", "model": "moe_transformer", "module": "causal_lm", "optimizer": "adamw"},
    data={"seq_len": 64, "batch_size": 16},
    model={"dim": 64, "depth": 4, "heads": 4, "num_experts": 8, "top_k": 2},
    optimizer={"lr": 3e-3},
    scheduler={"warmup_steps": 40},
    trainer={"max_steps": 200, "val_check_interval": 100, "limit_val_batches": 20},
)

recipe(
    "moe_growth",
    description="Byte-level MoE LM grown mid-training in depth (layer interposition) and width (noisy expert copies).",
    base="moe_growth_scratch",
    defaults={"callbacks": ["checkpoint", "orthogonal_growth"]},
    model={"depth": 2, "num_experts": 4, "top_k": 1},
    callbacks={"orthogonal_growth": {"at_step": 200, "depth_factor": 2, "width_factor": 2, "zero_init_copies": True,
                                     "noise_alpha": 0.01, "measure_batches": 8}},
    trainer={"max_steps": 400},
)
