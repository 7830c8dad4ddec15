"""The Ray actuator: dlop-offloader daemons as Ray actors on a Ray cluster's CPU nodes.

    actuator = RayActuator(store, token_file, num_cpus=4)   # in the trainer's process, after ray.init
    actuator.scale(3)   # three actors of 4 CPUs each, each running one daemon

Each offloader is one actor (:class:`Offloader`) that claims ``num_cpus`` of
its node, starts ``dlop-offloader --listen NODE_IP:0`` with that many compute
threads and the fleet's token, and answers with the address the daemon
listens on. The actuator announces that address in the fleet's store
(dlop.fleet.discovery), where the trainers find it as they find local or
SLURM daemons: a training script's OffloadLoader is the same under Ray.

Placement: actors go off the trainer's node (the node of the process that
made the actuator) where the cluster has room, through a label expression on
the node id that every Ray node carries (``ray.io/node-id``); soft by default,
so a cluster whose only free CPUs are on the trainer's node still gets its
offloaders, hard with ``trainer_node=False``. When the new actors do not all
fit, the actuator asks Ray's autoscaler for the whole fleet's CPUs
(``ray.autoscaler.sdk.request_resources``, one bundle per offloader) and
waits ``start_timeout`` seconds for them; actors still unplaced then are
removed and the scale fails naming the room the cluster has. The request
stays, so a node the autoscaler adds later serves the controller's next try.

Shrinking withdraws the newest offloader from the store, then has its actor
send the daemon SIGTERM: the daemon drains (finishes the batches it is
making, refuses new leases, which the trainers reissue elsewhere) and exits
0, and the actor ends. An actor that dies any other way (``ray.kill``, its
node lost) takes the daemon with it: the daemon was started with
PR_SET_PDEATHSIG, so its parent's death is the same SIGTERM and drain.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dlop.fleet import discovery
from dlop.fleet.scaling.actuator import Actuator, ActuatorError

EXTRA = "pip install 'dlop[ray]'"
NODE_LABEL = "ray.io/node-id"  # every Ray node's own id, as a label
TAIL_CHARS = 2000


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ActuatorError(f"ray: the ray package is not installed here ({e}); install the extra: {EXTRA}") from None
    return ray


class Offloader:
    """One dlop-offloader daemon in a Ray actor (made remote by :class:`RayActuator`).

    Its methods run on the actor's one thread, in the order they were called, so
    :meth:`drain` waits behind a :meth:`start` still in progress."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None

    def start(self, token: str, args: Sequence[str], timeout: float) -> dict:
        """Starts the daemon; its address, node and pid. RuntimeError with its stderr when it cannot."""
        import ray

        from dlop.fleet.launcher import daemon_path, die_with_parent

        host = ray.util.get_node_ip_address()
        node = ray.get_runtime_context().get_node_id()
        try:
            program = daemon_path()
        except SystemExit as e:
            raise RuntimeError(f"node {host}: {e}") from None
        self.folder = Path(tempfile.mkdtemp(prefix="dlop-ray-"))  # mode 0700
        token_file = self.folder / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        stderr = open(self.folder / "stderr", "w+")
        command = [program, "--listen", f"{host}:0", "--token-file", str(token_file), *args]
        parent = os.getpid()
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                     text=True, process_group=0, preexec_fn=lambda: die_with_parent(parent))
        timer = threading.Timer(timeout, self.proc.kill)  # readline has no timeout of its own
        timer.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not re.search(r"listening on \S+:\d+", line):
            code = self.proc.wait()
            stderr.seek(0)
            said = stderr.read()[-TAIL_CHARS:].strip() or "(nothing on stderr)"
            self._remove()
            why = f"exit status {code}" if code >= 0 else f"killed after {timeout:g} s without a ready line"
            raise RuntimeError(f"dlop-offloader did not start on node {host} ({why}): {said}")
        # The actor's stdout is Ray's log of it; a full pipe must never stall the daemon.
        threading.Thread(target=shutil.copyfileobj, args=(self.proc.stdout, sys.stdout), daemon=True).start()
        port = re.search(r"listening on \S+:(\d+)", line).group(1)
        return {"address": f"{host}:{port}", "host": host, "node": node, "pid": self.proc.pid}

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def drain(self, timeout: float) -> int:
        """SIGTERM, as a scheduler stops a daemon; its exit status (-9: killed after `timeout` seconds)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._remove()
        return code

    def _remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


@dataclass
class _Actor:
    handle: Any
    address: str = ""
    host: str = ""
    pid: int = 0
    index: int = 0  # its announcement in the store
    drained: Any = None  # the drain's ObjectRef, once asked
    since: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        return f"{self.address} (node {self.host}, pid {self.pid})"


class RayActuator(Actuator):
    """Offloaders as Ray actors of ``num_cpus`` CPUs each, in the Ray cluster this process joined.

    store: the fleet's c10d store, where the offloaders are announced to the trainers.
    token_file: the fleet's token (its text travels to each actor, which writes it to a private file).
    num_cpus: CPUs each actor claims; the daemon gets as many compute threads unless
    ``daemon_args`` has ``--threads``. trainer_node: whether offloaders may use the trainer's
    node when no other has room (soft placement) or never (hard). start_timeout: seconds new
    actors have to be placed and start their daemon. drain_timeout: seconds a drain may take.
    address: the Ray cluster to join when this process has not (``ray.init(address)``,
    default "auto"). runtime_env: the actors' Ray runtime environment.
    """

    name = "ray"

    def __init__(self, store: Any, token_file: str | os.PathLike, *, num_cpus: float = 1,
                 daemon_args: Sequence[str] = (), trainer_node: bool = True, start_timeout: float = 60.0,
                 drain_timeout: float = 60.0, address: str | None = "auto",
                 runtime_env: dict | None = None) -> None:
        ray = _ray()
        if isinstance(daemon_args, str):
            raise ValueError(f"RayActuator: daemon_args is a string ({daemon_args!r}); give a list of arguments")
        if not num_cpus > 0:
            raise ValueError(f"RayActuator: num_cpus ({num_cpus}) must be above 0")
        for what, value in (("start_timeout", start_timeout), ("drain_timeout", drain_timeout)):
            if not value > 0:
                raise ValueError(f"RayActuator: {what} ({value}) must be positive")
        from dlop.data._token import read_token_file

        self.token = read_token_file(token_file)
        if not self.token:
            raise ValueError(f"RayActuator: token file {token_file} is empty")
        self.store, self.num_cpus = store, num_cpus
        self.daemon_args = list(daemon_args)
        if "--threads" not in self.daemon_args:
            self.daemon_args = ["--threads", str(max(1, int(num_cpus)))] + self.daemon_args
        self.start_timeout, self.drain_timeout = float(start_timeout), float(drain_timeout)
        if not ray.is_initialized():
            try:
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ActuatorError(f"ray: cannot join the Ray cluster at {address!r}: {e}") from None
        self.trainer_node = ray.get_runtime_context().get_node_id()
        from ray.util.scheduling_strategies import NodeLabelSchedulingStrategy, NotIn

        off = {NODE_LABEL: NotIn(self.trainer_node)}
        self._strategy = NodeLabelSchedulingStrategy(hard={}, soft=off) if trainer_node \
            else NodeLabelSchedulingStrategy(hard=off)
        self._remote = ray.remote(Offloader).options(num_cpus=num_cpus, max_restarts=0, runtime_env=runtime_env,
                                                     scheduling_strategy=self._strategy)
        self.actors: list[_Actor] = []  # serving, oldest first
        self._stopping: list[_Actor] = []
        self._requested = 0  # offloaders asked of the autoscaler

    @property
    def floor(self) -> int:
        return 0

    def size(self) -> int:
        return len(self.actors)

    @property
    def addresses(self) -> list[str]:
        return [a.address for a in self.actors]

    def scale(self, target: int) -> str:
        target, have = max(int(target), 0), len(self.actors)
        if target > have:
            started = self._start(target - have)
            return f"started {len(started)} actor(s): {', '.join(a.describe() for a in started)}"
        if target < have:
            gone = self.actors[target:]
            del self.actors[target:]
            for a in reversed(gone):  # the newest first
                self._drain(a)
            self._request(target)
            return f"draining {len(gone)} actor(s): {', '.join(a.describe() for a in gone)}"
        return "no change"

    def _request(self, count: int) -> None:
        """Asks Ray's autoscaler for room for `count` offloaders (the request replaces the last one)."""
        if count == self._requested:
            return
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[{"CPU": self.num_cpus}] * count)
        self._requested = count

    def _free_cpus(self) -> float:
        return float(_ray().available_resources().get("CPU", 0.0))

    def _start(self, count: int) -> list[_Actor]:
        ray = _ray()
        want = len(self.actors) + count
        if self._free_cpus() < count * self.num_cpus or self._requested:
            self._request(want)
        new = [_Actor(self._remote.remote()) for _ in range(count)]
        refs = {a.handle.start.remote(self.token, self.daemon_args, self.start_timeout): a for a in new}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.start_timeout)
        started, failures = [], []
        for ref in ready:
            a = refs[ref]
            try:
                info = ray.get(ref)
            except Exception as e:
                failures.append(_cause(e))
                ray.kill(a.handle)
                continue
            a.address, a.host, a.pid = info["address"], info["host"], info["pid"]
            a.index = discovery.announce(self.store, a.address)
            started.append(a)
        for ref in pending:
            ray.kill(refs[ref].handle)
        self.actors += started
        if pending:
            failures.append(f"{len(pending)} found no room in {self.start_timeout:g} s: each needs "
                            f"{self.num_cpus:g} CPU(s) off the trainer's node"
                            f"{'' if self._strategy.hard else ' (or on it)'}, and the cluster has "
                            f"{self._free_cpus():g} of {ray.cluster_resources().get('CPU', 0):g} free; "
                            f"Ray's autoscaler was asked for room for {want} offloader(s) (request_resources)")
        if failures:
            raise ActuatorError(f"ray: started {len(started)} of {count} offloader actor(s); "
                                + "; ".join(failures))
        return started

    def _drain(self, a: _Actor) -> None:
        try:
            discovery.withdraw(self.store, a.index)
        except Exception:  # the store may be gone at the end: the actor goes all the same
            pass
        a.drained = a.handle.drain.remote(self.drain_timeout)
        # Queued behind the drain: the actor ends once its daemon has, and its CPUs go back to Ray.
        a.handle.__ray_terminate__.remote()
        self._stopping.append(a)

    def check(self) -> list[str]:
        ray = _ray()
        problems = []
        if self.actors:
            polls = {a.handle.poll.remote(): a for a in self.actors}
            ready, _ = ray.wait(list(polls), num_returns=len(polls), timeout=min(5.0, self.start_timeout))
            for ref in ready:
                a = polls[ref]
                try:
                    code = ray.get(ref)
                    if code is None:
                        continue
                    why = f"its daemon exited with status {code}"
                except Exception as e:
                    why = f"the actor died: {_cause(e)}"
                self.actors.remove(a)
                try:
                    discovery.withdraw(self.store, a.index)
                except Exception:
                    pass
                ray.kill(a.handle)
                problems.append(f"offloader {a.describe()}: {why}")
        done, _ = ray.wait([a.drained for a in self._stopping], num_returns=len(self._stopping), timeout=0) \
            if self._stopping else ([], [])
        for a in [a for a in self._stopping if a.drained in done]:
            self._stopping.remove(a)
            try:
                code = ray.get(a.drained)
            except Exception as e:
                code = f"unknown ({_cause(e)})"
            ray.kill(a.handle)
            if code != 0:
                problems.append(f"offloader {a.describe()} drained with exit status {code} "
                                "(3: --drain-timeout dropped leases, which the trainers reissued)")
        return problems

    def close(self) -> None:
        ray = _ray()
        if not ray.is_initialized():
            return
        self.scale(0)
        refs = [a.drained for a in self._stopping]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=self.drain_timeout + 10)
        for a in self._stopping:
            ray.kill(a.handle)  # a drain still running: the daemon takes its parent's death as SIGTERM
        self._stopping = []
        self._request(0)


def _cause(e: BaseException) -> str:
    """What went wrong in an actor, without Ray's traceback around it."""
    cause = getattr(e, "cause", None)
    if cause is not None and not isinstance(cause, type(e)):
        return str(cause)
    text = str(e).strip().splitlines()
    return text[-1] if text else type(e).__name__


__all__ = ["EXTRA", "Offloader", "RayActuator"]
