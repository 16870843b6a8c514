"""PEFT's LoRA on any model here (the `peft` group: `peft=lora`), for fine-tuning only low-rank adapters.

`LoRA(r, alpha, dropout, target_modules, use_dora, use_rslora, modules_to_save, merge)` holds PEFT's `LoraConfig`
values; `attach(model, spec)` injects the adapters in place with `peft.get_peft_model` (a transformers model inside
`hf_causal_lm` / `hf_masked_lm`, or the framework's own `TransformerLM`), so the model keeps its class, its
`forward` and its names, and only the adapters require grad. `init_from=` an adapter repo or folder (PEFT's
`adapter_config.json` + `adapter_model.safetensors`) continues training that adapter (`PeftModel.from_pretrained`,
is_trainable). The PEFT wrapper is kept beside the model (`peft_model(model)`), outside its module tree, for
`save_pretrained` (PEFT's own format, naming the base model and its revision) and `merge_and_unload`.

`merged_state(state, record)` folds a checkpoint's adapters into plain weights with tensor arithmetic alone (no
`peft` import), so every reader of a run dir (generation, probes, `init_from=`, a merged push) sees the plain model.
`peft` is imported only when an adapter is attached.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

#: where a run's model_config.json records the adapters (`LoRA.record()`)
PEFT_KEY = "peft"
#: PEFT's files (`save_pretrained`)
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
#: `target_modules`' value for every linear layer except the output head (PEFT's shorthand)
ALL_LINEAR = "all-linear"


def _peft() -> Any:
    try:
        import peft
    except ImportError as err:
        raise ImportError("peft=lora needs the `peft` library: pip install 'framework[peft]' (or pip install peft)"
                          ) from err
    return peft


@dataclasses.dataclass
class LoRA:
    """Low-rank adapters (Hu et al., 2021) through PEFT's `LoraConfig`; the defaults are TRL's command line's (r 16,
    alpha 32, dropout 0.05) on every linear layer but the output head.

    Args:
        r: rank of each adapter's A and B matrices, a positive integer.
        alpha: adapter scale numerator: B·A is multiplied by alpha / r (alpha / sqrt(r) with `use_rslora`).
        dropout: dropout probability on the adapters' input, in [0, 1).
        target_modules: "all-linear" (every linear layer but the output head) or a list of layer names to adapt.
            A name matches a layer's full dotted name or its last parts.
        use_dora: weight-decomposed LoRA (DoRA): adapt a magnitude and a direction separately.
        use_rslora: rank-stabilised scaling alpha / sqrt(r) instead of alpha / r.
        modules_to_save: layers trained in full beside the adapters (e.g. a new head); None: none.
        merge: push the model with the adapters merged into its weights, not the adapter alone.
    """

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.05
    target_modules: Any = ALL_LINEAR
    use_dora: bool = False
    use_rslora: bool = False
    modules_to_save: list[str] | None = None
    merge: bool = False

    method = "lora"

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"peft.r={self.r!r} must be a positive integer (the adapters' rank, e.g. 8 or 16)")
        if not (isinstance(self.alpha, (int, float)) and self.alpha > 0):
            raise ValueError(f"peft.alpha={self.alpha!r} must be > 0 (the adapters' scale is alpha / r)")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"peft.dropout={self.dropout!r} must be in [0, 1)")
        names = self.target_modules
        if not (isinstance(names, str) or (isinstance(names, (list, tuple)) and names and
                                           all(isinstance(n, str) for n in names))):
            raise ValueError(f"peft.target_modules={names!r} must be {ALL_LINEAR!r} or a list of layer names")
        self.target_modules = names if isinstance(names, str) else list(names)
        self.modules_to_save = list(self.modules_to_save) if self.modules_to_save else None

    @property
    def scale(self) -> float:
        """The factor on B·A: alpha / r (alpha / sqrt(r) with `use_rslora`)."""
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    def record(self) -> dict[str, Any]:
        """The plain values a run records (model_config.json) and a run dir's readers rebuild the adapters from."""
        return {"method": self.method, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> LoRA:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})

    def lora_config(self, target: nn.Module, task_type: str | None = None) -> Any:
        """PEFT's `LoraConfig` for `target` (a transformers model, or one of ours: "all-linear" is spelled out as its
        linear layers but the output head, which PEFT's shorthand finds only on a transformers model)."""
        peft = _peft()
        names = self.target_modules
        if names == ALL_LINEAR and not _is_transformers(target):
            names = linear_layers(target, exclude_head=True)
        return peft.LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=names,
                               use_dora=self.use_dora, use_rslora=self.use_rslora,
                               modules_to_save=self.modules_to_save, task_type=task_type)


@dataclasses.dataclass
class QLoRA(LoRA):
    """LoRA on a base loaded in 4 bits (QLoRA: bitsandbytes' NF4 with `double_quant`, computing in
    `compute_dtype`), through transformers' `BitsAndBytesConfig` and `peft.prepare_model_for_kbit_training`. It needs
    a CUDA GPU and `bitsandbytes`: refused by name anywhere else.

    The settings it shares with `LoRA` mean the same and are documented there.

    Args:
        quant_type: 4-bit data type of the frozen base: "nf4" (NormalFloat) or "fp4".
        compute_dtype: dtype the 4-bit layers compute in, e.g. "bfloat16" or "float16".
        double_quant: also quantize the quantization constants (saves about 0.4 bits per weight).
    """

    quant_type: str = "nf4"
    compute_dtype: str = "bfloat16"
    double_quant: bool = True

    method = "qlora"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.quant_type not in ("nf4", "fp4"):
            raise ValueError(f"peft.quant_type={self.quant_type!r} is invalid; valid: nf4, fp4")
        if not torch.cuda.is_available():
            raise ValueError("peft=qlora loads the base model in 4 bits with bitsandbytes, whose 4-bit kernels need a "
                             "CUDA GPU, and this machine has none (torch.cuda.is_available() is False); use peft=lora "
                             "here (model.dtype=bfloat16 halves the frozen base's memory)")
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise ValueError("peft=qlora needs the bitsandbytes library for its 4-bit base: pip install bitsandbytes")

    def quantization(self) -> dict[str, Any]:
        """transformers' `BitsAndBytesConfig` values for the base model."""
        return {"load_in_4bit": True, "bnb_4bit_quant_type": self.quant_type,
                "bnb_4bit_compute_dtype": self.compute_dtype, "bnb_4bit_use_double_quant": self.double_quant}


def _is_transformers(module: nn.Module) -> bool:
    return any(c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel" for c in type(module).mro())


def linear_layers(model: nn.Module, exclude_head: bool = False) -> list[str]:
    """The full names of `model`'s `nn.Linear` layers; `exclude_head`: without the output head (`head`, or what
    `get_output_embeddings` returns), whose adapters would train the vocabulary projection."""
    head = getattr(model, "head", None)
    if callable(getattr(model, "get_output_embeddings", None)):
        head = model.get_output_embeddings()
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and not (exclude_head and m is head)]


def adapter_target(model: nn.Module) -> nn.Module:
    """The module the adapters go into: a wrapped transformers model's `.hf`, else the model itself."""
    hf = getattr(model, "hf", None)
    return hf if isinstance(hf, nn.Module) else model


def attach(model: nn.Module, spec: LoRA | None = None, adapter_from: str | None = None,
           revision: str | None = None) -> Any:
    """Inject LoRA adapters into `model` in place (`spec`), or the adapter saved at `adapter_from` (a Hub id or
    folder of PEFT's format: its own config, trainable); freezes the rest. Returns PEFT's wrapper, which is also kept
    as `peft_model(model)`. ValueError naming the model's linear layers when `target_modules` matches none."""
    peft = _peft()
    target = adapter_target(model)
    causal = _is_transformers(target) and getattr(model, "kind", "causal") == "causal"
    task_type = "CAUSAL_LM" if causal else None
    with warnings.catch_warnings():  # PEFT asks transformers a question it has deprecated (not the user's)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        wrapped = _wrap(peft, model, target, spec, adapter_from, revision, task_type)
    if adapter_from is not None:
        spec = _spec_of(wrapped.peft_config["default"], merge=spec.merge if spec else False)
        log.info("peft: continuing the adapter %s with its own values (r=%d, alpha=%g, target_modules=%s; the peft "
                 "group's other values are not used)", adapter_from, spec.r, spec.alpha, spec.target_modules)
    _name_base(wrapped, model)
    object.__setattr__(model, "peft_wrapper", wrapped)  # not a submodule: the parameters keep their own names
    object.__setattr__(model, "peft_spec", spec)
    return wrapped


def _wrap(peft: Any, model: nn.Module, target: nn.Module, spec: LoRA | None, adapter_from: str | None,
          revision: str | None, task_type: str | None) -> Any:
    try:
        if adapter_from is not None:
            return peft.PeftModel.from_pretrained(target, adapter_from, revision=revision, is_trainable=True)
        else:
            assert spec is not None
            if isinstance(spec, QLoRA):
                if not getattr(target, "is_loaded_in_4bit", False):
                    raise ValueError("peft=qlora: the base model was not loaded in 4 bits (model=hf_causal_lm with "
                                     "model.name_or_path= takes peft=qlora's quantization)")
                checkpointing = bool((getattr(model, "init_config", None) or {}).get("gradient_checkpointing"))
                target = peft.prepare_model_for_kbit_training(target, use_gradient_checkpointing=checkpointing,
                                                              gradient_checkpointing_kwargs={"use_reentrant": False})
            return peft.get_peft_model(target, spec.lora_config(target, task_type))
    except ValueError as err:
        if "not found in the base model" not in str(err) and "Target modules" not in str(err):
            raise
        leaves = sorted({n.rsplit(".", 1)[-1] for n in linear_layers(target)})
        raise ValueError(f"peft.target_modules={spec.target_modules if spec else None!r} matches no layer of "
                         f"{type(target).__name__}; its linear layers are named: {', '.join(leaves)} (or use "
                         f"{ALL_LINEAR!r})") from None


def _spec_of(config: Any, merge: bool) -> LoRA:
    """Our values of a saved adapter's `LoraConfig`."""
    names = config.target_modules
    return LoRA(r=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                target_modules=names if isinstance(names, str) else sorted(names), use_dora=config.use_dora,
                use_rslora=config.use_rslora, modules_to_save=sorted(config.modules_to_save or []) or None,
                merge=merge)


def _name_base(wrapped: Any, model: nn.Module) -> None:
    """The adapter's config names the base model by what the run loaded (`model.name_or_path`) and, for a Hub id,
    the commit it resolved to, so `PeftModel.from_pretrained` finds exactly that base."""
    values = getattr(model, "init_config", {}) or {}
    source = values.get("name_or_path")
    config = wrapped.peft_config["default"]
    if source:
        config.base_model_name_or_path = str(source)
        local = Path(str(source)).expanduser().exists()
        config.revision = None if local else _commit_of(str(source), values.get("revision"))


def _commit_of(repo_id: str, revision: str | None) -> str | None:
    """The commit `revision` of the Hub repo resolved to when its config was read (the snapshot folder the cached
    config.json lies in; read from the cache on an offline node), else `revision` as given."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = Path(hf_hub_download(repo_id, "config.json", revision=revision))
    except (OSError, ValueError, EntryNotFoundError):  # unreadable now: the revision as given is still a true record
        return revision
    return path.parent.name if path.parent.parent.name == "snapshots" else revision


def peft_model(model: nn.Module) -> Any | None:
    """PEFT's wrapper of `model`'s adapters (None without adapters)."""
    return getattr(model, "__dict__", {}).get("peft_wrapper")


def peft_spec(model: nn.Module) -> LoRA | None:
    """The adapters' values (None without adapters)."""
    return getattr(model, "__dict__", {}).get("peft_spec")


def parameter_counts(model: Any) -> dict[str, int]:
    """`{"trainable", "total"}` parameters of `model` (what the optimizer updates, of all; `parameters()` yields
    tied weights once); zeros for something that is no module."""
    params = list(model.parameters()) if isinstance(model, nn.Module) else []
    return {"trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params)}


def trainable_line(model: nn.Module) -> str:
    """`trainable N of M parameters (P%)` (`parameter_counts`)."""
    counts = parameter_counts(model)
    trainable, total = counts["trainable"], counts["total"]
    return f"trainable {trainable:,} of {total:,} parameters ({100 * trainable / max(total, 1):.3g}%)"


def is_adapter_source(source: str, revision: str | None = None) -> bool:
    """True when `source` (a folder or Hub id) holds a PEFT adapter (`adapter_config.json`); one small request for
    a Hub id, answered from the cache on an offline node."""
    path = Path(source).expanduser()
    if path.exists():
        return (path / ADAPTER_CONFIG).is_file()
    if str(source).count("/") != 1:
        return False
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        hf_hub_download(str(source), ADAPTER_CONFIG, revision=revision)
    except (EntryNotFoundError, RepositoryNotFoundError, LocalEntryNotFoundError):
        return False
    return True


# ---- a checkpoint's adapters folded into plain weights -----------------------------------------------------------
def is_peft_state(state: dict[str, Tensor]) -> bool:
    """True when `state` holds PEFT-injected layers (`.base_layer.`, `.lora_A.`, `.modules_to_save.`)."""
    return any(".base_layer." in k or ".lora_A." in k or ".modules_to_save." in k for k in state)


def merged_state(state: dict[str, Tensor], record: dict[str, Any], adapter: str = "default") -> dict[str, Tensor]:
    """`state` with each adapted layer's W + scale·B·A (DoRA: rescaled row-wise to its magnitude) as its plain
    `weight`, and each saved module's trained copy as the module: the plain model's keys and values."""
    spec = LoRA.from_record(record)
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if f".lora_A.{adapter}." in key or f".lora_B.{adapter}." in key or ".lora_magnitude_vector." in key or \
                ".original_module." in key:
            continue
        if f".modules_to_save.{adapter}." in key:
            out[key.replace(f".modules_to_save.{adapter}.", ".")] = value
            continue
        if ".base_layer." not in key:
            out.setdefault(key, value)
            continue
        plain, prefix = key.replace(".base_layer.", "."), key.split(".base_layer.")[0]
        a, b = state.get(f"{prefix}.lora_A.{adapter}.weight"), state.get(f"{prefix}.lora_B.{adapter}.weight")
        if not key.endswith(".weight") or a is None or b is None:
            out[plain] = value
            continue
        weight = value.float() + spec.scale * (b.float() @ a.float())
        magnitude = state.get(f"{prefix}.lora_magnitude_vector.{adapter}.weight")
        if magnitude is not None:  # DoRA: each output row's norm set to its learned magnitude
            weight = weight * (magnitude.float() / torch.linalg.norm(weight, dim=1)).unsqueeze(1)
        out[plain] = weight.to(value.dtype)
    return out


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "ALL_LINEAR", "LoRA", "PEFT_KEY", "QLoRA", "adapter_target", "attach",
           "is_adapter_source", "is_peft_state", "linear_layers", "merged_state", "parameter_counts", "peft_model",
           "peft_spec", "trainable_line"]
