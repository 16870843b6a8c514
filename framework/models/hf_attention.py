"""Moved to `framework.serving.hf_attention` (serving a head allocation is one concern, imported by models and
probes alike); this name stays so existing imports keep working."""

from framework.serving.hf_attention import (  # noqa: F401
    NAME,
    attention_shape,
    cache_nbytes,
    left_padding,
    mixed_kv_cache,
    rlkv_attention,
    use_rlkv_attention,
)
