"""Models: the transformer LM (dense and MoE), small image nets, timm and Hugging Face wrappers, LoRA adapters."""
