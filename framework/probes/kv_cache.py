"""Moved to `framework.serving.kv_cache` and `framework.serving.decoding` (serving a head allocation is one concern,
imported by models and probes alike); this name stays so existing imports keep working."""

from framework.serving.decoding import decode, decode_uncached  # noqa: F401
from framework.serving.kv_cache import (  # noqa: F401
    PREFILL_POLICIES,
    LayerKVCache,
    MixedKVCache,
    kv_fraction,
    theoretical_speedup,
)
