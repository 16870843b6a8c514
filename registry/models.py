"""Models (partial: completed with the vocabulary size the data reports)."""

from framework.models.transformer import TransformerLM
from framework.registry import MODELS

MODELS.register(TransformerLM, name="transformer_lm", dim=128, depth=4, heads=4, max_seq_len=1024)

from framework.models.moe import MoETransformerLM  # noqa: E402

MODELS.register(MoETransformerLM, name="moe_transformer", dim=128, depth=4, heads=4, num_experts=4, top_k=1,
                router="softmax_topk_renorm", max_seq_len=1024)

from framework.models.convnet import MLP, ConvNet  # noqa: E402

MODELS.register(MLP, name="mlp", hidden=256, depth=2)
MODELS.register(ConvNet, name="convnet", channels=32, hidden=128)

from framework.models.hf import HFCausalLM, HFMaskedLM  # noqa: E402  (transformers is imported when one is built)

MODELS.register(
    HFCausalLM, name="hf_causal_lm",
    description="A transformers causal LM (Llama, Qwen2/3, Mistral, Mixtral, Qwen2-MoE, OLMoE, ...) from a Hub id or "
                "folder (name_or_path=) or a fresh config (config={model_type: llama, ...}), with its tokenizer; "
                "weights that do not fit the checkpoint are an error (strict=false: a warning).",
)
MODELS.register(
    HFMaskedLM, name="hf_masked_lm",
    description="A transformers masked LM (BERT, RoBERTa, ModernBERT, ...) by Hub id, folder or fresh config: a "
                "bidirectional backbone for the mdlm module, with its tokenizer's [MASK]; weights that do not fit the "
                "checkpoint are an error (strict=false: a warning).",
)

from framework.models.timm_models import timm_model  # noqa: E402  (timm is imported when one is built)

MODELS.register(
    timm_model, name="timm",
    description="A timm image model by name (model.name=resnet18, vit_tiny_patch16_224, ...) or Hub id "
                "(hf-hub:org/name); pretrained=, num_classes and in_chans from the data, extra timm arguments "
                "(+model.drop_rate=0.1); pushed back in timm's own format.",
)
