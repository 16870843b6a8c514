"""Tiny Hugging Face models for the tests: one config per family (hidden 32, 2 layers, grouped KV heads), a small
BPE tokenizer trained here on the byte corpus's text (nothing is downloaded), and folders `save_pretrained` wrote."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

#: transformers config values per family: every causal family has 2 layers, hidden 32, 4 query / 2 KV heads
_COMMON = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 256}
CAUSAL_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **_COMMON},
    "qwen2": {"model_type": "qwen2", **_COMMON},
    "qwen3": {"model_type": "qwen3", "head_dim": 8, **_COMMON},
    "mistral": {"model_type": "mistral", **_COMMON},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, **_COMMON},
    "olmoe": {"model_type": "olmoe", "num_experts": 4, "num_experts_per_tok": 2, **_COMMON},
}
#: the family matrix (tests/hf/test_family_matrix.py): every decoder family of transformers 5 checked, tiny and built
#: offline, each with the attention features that set it apart from Llama's (a window of 6 positions where it has one)
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
MATRIX: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **_COMMON},
    "qwen2": {"model_type": "qwen2", **_COMMON},
    "qwen3": {"model_type": "qwen3", "head_dim": 8, **_COMMON},
    "mistral": {"model_type": "mistral", **_COMMON},
    "mistral_window": {"model_type": "mistral", "sliding_window": 6, **_COMMON},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, **_COMMON},
    "gemma2": {"model_type": "gemma2", "head_dim": 8, "sliding_window": 6, "attn_logit_softcapping": 0.5, **_COMMON},
    "gemma3": {"model_type": "gemma3_text", "head_dim": 8, "sliding_window": 6,
               "layer_types": ["sliding_attention", "full_attention"], **_COMMON},
    "phi3": {"model_type": "phi3", **_COMMON},
    "smollm3": {"model_type": "smollm3", **_COMMON},
    "granite": {"model_type": "granite", **_COMMON},
    "granitemoe": {"model_type": "granitemoe", "num_local_experts": 4, "num_experts_per_tok": 2, **_COMMON},
    "olmoe": {"model_type": "olmoe", "num_experts": 4, "num_experts_per_tok": 2, **_COMMON},
    "qwen2_moe": {"model_type": "qwen2_moe", "num_experts": 4, "shared_expert_intermediate_size": 32, **_MOE,
                  **_COMMON},
    "qwen3_moe": {"model_type": "qwen3_moe", "num_experts": 4, "head_dim": 8, **_MOE, **_COMMON},
    "deepseek_v3": {"model_type": "deepseek_v3", "n_routed_experts": 4, "n_group": 2, "topk_group": 1,
                    "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 4,
                    "qk_nope_head_dim": 8, "v_head_dim": 8, **_MOE, **_COMMON, "num_key_value_heads": 4},
    "gpt_oss": {"model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 8,
                "sliding_window": 6, **_COMMON},
}
#: what sets each matrix family's attention or routing apart from Llama's (README and docs/hf_models.md list it)
FEATURES: dict[str, str] = {
    "llama": "", "qwen2": "", "qwen3": "q/k norms", "mistral": "", "mistral_window": "sliding window (every layer)",
    "mixtral": "MoE", "gemma2": "sliding window (alternate layers), logit softcapping, eager attention",
    "gemma3": "sliding window (per layer_types), q/k norms", "phi3": "fused qkv", "smollm3": "no RoPE on some layers",
    "granite": "scaled residuals and logits", "granitemoe": "MoE (router named `router`)", "olmoe": "MoE",
    "qwen2_moe": "MoE + shared expert", "qwen3_moe": "MoE", "deepseek_v3": "MLA, group-limited MoE routing",
    "gpt_oss": "attention sinks, sliding window (alternate layers), MoE (router named `router`), eager attention",
}
MASKED_FAMILIES: dict[str, dict[str, Any]] = {
    "bert": {"model_type": "bert", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "max_position_embeddings": 256},
}
SPECIAL = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
           "mask_token": "[MASK]"}


@functools.lru_cache(maxsize=1)
def _trained_tokenizer_json(vocab: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from framework.data.text import corpus_bytes

    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = corpus_bytes("pydoc")[:200_000].decode("utf-8", errors="ignore")
    tok.train_from_iterator([text[i:i + 2000] for i in range(0, len(text), 2000)], trainer)
    return tok.to_str()


def tokenizer(vocab: int = 384):
    """A byte-level BPE tokenizer of `vocab` tokens (special tokens included), as transformers' fast tokenizer."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_trained_tokenizer_json(vocab)), **SPECIAL)


def hf_config(family: str, vocab_size: int, **changes: Any):
    """The transformers config of `family`'s tiny model."""
    from transformers import AutoConfig

    values = {**CAUSAL_FAMILIES.get(family, MASKED_FAMILIES.get(family, {})), **changes}
    model_type = values.pop("model_type")
    tok_ids = {}
    if vocab_size > 4:
        tok_ids = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, **tok_ids, **values)


def save_model(family: str, folder: Path, seed: int = 0, with_tokenizer: bool = True, **changes: Any) -> Path:
    """`save_pretrained` of a fresh tiny `family` model (and the tokenizer) into `folder`; returns the folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    tok = tokenizer()
    config = hf_config(family, changes.pop("vocab_size", len(tok)), **changes)
    auto = AutoModelForMaskedLM if family in MASKED_FAMILIES else AutoModelForCausalLM
    torch.manual_seed(seed)
    model = auto.from_config(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    if with_tokenizer:
        tok.save_pretrained(str(folder))
    return folder
#: the matrix families orthogonal growth takes (tests/growth/test_growth_hf.py: depth and width, function kept)
GROWN = ("mixtral", "granitemoe", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss")


def matrix_table() -> str:
    """The matrix as README and docs/hf_models.md print it (tests/hf/test_family_matrix.py checks both hold it)."""
    rows = ["| family | `model_type` | what sets it apart | RLKV gates, mixed KV cache, OLion / Muon | growth |",
            "|---|---|---|---|---|"]
    for family, values in MATRIX.items():
        growth = "depth and width, function kept" if family in GROWN else "dense: refused by name"
        rows.append(f"| {family} | `{values['model_type']}` | {FEATURES[family] or '—'} | exact | {growth} |")
    return "\n".join(rows)
