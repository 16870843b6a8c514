"""A run dir belongs to one run at a time: a lock file that works on a shared network file system, across hosts.

The lock is `RUN_DIR/.run.lock`, created with `O_CREAT | O_EXCL` (atomic on local disks and on NFSv3+), holding
who has it (host, pid, start time, run id); a thread touches it every `HEARTBEAT_S` seconds while the run lives.
A second run is refused in one line naming the holder (`RunDirBusyError`, exit 2) and touches nothing. A lock
left by a killed run is stale, and taken over: on the same host when its pid is gone, from another host when its
heartbeat is older than `STALE_S`. The processes of one run (DDP ranks, the nodes of a SLURM or torchrun job) share
a run id (`run_identity`), so rank 0 takes the lock and the others are let in.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from framework.errors import InputError

LOCK_NAME = ".run.lock"
HEARTBEAT_S, STALE_S = 30.0, 300.0
#: how long a process of a run that is not rank 0 waits for rank 0 to take the lock
JOIN_WAIT_S = 120.0


class RunDirBusyError(InputError):
    """The run dir is held by another run that is alive; the message names it (host, pid, start time)."""


def run_identity(env: dict[str, str] | None = None) -> str:
    """What the processes of one run share: our own id once rank 0 set it, else the scheduler's job id (SLURM,
    torchrun), else the rendezvous address of a multi-process launch; a fresh id for a lone process."""
    env = dict(os.environ) if env is None else env
    if env.get("FRAMEWORK_RUN_ID"):
        return env["FRAMEWORK_RUN_ID"]
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}"
    if env.get("TORCHELASTIC_RUN_ID", "none") not in ("", "none"):
        return f"torchrun:{env['TORCHELASTIC_RUN_ID']}"
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"dist:{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def launch_rank(env: dict[str, str] | None = None) -> int:
    """This process's global rank as its launcher set it (0 when nothing says otherwise)."""
    env = dict(os.environ) if env is None else env
    for key in ("RANK", "SLURM_PROCID"):
        if env.get(key, "").isdigit():
            return int(env[key])
    node = int(env.get("NODE_RANK") or env.get("GROUP_RANK") or 0)
    return 0 if node == 0 and int(env.get("LOCAL_RANK") or 0) == 0 else 1


def read_holder(path: Path) -> dict[str, Any] | None:
    """The lock's content (None when it is gone or half-written)."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def is_stale(holder: dict[str, Any], path: Path, now: float | None = None) -> bool:
    """True if the holder is dead: its pid is gone on this host, or its heartbeat stopped on another."""
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder.get("pid", -1)), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError, OverflowError):
            return False
        return False
    try:
        beat = path.stat().st_mtime
    except FileNotFoundError:
        return True
    return (time.time() if now is None else now) - beat > STALE_S


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another run (the lock file is being written)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
    return f"another run (host {holder.get('host')}, pid {holder.get('pid')}, started {started})"


def _create(path: Path, run_id: str) -> bool:
    """Create the lock holding this process's record; False if it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "run_id": run_id}
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    return True


def _take_over(path: Path, stale: dict[str, Any]) -> None:
    """Move a stale lock aside (an atomic rename); put it back if another process replaced it meanwhile."""
    aside = path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if read_holder(aside) != stale:  # not the lock we judged: someone took over first; give theirs back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
    aside.unlink(missing_ok=True)


def acquire(run_dir: Path, key: str = "hydra.run.dir", run_id: str | None = None) -> bool:
    """Take `run_dir`'s lock for this run (True), or join the run holding it with our run id (False: nothing to
    release). RunDirBusyError if another live run holds it."""
    run_id = run_id or run_identity()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    for _ in range(5):
        if _create(path, run_id):
            return True
        holder = read_holder(path)
        if holder is not None and holder.get("run_id") == run_id:
            return False  # our own run's rank 0 (or a requeued incarnation of the same job) holds it
        if holder is not None and is_stale(holder, path):
            _take_over(path, holder)
            continue
        if holder is None:
            time.sleep(0.2)  # being written right now
            continue
        break
    raise RunDirBusyError(
        f"{key}={run_dir} is in use by {_describe(read_holder(path))}; nothing was written. Wait for it to finish,"
        f" choose another {key}=..., or, if that run is gone (e.g. its host was lost), delete {path}")


def join(run_dir: Path, key: str = "hydra.run.dir", run_id: str | None = None,
         wait_s: float = JOIN_WAIT_S) -> bool:
    """For a process of a run that is not rank 0: wait until the run dir's lock names our run (False: rank 0
    holds it); RunDirBusyError if it names another live run."""
    run_id = run_id or run_identity()
    path, deadline = run_dir / LOCK_NAME, time.time() + wait_s
    while True:
        holder = read_holder(path)
        if holder is not None and holder.get("run_id") == run_id:
            return False
        if holder is not None and not is_stale(holder, path) or time.time() > deadline:
            raise RunDirBusyError(
                f"{key}={run_dir} is in use by {_describe(holder)}, not by this process's run ({run_id})"
                if holder else f"{key}={run_dir}: rank 0 of this run did not take the run dir within {wait_s:.0f} s")
        time.sleep(0.5)


def release(run_dir: Path, run_id: str) -> None:
    """Remove the lock if this run holds it."""
    path = run_dir / LOCK_NAME
    holder = read_holder(path)
    if holder is not None and holder.get("run_id") == run_id and holder.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def _heartbeat(path: Path, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        try:
            os.utime(path)
        except OSError:
            return


@contextmanager
def run_dir_lock(run_dir: Path, key: str = "hydra.run.dir") -> Iterator[str]:
    """Hold `run_dir` for this run while the block runs (rank 0 takes it, the run's other processes join it).
    Sets FRAMEWORK_RUN_ID so the processes Lightning starts for this run are recognised as its own."""
    run_id, before = run_identity(), os.environ.get("FRAMEWORK_RUN_ID")
    run_dir = run_dir.absolute()
    owner = join(run_dir, key, run_id) if launch_rank() != 0 else acquire(run_dir, key, run_id)
    os.environ["FRAMEWORK_RUN_ID"] = run_id
    stop = threading.Event()
    if owner:
        threading.Thread(target=_heartbeat, args=(run_dir / LOCK_NAME, stop), daemon=True).start()
    try:
        yield run_id
    finally:
        stop.set()
        if owner:
            release(run_dir, run_id)
        if before is None:
            os.environ.pop("FRAMEWORK_RUN_ID", None)
        else:
            os.environ["FRAMEWORK_RUN_ID"] = before
