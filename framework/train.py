"""`python -m framework.train recipe=NAME [group=choice ...] [key=value ...]`

The program's edge. `main` checks the command line before Hydra runs (`framework.cli`: names, keys, types, then every
value through the preflight), then Hydra composes the config (`framework.app`) and runs the pipeline
(`framework.pipeline.train`: build, fit, record, push), which raises and never exits. The one `except` that turns
its errors into exit codes is `framework.errors.report_and_exit` (codes in the README and `framework.errors`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Any

from hydra_zen import zen

from framework.app import register_app, seed_everything
from framework.cli import check_command_line
from framework.compose import run_dir_of
from framework.console import quiet_console
from framework.errors import report_and_exit
from framework.pipeline import train
from framework.recipe import searchpath_folders
from framework.resume import check_start
from framework.run_lock import launch_rank, run_dir_lock
from framework.strategies import FSDP2Strategy  # noqa: F401 - importing it registers `trainer.strategy=fsdp2`


@functools.wraps(train)  # zen reads the pipeline's parameters through it
def run_at_edge(*args: Any, **config: Any) -> dict[str, Any]:
    """The pipeline as Hydra calls it, its errors mapped to exit codes (one `error:` line, rank 0 prints)."""
    return report_and_exit(train, *args, **config)


task = zen(run_at_edge, pre_call=zen(seed_everything))


def main() -> None:
    """`python -m framework.train`: check the command line (exit 2 before anything is written), then run."""
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    quiet_console()
    report_and_exit(register_app, searchpath_folders(sys.argv[1:]))  # a YAML recipe that does not parse: exit 2
    sys.argv[1:] = report_and_exit(check_command_line, sys.argv[1:])
    where = run_dir_of(sys.argv[1:])
    if where and not where.multirun and not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
        sys.argv.append(f"hydra.run.dir={where.path}")  # the dir the lock holds, not one a second later's clock names
    with contextlib.ExitStack() as held:
        if where:  # one run per run dir: a second one is refused here (exit 2), before Hydra writes anything
            report_and_exit(held.enter_context, run_dir_lock(where.path, where.key))
            if launch_rank() == 0:  # and a fresh start never replaces a run the dir holds (exit 2, nothing written)
                report_and_exit(check_start, where.path, where.ckpt_path, where.key, where.multirun)
        task.hydra_main(config_name="train", config_path=None, version_base="1.3")


if __name__ == "__main__":
    main()
