from framework.recipe import recipe

# Byte-level masked diffusion LM (MDLM, arXiv 2406.07524) on CPython's docs: char_lm's data, backbone size and schedule,
# bidirectional. Sample from it with `python -m framework.generate RUN_DIR --prompt "..."`. `size=gpu` is the
# GPU size (conf/preset/mdlm_text/gpu.yaml: 8×512, 50k steps, EMA 0.9999).
recipe(
    "mdlm_text",
    description="Byte-level masked diffusion LM (MDLM) on CPython's docs; sample with `python -m framework.generate`.",
    base="char_lm",
    defaults={"module": "mdlm"},
    model={"causal": False, "max_seq_len": 512, "init": "gpt2"},
    module={"ema_decay": 0.99},
    optimizer={"weight_decay": 0.0},
)
