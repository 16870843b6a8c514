"""The record a finished (or interrupted) run leaves in its run dir: `results.json` and `model_config.json`.

`RunRecord` is a Lightning callback, so it sees the run from its first validation on (the time it took) and knows
which rank writes: rank 0 writes the record and prints the summary; each other rank of a multi-process run writes
its own `results.rank{N}.json`, to check that ranks agree.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L

from framework import __version__
from framework.models.peft_adapters import parameter_counts
from framework.rundir import RESULTS_NAME, SPEC_NAME

#: the run's own log lines (the summary): Hydra's job log file gets them (see `framework.console`)
log = logging.getLogger("framework.run")


class RunRecord(L.Callback):
    """Writes `results.json` (final and untrained metrics, steps, seconds, command, the data's record) and
    `model_config.json` (the model's registry name and constructor values: what the Hub's config.json holds)."""

    def __init__(self, run_dir: str | Path, command: str, resume_command: str, choices: dict[str, Any],
                 resumed_from: str | None = None):
        self.run_dir, self.command, self.resume_command = Path(run_dir), command, resume_command
        self.choices = {k: v for k, v in choices.items() if not k.startswith("hydra")}
        self.resumed_from = resumed_from  # the checkpoint this run continues (absolute path), None for a fresh run
        self.start: float | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.start is None:  # the first validate or fit of the run starts its clock
            self.start = time.time()

    def finish(self, trainer: L.Trainer, lm: L.LightningModule, initial: dict[str, float],
               metrics: dict[str, float]) -> dict[str, Any]:
        """Write the finished run's record (and print its summary on rank 0); returns the results."""
        results = {
            "status": "finished",
            "recipe": self.choices.get("recipe"),
            "choices": self.choices,
            "metrics": metrics,
            "initial_metrics": initial,
            "global_step": trainer.global_step,
            "seconds": round(time.time() - (self.start or time.time()), 2),
            "run_dir": str(self.run_dir),
            "last_checkpoint": last_checkpoint(trainer),
            "resumed_from": self.resumed_from,
            "command": self.command,
            "framework_version": __version__,
            "numerics": numerics(trainer),
            "parameters": parameter_counts(getattr(lm, "model", lm)),
            **data_record(trainer),
        }
        if trainer.is_global_zero:
            spec = model_spec(lm.model, self.choices.get("model"), getattr(lm, "mask_id", None))
            self._write(SPEC_NAME, spec)
            self._write(RESULTS_NAME, results)
            text = summary(results)
            print(text)
            for line in text.splitlines():
                log.info(line)
        elif trainer.world_size > 1:
            self._write(f"results.rank{trainer.global_rank}.json", results)
        return results

    def interrupted(self, trainer: L.Trainer, checkpoint: str, signum: int | None = None) -> None:
        """Record a stop on request (Ctrl-C, SIGTERM, SIGUSR1): the metrics so far, the step, the signal, the
        checkpoint and the command that resumes from it."""
        if trainer.is_global_zero:
            self._write(RESULTS_NAME, {
                "status": "interrupted", "interrupted": True, "signal": signal.Signals(signum).name if signum else None,
                "global_step": trainer.global_step, "metrics": numbers(trainer.callback_metrics),
                "checkpoint": checkpoint, "resume": f"{self.resume_command} ckpt_path={checkpoint}",
                "resumed_from": self.resumed_from, **data_record(trainer),
            })

    def _write(self, name: str, content: dict[str, Any]) -> None:
        (self.run_dir / name).write_text(json.dumps(content, indent=2))


def numerics(trainer: L.Trainer) -> dict[str, str]:
    """What decided the run's arithmetic: Lightning's precision and OLion's Newton–Schulz dtype (with why)."""
    from framework.optim.ns_dtype import ns_record

    precision = getattr(trainer, "precision", None)
    return {**({"precision": str(precision)} if precision is not None else {}),
            **ns_record(list(getattr(trainer, "optimizers", None) or []))}


def numbers(values: dict[str, Any], prefix: str = "", suffix: str = "") -> dict[str, float]:
    """Logged values as plain floats (a non-finite one becomes NaN), keys as `{prefix}{key}{suffix}`."""
    out = {}
    for key, v in values.items():
        value = float(v.item() if hasattr(v, "item") else v)
        out[f"{prefix}{key}{suffix}"] = value if math.isfinite(value) else float("nan")
    return out


def summary(results: dict[str, Any]) -> str:
    """A one-screen account of a finished run: final metrics (with the untrained values) and where things are."""
    init = results["initial_metrics"]
    lines = [f"== {results['recipe'] or 'run'} finished: {results['global_step']} steps in {results['seconds']} s =="]
    for key, value in sorted(results["metrics"].items()):
        before = init.get(f"{key}_init")
        lines.append(f"  {key:24s} {value:10.4f}" + (f"   (untrained: {before:.4f})" if before is not None else ""))
    data = results.get("data") or {}
    if "tokens" in data:
        lines.append(f"  data             {data.get('dataset')}: {data['tokens']:,} tokens, packing efficiency "
                     f"{data.get('packing_efficiency', float('nan')):.4f}")
    elif "train_images" in data:  # data=images
        size = "x".join(str(n) for n in data.get("input_size", [])[1:])
        skipped = f", {data['skipped']} skipped" if data.get("skipped") else ""
        lines.append(f"  data             {data.get('dataset')}: {data['train_images']:,} training and "
                     f"{data.get('val_images', 0):,} validation images, {data.get('classes', '?')} classes at "
                     f"{size or '?'}{skipped}")
    elif "images_read" in data:  # data=images, streamed
        size = "x".join(str(n) for n in data.get("input_size", [])[1:])
        lines.append(f"  data             {data.get('dataset')}: {data['images_read']:,} training images read "
                     f"(streamed; {data.get('repeated_images', 0):,} repeated, {data.get('skipped', 0):,} skipped), "
                     f"{data.get('val_images', 0):,} validation images, {data.get('num_classes', '?')} classes at "
                     f"{size or '?'}")
    elif "rows_read" in data:  # data=text / chat, streamed
        lines.append(f"  data             {data.get('dataset')}: {data['rows_read']:,} rows of {data.get('seq_len')} "
                     f"tokens read (streamed; {data.get('repeated_rows', 0):,} repeated)")
    lines += [
        f"  run dir          {results['run_dir']}",
        f"  results          {results['run_dir']}/results.json",
        f"  last checkpoint  {results['last_checkpoint']}",
    ]
    return "\n".join(lines)


def model_spec(model: Any, name: str | None, mask_id: int | None = None) -> dict[str, Any]:
    """The registry name and plain constructor values that rebuild `model` (what the Hub's config.json holds),
    its adapters' values (`peft`) and the [MASK] id of a masked diffusion model (what `framework.generate` appends)."""
    from framework.models.peft_adapters import PEFT_KEY, peft_spec

    spec: dict[str, Any] = {"name": name, "config": dict(getattr(model, "init_config", {}))}
    if peft_spec(model) is not None:  # adapters in the checkpoint: how to rebuild (and fold) them
        spec[PEFT_KEY] = peft_spec(model).record()
    return spec if mask_id is None else {**spec, "mask_id": int(mask_id)}


def data_record(trainer: L.Trainer) -> dict[str, Any]:
    """`{"data": ...}`: what the data module says of itself (`record()`: the user's data names its source, revision
    or files and fingerprint, format, tokens and packing efficiency); empty for data that says nothing."""
    record = getattr(getattr(trainer, "datamodule", None), "record", None)
    return {"data": record()} if callable(record) else {}


def last_checkpoint(trainer: L.Trainer) -> str | None:
    """The checkpoint callback's last (else best) saved path; None without one."""
    cb = trainer.checkpoint_callback
    if cb is None:
        return None
    return getattr(cb, "last_model_path", None) or getattr(cb, "best_model_path", None) or None


__all__ = ["RunRecord", "data_record", "last_checkpoint", "model_spec", "numbers", "summary"]
