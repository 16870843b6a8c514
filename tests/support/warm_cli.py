"""`python -m MODULE ARGS` for the tests, without paying the torch + Lightning import in every process.

Most of a smoke-size CLI run is its import (about 7 of 9 s on 2 cores). A server process imports the module once, the
way the real command does (same interpreter, same environment), then forks one child per run: the child sets argv,
environment, working directory and its own stdout/stderr, runs the module as `__main__` and exits with its code. It is
a real process (its own pid, exit code, signals, SIGKILL), only its imports (and, for `framework.train`, the
app's registration, `register_app()`, which every run does first and which is idempotent) were done before the fork.

Where a fresh interpreter matters, the tests get one: `popen` falls back to `subprocess.Popen` for another module, for
an environment that differs from the server's in a variable that may be read at import, or for a working directory
or PYTHONPATH that shadows a module the server imported; `FRAMEWORK_TEST_FRESH_CLI=1` turns the warm path off for a
whole session. Import-time output (none today) is prepended to every child's. What a fork cannot give a child: its
own string-hash seed (every warm child shares the server's, as two runs with the same `PYTHONHASHSEED` would).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# read by the command at run time, not at import: a run may set them and still be served warm; a run whose
# environment differs in anything else is started fresh. PYTEST_CURRENT_TEST is read by no one; the KMP_ pair is what
# importing scikit-learn in a test sets, read only by Intel's OpenMP runtime (torch and scikit-learn load GNU's here)
RUNTIME_ENV = ("FRAMEWORK_SMOKE", "FRAMEWORK_NS_DTYPE", "FRAMEWORK_DATA_CACHE", "PYTHONPATH", "HYDRA_FULL_ERROR",
               "FAULT_SEED", "PYTEST_CURRENT_TEST", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK",
               # what torchrun gives its workers, read by torch.distributed and Lightning when a run starts
               "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
               "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
               "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")
# the variables a package reads when it is imported: a run may set them differently where the server has not
# imported that package (the train CLI imports huggingface_hub only when a run talks to the Hub)
READ_AT_IMPORT_BY = {"HF_": "huggingface_hub", "MLFLOW_": "mlflow", "WANDB_": "wandb"}
WARM_MODULES = ("framework.train",)
# the tests' environment when they were collected, as the CLI helpers pass it on: the server imports in this one
BASE_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

_SERVER = r'''
import json, os, select, sys
module, out_dir = sys.argv[1], sys.argv[2]
os.dup2(os.open(os.path.join(out_dir, "import.out"), os.O_WRONLY | os.O_CREAT), 1)
os.dup2(os.open(os.path.join(out_dir, "import.err"), os.O_WRONLY | os.O_CREAT), 2)
import importlib
importlib.import_module(module)  # everything `python -m module` imports; then forget the module itself, which
sys.modules.pop(module)           # the child runs as `__main__` as `-m` does (runpy warns about one imported before)
parent, _, leaf = module.rpartition(".")
if parent and hasattr(sys.modules[parent], leaf):
    delattr(sys.modules[parent], leaf)
if module == "framework.train":  # the catalog and the app's conf, which every run registers first (idempotent)
    from framework.app import register_app
    register_app()
import atexit, io, runpy, threading, traceback
sys.stdout.flush(); sys.stderr.flush()
base_path = list(sys.path[1:])  # [0] is '' for -c; `-m` puts the working directory there
reply = os.fdopen(int(sys.argv[3]), "w", buffering=1)
top = {m: getattr(sys.modules[m], "__file__", None) or "" for m in sys.modules if "." not in m}
reply.write(json.dumps({"ready": top}) + "\n")

def child(req):
    reply.close()
    signal.set_wakeup_fd(-1); signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the loop's, not the run's
    os.close(wake_r); os.close(wake_w)
    os.chdir(req["cwd"])
    os.environ.clear(); os.environ.update(req["env"])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [req["cwd"], *extra, *base_path]
    fd_in = os.open(os.devnull, os.O_RDONLY); os.dup2(fd_in, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), fd)
    unbuffered = bool(req["env"].get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, write_through=True,
                                  errors="backslashreplace")
    sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin
    sys.argv = [req["module"], *req["args"]]
    code = 0
    try:
        if req["module"] == "-c":  # `python -c CODE ARGS`: argv is ['-c', ARGS...], the code runs as __main__
            sys.argv = ["-c", *req["args"][1:]]
            sys.modules["__main__"] = main = type(sys)("__main__")
            exec(compile(req["args"][0], "<string>", "exec"), main.__dict__)
        else:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr); code = 1
    except KeyboardInterrupt:
        traceback.print_exc(); code = -signal.SIGINT
    except BaseException:
        traceback.print_exc(); code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush(); sys.stderr.flush()
    finally:
        if code < 0:
            import signal as s
            s.signal(-code, s.SIG_DFL); os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)

import signal
# a child's exit wakes the loop at once (SIGCHLD writes to wake_w): no polling, and no run's end noticed late
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
children = {}
buf = b""
while True:
    ready, _, _ = select.select([0, wake_r], [], [])
    if wake_r in ready:
        os.read(wake_r, 1 << 12)
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            break
        reply.write(json.dumps({"id": children.pop(pid), "code": os.waitstatus_to_exitcode(status)}) + "\n")
    if 0 not in ready:
        continue
    data = os.read(0, 1 << 16)
    if not data:
        break
    buf += data
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(req)
        children[pid] = req["id"]
        reply.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")
reply.close()
os._exit(0)  # stdin closed: the tests are done with it, and an interpreter holding torch takes ~1.7 s to tear down
'''


class WarmProcess:
    """The parts of `subprocess.Popen` the tests use, for a child of the server."""

    def __init__(self, args: list[str], out: Path, err: Path, prefix: dict[str, bytes], text: bool):
        self.args, self._out, self._err, self._prefix, self._text = args, out, err, prefix, text
        self.pid: int = -1
        self.returncode: int | None = None
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, timeout: float | None = None) -> tuple:
        self.wait(timeout)
        outs = [self._prefix[k] + (p.read_bytes() if p.exists() else b"")
                for k, p in (("out", self._out), ("err", self._err))]
        for p in (self._out, self._err):
            p.unlink(missing_ok=True)
        return tuple(o.decode(errors="replace") for o in outs) if self._text else tuple(outs)

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._done.set()


class WarmCLI:
    """One server per test process and module: it imports the module once, then forks a child for each run."""

    def __init__(self, module: str, env: dict[str, str], cwd: Path):
        self.module, self.env = module, dict(env)
        self._dir = Path(tempfile.mkdtemp(prefix="warm_cli_"))
        read, write = os.pipe()
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVER, module, str(self._dir), str(write)],
                                      stdin=subprocess.PIPE, env=self.env, cwd=cwd, pass_fds=(write,))
        os.close(write)
        self._reply = os.fdopen(read, "r")
        self._lock, self._next = threading.Lock(), 0
        self._changed = threading.Condition(self._lock)
        self._running: dict[int, WarmProcess] = {}
        self._ready, self._prefix, self._top_level = False, {}, {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._reply:
            msg = json.loads(line)
            with self._changed:
                if "ready" in msg:
                    self._prefix = {k: (self._dir / f"import.{k}").read_bytes() for k in ("out", "err")}
                    self._ready, self._top_level = True, msg["ready"]
                elif "pid" in msg:
                    self._running[msg["id"]].pid = msg["pid"]
                else:
                    self._running.pop(msg["id"])._finish(msg["code"])
                self._changed.notify_all()
        with self._changed:  # the server is gone: nothing it ran will report
            for proc in self._running.values():
                proc._finish(-1)
            self._running.clear()
            self._changed.notify_all()

    def serves(self, env: dict[str, str], cwd: Path) -> bool:
        """Whether a run with `env` in `cwd` imports what the server imported: `same_imports(env)` and nothing in
        `cwd` or on PYTHONPATH shadowing a top-level module the server imported from elsewhere."""
        if not self.same_imports(env):
            return False
        folders = [Path(cwd), *(Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        for path in (p for f in folders if f.is_dir() for p in f.iterdir()):
            imported = self._top_level.get(path.name.removesuffix(".py"))
            if imported is not None and not Path(imported).resolve().is_relative_to(path.resolve()):
                return False
        return True

    def same_imports(self, env: dict[str, str]) -> bool:
        """Whether `env` equals the server's in every variable but those read at run time (RUNTIME_ENV) or by a
        package the server has not imported (False once the server is gone)."""
        if self._proc.poll() is not None:
            return False
        self._wait_ready()
        for key in (set(env) | set(self.env)) - set(RUNTIME_ENV):
            unread = any(key.startswith(prefix) and package not in self._top_level
                         for prefix, package in READ_AT_IMPORT_BY.items())
            if env.get(key) != self.env.get(key) and not unread:
                return False
        return True

    def _wait_ready(self) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: self._ready or self._proc.poll() is not None, timeout=600) \
                    or not self._ready:
                raise RuntimeError(f"the warm server for {self.module} did not start: "
                                   f"{(self._dir / 'import.err').read_text()[-3000:]}")

    def popen(self, args: list[str], env: dict[str, str], cwd: Path, text: bool = True, module: str | None = None
              ) -> WarmProcess:
        """A child running `module` (default: the server's; `-c`: ARGS[0] is the code) with `args`."""
        self._wait_ready()
        with self._changed:
            rid, self._next = self._next, self._next + 1
            out, err = self._dir / f"{rid}.out", self._dir / f"{rid}.err"
            proc = self._running[rid] = WarmProcess(list(args), out, err, self._prefix, text)
            req = {"id": rid, "module": module or self.module, "args": list(args), "env": env, "cwd": str(cwd),
                   "stdout": str(out), "stderr": str(err)}
            self._proc.stdin.write((json.dumps(req) + "\n").encode())
            self._proc.stdin.flush()
            self._changed.wait_for(lambda: proc.pid != -1 or proc.returncode is not None, timeout=600)
        if proc.pid == -1:
            raise RuntimeError(f"the warm server for {self.module} stopped (exit {self._proc.poll()})")
        return proc

    def close(self, wait: bool = True) -> None:
        """End the server (its stdin closed, it exits) and remove its folder; `wait=False`: only tell it to end."""
        if self._proc.poll() is None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        if wait:
            self._proc.wait(timeout=60)
            shutil.rmtree(self._dir, ignore_errors=True)


_SERVERS: dict[tuple[str, str], WarmCLI] = {}
_STARTING = threading.Lock()
_OWNER = os.getpid()  # a process forked from this one (a test's rank workers) leaves the servers alone at exit
#: servers per module beyond the first (the tests' own environment): one for each other environment a test runs the
#: module in (a Hub test's HF_ENDPOINT, say), the least recently started idle one closed to make room
MORE_SERVERS = 2


def _key(env: dict[str, str]) -> str:
    return json.dumps(sorted((k, v) for k, v in env.items() if k not in RUNTIME_ENV))


def _server(module: str, env: dict[str, str], cwd: Path) -> WarmCLI | None:
    """A server that serves a run of `module` with `env` in `cwd`: the tests' own, one started for this environment
    before, or a new one for it (None where a run must start fresh: its folder shadows an imported module)."""
    root = Path(__file__).resolve().parents[2]
    with _STARTING:
        base = {k: v for k, v in BASE_ENV.items() if k not in RUNTIME_ENV}
        if (module, _key(base)) not in _SERVERS:
            _SERVERS[module, _key(base)] = WarmCLI(module, base, root)
        ours = [s for (m, _), s in _SERVERS.items() if m == module]
    for server in ours:
        if server.serves(env, cwd):
            return server
    if not any(s.same_imports(env) for s in ours):  # the environment differs: a server of its own
        with _STARTING:
            others = [(k, s) for k, s in _SERVERS.items() if k[0] == module and s is not ours[0]]
            if len(others) >= MORE_SERVERS:
                idle = [(k, s) for k, s in others if not s._running]
                if not idle:
                    return None
                _SERVERS.pop(idle[0][0]).close()
            server = _SERVERS[module, _key(env)] = WarmCLI(
                module, {k: v for k, v in env.items() if k not in RUNTIME_ENV}, root)
        if server.serves(env, cwd):
            return server
    return None


def popen(module: str, args: list[str], env: dict[str, str], cwd: Path, text: bool = True, via: str | None = None):
    """`python -m MODULE ARGS` (`-c`: `python -c ARGS[0] ARGS[1:]`) with `env` in `cwd`, stdout and stderr captured:
    warm where it can, else fresh. `via`: a warm module whose server runs this one (a `framework.*` CLI or a snippet
    forked from the train CLI's imports, a superset of most of theirs; for the guides' small runs in make test, whose
    fresh-process runs are in make test-slow)."""
    server_module = via or module
    if server_module in WARM_MODULES and os.environ.get("FRAMEWORK_TEST_FRESH_CLI") != "1":
        server = _server(server_module, env, cwd)
        if server is not None:
            return server.popen(args, env, cwd, text, module=module)
    command = [sys.executable, "-c", *args] if module == "-c" else [sys.executable, "-m", module, *args]
    return subprocess.Popen(command, cwd=cwd, env=env, text=text, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run(module: str, args: list[str], env: dict[str, str], cwd: Path, timeout: float | None = None,
        via: str | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run(..., capture_output=True, text=True)` of `python -m MODULE ARGS`, through `popen`."""
    proc = popen(module, args, env, cwd, via=via)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], proc.returncode, out, err)


@atexit.register
def _close_all() -> None:
    if os.getpid() == _OWNER:
        for server in _SERVERS.values():  # all told first, so they end together
            server.close(wait=False)
        for server in _SERVERS.values():
            server.close()
