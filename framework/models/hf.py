"""Hugging Face `transformers` language models as registered models (`hf_causal_lm`, `hf_masked_lm`).

A user's Llama, Qwen, Mistral, Mixtral, OLMoE or masked LM sits under the same modules, optimizers, callbacks and
strategies as the framework's own `TransformerLM`: the wrapper is an `nn.Module` whose `forward(ids)` returns
logits (batch, seq, vocab), like every model here. It loads from a Hub id or a local folder (`name_or_path=`), or
builds a fresh model from a transformers config (`config={"model_type": "llama", "hidden_size": 64, ...}`: the
vocabulary size comes from the data when the config leaves it out). Loading never runs remote code and reads
safetensors only.

What differs per family (how the model is called, whether logits are shifted, its mask token) is one `Adapter`;
`register_adapter` adds one for a family the defaults do not cover (a remote-code MDLM such as LLaDA or Dream:
docs/hf_models.md). transformers is imported here only, when a model is built: a run on the framework's own models
never loads it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from framework.models.base import RecordsConfig
from framework.models.documents import document_mask, mask_for, shift_within_documents
from framework.models.hf_adapters import ADAPTERS, Adapter, adapter_for, register_adapter
from framework.models.hf_loading import (
    _transformers,
    check_weight_files,
    fresh_hf_config,
    load_hf_config,
    load_pretrained,
    load_tokenizer,
)
from framework.serving.attention import check_window

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _building_on_meta() -> bool:
    """True inside `accelerate.init_empty_weights` (the preflight's build): a new parameter lands on meta."""
    return nn.Linear(1, 1).weight.device.type == "meta"


class HFLanguageModel(RecordsConfig):
    """A transformers LM as a framework model: `forward(ids) -> logits`; `.hf` is the transformers model itself.

    `causal=False` runs a causal family without its causal mask (transformers 5 uses a 4-D boolean mask as given:
    checked on Llama, Qwen2/3, Mistral, Mixtral, OLMoE) as an MDLM backbone, its logits shifted one place right
    (Dream's convention, so an autoregressive head keeps its meaning). The registered subclasses list only their own.

    Args:
        name_or_path: Hub id or local folder (`save_pretrained` layout) to load; give this or `config`, not both.
        config: transformers config values with `model_type` (`{model_type: llama, ...}`) for a fresh, untrained model.
        vocab_size: token ids the data uses; supplied from the data at build time (a fresh config without one takes it).
            A loaded model must have at least that many embeddings.
        revision: Hub branch, tag or commit of `name_or_path`; None: the default branch.
        dtype: dtype of the weights: "float32", "bfloat16" or "float16".
        attn_implementation: transformers' attention kernel ("sdpa", "eager", or a registered one); None: its default.
        tokenizer: Hub id or folder of the tokenizer when it is not `name_or_path`'s (a grown model's source).
        strict: refuse checkpoint weights that are missing, unexpected or misshapen; False loads with a warning.
        special_ids: the data's special token ids (`{"eos_id": 3, ...}`) a fresh config takes; supplied by the run.
        gradient_checkpointing: transformers' own non-reentrant checkpointing: recompute activations, saving memory.
    """

    kind = "causal"
    auto_class = "AutoModelForCausalLM"

    def __init__(
        self,
        name_or_path: str | None = None,
        config: dict[str, Any] | None = None,
        vocab_size: int | None = None,
        revision: str | None = None,
        dtype: str = "float32",
        attn_implementation: str | None = None,
        causal: bool = True,
        tokenizer: str | None = None,
        strict: bool = True,
        special_ids: dict[str, int] | None = None,
        gradient_checkpointing: bool = False,
        quantization: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.bidirectional = not causal
        if (name_or_path is None) == (config is None):
            raise ValueError(
                f"model.name_or_path={name_or_path!r}, model.config={config!r}: give exactly one, a Hub id or a "
                "folder (name_or_path) or a transformers config for a fresh model (config={model_type: llama, ...})")
        if dtype not in DTYPES:
            raise ValueError(f"model.dtype={dtype!r} is invalid; valid: {', '.join(DTYPES)}")
        transformers = _transformers()
        auto = getattr(transformers, self.auto_class)
        kwargs = {"dtype": DTYPES[dtype], **({"attn_implementation": attn_implementation}
                                             if attn_implementation else {})}
        if quantization:  # peft=qlora's 4-bit base (framework.models.peft_adapters.QLoRA: CUDA only)
            if name_or_path is None:
                raise ValueError("peft=qlora quantizes trained weights: give model.name_or_path, not a fresh config")
            kwargs["quantization_config"] = transformers.BitsAndBytesConfig(**quantization)
        if name_or_path is not None:
            hf_config = load_hf_config(str(name_or_path), revision)
            self._check_kind(hf_config, f"model.name_or_path={name_or_path}")
            if _building_on_meta():  # the preflight: the architecture, and the weight files' headers
                check_weight_files(str(name_or_path))
                model = auto.from_config(hf_config, **kwargs)
            else:
                model = load_pretrained(auto, str(name_or_path), revision, strict, **kwargs).train()  # loads in eval
        else:
            hf_config = fresh_hf_config(config, vocab_size, special_ids)
            self._check_kind(hf_config, f"model.config.model_type={hf_config.model_type}")
            model = auto.from_config(hf_config, **kwargs)
        self.hf = model
        if gradient_checkpointing:
            enable_checkpointing(model)
        self.loaded_weights = name_or_path is not None  # trained weights, not a fresh init (probes keep them as is)
        self.adapter = adapter_for(hf_config.model_type, self.kind)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        if vocab_size is not None and int(vocab_size) > self.vocab_size:
            mask = (" If the extra id is the [MASK] the mdlm module appends when the data has none: the tokenizer has "
                    "no mask token, so use a masked LM (model=hf_masked_lm) or a tokenizer with one."
                    if int(vocab_size) == self.vocab_size + 1 else "")
            raise ValueError(f"the data's token ids go up to {int(vocab_size) - 1} (vocab_size={vocab_size}), but the "
                             f"model has {self.vocab_size} embeddings (ids 0..{self.vocab_size - 1}): use the model's "
                             f"own tokenizer, or a model with a larger vocabulary.{mask}")
        positions = getattr(hf_config, "max_position_embeddings", None)
        self.max_seq_len = int(positions) if isinstance(positions, int) else None
        self.max_seq_len_key = "the model config's max_position_embeddings"

    def _check_kind(self, hf_config: Any, where: str) -> None:
        transformers = _transformers()
        mapping = getattr(transformers, f"MODEL_FOR_{'CAUSAL_LM' if self.kind == 'causal' else 'MASKED_LM'}_MAPPING")
        if type(hf_config) not in mapping:
            other = "hf_masked_lm" if self.kind == "causal" else "hf_causal_lm"
            raise ValueError(f"{where}: a {hf_config.model_type} model has no {self.auto_class} head in transformers"
                             f" {transformers.__version__}; try model={other}")

    @classmethod
    def tokenizer_for(cls, name_or_path: str | None = None, revision: str | None = None, tokenizer: str | None = None,
                      **_: Any) -> Any | None:
        """The tokenizer a model of these arguments comes with: `tokenizer`'s (a Hub id or folder) when given, else
        `name_or_path`'s (None for a fresh config)."""
        source = tokenizer or name_or_path
        return load_tokenizer(str(source), revision) if source else None

    @property
    def mask_id(self) -> int | None:
        """The model's [MASK] token id (its config's `mask_token_id`), None where it has none."""
        value = getattr(self.hf.config, "mask_token_id", None)
        return int(value) if isinstance(value, int) else None

    def forward(self, idx: Tensor, key_padding_mask: Tensor | None = None, position_ids: Tensor | None = None
                ) -> Tensor:
        """Logits (batch, seq, vocab) of token ids (batch, seq); `key_padding_mask` (batch, seq), True = real token;
        `position_ids` (batch, seq): packed rows, each document's positions from 0 (`_packed`)."""
        if position_ids is not None:
            return self._packed(idx, key_padding_mask, position_ids)
        mask = None if key_padding_mask is None else key_padding_mask.long()
        if not self.bidirectional or self.adapter.bidirectional:
            return self.adapter.logits(self.hf, idx, mask)
        b, t = idx.shape
        keys = torch.ones(b, t, dtype=torch.bool, device=idx.device) if mask is None else mask.bool()
        full = keys[:, None, None, :].expand(b, 1, t, t)  # every query sees every real key
        logits = self.adapter.logits(self.hf, idx, self._mask(full))
        return shift_within_documents(logits, None) if self.adapter.shifted else logits

    def _mask(self, mask: Tensor) -> Tensor:
        return mask_for(mask, self.hf.config._attn_implementation, self.hf.get_input_embeddings().weight.dtype)

    def _packed(self, idx: Tensor, key_padding_mask: Tensor | None, position_ids: Tensor) -> Tensor:
        """Logits of packed rows, attention kept inside each document. A causal model without padding gets the
        position ids alone: transformers 5 reads the documents from them and builds the block-causal mask (sdpa,
        eager, flex; flash-attention's varlen path). A bidirectional one (a masked LM, `causal=False`), or padding,
        gets our 4-D block mask. Positions are offset where the family's start past its padding id (RoBERTa's)."""
        bidirectional = self.bidirectional or self.adapter.bidirectional
        mask = None
        if bidirectional or key_padding_mask is not None:
            mask = self._mask(document_mask(position_ids, causal=not bidirectional, key_padding_mask=key_padding_mask))
        logits = self.adapter.logits(self.hf, idx, mask, position_ids + self._position_offset())
        if self.bidirectional and not self.adapter.bidirectional and self.adapter.shifted:
            return shift_within_documents(logits, position_ids)
        return logits

    def _position_offset(self) -> int:
        """Where the model's positions start: past the padding id for a family whose position embeddings have one
        (RoBERTa and its kin count from `pad_token_id + 1`), else 0."""
        table = getattr(getattr(self.hf.base_model, "embeddings", None), "position_embeddings", None)
        pad = getattr(table, "padding_idx", None)
        return 0 if pad is None else int(pad) + 1

    def save_pretrained(self, folder: str | Path, tokenizer: Any | None = None) -> None:
        """Write the model in transformers' own layout (config.json, model.safetensors, generation config), and the
        tokenizer's files where there is one."""
        self.hf.save_pretrained(str(folder), safe_serialization=True)
        if tokenizer is None:
            tokenizer = self.tokenizer_for(**self.init_config)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder))


class HFCausalLM(HFLanguageModel):
    """A transformers causal LM (`AutoModelForCausalLM`): Llama, Qwen2/3, Mistral, Mixtral, Qwen2-MoE, OLMoE, ...

    It takes RLKV's per-KV-head gates and a mixed KV cache as the framework's own `TransformerLM` does
    (`forward(ids, gates=, window=)`, `forward(ids, cache=)`, `gate_shape`, `mixed_cache`), through transformers'
    attention interface (`framework.serving.hf_attention`), so the probes and `decode` run on it unchanged.

    The settings both transformers models share are `HFLanguageModel`'s.

    Args:
        causal: keep the causal mask; False runs it bidirectionally as an MDLM backbone (logits shifted right).
        quantization: transformers' `BitsAndBytesConfig` values for a 4-bit base (handed in by `peft=qlora`; CUDA).
    """

    def __init__(self, name_or_path: str | None = None, config: dict[str, Any] | None = None,
                 vocab_size: int | None = None, revision: str | None = None, dtype: str = "float32",
                 attn_implementation: str | None = None, causal: bool = True, tokenizer: str | None = None,
                 strict: bool = True, special_ids: dict[str, int] | None = None, gradient_checkpointing: bool = False,
                 quantization: dict[str, Any] | None = None):
        super().__init__(name_or_path, config, vocab_size, revision, dtype, attn_implementation, causal, tokenizer,
                         strict, special_ids, gradient_checkpointing, quantization)

    @property
    def gate_shape(self) -> tuple[int, int]:
        """(layers, kv_heads): one gate per KV head, shared by the query heads of its group."""
        from framework.serving.hf_attention import attention_shape

        if self.bidirectional:
            raise ValueError("this hf_causal_lm has causal=False: gates and KV caches need causal attention")
        layers, kv_heads, _ = attention_shape(self.hf)
        return layers, kv_heads

    def mixed_cache(self, full_heads: Tensor | None = None, window: tuple[int, int] = (1, 4),
                    capacity: int | None = None, prefill: str = "streaming") -> Any:
        """A transformers `Cache` (`framework.serving.hf_attention.mixed_kv_cache`) for `forward(ids, cache=)` and
        for `self.hf.generate(ids, cache=...)`."""
        from framework.serving.hf_attention import mixed_kv_cache

        self.gate_shape  # noqa: B018 - refuses a bidirectional model
        return mixed_kv_cache(self.hf, full_heads, window, capacity, prefill)

    def forward(self, idx: Tensor, key_padding_mask: Tensor | None = None, gates: Tensor | None = None,
                window: tuple[int, int] | None = None, cache: Any = None, position_ids: Tensor | None = None) -> Tensor:
        """Logits (batch, seq, vocab). `gates` (layers, kv_heads) in [0, 1] with `window=(sink, recent)` blend full
        (1) and streaming (0) attention per KV head; `cache` (`mixed_cache`) continues from what it holds;
        `position_ids`: packed rows (`HFLanguageModel.forward`), not with gates or a cache."""
        if gates is None and cache is None:
            return super().forward(idx, key_padding_mask, position_ids)
        if position_ids is not None:
            raise ValueError("position_ids (packed rows) do not combine with attention gates or a KV cache: give one "
                             "document per row there (data.packing=false)")
        return self._run(self.hf, idx, key_padding_mask, gates, window, cache).logits

    def features(self, idx: Tensor, key_padding_mask: Tensor | None = None, gates: Tensor | None = None,
                 window: tuple[int, int] | None = None, cache: Any = None) -> Tensor:
        """The decoder's final hidden states (batch, seq, hidden), after its last norm: the LM head's input (what
        DuoAttention's probe distils). Gates and cache as in `forward`."""
        return self._run(self.hf.base_model, idx, key_padding_mask, gates, window, cache).last_hidden_state

    def _run(self, target: nn.Module, idx: Tensor, key_padding_mask: Tensor | None, gates: Tensor | None,
             window: tuple[int, int] | None, cache: Any) -> Any:
        kwargs: dict[str, Any] = {"use_cache": cache is not None}
        if gates is not None or cache is not None:
            from framework.serving.hf_attention import NAME, use_rlkv_attention

            shape = self.__dict__.get("_gate_shape")  # once per model: a decode loop calls this every token
            if shape is None:
                shape = self.__dict__["_gate_shape"] = self.gate_shape
            if self.hf.config._attn_implementation != NAME:
                use_rlkv_attention(self.hf)
            if gates is not None:
                if tuple(gates.shape) != shape:
                    raise ValueError(f"gates of shape {tuple(gates.shape)} do not fit: expected (layers, kv_heads) = "
                                     f"{shape}")
                kwargs.update(rlkv_gates=gates, rlkv_window=check_window(window))
            if cache is not None:  # a padded prompt: left padding only (framework.serving.hf_attention.left_padding)
                kwargs[cache_argument(self.hf)] = cache
        mask = None if key_padding_mask is None else key_padding_mask.long()
        return target(input_ids=idx, attention_mask=mask, **kwargs)


def cache_argument(model: nn.Module) -> str:
    """The name under which `model.forward` takes a KV cache: `cache` (transformers ≥ 5.x) or `past_key_values`."""
    return _cache_argument(type(model))


@functools.cache
def _cache_argument(cls: type) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


class HFMaskedLM(HFLanguageModel):
    """A transformers masked LM (`AutoModelForMaskedLM`: BERT, RoBERTa, ModernBERT, ...): bidirectional, logits at
    each position, a [MASK] token: an MDLM backbone.

    Its settings are `HFLanguageModel`'s.
    """

    kind = "masked"
    auto_class = "AutoModelForMaskedLM"

    def __init__(self, name_or_path: str | None = None, config: dict[str, Any] | None = None,
                 vocab_size: int | None = None, revision: str | None = None, dtype: str = "float32",
                 attn_implementation: str | None = None, tokenizer: str | None = None, strict: bool = True,
                 special_ids: dict[str, int] | None = None, gradient_checkpointing: bool = False):
        super().__init__(name_or_path, config, vocab_size, revision, dtype, attn_implementation, tokenizer=tokenizer,
                         strict=strict, special_ids=special_ids, gradient_checkpointing=gradient_checkpointing)


def enable_checkpointing(model: nn.Module) -> None:
    """transformers' gradient checkpointing on `model`, non-reentrant (so a frozen embedding, as under LoRA, needs no
    input that requires grad), with the KV cache off while training; ValueError where the family has none."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"model.gradient_checkpointing=true: {type(model).__name__} does not support gradient "
                         "checkpointing in transformers; set model.gradient_checkpointing=false")
    enable = getattr(model, "activation_checkpointing_enable", None)  # its name from transformers 5.25 on
    if callable(enable):
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def is_hf_model(model: Any) -> bool:
    """True for a transformers model wrapped here (`HFLanguageModel`)."""
    return isinstance(model, HFLanguageModel)


__all__ = ["ADAPTERS", "Adapter", "HFCausalLM", "HFLanguageModel", "HFMaskedLM", "adapter_for",
           "fresh_hf_config", "is_hf_model", "load_hf_config", "load_tokenizer", "register_adapter"]

