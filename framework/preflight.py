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

import itertools
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from framework.build_check import build_parts, check_data_source
from framework.compose import NO_RUN_FLAGS, compose_job
from framework.errors import CheckpointError, InputError, PreflightError

#: sweeps larger than this are checked on their first MAX_JOBS combinations only (each check composes once)
MAX_JOBS = 32
HUB_TIMEOUT_S = 10.0


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


def check_job(overrides: list[str], config_name: str = "train", multirun: bool = False) -> None:
    """Compose one job and check it; PreflightError on the first problem."""
    from hydra.core.hydra_config import HydraConfig

    cfg = compose_job(overrides, config_name, multirun, keep=True)
    if cfg is None:
        return
    try:
        _check_composed(cfg, choices=dict(cfg.hydra.runtime.choices), multirun=multirun)
    except (RuntimeError, NotImplementedError) as err:
        if not _beyond_meta(err):
            raise
        # a step the meta device cannot take (e.g. `.item()` on a meta tensor): the run builds for real and meets it
    finally:
        HydraConfig.instance().cfg = None  # the run sets its own; nothing of the check stays behind


def _beyond_meta(err: BaseException) -> bool:
    """True for an error that only building on the meta device raises (the real run does the step for real)."""
    return isinstance(err, NotImplementedError) or "meta" in str(err).lower()


def _check_composed(cfg: DictConfig, choices: dict[str, Any], multirun: bool) -> None:
    """The checks, in the order a user would want to hear of them: where the run goes, values, then the build."""
    check_run_dir(Path(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir)),
                  "hydra.sweep.dir" if multirun else "hydra.run.dir")
    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    check_read(job)
    check_job_values(job)
    check_trainer(job.trainer)
    quiet = logging.getLogger("framework.data")  # the run says what the data's build says, once, in its log too
    before = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        _check_built(cfg, job, choices)
    finally:
        quiet.setLevel(before)


def _check_built(cfg: DictConfig, job: DictConfig, choices: dict[str, Any]) -> None:
    """The checks that build the parts (the model on the meta device, the data's constructor)."""
    lm, data = build_parts(job, choices)
    if lm is not None:  # the data took the model's tokenizer
        check_data_source(data)
    if job.get("init_from"):
        check_init_from(str(job.init_from))
    repo_id = OmegaConf.select(job, "hub.repo_id")
    if repo_id:
        from framework.hub import check_repo_id

        try:
            check_repo_id(str(repo_id))
        except ValueError as err:
            raise PreflightError(f"hub.repo_id={repo_id}: {err}") from None
    if job.get("ckpt_path"):
        check_ckpt_path(str(job.ckpt_path), lm, Path(str(cfg.hydra.run.dir)), data)


def check_ckpt_path(ckpt_path: str, lm: Any, run_dir: Path, data: Any = None) -> None:
    """`ckpt_path=` (or `auto`) names a finite checkpoint of this very model (`framework.resume.checked_resume`,
    against the module built on the meta device) and of this data (`check_ckpt_data`), so a wrong one leaves no run
    dir behind."""
    from framework.checkpointing import load_checkpoint_file
    from framework.resume import AUTO, checked_resume

    path = None
    try:
        if lm is not None:
            _, path = checked_resume(ckpt_path, lm, run_dir)
        elif ckpt_path != AUTO:
            load_checkpoint_file(ckpt_path)
    except (InputError, CheckpointError) as err:
        message = str(err) if str(err).startswith("ckpt_path=") else f"ckpt_path={ckpt_path}: {err}"
        hint = "" if ckpt_path == AUTO else (" (give a .ckpt file, e.g. outputs/train/<date>_<time>/checkpoints/"
                                             "last.ckpt, or ckpt_path=auto to resume from the run dir's newest one)")
        raise PreflightError(message + hint) from None
    if path is not None:
        check_ckpt_data(path, data)


def check_ckpt_data(path: str, data: Any) -> None:
    """The data module takes the checkpoint's data state (`load_state_dict`, what Lightning hands it on resume): the
    user's data refuses one written on other data, naming both fingerprints (PreflightError, the message as is)."""
    from framework.checkpointing import read_checkpoint

    state = read_checkpoint(path, mmap=True).get(type(data).__qualname__)
    if state is None or not callable(getattr(data, "load_state_dict", None)):
        return
    try:
        data.load_state_dict(state)
    except InputError as err:
        raise PreflightError(str(err)) from None


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


def check_read(job: DictConfig) -> None:
    """Every top-level key is one the run reads (`framework.app.TrainConfig`): `+foo=1` would otherwise be
    accepted and do nothing. A `+key` inside a part (`+model.foo=1`) meets that part's constructor instead."""
    from dataclasses import fields

    from framework.app import TrainConfig

    known = {f.name for f in fields(TrainConfig)} - {"defaults"}
    unread = sorted(str(k) for k in job if k not in known)
    if unread:
        raise PreflightError(f"+{unread[0]}=...: nothing reads the setting {unread[0]!r}, so it would be ignored;"
                             f" the run reads: {', '.join(sorted(known))}")


def check_job_values(job: DictConfig) -> None:
    """No required value left unset (`???`) and no NaN anywhere; the seed is an integer numpy and torch accept;
    threads is a positive integer or null."""
    leaves = list(_leaves(OmegaConf.to_container(job, resolve=False)))
    unset = [key for key, value in leaves if value == MISSING]
    if unset:
        more = f" (also unset: {', '.join(unset[1:])})" if unset[1:] else ""
        raise PreflightError(f"{unset[0]}=??? is a required value left unset: give it on the command line, "
                             f"{unset[0]}=...{more}")
    for key, value in leaves:
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


#: the Trainer arguments whose range Lightning does not check when it is built (it divides by them, or ignores a
#: negative one): lowest valid value and how to say it
TRAINER_RANGES = {
    "max_steps": (1, "an integer >= 1 (0 trains nothing)"),
    "max_epochs": (1, "an integer >= 1 (0 trains nothing)"),
    "accumulate_grad_batches": (1, "an integer >= 1 (batches per optimizer step)"),
    "log_every_n_steps": (1, "an integer >= 1"),
    "check_val_every_n_epoch": (1, "an integer >= 1, or null"),
    "gradient_clip_val": (0, "a number >= 0, or null (no clipping)"),
    "val_check_interval": (1e-12, "> 0: a fraction of an epoch (0, 1] or a number of steps, or null"),
    "num_nodes": (1, "an integer >= 1"),
}
NO_LIMIT = {"max_steps", "max_epochs"}


def check_trainer(trainer: DictConfig) -> None:
    """The trainer values a user types most, with the valid range (Lightning checks the rest when it is built)."""
    devices = trainer.get("devices")
    as_int = int(devices) if isinstance(devices, str) and devices.lstrip("-").isdigit() else devices
    if isinstance(as_int, bool) or (isinstance(as_int, int) and (as_int == 0 or as_int < -1)):
        raise PreflightError(f"trainer.devices={devices!r} must be >= 1, or -1 / 'auto' (every available device)")
    for key, (low, what) in TRAINER_RANGES.items():
        value = trainer.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        unlimited = key in NO_LIMIT and value == -1
        if value is not None and not unlimited and (not number or value < low):
            limit = ", or -1 for no limit" if key in NO_LIMIT else ""
            raise PreflightError(f"trainer.{key}={value!r} must be {what}{limit}")
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


def check_init_from(source: str) -> None:
    """`init_from=` names an existing run dir, a `.ckpt` file, or a model repo the Hub has (one short request)."""
    from framework.models.peft_adapters import is_adapter_source
    from framework.rundir import LAST_CHECKPOINT, resolve_source

    try:
        resolved = resolve_source(source)
    except FileNotFoundError as err:
        raise PreflightError(f"init_from={source}: {err}") from None
    if resolved.kind == "run_dir":
        if not (Path(source) / LAST_CHECKPOINT).is_file() and not is_adapter_source(source):
            raise PreflightError(f"init_from={source}: the run dir has no {LAST_CHECKPOINT} (nor is it a PEFT adapter)")
        return
    if resolved.is_local:
        return
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    what = f"init_from={source}: no such local run dir or .ckpt file"
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


__all__ = ["PreflightError", "preflight", "check_job", "compose_job", "check_run_dir", "check_init_from"]
