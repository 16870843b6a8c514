"""Serving: the mixed per-head KV cache, its transformers attention hook, and decoding."""
