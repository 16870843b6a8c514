"""The NaN/inf guard's cost beside a char_lm training step, side by side in one run.

A char_lm training step (the recipe's own data, model, AdamW and schedule at `--size`, through Lightning; no logger,
checkpoint or validation) timed with the guard off; reading on the host every step (`guard.every_n_steps=1`: one
sync for the loss and one sum per weight and optimizer-state tensor each step, what the guard did before issue 34);
every step without the state (`guard.check_state=false`); and at its default (`guard.every_n_steps=50`, the loss
kept on its device in between). ms/step is the wall time of the steps after `--warmup` ones (CUDA synchronised at
both ends) over their count, the median of `--rounds` rounds that interleave the four, so machine load hits each
alike; "x off" is the ratio to the guard off, "+ms" the difference.

    python tools/bench/guard.py [--quick] [--size cpu|smoke|gpu] [--steps 100] [--warmup 10] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from framework.callbacks.safety import StopOnNonFinite  # noqa: E402

GUARDS = {  # name -> the guard's settings (None: off)
    "off": None,
    "every step (guard.every_n_steps=1)": {"every_n_steps": 1},
    "every step, loss only (+ check_state=false)": {"every_n_steps": 1, "check_state": False},
    "default (guard.every_n_steps=50)": {},
}


class StepClock(L.Callback):
    """Wall time from the start of step `warmup` to the end of training (every callback's work included)."""

    def __init__(self, warmup: int):
        self.warmup, self.start, self.seconds, self.steps = warmup, None, 0.0, 0

    @staticmethod
    def _sync(pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.start is None and trainer.global_step == self.warmup:
            self._sync(pl_module)
            self.start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(pl_module)
        self.seconds, self.steps = time.perf_counter() - self.start, trainer.global_step - self.warmup


@functools.cache
def _register() -> None:
    from framework.app import register_app

    register_app()


def char_lm(size: str) -> tuple[Any, Any, dict[str, Any]]:
    """The char_lm recipe at `size`, built as a run builds it: (data module, LightningModule, trainer settings)."""
    from hydra_zen import instantiate

    from framework.assembly import assemble
    from framework.compose import compose_job

    _register()
    cfg = compose_job(["recipe=char_lm", f"size={size}", f"hydra.run.dir={tempfile.mkdtemp()}"])
    parts = {name: instantiate(cfg[name]) if cfg.get(name) is not None else None
             for name in ("data", "model", "module", "optimizer", "scheduler")}
    data = parts.pop("data")
    lm, _ = assemble(data=data, seed=0, choices=dict(cfg.hydra.runtime.choices), **parts)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    return data, lm, {"accelerator": cfg.trainer.accelerator, "precision": cfg.trainer.precision}


def ms_per_step(size: str, guard: dict[str, Any] | None, steps: int, warmup: int) -> float:
    """One fit of `warmup + steps` char_lm steps with `guard` (None: none); ms per measured step."""
    L.seed_everything(0, verbose=False)
    data, lm, settings = char_lm(size)
    clock = StepClock(warmup)
    callbacks = ([] if guard is None else [StopOnNonFinite(**guard)]) + [clock]
    trainer = L.Trainer(max_steps=warmup + steps, max_epochs=-1, callbacks=callbacks, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False, devices=1,
                        **{k: v for k, v in settings.items() if v is not None})
    trainer.fit(lm, datamodule=data)
    return 1e3 * clock.seconds / clock.steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="size=smoke, 20 steps, 2 rounds")
    ap.add_argument("--size", choices=("cpu", "smoke", "gpu"), default="cpu")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.quick:
        args.size, args.steps, args.warmup, args.rounds = "smoke", 20, 3, 2
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no "GPU available" lines per fit
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # torch's deprecation notice inside Lightning
    times: dict[str, list[float]] = {name: [] for name in GUARDS}
    for _ in range(args.rounds):
        for name, guard in GUARDS.items():
            times[name].append(ms_per_step(args.size, guard, args.steps, args.warmup))
    _, lm, settings = char_lm(args.size)
    params = sum(p.numel() for p in lm.parameters())
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and settings["accelerator"] != "cpu" else (
        f"CPU, {torch.get_num_threads()} threads")
    print(f"char_lm at size={args.size}: {params / 1e6:.2f}M parameters, AdamW, {device}, precision "
          f"{settings['precision'] or '32'}; {args.steps} steps after {args.warmup}, median of {args.rounds} rounds\n")
    off = statistics.median(times["off"])
    print("| guard | ms/step | x off | +ms/step |")
    print("|---|---|---|---|")
    for name, got in times.items():
        ms = statistics.median(got)
        print(f"| {name} | {ms:.2f} | {ms / off:.3f} | {ms - off:+.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
