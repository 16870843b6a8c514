"""The checks `python -m framework.train` runs before Hydra writes anything (the run dir, `.hydra/`, logs).

The config is composed exactly as Hydra will compose it, then everything a run builds is built once, cheaply:
the data module (constructors only; no data are loaded), the model and module on the meta device
(`accelerate.init_empty_weights`), the optimizer and schedule, loss, metric, sampler, callbacks and the
Trainer. An out-of-range value then fails here, as one `PreflightError` naming the setting, its value and what
is valid, instead of after `.hydra/` is written with a traceback. Also checked: the run dir can be created,
trainer values, the seed, NaN values, the data's sequence length against the model's, and that `init_from=`
and `ckpt_path=` point at something that exists.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

#: Hydra flags after which nothing runs (help, config printing, shell completion): no preflight for them
NO_RUN_FLAGS = frozenset({"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-i", "--info", "-sc",
                          "--shell-completion", "--experimental-rerun", "-cp", "--config-path", "-cn",
                          "--config-name", "-cd", "--config-dir"})
#: sweeps larger than this are checked on their first MAX_JOBS combinations only (each check composes once)
MAX_JOBS = 32
HUB_TIMEOUT_S = 10.0
#: where a constructor error is raised (the innermost frame of a chosen component) → the group it belongs to
PART_GROUPS = ("model", "loss", "optimizer", "scheduler", "sampler", "metric", "module")


class PreflightError(ValueError):
    """A run that would fail, found before anything is written; the message names the setting and what is valid."""


def preflight(argv: list[str], config_name: str = "train") -> None:
    """Raise PreflightError if the run `argv` describes (every job of a `-m` sweep) would fail on a bad value."""
    if os.environ.get("LOCAL_RANK", "0") != "0" or NO_RUN_FLAGS.intersection(argv):
        return  # a DDP child (rank 0 checked the same command) or a command that runs nothing
    multirun = "-m" in argv or "--multirun" in argv
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    for job in itertools.islice(_jobs(overrides), MAX_JOBS):
        check_job(job, config_name, multirun)


def _jobs(overrides: list[str]) -> Iterator[list[str]]:
    """The override lists of every job a sweep runs (one list for a plain run)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        options = [[f"{ov.get_key_element()}={v}" for v in ov.sweep_string_iterator()]
                   if ov.is_sweep_override() else [arg] for ov, arg in zip(parsed, overrides, strict=True)]
    except (HydraException, ValueError, TypeError):
        return  # malformed overrides or sweeps only a sweeper plugin understands: Hydra reports those itself
    for combo in itertools.product(*options):
        yield list(combo)


def compose_job(overrides: list[str], config_name: str = "train", multirun: bool = False) -> DictConfig | None:
    """The job config Hydra will run (hydra node included), with `hydra:runtime.output_dir` resolvable.

    None when Hydra cannot compose it (Hydra then reports why). The run dir is not created.
    """
    from hydra import compose, initialize
    from hydra.core.hydra_config import HydraConfig

    with initialize(version_base="1.3", config_path=None):
        try:
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        except Exception:  # noqa: BLE001 - composition errors are Hydra's to report, with its own message
            return None
    with open_dict(cfg):
        run_dir = Path(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))
        cfg.hydra.runtime.output_dir = str(run_dir.absolute())
    HydraConfig.instance().set_config(cfg)
    return cfg


def check_job(overrides: list[str], config_name: str = "train", multirun: bool = False) -> None:
    """Compose one job and check it; PreflightError on the first problem."""
    from hydra.core.hydra_config import HydraConfig

    cfg = compose_job(overrides, config_name, multirun)
    if cfg is None:
        return
    try:
        _check_composed(cfg, choices=dict(cfg.hydra.runtime.choices), multirun=multirun)
    except PreflightError:
        raise
    except Exception:  # noqa: BLE001 - not a refused value: the run itself meets it and reports it in full
        return
    finally:
        HydraConfig.instance().cfg = None  # the run sets its own; nothing of the check stays behind


def _check_composed(cfg: DictConfig, choices: dict[str, Any], multirun: bool) -> None:
    """The checks, in the order a user would want to hear of them: where the run goes, values, then the build."""
    check_run_dir(Path(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir)),
                  "hydra.sweep.dir" if multirun else "hydra.run.dir")
    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    check_values(job)
    check_trainer(job.trainer)
    build_parts(job, choices)
    if job.get("init_from"):
        check_init_from(str(job.init_from))
    repo_id = OmegaConf.select(job, "hub.repo_id")
    if repo_id:
        from framework.hub import check_repo_id

        try:
            check_repo_id(str(repo_id))
        except ValueError as err:
            raise PreflightError(f"hub.repo_id={repo_id}: {err}") from None
    if job.get("ckpt_path") and not Path(str(job.ckpt_path)).is_file():  # the run checks one that exists in full
        from framework.checkpointing import CheckpointError, load_checkpoint_file

        try:
            load_checkpoint_file(str(job.ckpt_path))
        except CheckpointError as err:
            raise PreflightError(f"ckpt_path={job.ckpt_path}: {err} (give a .ckpt file, e.g. "
                                 "outputs/train/<date>_<time>/checkpoints/last.ckpt)") from None


def check_run_dir(run_dir: Path, key: str = "hydra.run.dir") -> None:
    """The run dir exists as a writable directory, or can be created: its first existing ancestor is a
    writable directory (probed by creating and removing a temporary directory there, which also works as root)."""
    path = run_dir.absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise PreflightError(f"{key}={run_dir} cannot be created: {existing} is a file, not a directory "
                             f"(choose another {key}=...)")
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as err:
        raise PreflightError(f"{key}={run_dir} cannot be created: {existing} is not writable "
                             f"({err.strerror or err}); choose a writable {key}=...") from None


def check_values(job: DictConfig) -> None:
    """No NaN anywhere; the seed is an integer numpy and torch accept; threads is a positive integer or null."""
    for key, value in _leaves(OmegaConf.to_container(job, resolve=False)):
        if isinstance(value, float) and math.isnan(value):
            raise PreflightError(f"{key}=nan is not a number; give a finite value")
    seed = job.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise PreflightError(f"seed={seed!r} must be an integer in [0, 2**32 - 1], e.g. seed=0")
    threads = job.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise PreflightError(f"threads={threads!r} must be a positive integer, or null (torch's default)")


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, node


def check_trainer(trainer: DictConfig) -> None:
    """The trainer values a user types most, with the valid range (Lightning checks the rest when it is built)."""
    devices = trainer.get("devices")
    as_int = int(devices) if isinstance(devices, str) and devices.lstrip("-").isdigit() else devices
    if isinstance(as_int, bool) or (isinstance(as_int, int) and (as_int == 0 or as_int < -1)):
        raise PreflightError(f"trainer.devices={devices!r} must be >= 1, or -1 / 'auto' (every available device)")
    for key in ("max_steps", "max_epochs"):
        value = trainer.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < -1):
            raise PreflightError(f"trainer.{key}={value!r} must be an integer >= 0, or -1 for no limit")
    accelerator = trainer.get("accelerator")
    if isinstance(accelerator, str):
        available = available_accelerators()
        if accelerator.lower() not in available:
            raise PreflightError(f"trainer.accelerator={accelerator!r} is not available on this machine; available:"
                                 f" {', '.join(available)}")


def available_accelerators() -> list[str]:
    """Accelerator names Lightning can run here ('gpu' only with CUDA or MPS present)."""
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    names = ["auto", "cpu"]
    if CUDAAccelerator.is_available():
        names += ["gpu", "cuda"]
    if MPSAccelerator.is_available():
        names += ["gpu", "mps"] if "gpu" not in names else ["mps"]
    return names


def build_parts(job: DictConfig, choices: dict[str, Any]) -> None:
    """Build what the run builds (models on the meta device, no data loaded); errors become PreflightError."""
    from accelerate import init_empty_weights
    from hydra_zen import instantiate

    from framework.train import assemble

    parts: dict[str, Any] = {}
    for name in ("data", "model", "module", "optimizer", "scheduler", "loss", "metric", "sampler", "trainer"):
        with _refusal(name, choices.get(name)):
            parts[name] = instantiate(job[name]) if job.get(name) is not None else None
    callbacks = {}
    for name, node in (job.get("callbacks") or {}).items():
        with _refusal(f"callbacks.{name}", None):
            callbacks[name] = instantiate(node)
    data = parts.pop("data")
    trainer = parts.pop("trainer")
    if data is None or parts["module"] is None:
        return
    with _refusal(None, choices), init_empty_weights():
        lm, callbacks = assemble(data=data, callbacks=callbacks, seed=job.seed, choices=choices, **parts)
        if hasattr(lm, "configure_optimizers"):
            try:
                lm.configure_optimizers()
            except (RuntimeError, NotImplementedError, AttributeError):
                pass  # needs a running trainer or real tensors: the run checks it when it gets there
    check_lengths(data, getattr(lm, "model", None), choices)
    with _refusal("trainer", None), _quiet_lightning():
        built = trainer(callbacks=list(callbacks.values()), logger=False, enable_progress_bar=False)
    check_strategy(built, lm, callbacks, job.trainer.get("strategy"))


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
    if isinstance(seq_len, int) and seq_len > limit:
        raise PreflightError(f"data.seq_len={seq_len} is longer than model.max_seq_len={limit}, the longest sequence "
                             f"the model '{choices.get('model')}' takes: set data.seq_len <= {limit} or raise "
                             "model.max_seq_len")
    if isinstance(max_len, int) and max_len > limit:
        raise PreflightError(f"data '{choices.get('data')}' makes sequences of up to {max_len} tokens, longer than "
                             f"model.max_seq_len={limit}: raise model.max_seq_len to >= {max_len} or shorten the data")


def check_init_from(source: str) -> None:
    """`init_from=` names an existing run dir, a `.ckpt` file, or a model repo the Hub has (one short request)."""
    from framework.runs import LAST_CHECKPOINT

    path = Path(source)
    if path.is_dir():
        if not (path / LAST_CHECKPOINT).is_file():
            raise PreflightError(f"init_from={source}: the run dir has no {LAST_CHECKPOINT}")
        return
    if path.is_file():
        return
    if path.suffix == ".ckpt":
        raise PreflightError(f"init_from={source}: no such checkpoint file")
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from framework.hub import check_repo_id

    what = f"init_from={source}: no such local run dir or .ckpt file"
    try:
        check_repo_id(source)
    except ValueError:
        raise PreflightError(f"{what}, and not a Hub repo id ('namespace/name')") from None
    cached = isinstance(try_to_load_from_cache(source, "config.json"), str)
    if constants.HF_HUB_OFFLINE:
        if not cached:
            raise PreflightError(f"{what}; HF_HUB_OFFLINE is set and the Hub repo '{source}' is not in the local cache")
        return
    try:
        HfApi().model_info(source, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; the download says whether this token may read it
    except RepositoryNotFoundError:
        raise PreflightError(f"{what}, and the Hub at {constants.ENDPOINT} has no model repo '{source}' (push one "
                             "with hub.repo_id=... or `python -m framework.hub push`)") from None
    except Exception as err:  # noqa: BLE001 - unreachable Hub: fine if a cached copy exists
        if not cached:
            raise PreflightError(f"{what}, and the Hub at {constants.ENDPOINT} cannot be reached to look for "
                                 f"'{source}' ({type(err).__name__}: {err})") from None


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


__all__ = ["PreflightError", "preflight", "check_job", "compose_job", "check_run_dir", "check_init_from"]
