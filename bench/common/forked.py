"""Benchmark programs run in a forked copy of this process rather than a fresh Python.

A fresh interpreter spends 2-3 s importing torch before it measures anything,
and the linearity report starts a dozen of them one after another. A child
forked from a process that has already imported torch (and loaded dlop's
backend) starts at once. The program still runs as ``python -m MODULE ARGS``
would: its own argv, environment, standard output, and, on a namespace host,
that host's network (``netns_join.enter``, the steps of ``ip netns exec``).

Forking is only safe from a process whose other threads expect it: a lock
one of them held would stay held in the child forever. numpy's BLAS pool
does (it parks its threads around a fork, as torch's DataLoader relies on);
Python threads and dlop's engine do not, so ``start`` starts a fresh
interpreter instead while this process has either. Nor does torch's OpenMP
pool, which this process starts the first time it computes with more than
one thread: the parent imports (``preload``) and leaves the computing to
its children (``call`` runs a function in one and returns its result).
"""

from __future__ import annotations

import os
import pickle
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback

from bench.common.netns_join import enter


class Child:
    """A forked program, with the part of subprocess.Popen's interface the benchmarks use."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


def fork_safe() -> bool:
    """No Python thread but this one, and no dlop engine thread (a process group's)."""
    if threading.active_count() > 1:
        return False
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as f:
            if f.read().startswith("dlop-"):
                return False
    return True


def _child(module: str, args: list[str], env: dict, stdout, netns: str | None, cpus) -> None:
    """Becomes `python -m module args`; never returns."""
    code = 1
    try:
        if stdout is not None:
            fd = stdout if isinstance(stdout, int) else stdout.fileno()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            # The parent's sys.stdout may not write to descriptor 1 (a test runner's capture does not).
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
        if netns is not None:
            enter(netns)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        os.environ.clear()
        os.environ.update(env)
        if "OMP_NUM_THREADS" in env:  # torch read it when this process imported it, before this environment
            import torch

            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)


def preload() -> None:
    """Imports what every benchmark child needs, once, here: torch, torch.distributed and dlop's backend (which the
    dlop command itself loads only on demand)."""
    import torch.distributed  # noqa: F401

    import dlop

    dlop._load_backend()


def call(fn, *args):
    """fn(*args) in a forked child: its result, which must pickle. Refused where forking is not safe."""
    if not fork_safe():
        raise RuntimeError("forked.call from a process with other threads")
    read_end, write_end = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 1
        try:
            outcome = (True, fn(*args))
        except BaseException as e:
            outcome = (False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        try:
            with os.fdopen(write_end, "wb") as f:
                pickle.dump(outcome, f)
            code = 0
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status != 0 or not data:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} died in its forked child (exit {status})")
    ok, value = pickle.loads(data)
    if not ok:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed in its forked child: {value}")
    return value


def start(module: str, args: list[str], env: dict | None = None, stdout=None, netns: str | None = None,
          cpus=None) -> Child | subprocess.Popen:
    """`python -m module args` with `env` (default: this environment), its output and errors to `stdout` (a
    file), inside network namespace `netns` and on `cpus` when given."""
    env = dict(os.environ if env is None else env)
    if not fork_safe():
        argv = [sys.executable, "-m", module, *args]
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]
        kw = {"preexec_fn": (lambda: os.sched_setaffinity(0, cpus))} if cpus is not None else {}
        return subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.STDOUT if stdout else None, **kw)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _child(module, args, env, stdout, netns, cpus)
    return Child(pid)
