"""A push of a model that trains PEFT adapters (`peft=lora`): PEFT's own format by default (`adapter_config.json` +
`adapter_model.safetensors`, naming the base model and its revision, with the tokenizer), which
`PeftModel.from_pretrained(base, repo)` opens; with `peft.merge=true`, or for the framework's own models, the merged
model in its usual format (`AutoModelForCausalLM` opens a transformers one)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from torch import nn

from framework.models.peft_adapters import LoRA, attach, peft_model, peft_spec

#: a push bundle's format when it publishes the adapter alone
ADAPTER = "peft"


def pushes_adapter(model: nn.Module, record: dict[str, Any] | None) -> bool:
    """True when a model with these adapters (`record`, a run's `peft` entry) goes up as the adapter alone: a
    transformers model (PEFT's format names its base by Hub id) without `merge`."""
    from framework.hub.pushable import _is_hf

    return bool(record) and not record.get("merge") and _is_hf(model)


def with_adapters(model: nn.Module, record: dict[str, Any]) -> nn.Module:
    """`model` (the base, rebuilt from a run's config) with the run's adapters attached, to take its weights."""
    attach(model, LoRA.from_record(record))
    return model


def live_push_model(model: nn.Module) -> tuple[nn.Module, bool]:
    """What a live model with adapters publishes: (the model, True) for the adapter alone, else (a merged copy,
    False); a model without adapters as it is. The training model is never changed."""
    spec = peft_spec(model)
    if spec is None:
        return model, False
    if pushes_adapter(model, spec.record()):
        return model, True
    merged = copy.deepcopy(model)
    peft_model(merged).merge_and_unload()  # folds the adapters into the copy's own layers, in place
    for name in ("peft_wrapper", "peft_spec"):
        merged.__dict__.pop(name, None)
    return merged.requires_grad_(True), False


def stage_adapter(model: nn.Module, folder: Path) -> None:
    """Write the adapter in PEFT's format into `folder`, with the base model's tokenizer."""
    peft_model(model).save_pretrained(str(folder))
    tokenizer = model.tokenizer_for(**model.init_config) if hasattr(model, "tokenizer_for") else None
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def adapter_base(model: nn.Module) -> tuple[str | None, str | None]:
    """The base model's Hub id or folder and revision, as the adapter's config names them."""
    config = peft_model(model).peft_config["default"]
    return config.base_model_name_or_path, config.revision


def adapter_usage(base: str | None, base_revision: str | None, repo_id: str, revision: str | None) -> str:
    """The card's snippet that opens the adapter on its base (PEFT), and merges it."""
    rev = f", revision={revision!r}" if revision and revision != "main" else ""
    base_rev = f", revision={base_revision!r}" if base_revision else ""
    return (f"A PEFT LoRA adapter on `{base}`:\n\n```python\nfrom peft import PeftModel\n"
            f"from transformers import AutoModelForCausalLM\n\n"
            f"base = AutoModelForCausalLM.from_pretrained({base!r}{base_rev})\n"
            f"model = PeftModel.from_pretrained(base, {repo_id!r}{rev}).eval()\n"
            f"merged = model.merge_and_unload()  # a plain transformers model\n```\n\n"
            f"or continue training it: `python -m framework.train recipe=sft model.name_or_path={base} "
            f"init_from={repo_id} ...`.\n")


__all__ = ["ADAPTER", "adapter_base", "adapter_usage", "live_push_model", "pushes_adapter", "stage_adapter",
           "with_adapters"]
