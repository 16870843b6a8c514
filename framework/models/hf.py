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

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from framework.models.base import RecordsConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: files a folder or repo of a transformers tokenizer holds (any one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model", "vocab.json")


@dataclasses.dataclass(frozen=True)
class Adapter:
    """The facts that differ per model family, in one place.

    `kind`: "causal" (next-token logits, `AutoModelForCausalLM`) or "masked" (logits at the same position,
    `AutoModelForMaskedLM`); `shifted`: logits at position t predict token t+1; `bidirectional`: every position
    attends to every other (what an MDLM backbone needs); `mask_token`: the tokenizer's attribute that holds the
    [MASK] token (None: the family has none); `call(model, ids, attention_mask)`: the logits of a batch of token
    ids (`attention_mask`: None, a (batch, seq) key mask with 1 = real token, or a 4-D boolean mask).
    """

    name: str
    kind: str
    shifted: bool
    bidirectional: bool
    model_types: tuple[str, ...] = ()  # transformers `model_type`s it covers; () = the kind's default
    mask_token: str | None = None
    call: Callable[..., Tensor] | None = None

    def logits(self, model: nn.Module, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        if self.call is not None:
            return self.call(model, ids, attention_mask)
        if self.kind == "causal":
            return model(input_ids=ids, attention_mask=attention_mask, use_cache=False).logits
        return model(input_ids=ids, attention_mask=attention_mask).logits


#: the adapters by name; `adapter_for` picks one by the config's model_type, else the kind's default
ADAPTERS: dict[str, Adapter] = {}


def register_adapter(adapter: Adapter) -> Adapter:
    """Add (or replace) an adapter; a family's `model_types` then use it."""
    ADAPTERS[adapter.name] = adapter
    return adapter


register_adapter(Adapter("causal", "causal", shifted=True, bidirectional=False))
register_adapter(Adapter("masked", "masked", shifted=False, bidirectional=True, mask_token="mask_token_id"))


def adapter_for(model_type: str, kind: str) -> Adapter:
    """The adapter registered for `model_type` of this `kind`, else the kind's default."""
    for adapter in ADAPTERS.values():
        if adapter.kind == kind and model_type in adapter.model_types:
            return adapter
    return ADAPTERS[kind]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - the dev extra installs it
        raise ImportError("Hugging Face models need `transformers`: pip install 'framework[hf]'") from err
    transformers.utils.logging.set_verbosity_error()  # tiny test configs trip vocabulary-range warnings
    transformers.utils.logging.disable_progress_bar()  # per-file bars on every load and save
    return transformers


def _building_on_meta() -> bool:
    """True inside `accelerate.init_empty_weights` (the preflight's build): a new parameter lands on meta."""
    return nn.Linear(1, 1).weight.device.type == "meta"


def _plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def load_hf_config(name_or_path: str, revision: str | None = None) -> Any:
    """The transformers config of a Hub id or a local folder; ValueError naming what is wrong (an unknown id, a
    folder without config.json, a model type transformers does not know, a config asking for remote code)."""
    transformers = _transformers()
    where = f"model.name_or_path={name_or_path}"
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{where}: the folder has no config.json; a transformers model folder holds the "
                             "config.json and model.safetensors that save_pretrained writes")
    elif name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ValueError(f"{where}: no such folder, and not a Hub id ('namespace/name')")
    try:
        config = transformers.AutoConfig.from_pretrained(name_or_path, revision=revision, trust_remote_code=False)
    except ValueError as err:
        raise ValueError(f"{where}: {_first_line(err)} (transformers {transformers.__version__} knows: "
                         f"{_known_types_hint(name_or_path, revision)})") from None
    except (OSError, KeyError) as err:
        from huggingface_hub import constants

        raise ValueError(f"{where}: not a local folder, and the Hub at {constants.ENDPOINT} has no model repo "
                         f"{name_or_path!r} ({type(err).__name__}: {_first_line(err)})") from None
    if getattr(config, "auto_map", None):
        raise ValueError(f"{where}: the config asks for remote code (auto_map); the framework never runs remote "
                         "code: register an Adapter for the family (docs/hf_models.md)")
    return config


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _known_types_hint(name_or_path: str, revision: str | None) -> str:
    """The model types closest to the one a config names (for an unknown architecture)."""
    import difflib
    import json

    transformers = _transformers()
    known = sorted(transformers.CONFIG_MAPPING.keys())
    try:
        path = Path(name_or_path)
        if path.is_dir():
            text = (path / "config.json").read_text()
        else:
            from huggingface_hub import hf_hub_download

            text = Path(hf_hub_download(name_or_path, "config.json", revision=revision)).read_text()
        asked = str(json.loads(text).get("model_type"))
    except Exception:  # noqa: BLE001 - only a hint
        return f"{len(known)} model types"
    close = difflib.get_close_matches(asked, known, n=3, cutoff=0.6)
    return (f"did you mean {' or '.join(map(repr, close))}? " if close else "") + f"{len(known)} model types"


def fresh_hf_config(config: dict[str, Any], vocab_size: int | None) -> Any:
    """A transformers config from `{"model_type": ..., **values}`; the data's `vocab_size` unless the config sets
    one. ValueError for a missing or unknown model_type (with close matches)."""
    import difflib

    transformers = _transformers()
    values = _plain(config)
    model_type = values.pop("model_type", None)
    known = sorted(transformers.CONFIG_MAPPING.keys())
    if model_type not in transformers.CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), known, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise ValueError(f"model.config.model_type={model_type!r} is not a model type transformers "
                         f"{transformers.__version__} knows: {hint}e.g. llama, qwen2, qwen3, mistral, mixtral, olmoe, "
                         f"bert ({len(known)} in all)")
    if vocab_size is not None:
        values.setdefault("vocab_size", int(vocab_size))
    return transformers.AutoConfig.for_model(model_type, **values)


@functools.lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str, revision: str | None = None) -> Any | None:
    """The tokenizer saved with a model (a Hub id or a folder), or None where there is none."""
    transformers = _transformers()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            return None
    else:
        from huggingface_hub import HfApi

        try:
            files = set(HfApi().list_repo_files(name_or_path, revision=revision))
        except Exception:  # noqa: BLE001 - the model's own loading reports an unreachable or unknown repo
            return None
        if not files.intersection(TOKENIZER_FILES):
            return None
    return transformers.AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=False)


class HFLanguageModel(RecordsConfig):
    """A transformers LM as a framework model: `forward(ids) -> logits`; `.hf` is the transformers model itself.

    Give `name_or_path` (a Hub id or a folder that `save_pretrained` wrote) or `config` (a fresh model: a dict with
    `model_type` and the config's values). `vocab_size` is what the data needs: a fresh config without one takes it;
    a loaded model must have at least that many embeddings. `dtype` is the weights' dtype ("float32",
    "bfloat16", "float16"); `attn_implementation` is transformers' ("sdpa", "eager", or one registered with its
    `AttentionInterface`). `causal=False` runs a causal family without its causal mask (transformers 5 uses a
    4-D boolean mask as given: checked on Llama, Qwen2/3, Mistral, Mixtral, OLMoE) as an MDLM backbone; its logits
    are then shifted one place right (Dream's convention: position t's logits come from t−1's output, so an
    autoregressive checkpoint's head keeps its meaning).
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
        attn_implementation: str | None = "sdpa",
        causal: bool = True,
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
        if name_or_path is not None:
            hf_config = load_hf_config(str(name_or_path), revision)
            self._check_kind(hf_config, f"model.name_or_path={name_or_path}")
            if _building_on_meta():  # the preflight: the architecture, not the weights
                model = auto.from_config(hf_config, **kwargs)
            else:
                model = auto.from_pretrained(str(name_or_path), revision=revision, use_safetensors=True,
                                             trust_remote_code=False, **kwargs).train()  # it loads in eval mode
        else:
            hf_config = fresh_hf_config(config, vocab_size)
            self._check_kind(hf_config, f"model.config.model_type={hf_config.model_type}")
            model = auto.from_config(hf_config, **kwargs)
        self.hf = model
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
    def tokenizer_for(cls, name_or_path: str | None = None, revision: str | None = None, **_: Any) -> Any | None:
        """The tokenizer a model of these arguments comes with (None for a fresh config)."""
        return load_tokenizer(str(name_or_path), revision) if name_or_path else None

    @property
    def mask_id(self) -> int | None:
        """The model's [MASK] token id (its config's `mask_token_id`), None where it has none."""
        value = getattr(self.hf.config, "mask_token_id", None)
        return int(value) if isinstance(value, int) else None

    def forward(self, idx: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Logits (batch, seq, vocab) of token ids (batch, seq); `key_padding_mask` (batch, seq), True = real token."""
        mask = None if key_padding_mask is None else key_padding_mask.long()
        if not self.bidirectional or self.adapter.bidirectional:
            return self.adapter.logits(self.hf, idx, mask)
        b, t = idx.shape
        keys = torch.ones(b, t, dtype=torch.bool, device=idx.device) if mask is None else mask.bool()
        full = keys[:, None, None, :].expand(b, 1, t, t)  # every query sees every real key
        logits = self.adapter.logits(self.hf, idx, full)
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1) if self.adapter.shifted else logits

    def save_pretrained(self, folder: str | Path, tokenizer: Any | None = None) -> None:
        """Write the model in transformers' own layout (config.json, model.safetensors, generation config), and the
        tokenizer's files where there is one."""
        self.hf.save_pretrained(str(folder), safe_serialization=True)
        if tokenizer is None:
            tokenizer = self.tokenizer_for(**self.init_config)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder))


class HFCausalLM(HFLanguageModel):
    """A transformers causal LM (`AutoModelForCausalLM`): Llama, Qwen2/3, Mistral, Mixtral, Qwen2-MoE, OLMoE, ..."""

    def __init__(self, name_or_path: str | None = None, config: dict[str, Any] | None = None,
                 vocab_size: int | None = None, revision: str | None = None, dtype: str = "float32",
                 attn_implementation: str | None = "sdpa", causal: bool = True):
        super().__init__(name_or_path, config, vocab_size, revision, dtype, attn_implementation, causal)


class HFMaskedLM(HFLanguageModel):
    """A transformers masked LM (`AutoModelForMaskedLM`: BERT, RoBERTa, ModernBERT, ...): bidirectional, logits at
    each position, a [MASK] token: an MDLM backbone."""

    kind = "masked"
    auto_class = "AutoModelForMaskedLM"

    def __init__(self, name_or_path: str | None = None, config: dict[str, Any] | None = None,
                 vocab_size: int | None = None, revision: str | None = None, dtype: str = "float32",
                 attn_implementation: str | None = "sdpa"):
        super().__init__(name_or_path, config, vocab_size, revision, dtype, attn_implementation)


class HFFeatures(nn.Module):
    """Pooled hidden states of a transformers model: token ids (batch, seq) -> features (batch, hidden), e.g. as
    GICDM's `feature` (as a timm model with `num_classes=0` gives image features).

    `model`: a framework HF model (`HFCausalLM`, `HFMaskedLM`), a transformers model, or a Hub id / folder (loaded
    with `AutoModel`). `layer`: which hidden state (-1: the last); `pool`: "mean" over real tokens, "last" (the last
    real token: a causal LM's summary) or "first" (a masked LM's [CLS]). Real tokens are those where
    `attention_mask` is 1 (default: every token)."""

    POOLS = ("mean", "last", "first")

    def __init__(self, model: nn.Module | str, layer: int = -1, pool: str = "mean"):
        super().__init__()
        if pool not in self.POOLS:
            raise ValueError(f"pool={pool!r} is invalid; valid: {', '.join(self.POOLS)}")
        if isinstance(model, str):
            load_hf_config(model)  # a clear error for a bad id or folder
            model = _transformers().AutoModel.from_pretrained(model, use_safetensors=True, trust_remote_code=False)
        self.hf = model.hf if isinstance(model, HFLanguageModel) else model
        self.layer, self.pool = int(layer), pool

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.long()
        out = self.hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        hidden = out.hidden_states[self.layer].float()
        if self.pool == "first":
            return hidden[:, 0]
        if self.pool == "last":
            last = mask.sum(1).clamp(min=1) - 1
            return hidden[torch.arange(ids.shape[0], device=ids.device), last]
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)


def is_hf_model(model: Any) -> bool:
    """True for a transformers model wrapped here (`HFLanguageModel`)."""
    return isinstance(model, HFLanguageModel)


__all__ = ["ADAPTERS", "Adapter", "HFCausalLM", "HFFeatures", "HFLanguageModel", "HFMaskedLM", "adapter_for",
           "fresh_hf_config", "is_hf_model", "load_hf_config", "load_tokenizer", "register_adapter"]
