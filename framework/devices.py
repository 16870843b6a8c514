"""The device a command-line tool runs a model on (`--device`): `auto` is the GPU where torch sees one; and the CPUs
it may use (`usable_cpus`), for its default thread and worker counts."""

from __future__ import annotations

import os

import torch


def pick_device(name: str) -> torch.device:
    """`auto`: CUDA where torch sees a GPU, else the CPU; any other name must be a device this machine has."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device name; valid: auto, cpu, cuda, cuda:N, mps") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"--device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s); use "
                         "--device cpu, or auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {name!r}: MPS is not available here; use --device cpu, or auto")
    return device


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the OS has one (a job's share of a node), else
    every CPU; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def auto_precision(accelerator: object = "auto") -> str:
    """`trainer.precision=auto`: `bf16-mixed` where the run goes to a CUDA GPU with bf16 tensor cores (compute
    capability 8.0 and up), else `32-true` (a CPU, or an older GPU: fp16 there needs loss scaling, a choice left to
    the user as trainer.precision=16-mixed)."""
    gpu = str(accelerator).lower() in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    return "bf16-mixed" if gpu and torch.cuda.is_bf16_supported(including_emulation=False) else "32-true"
