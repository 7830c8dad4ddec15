"""torchrun jobs of restart_training.py for the tests: the job, its events and its processes.

Used by test_restarts.py (jobs that restart) and test_killed_jobs.py (jobs
killed whole, jobs sharing a machine); test_dlop_run.py uses its process
helpers (alive, kill_leftovers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from c10d_harness import python_env, venv_bin

SCRIPT = str(Path(__file__).with_name("restart_training.py"))
JOB_DEADLINE = 240.0


def descendants(pid: int) -> list[int]:
    """pid's children, theirs, and so on (torchrun starts its ranks in sessions of their own)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = [int(c) for c in (task / "children").read_text().split()]
                found += kids
                todo += kids
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    """A process with this pid that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_leftovers(pids: list[int], launcher) -> None:
    """SIGKILLs whatever of `pids` still runs, and the launcher (a Popen) if it has not exited: a test's cleanup."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    if launcher.poll() is None:
        launcher.kill()
        launcher.wait()


class Job:
    """One torchrun (or, with `popen`, another launcher) of restart_training.py in its own folder."""

    def __init__(self, folder: Path, argv: list[str], env: dict[str, str], popen=subprocess.Popen,
                 log: str = "log"):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.log_path = folder / log
        self.log = open(self.log_path, "w")  # noqa: SIM115  (closed in wait/kill)
        self.pids: set[int] = set()
        self.proc = popen(argv, env=python_env({"RESTART_DIR": str(folder), **env}), stdout=self.log,
                          stderr=subprocess.STDOUT, start_new_session=True)

    def events(self) -> list[list[str]]:
        try:
            return [line.split() for line in (self.folder / "events").read_text().splitlines()]
        except FileNotFoundError:
            return []

    def wait_for(self, kind: str, timeout: float = 60.0, world: int | None = None) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pids.update(descendants(self.proc.pid))
            for e in self.events():
                if e[0] == kind and (world is None or int(e[3]) == world):
                    return e
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        pytest.fail(f"no '{kind}' event within {timeout:.0f} s (launcher exit {self.proc.poll()}):\n{self.tail()}")

    def wait(self, timeout: float = JOB_DEADLINE) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"job in {self.folder} still running after {timeout:.0f} s:\n{self.tail()}")
        self.log.close()
        return code

    def kill(self) -> None:
        """SIGKILL to the launcher and every process under it, all at once (a job killed whole)."""
        everyone = [self.proc.pid, *descendants(self.proc.pid)]
        self.pids.update(everyone)
        for pid in everyone:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in everyone) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.log.close()

    def tail(self, n: int = 6000) -> str:
        if not self.log.closed:
            self.log.flush()
        text = self.log_path.read_text(errors="replace")
        return text[-n:]


def torchrun(nproc: int, port: int, rdzv: str = "static", max_restarts: int = 0, nnodes: str = "1",
             endpoint: str = "127.0.0.1", script_args: tuple[str, ...] = (), store_host: bool | None = None,
             local_addr: str | None = None) -> list[str]:
    """torchrun's command line. store_host: whether this launcher serves the c10d rendezvous's store
    (None: torchrun decides, from whether the endpoint is one of this host's names); local_addr:
    the address the other hosts reach this one at (None: its host name)."""
    argv = [venv_bin("torchrun"), f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.1"]
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    if rdzv == "static":
        argv += ["--rdzv-backend=static", f"--master-addr={endpoint}", f"--master-port={port}"]
    else:
        # A round closes a second after its minimum of nodes joined; a node is dead after 3 missed beats.
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}:{port}", f"--rdzv-id=restarts-{port}",
                 "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
                 + ("" if store_host is None else f",is_host={str(store_host).lower()}")]
    return [*argv, SCRIPT, *script_args]
