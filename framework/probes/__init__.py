"""Probes that learn which attention heads need a full KV cache (RLKV, DuoAttention, random), and the mixed cache."""
