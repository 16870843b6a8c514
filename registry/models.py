"""Models (partial: completed with the vocabulary size the data reports)."""

from framework.models.transformer import TransformerLM
from framework.registry import MODELS

MODELS.register(TransformerLM, name="transformer_lm", dim=128, depth=4, heads=4, max_seq_len=1024)
