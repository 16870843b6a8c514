"""The preflight's build: everything a run builds, built once on the meta device (`accelerate.init_empty_weights`;
no data loaded), so a constructor that refuses a value does so before anything is written, as one PreflightError
naming the group, its choice and the reason. Also: the data's sequence length against the model's, and what a
strategy cannot run."""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig

from framework import assembly, run_tools
from framework.errors import InputError, PreflightError

#: where a constructor error is raised (the innermost frame of a chosen component) → the group it belongs to
PART_GROUPS = ("model", "loss", "optimizer", "scheduler", "sampler", "metric", "module")


def build_parts(job: DictConfig, choices: dict[str, Any]) -> tuple[Any, Any]:
    """Build what the run builds (models on the meta device, no data loaded); errors become PreflightError.
    Returns the LightningModule (on meta; None for a config without data or module) and the data module."""
    from accelerate import init_empty_weights
    from hydra_zen import instantiate

    check_user_tools(job.trainer)
    parts: dict[str, Any] = {}
    for name in ("data", "model", "module", "optimizer", "scheduler", "loss", "metric", "sampler", "trainer", "peft"):
        if job.get(name) is not None:
            check_numbers(name, job[name])
        with _refusal(name, choices.get(name)):
            parts[name] = instantiate(job[name]) if job.get(name) is not None else None
    callbacks = {}
    for name, node in (job.get("callbacks") or {}).items():
        with _refusal(f"callbacks.{name}", None):
            callbacks[name] = instantiate(node)
    if job.get("guard") is not None:  # the NaN/inf guard: its values are checked here, it is built by the run
        check_numbers("guard", job.guard)
        with _refusal("guard", None):
            instantiate(job.guard)
    data = parts.pop("data")
    trainer = run_tools.with_auto_precision(parts.pop("trainer"))
    peft = parts.pop("peft")
    if data is None or parts["module"] is None:
        return None, data
    with _refusal(None, choices), init_empty_weights():
        lm, callbacks = assembly.assemble(data=data, callbacks=callbacks, seed=job.seed, choices=choices, peft=peft,
                                          **parts)
    with _refusal("peft", choices.get("peft")), init_empty_weights():
        assembly.attach_adapters(lm, peft)  # an adapter init_from= is attached by the run (it reads the repo)
    with _refusal(None, choices), init_empty_weights():
        if hasattr(lm, "configure_optimizers"):
            try:
                lm.configure_optimizers()
            except (RuntimeError, NotImplementedError, AttributeError):
                pass  # needs a running trainer or real tensors: the run checks it when it gets there
    check_lengths(data, getattr(lm, "model", None), choices)
    if callable(getattr(lm, "check_data", None)):  # a value checked against the run's real data sizes
        with _refusal("module", choices.get("module")):
            lm.check_data(data)
    theirs = run_tools.user_callbacks(trainer.keywords.get("callbacks"))  # the run merges them with ours
    named = {**{f"callbacks.{n}": cb for n, cb in callbacks.items()},
             **{f"trainer.callbacks[{i}]": cb for i, cb in enumerate(theirs)}}
    try:
        run_tools.check_loggers_needed(trainer.keywords.get("logger"), named)
    except InputError as err:
        raise PreflightError(str(err)) from None
    with _refusal("trainer", None), _quiet_lightning():
        bar = run_tools.show_progress_bar(trainer.keywords.get("enable_progress_bar"), theirs)
        built = trainer(callbacks=run_tools.merge_callbacks(list(callbacks.values()), theirs), logger=False,
                        enable_progress_bar=bar)
    check_strategy(built, lm, callbacks, job.trainer.get("strategy"))
    for name, callback in named.items():  # e.g. orthogonal_growth: every copy of the model is one it grows
        try:
            getattr(callback, "check_run", lambda *_: None)(built, lm)
        except (ValueError, TypeError, NotImplementedError) as err:
            raise PreflightError(f"{name}: {err}") from None
    return lm, data


def check_data_source(data: Any) -> None:
    """The user's data (a module with `document_batches`, e.g. data=text / chat) gives at least one document in each
    split it reads: a source whose every row is empty, or skipped (a conversation with no assistant turn), is
    refused here, not once the run dir is written. Read until the first document; looked at once per fingerprint."""
    read = getattr(data, "document_batches", None)
    if not callable(read) or not isinstance(getattr(data, "fingerprint", None), str):
        return
    from framework.data import sources
    from framework.data.packing import fingerprint

    key = fingerprint({"documents-in": data.fingerprint})
    if sources.remembered(data.root, key) is not None:
        return
    for split in [data.split, *([data.val_split] if data.val_split else [])]:
        try:
            found = next((batch for batch in read(None, split) if len(batch)), None)
        except InputError as err:
            raise PreflightError(str(err)) from None
        if found is None:
            why = ("every row is skipped (a conversation with no assistant turn, or one cut by data.seq_len to no "
                   "target)" if callable(getattr(data, "renderer", None)) else
                   f"every value of data.column={data.column!r} is empty or null")
            raise PreflightError(f"data.source={data.source.spec}: the {split} split has no document to train on: "
                                 f"{why} (an empty source)")
    sources.remember(data.root, key, {"documents": True})


def check_user_tools(trainer: DictConfig) -> None:
    """`trainer.logger` and `trainer.callbacks` build, and are Lightning loggers and callbacks (`framework.run_tools`
    says what each form means); else a PreflightError naming the setting and the forms that work."""
    from hydra_zen import instantiate
    from omegaconf import OmegaConf

    for key, check in (("logger", run_tools.user_loggers), ("callbacks", run_tools.user_callbacks)):
        node = trainer.get(key)
        if node is None or (key == "logger" and isinstance(node, bool)):
            continue
        try:
            check(instantiate(node) if OmegaConf.is_config(node) else node)
        except InputError as err:
            raise PreflightError(str(err)) from None
        except Exception as err:  # noqa: BLE001 - a user's class that cannot be found or built: say which and why
            while err.__cause__ is not None:
                err = err.__cause__
            reason = " ".join(str(err).split()) or type(err).__name__
            raise PreflightError(f"trainer.{key}: cannot build it ({type(err).__name__}: {reason})") from None


def check_numbers(group: str, node: Any) -> None:
    """A value given as text where the part's constructor takes a number (`optimizer.lr=abc`) is refused, naming
    the setting, the value and the type the constructor declares (its type hints; the build itself checks ranges)."""
    from hydra_zen import get_target

    try:
        target = get_target(node)
        hints = typing.get_type_hints(target if inspect.isfunction(target) else target.__init__)
    except (TypeError, ValueError, NameError, AttributeError):  # no target, or hints that do not resolve
        return
    for key, value in node.items():
        hint = hints.get(str(key))
        if isinstance(value, str) and "${" not in value and hint is not None and _wants_number(hint):
            try:
                float(value)
            except ValueError:
                name = getattr(target, "__name__", str(target))
                raise PreflightError(f"{group}.{key}={value!r} is not a number: {name} takes {key}: "
                                     f"{_type_name(hint)}") from None


def _wants_number(hint: Any) -> bool:
    """True if `hint` admits int or float but not str (nor Any)."""
    args = typing.get_args(hint) or (hint,)
    flat = [a for arg in args for a in (typing.get_args(arg) or (arg,))]
    return any(a in (int, float) for a in flat) and not any(a in (str, Any) for a in flat)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_strategy(trainer: Any, lm: Any, callbacks: dict[str, Any], setting: Any) -> None:
    """Under FSDP2 (`trainer.strategy=fsdp2`) the module must shard itself and train nothing outside its model;
    a callback with `check_strategy(strategy)` (e.g. orthogonal_growth) says whether it runs under the strategy."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from framework.strategies import unshardable

    reason = unshardable(lm) if isinstance(trainer.strategy, ModelParallelStrategy) else None
    if reason:
        raise PreflightError(f"trainer.strategy={setting}: {reason}")
    for name, callback in callbacks.items():
        try:
            getattr(callback, "check_strategy", lambda _: None)(trainer.strategy)
        except NotImplementedError as err:
            raise PreflightError(f"trainer.strategy={setting}: callbacks.{name}: {err}") from None


def check_lengths(data: Any, model: Any, choices: dict[str, Any]) -> None:
    """The data's sequences fit the model's position table (`max_seq_len`)."""
    limit = getattr(model, "max_seq_len", None)
    if not isinstance(limit, int):
        return
    seq_len, max_len = getattr(data, "seq_len", None), getattr(data, "max_len", None)
    key = getattr(model, "max_seq_len_key", None)  # a Hugging Face model: its config's max_position_embeddings
    limit_is, raise_it = ((f"{key} ({limit})", "use a model with more positions") if key
                          else (f"model.max_seq_len={limit}", "raise model.max_seq_len"))
    if isinstance(seq_len, int) and seq_len > limit:
        raise PreflightError(f"data.seq_len={seq_len} is longer than {limit_is}, the longest sequence "
                             f"the model '{choices.get('model')}' takes: set data.seq_len <= {limit} or {raise_it}")
    if isinstance(max_len, int) and max_len > limit:
        raise PreflightError(f"data '{choices.get('data')}' makes sequences of up to {max_len} tokens, longer than "
                             f"{limit_is}: {raise_it} (>= {max_len}) or shorten the data")


@contextmanager
def _refusal(group: str | None, choice: Any) -> Iterator[None]:
    """Turn a constructor's ValueError/TypeError (and Lightning's MisconfigurationException) into a PreflightError
    naming the group and choice. With `group=None`, `choice` is the choices dict and the group is found from the
    traceback (the innermost frame inside a chosen component)."""
    from hydra.errors import InstantiationException
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        yield
    except PreflightError:
        raise
    except (ValueError, TypeError, MisconfigurationException, InstantiationException) as err:
        cause = err
        while isinstance(cause, InstantiationException) and cause.__cause__ is not None:
            cause = cause.__cause__
        refused = isinstance(cause, (ValueError, TypeError, MisconfigurationException))
        if not refused or "meta tensor" in str(cause).lower():
            raise  # not a refused value (an import problem, a step meta tensors cannot take): check_job skips it
        if group is None:
            group = _group_of(cause, choice)
            choice = choice.get(group) if group else None
        where = f"{group} '{choice}': " if group and choice else (f"{group}: " if group else "")
        raise PreflightError(where + " ".join(str(cause).split())) from None


def _group_of(err: BaseException, choices: dict[str, Any]) -> str | None:
    """The group whose chosen component raised `err`: the innermost traceback frame that runs inside it."""
    from framework.registry import GROUPS

    targets: dict[str, Any] = {}
    for group in PART_GROUPS:
        name = choices.get(group)
        if isinstance(name, str) and name in GROUPS.get(group, ()):
            targets[group] = GROUPS[group].get(name)
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        owner = frame.f_locals.get("self")
        for group, target in targets.items():
            if (inspect.isclass(target) and isinstance(owner, target)) or getattr(target, "__code__", None) is \
                    frame.f_code:
                return group
    return None


@contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Silence Lightning's 'GPU available...' lines while the preflight builds a Trainer (the run prints them)."""
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
