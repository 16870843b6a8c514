"""Adapters for parameter-efficient fine-tuning (`peft=lora`), on the `peft` library (imported only when chosen)."""

from framework.models.peft_adapters import LoRA, QLoRA
from framework.registry import PEFT

PEFT.register(
    LoRA, name="lora",
    description="PEFT's LoRA on every linear layer but the output head (peft.r=16, peft.alpha=32, peft.dropout=0.05, "
                "peft.target_modules=all-linear or [q_proj,v_proj], peft.use_dora, peft.use_rslora): only the adapters "
                "train, any optimizer; pushed in PEFT's format (peft.merge=true: the merged model).",
)
PEFT.register(
    QLoRA, name="qlora",
    description="LoRA on a base loaded in 4 bits (bitsandbytes NF4, double quantization, bf16 compute): a CUDA GPU and "
                "bitsandbytes only; refused by name elsewhere (use peft=lora there).",
)
