"""Composing a run's config before Hydra runs it: the job config (`compose_job`), where the run writes (`run_dir_of`),
and the Hydra context both compose in (`hydra_context`).

A command composes its config several times before training (the setting check, the preflight, the run dir, then
Hydra's own two), so each composition's fixed cost is paid per command: `hydra_context` is `hydra.initialize` without
its walk of the call stack, and the preflight's composition is handed on to `run_dir_of` rather than done again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from omegaconf import DictConfig, open_dict

#: Hydra flags after which nothing runs (help, config printing, shell completion): no preflight for them
NO_RUN_FLAGS = frozenset({"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-i", "--info", "-sc",
                          "--shell-completion", "--experimental-rerun", "-cp", "--config-path", "-cn",
                          "--config-name", "-cd", "--config-dir"})
#: the last job `compose_job(..., keep=True)` composed, by (overrides, config name, multirun): `run_dir_of` takes it
_KEPT: dict[tuple, DictConfig] = {}


@contextlib.contextmanager
def hydra_context(job_name: str = "preflight") -> Iterator[None]:
    """`hydra.initialize(version_base="1.3", config_path=None)` as called from here, without its caller detection:
    that runs `inspect.stack()`, which reads the source lines of every frame of the stack and searches every loaded
    module for each (about a second once torch and Lightning are loaded). The caller's file only names the job
    (`job_name`, what Hydra would have detected here) and adds no config path, as config_path is None."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    version.setbase("1.3")
    Hydra.create_main_hydra_file_or_module(calling_file=__file__, calling_module=None, config_path=None,
                                           job_name=job_name)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


class RunTarget(NamedTuple):
    """Where a run writes (its run dir, or a sweep's dir), the setting that names it, and what it resumes from."""

    path: Path
    key: str  # "hydra.run.dir" | "hydra.sweep.dir"
    ckpt_path: str | None
    multirun: bool


def run_dir_of(argv: list[str], config_name: str = "train") -> RunTarget | None:
    """Where the run `argv` describes writes; None for a command that runs nothing (`--cfg`, `--help`, ...) or a
    config Hydra cannot compose (it reports that)."""
    from hydra.core.hydra_config import HydraConfig

    if NO_RUN_FLAGS.intersection(argv):
        return None
    multirun = "-m" in argv or "--multirun" in argv
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    kept = _KEPT.pop((tuple(overrides), config_name, multirun), None)
    cfg = kept if kept is not None else compose_job(overrides, config_name, multirun)
    HydraConfig.instance().cfg = None
    if cfg is None:
        return None
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    ckpt_path = cfg.get("ckpt_path")
    return RunTarget(Path(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir)), key,
                     None if ckpt_path is None else str(ckpt_path), multirun)


def compose_job(overrides: list[str], config_name: str = "train", multirun: bool = False,
                keep: bool = False) -> DictConfig | None:
    """The job config Hydra will run (hydra node included), with `hydra:runtime.output_dir` resolvable.

    None when Hydra cannot compose it (Hydra then reports why). The run dir is not created. `keep=True` keeps it
    for the next `run_dir_of` of the same command, which then does not compose it again.
    """
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _KEPT.clear()
    with hydra_context():
        try:
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        except (HydraException, OmegaConfBaseException):  # Hydra reports these itself, with its own message
            return None
    with open_dict(cfg):
        run_dir = Path(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))
        cfg.hydra.runtime.output_dir = str(run_dir.absolute())
    if keep:
        _KEPT[tuple(overrides), config_name, multirun] = cfg  # the preflight only reads it
    HydraConfig.instance().set_config(cfg)
    return cfg
