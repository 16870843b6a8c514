"""The Newton–Schulz dtype OLion uses by default: whichever of bf16 and fp32 this device multiplies faster.

Not a rule by device type: CPUs with bf16 matrix instructions (AVX-512 BF16, AMX) run bf16 matmuls 2–3× faster
than fp32, CPUs without them 10–30× slower. So the choice is measured once per process and device (a few small
matmuls, well under a second), and cached. `FRAMEWORK_NS_DTYPE=bfloat16|float32` or OLion's `ns_dtype` override it.
"""

from __future__ import annotations

import logging
import os
import statistics
import time

import torch

log = logging.getLogger(__name__)

#: the environment variable that fixes the choice for every OLion in the process
ENV_VAR = "FRAMEWORK_NS_DTYPE"
#: dtypes the override may name
CHOICES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
#: bf16 is chosen when its matmul takes at most this fraction of fp32's: a margin, so timing noise on a device
#: where the two are close cannot flip the choice between runs
BF16_MAX_TIME_RATIO = 0.75
#: matrix size and repeats of the measurement (the size of a small transformer's hidden matrices)
PROBE_SIZE, PROBE_REPEATS = 256, 5

_chosen: dict[str, tuple[torch.dtype, float]] = {}


def device_key(device: torch.device) -> str:
    """What the measurement depends on: the device, and on CPU the number of torch threads."""
    if device.type == "cpu":
        return f"cpu/threads={torch.get_num_threads()}"
    return str(device)


def env_override() -> torch.dtype | None:
    """The dtype named by FRAMEWORK_NS_DTYPE, None when unset; a ValueError naming the valid values otherwise."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return None
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is invalid: valid: {', '.join(CHOICES)}")
    return CHOICES[value]


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
    """bf16 matmul time / fp32 matmul time on `device` (below 1: bf16 is faster)."""
    return matmul_seconds(torch.bfloat16, device) / matmul_seconds(torch.float32, device)


def fast_ns_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 where this device's bf16 matmul takes ≤ BF16_MAX_TIME_RATIO of fp32's, else fp32 (cached)."""
    override = env_override()
    if override is not None:
        return override
    device = torch.device(device)
    key = device_key(device)
    if key not in _chosen:
        ratio = measured_ratio(device)
        dtype = torch.bfloat16 if ratio <= BF16_MAX_TIME_RATIO else torch.float32
        _chosen[key] = (dtype, ratio)
        log.info("OLion: Newton-Schulz in %s on %s (bf16 matmul took %.2fx fp32's; set ns_dtype or %s to "
                 "override)", str(dtype).removeprefix("torch."), key, ratio, ENV_VAR)
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
