from framework.recipe import recipe

recipe(
    "sft",
    description="Supervised fine-tuning of a Hugging Face chat model (model.name_or_path=, default "
                "SmolLM2-135M-Instruct) on chat rows (data.source=, default trl-lib/Capybara): its chat template, the "
                "loss on the assistant's tokens, packed rows as long as the model's context up to 2048, validation "
                "loss, a learning rate per optimizer and per optimizer with peft=lora, bf16 on a GPU that has it; "
                "pushed when hub.repo_id= is set.",
    defaults={"data": "chat", "model": "hf_causal_lm", "module": "causal_lm", "optimizer": "adamw"},
    model={"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"},
    data={"source": "trl-lib/Capybara", "seq_len": None, "packing": True, "batch_size": 4},
    optimizer={"weight_decay": 0.0},
    scheduler={"warmup_steps": 10},
    trainer={"max_steps": 200, "val_check_interval": 50, "limit_val_batches": 20, "gradient_clip_val": 1.0,
             "precision": "auto"},
    # AdamW's are TRL's (2e-5 full, ten times that for adapters); Lion's a tenth of AdamW's (its authors' advice for a
    # sign update); OLion's three times AdamW's (the low end of the start docs/olion.md measures); Muon's as AdamW's
    lrs={"adamw": 2e-5, "lion": 2e-6, "olion": 6e-5, "muon": 2e-5,
         "adamw+lora": 2e-4, "lion+lora": 2e-5, "olion+lora": 6e-4, "muon+lora": 2e-4},
)
