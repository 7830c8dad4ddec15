"""What tests need to start processes and wait on them.

* :func:`rank_process_context`: how the harnesses (c10d_harness.py,
  training_ranks.py) start rank processes: forked from a server process that
  has imported torch once, so a rank starts in tens of milliseconds instead of
  the seconds its own ``import torch`` takes (most of a short test's time on a
  loaded 2-core machine). :func:`python_env` and :func:`adopt_environment`
  carry the parent's environment at each start into the rank; its working
  directory is the fork server's (the test process's when its first ranks
  started), so ranks use absolute paths.
* :func:`wait_for`: a poll with a deadline, for a condition a test cannot be
  told about.
* :func:`offloader`: the dlop-offloader executable, or a skip.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Imported once by the server the ranks are forked from: torch (which also
# loads the backends it finds through entry points, dlop's registration
# among them), not dlop._C, whose settings are read when it loads.
_PRELOAD = ["torch", "torch.distributed"]
_context = None


def rank_process_context():
    """The multiprocessing context for rank processes (one fork server per test process).

    Not plain fork: the pytest process may hold OpenMP, UCX and server threads.
    The fork server is a fresh interpreter whose only work is the import of
    torch, made with OMP_NUM_THREADS=1 so that no BLAS or OpenMP pool is up
    when it forks.
    """
    global _context
    if _context is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        _context = ctx
    return _context


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ for a child Python (ranks, scripts, torchrun, mpirun): OMP_NUM_THREADS=1 and extra.

    A forked rank inherits the fork server's environment from when that
    started: it gets this one through adopt_environment instead.
    """
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def adopt_environment(env: dict[str, str]) -> None:
    """In a rank: os.environ becomes env, and what torch read from it at import is read again."""
    os.environ.clear()
    os.environ.update(env)
    import torch.distributed as dist

    # TORCH_DISTRIBUTED_DEBUG is read when torch.distributed is imported (in the fork server).
    dist.set_debug_level_from_env()


def wait_for(predicate, timeout: float, what: str, logs: list[Path] = (), interval: float = 0.05):
    """predicate()'s first true value, polled every interval until timeout; else AssertionError
    naming what it waited for, with the last lines of each of logs."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    tails = "".join(f"\n--- {p} ---\n" + "\n".join(Path(p).read_text(errors="replace").splitlines()[-15:])
                    for p in logs if Path(p).exists())
    raise AssertionError(f"not within {timeout:g} s: {what}{tails}")


def offloader() -> str:
    """The dlop-offloader to test: $DLOP_OFFLOADER, the venv's, the build's or the PATH's; else a skip."""
    for c in (os.environ.get("DLOP_OFFLOADER", ""), str(ROOT / ".venv/bin/dlop-offloader"),
              str(ROOT / "build/offload/daemon/dlop-offloader"), shutil.which("dlop-offloader") or ""):
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("dlop-offloader is not built (make build, or set DLOP_OFFLOADER)")


class Daemon:
    """A dlop-offloader on a free loopback port, one compute thread; `address` once it listens."""

    def __init__(self, token_file: Path, *extra: str, stderr=None, env: dict[str, str] | None = None) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [offloader(), "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--threads", "1", *extra],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
        )
        line = self.proc.stdout.readline()
        assert "listening on" in line, f"dlop-offloader did not start: {line!r}"
        self.address = "127.0.0.1:" + line.strip().rsplit(":", 1)[1]
        # Read on, so that a full pipe never stops the daemon; UCX writes its errors there.
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def output(self) -> str:
        """What the daemon wrote on stdout after it listened (UCX's warnings and errors)."""
        return "".join(self.lines)

    def kill(self) -> None:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def token_file_with(path: Path, token: str) -> Path:
    """A token file the daemons accept (owner-only)."""
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def small_image_dataset(out: Path) -> str:
    """A class-folder dataset of 3 classes x 6 JPEGs (dlop make-dataset, seed 3) at `out`."""
    from dlop.data.make_dataset import main as make_dataset

    assert make_dataset([str(out), "--classes", "3", "--per-class", "6", "--seed", "3"]) == 0
    return str(out)


def two_daemons(tmp_path: Path, token: str):
    """Yields two offloaders sharing one token; kills them after (a pytest fixture's body)."""
    token_file = token_file_with(tmp_path / "token", token)
    ds = [Daemon(token_file), Daemon(token_file)]
    yield ds
    for d in ds:
        d.kill()
