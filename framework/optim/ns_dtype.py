"""The Newton–Schulz dtype OLion uses by default: bf16 where the device has bf16 matrix instructions, else fp32.

Decided from what the device is, never from a timing (a timing on a busy machine flipped between two identical
runs): CUDA devices with bf16 tensor cores (compute capability 8.0 and up), x86 CPUs with AVX-512 BF16 or AMX, and
Arm CPUs with the BF16 extension get bf16 (there it runs 2–3x faster than fp32); other CPUs, where bf16 matmuls are
emulated and run 10–30x slower, and other devices get fp32. `FRAMEWORK_NS_DTYPE=bfloat16|float32` or OLion's
`ns_dtype` override it. The choice is saved in the optimizer's param groups (`AUTO_KEY`), so a resumed run keeps it.
`measured_ratio` times the two for the benchmarks; it decides nothing.
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

#: the environment variable that fixes the choice for every OLion in the process
ENV_VAR = "FRAMEWORK_NS_DTYPE"
#: dtypes the override may name
CHOICES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
#: matrix size and repeats of `measured_ratio` (the size of a small transformer's hidden matrices)
PROBE_SIZE, PROBE_REPEATS = 256, 5

#: x86 bf16 matrix instructions, and torch's probe for each (`torch.cpu`)
X86_BF16 = (("AVX-512 BF16", "_is_avx512_bf16_supported"), ("AMX", "_is_amx_tile_supported"))

_chosen: dict[str, tuple[torch.dtype, str]] = {}


def env_override() -> torch.dtype | None:
    """The dtype named by FRAMEWORK_NS_DTYPE, None when unset; a ValueError naming the valid values otherwise."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return None
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is invalid: valid: {', '.join(CHOICES)}")
    return CHOICES[value]


def bf16_matrix_support(device: torch.device | str) -> tuple[bool, str]:
    """Whether `device` multiplies bf16 matrices natively, and what says so (for the log and the run record)."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return native, f"{torch.cuda.get_device_name(index)} (compute capability {major}.{minor}): " + (
            "bf16 tensor cores" if native else "no bf16 tensor cores")
    if device.type != "cpu":
        return False, f"{device.type}: no bf16 matrix support known to the framework"
    cpu = getattr(torch, "cpu", None)
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        found = [name for name, probe in X86_BF16 if callable(getattr(cpu, probe, None)) and getattr(cpu, probe)()]
        return bool(found), ("x86 CPU with " + " and ".join(found) if found else "x86 CPU without AVX-512 BF16 or AMX")
    if platform.machine().lower() in ("aarch64", "arm64"):
        native = "bf16" in _arm_features()
        return native, f"Arm CPU {'with' if native else 'without'} the BF16 extension"
    return False, f"{platform.machine() or 'unknown'} CPU: no bf16 matrix instructions known to the framework"


def _arm_features() -> set[str]:
    """The Arm CPU's feature flags (Linux: /proc/cpuinfo's `Features`; macOS: sysctl's FEAT_BF16)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("features"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    if platform.system() == "Darwin":
        import subprocess

        out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True)
        return {"bf16"} if out.stdout.strip() == "1" else set()
    return set()


def matmul_seconds(dtype: torch.dtype, device: torch.device) -> float:
    """Median seconds of one PROBE_SIZE² matmul in `dtype` on `device` (after a warm-up)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_SIZE, PROBE_SIZE, generator=gen, device=gen.device) / PROBE_SIZE**0.5
    x = x.to(device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    y = x @ x
    times = []
    for _ in range(PROBE_REPEATS):
        sync()
        start = time.perf_counter()
        y = torch.addmm(y, x, x, beta=0.5, alpha=0.5)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measured_ratio(device: torch.device) -> float:
    """bf16 matmul time / fp32 matmul time on `device` (below 1: bf16 is faster); for the benchmarks only."""
    return matmul_seconds(torch.bfloat16, device) / matmul_seconds(torch.float32, device)


def fast_ns_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 where `device` has bf16 matrix instructions (`bf16_matrix_support`), else fp32; the override first."""
    override = env_override()
    if override is not None:
        return override
    device = torch.device(device)
    key = device.type if device.type == "cpu" else str(device)
    if key not in _chosen:
        native, why = bf16_matrix_support(device)
        dtype = torch.bfloat16 if native else torch.float32
        _chosen[key] = (dtype, why)
        log.info("OLion: Newton-Schulz in %s on %s (%s; set ns_dtype or %s to override)",
                 str(dtype).removeprefix("torch."), key, why, ENV_VAR)
    return _chosen[key][0]


def forget() -> None:
    """Drop the cached choices (tests; a process that changed its thread count re-measures anyway)."""
    _chosen.clear()


#: the param-group key holding the dtype `ns_dtype=None` resolved to (saved with the optimizer state, so a
#: resumed run keeps the dtype it started with)
AUTO_KEY = "ns_dtype_auto"


def group_ns_dtype(group: dict, device: torch.device, process_group: object, world: int) -> torch.dtype:
    """The group's NS dtype: its `ns_dtype`, else the one chosen for it before, else `fast_ns_dtype` (rank 0's
    choice when several processes step together, so every rank runs the same arithmetic)."""
    if group["ns_dtype"] is not None:  # a name (a state saved before held the dtype itself)
        given = group["ns_dtype"]
        return getattr(torch, given) if isinstance(given, str) else given
    name = group.get(AUTO_KEY)
    if name not in CHOICES:
        name = str(fast_ns_dtype(device)).removeprefix("torch.")
        if world > 1:
            import torch.distributed as dist

            code = torch.tensor([list(CHOICES).index(name)], device=device)
            dist.broadcast(code, src=dist.get_global_rank(process_group, 0) if process_group else 0,
                           group=process_group)
            name = list(CHOICES)[int(code.item())]
        group[AUTO_KEY] = name
    return CHOICES[name]


def ns_record(optimizers: list[torch.optim.Optimizer]) -> dict[str, str]:
    """What the run records of its Newton–Schulz numerics: the dtype each OLion group ran (`ns_dtype`: one name, or
    several joined by ', ') and why (`ns_dtype_from`: given, the device's instruction set, or the checkpoint it
    resumed); {} when no optimizer runs Newton–Schulz with a chosen dtype."""
    names, sources = [], []
    for group in (g for opt in optimizers for g in opt.param_groups if "ns_dtype" in g):
        given = group["ns_dtype"]
        if given is not None:
            names.append(given if isinstance(given, str) else str(given).removeprefix("torch."))
            sources.append("given (ns_dtype)")
        elif group.get(AUTO_KEY) in CHOICES:
            names.append(group[AUTO_KEY])
            chosen = [why for dtype, why in _chosen.values() if str(dtype).removeprefix("torch.") == group[AUTO_KEY]]
            sources.append(f"{ENV_VAR}" if env_override() is not None else
                           chosen[0] if chosen else "the checkpoint this run resumed")
    if not names:
        return {}
    return {"ns_dtype": ", ".join(dict.fromkeys(names)), "ns_dtype_from": "; ".join(dict.fromkeys(sources))}
