"""Moved to `framework.serving.kv_cache` (serving a head allocation is one concern, imported by models and probes
alike); this name stays so existing imports keep working."""

from framework.serving.kv_cache import (  # noqa: F401
    PREFILL_POLICIES,
    LayerKVCache,
    MixedKVCache,
    decode,
    decode_uncached,
    kv_fraction,
    theoretical_speedup,
)
