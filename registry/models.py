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
