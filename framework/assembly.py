"""Wiring the built groups into a run: the LightningModule and the callback set. The run pipeline
(`framework.pipeline`) and the preflight (`framework.preflight`, on the meta device) both call `assemble`."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from typing import Any

import lightning as L

from framework.modules.data_spec import DataSpec
from framework.registry import LOSSES, METRICS, MODULES, SAMPLERS

#: group → the module's constructor argument it is handed to (the `loss` group is a module's extra loss term)
MODULE_ARGS = {"loss": "extra_loss", "metric": "metric"}
#: the data's special-token ids a model factory taking `special_ids` gets (those the data states)
SPECIAL_IDS = ("pad_id", "bos_id", "eos_id", "mask_id")


def assemble(
    data: Any,
    model: Any,
    module: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    loss: Any = None,
    metric: Any = None,
    sampler: Any = None,
    callbacks: dict[str, L.Callback] | None = None,
    seed: int | None = 0,
    choices: dict[str, Any] | None = None,
    peft: Any = None,
) -> tuple[L.LightningModule, dict[str, L.Callback]]:
    """Wire the built groups into the LightningModule and the callback set that `train` fits (the CLI's preflight
    runs the same on the meta device, so a group this ignores would show). A data module without a seed takes
    the run's. A `loss` or `metric` goes to a module whose constructor takes it (`MODULE_ARGS`); any other module
    refuses it (ValueError naming the modules that take one, and the group's choice from `choices` if given)."""
    if getattr(data, "seed", 0) is None:
        data.seed = seed
    hand_tokenizer(model, data)
    hand_data_config(model, data)
    model = hand_special_ids(model, data)
    model = hand_quantization(model, peft)
    spec = appended_mask(module, DataSpec.of(data))
    extra = {MODULE_ARGS[group]: _handed_to(module, group, part, (choices or {}).get(group))
             for group, part in (("loss", loss), ("metric", metric)) if part is not None}
    if "extra_loss" in extra:  # the loss is built (with the data's mask and pad ids) once the module takes it
        extra["extra_loss"] = spec.complete(loss)()
    lm = spec.complete(module)(model=model, optimizer=optimizer, scheduler=scheduler, **extra)
    hand_seq_len(getattr(lm, "model", None), data)
    callbacks = dict(callbacks or {})
    if sampler is not None and getattr(data, "streaming", False):
        choice = (choices or {}).get("sampler")
        raise ValueError(f"sampler={choice or _registered_name(SAMPLERS, getattr(sampler, 'func', type(sampler)))}: "
                         "a selection sampler scores and re-draws rows by their index, which a stream "
                         "(data.streaming=true) does not have; drop one (data.streaming=false reads the cached rows)")
    if sampler is not None:  # a selection policy: the DataSelection callback runs it (added if not listed)
        from framework.callbacks.selection import with_selection

        callbacks = with_selection(callbacks, sampler() if isinstance(sampler, functools.partial) else sampler, seed)
    return lm, callbacks


#: the longest rows `data.seq_len=null` makes from a model's context length (a 128k-context model trains on 2048)
SEQ_LEN_CAP = 2048


def hand_seq_len(model: Any, data: Any) -> int | None:
    """Data whose `seq_len` is None takes the model's context length (`max_seq_len`: a transformers config's
    max_position_embeddings) up to `SEQ_LEN_CAP`, and says so; ValueError when the model states none."""
    if getattr(data, "seq_len", 0) is not None:
        return None
    limit = getattr(model, "max_seq_len", None)
    if not isinstance(limit, int):
        raise ValueError(f"data.seq_len=null takes the model's context length, but {type(model).__name__} states none"
                         " (no max_position_embeddings): give data.seq_len")
    data.seq_len = min(limit, SEQ_LEN_CAP)
    logging.getLogger("framework.data").info(
        "data.seq_len=%d: the model's context length (%d)%s", data.seq_len, limit,
        f", capped at {SEQ_LEN_CAP} (set data.seq_len= for longer rows)" if limit > SEQ_LEN_CAP else "")
    return data.seq_len


def attach_adapters(lm: L.LightningModule, peft: Any = None, adapter_from: str | None = None) -> str | None:
    """Put the `peft` group's adapters (`peft=lora`), or the PEFT adapter saved at `adapter_from` (an `init_from=`
    that holds one: its own values, trained on), into `lm.model` in place, after the base weights are loaded and
    before the optimizer sees the parameters. Returns `trainable N of M parameters` (None when there are none)."""
    if peft is None and adapter_from is None:
        return None
    from framework.models.peft_adapters import attach, trainable_line

    attach(lm.model, peft, adapter_from)
    return trainable_line(lm.model)


def appended_mask(module: Any, spec: DataSpec) -> DataSpec:
    """`spec` with the [MASK] a masked diffusion module appends to a vocabulary that has none (id `vocab_size`, the
    vocabulary one larger: MDLM's convention, `framework.modules.mdlm`), so a loss built beside it (`mask_agnostic`)
    masks with the same id. Unchanged where the data states a mask id, or the module takes none or is given one."""
    target = getattr(module, "func", module)
    given = getattr(module, "keywords", {})
    if spec.mask_id is not None or spec.vocab_size is None or given.get("mask_id") is not None or \
            "mask_id" not in _parameters(target):
        return spec
    return dataclasses.replace(spec, mask_id=spec.vocab_size, vocab_size=spec.vocab_size + 1)


def _parameters(target: Any) -> Any:
    try:
        return inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin or an object without a signature: it takes nothing by name
        return {}


def hand_tokenizer(model: Any, data: Any) -> Any:
    """A model that brings its own tokenizer (a Hugging Face model loaded by name) gives it to the data, so text is
    tokenized its way; data that cannot take one (a task with its own symbol ids) keeps its ids, which must fit
    the model's vocabulary. Returns the tokenizer (None without one)."""
    target = getattr(model, "func", type(model))
    ask = getattr(target, "tokenizer_for", None)
    if not callable(ask):
        return None
    tokenizer = ask(**getattr(model, "keywords", {})) if isinstance(model, functools.partial) else \
        getattr(model, "tokenizer", None)
    if tokenizer is not None and callable(getattr(data, "use_tokenizer", None)):
        data.use_tokenizer(tokenizer)
    return tokenizer


def hand_data_config(model: Any, data: Any) -> dict[str, Any] | None:
    """A model factory that states its data config (timm's input size, interpolation, mean, std, crop: its
    `data_config_for`, asked before anything is built) gives it to data that takes one (`use_data_config`), so images
    are resized and normalised the model's way; other data (digits: fixed arrays) is left alone. Returns it (None)."""
    ask = getattr(model.func, "data_config_for", None) if isinstance(model, functools.partial) else None
    take = getattr(data, "use_data_config", None)
    if not callable(ask) or not callable(take):
        return None
    config = ask(**model.keywords)
    take(config)
    return config


def hand_special_ids(model: Any, data: Any) -> Any:
    """`model` (a factory) with the data's special-token ids (`SPECIAL_IDS` it states, after it took a tokenizer) as
    `special_ids` where it takes them and has none: a fresh HF config's pad/bos/eos are then the data's."""
    if not isinstance(model, functools.partial) or model.keywords.get("special_ids") is not None or \
            "special_ids" not in inspect.signature(model.func).parameters:
        return model
    ids = {name: int(getattr(data, name)) for name in SPECIAL_IDS if isinstance(getattr(data, name, None), int)}
    return functools.partial(model, special_ids=ids)


def hand_quantization(model: Any, peft: Any) -> Any:
    """`model` (a factory) with the `peft` group's base quantization (`peft=qlora`: 4-bit) where it takes one."""
    ask = getattr(peft, "quantization", None)
    if not callable(ask) or not isinstance(model, functools.partial) or \
            "quantization" not in inspect.signature(model.func).parameters:
        return model
    return functools.partial(model, quantization=ask())


def _handed_to(module: Any, group: str, part: Any, choice: str | None = None) -> Any:
    """`part` (the built `group` choice), after checking that `module` takes it; ValueError in the user's words."""
    target, arg = getattr(module, "func", module), MODULE_ARGS[group]
    if arg in inspect.signature(target).parameters:
        return part
    registry = {"loss": LOSSES, "metric": METRICS}[group]
    kind = getattr(part, "func", type(part))
    names = [n for n in registry.names() if registry.get(n) is kind]
    choice = choice or (names[0] if len(names) == 1 else None)
    chosen = f"{group}={choice}" if choice else f"{group} {getattr(kind, '__name__', kind)}"
    takers = [n for n in MODULES.names() if arg in inspect.signature(MODULES.get(n)).parameters]
    what, verb = ("loss term", "add") if group == "loss" else ("metric", "evaluate")
    raise ValueError(f"{chosen}: module {_registered_name(MODULES, target)!r} takes no {what}, so it would be "
                     f"ignored; modules that {verb} one: {', '.join(takers) or '(none)'}")


def _registered_name(registry: Any, target: Any) -> str:
    try:
        return registry.name_of(target)
    except LookupError:
        return getattr(target, "__name__", repr(target))
