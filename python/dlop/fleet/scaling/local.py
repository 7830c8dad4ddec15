"""The local actuator: dlop-offloader daemons on this host, started and stopped by
``dlop run --offloaders auto`` within the cores its command leaves spare.

Each daemon is started as dlop.fleet.local starts them (its own process
group, gone when this process goes, the run's token) and announced in the
fleet's store, where the trainers' discovery finds it. To shrink, the newest
daemon is withdrawn from the store first (so that no trainer newly joins it)
and sent SIGTERM: it drains (finishes the batches it is making, refuses new
leases, which the trainers reissue elsewhere) and exits 0. A daemon that
exits without being asked is a problem :meth:`check` reports.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from dlop.fleet import discovery
from dlop.fleet.local import daemon_address, start_daemon
from dlop.fleet.scaling.actuator import Actuator, ActuatorError


class _Daemon:
    def __init__(self, proc: subprocess.Popen, address: str, index: int) -> None:
        self.proc, self.address, self.index = proc, address, index


class LocalActuator(Actuator):
    name = "local"

    def __init__(self, store: Any, token_file: Path, cores: int, threads: int = 1,
                 start_timeout: float = 30.0, drain_timeout: float = 60.0) -> None:
        if cores < 1:
            raise ValueError(f"--cores {cores}: the local offloaders need at least 1")
        self.store, self.token_file = store, Path(token_file)
        self.cores, self.threads = int(cores), int(threads)
        self.start_timeout, self.drain_timeout = float(start_timeout), float(drain_timeout)
        self.daemons: list[_Daemon] = []  # oldest first
        self._stopping: list[_Daemon] = []
        self._lock = threading.Lock()

    @property
    def floor(self) -> int:
        return 0

    @property
    def capacity(self) -> int:
        return max(1, self.cores // self.threads)

    def size(self) -> int:
        return len(self.daemons)

    @property
    def addresses(self) -> list[str]:
        return [d.address for d in self.daemons]

    def _start(self, count: int) -> list[_Daemon]:
        procs = [start_daemon(self.token_file, self.threads) for _ in range(count)]
        started, failure = [], None
        for proc in procs:  # they start in parallel; each prints its address first
            try:
                address = daemon_address(proc, self.start_timeout)
                started.append(_Daemon(proc, address, discovery.announce(self.store, address)))
            except (SystemExit, Exception) as e:
                failure = failure or str(e)
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        self.daemons += started
        if failure:
            raise ActuatorError(f"started {len(started)} of {count} daemon(s): {failure}")
        return started

    def _drain(self, d: _Daemon) -> None:
        try:
            discovery.withdraw(self.store, d.index)
        except Exception:  # the store may be gone at the end: the daemon goes all the same
            pass
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
        with self._lock:
            self._stopping.append(d)

    def scale(self, target: int) -> str:
        target = min(max(target, 0), self.capacity)
        have = len(self.daemons)
        if target > have:
            started = self._start(target - have)
            return f"started {len(started)} daemon(s): {', '.join(f'{d.address} (pid {d.proc.pid})' for d in started)}"
        if target < have:
            gone = self.daemons[target:]
            del self.daemons[target:]
            for d in reversed(gone):  # the newest first
                self._drain(d)
            return f"draining {len(gone)} daemon(s): {', '.join(f'{d.address} (pid {d.proc.pid})' for d in gone)}"
        return "no change"

    def check(self) -> list[str]:
        problems = []
        for d in [d for d in self.daemons if d.proc.poll() is not None]:
            self.daemons.remove(d)
            try:
                discovery.withdraw(self.store, d.index)
            except Exception:
                pass
            problems.append(f"daemon {d.address} (pid {d.proc.pid}) exited with status {d.proc.returncode}")
        with self._lock:
            for d in [d for d in self._stopping if d.proc.poll() is not None]:
                self._stopping.remove(d)
                if d.proc.returncode != 0:
                    problems.append(f"daemon {d.address} drained with exit status {d.proc.returncode} "
                                    "(3: --drain-timeout dropped leases, which the trainers reissued)")
        return problems

    def close(self) -> None:
        self.scale(0)
        with self._lock:
            stopping, self._stopping = list(self._stopping), []
        for d in stopping:
            try:
                d.proc.wait(timeout=self.drain_timeout)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
