"""Offloaders as SLURM batch jobs: :class:`SlurmActuator` submits one job per
offloader with ``sbatch`` and stops the newest with ``scancel``.

Each job runs ``dlop offloader --store HOST:PORT --token-file F`` with the
Python this process runs (a cluster's software sits on the shared
filesystem), as the batch script's own process (``exec``): the daemon
announces itself in the training job's c10d store, where the trainers find
it, and withdraws the announcement when it ends.

Stopping a running job is ``scancel --batch --signal=TERM``: SIGTERM to
`dlop offloader` alone, which forwards it once to its daemon; the daemon
drains (finishes the batches it is making, refuses new leases) and exits 0,
and the job ends COMPLETED. Plain ``scancel`` (or ``--full``) signals the
whole process group, so the daemon would also get the forwarded SIGTERM,
which it takes as a second one that cuts the drain short; and SIGKILL
follows after KillWait. Plain ``scancel`` is kept for pending jobs and for a
job still running ``stop_timeout`` seconds after its SIGTERM.

The floor is a het job's fixed group of offloaders (dlop.fleet.slurm): counted,
never submitted or cancelled here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from dlop.fleet.scaling.actuator import Actuator, ActuatorError

# squeue's final states. COMPLETING is none: the job's processes are ending, its final state is not known yet.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
NOT_STARTED = {"PENDING", "CONFIGURING"}  # CONFIGURING: its nodes are booting
TAIL_LINES = 3


@dataclass
class _Job:
    id: str
    submitted: float  # time.monotonic()
    output: Path
    stop_sent: float | None = None  # when scancel --batch --signal=TERM went out


class SlurmActuator(Actuator):
    """Offloaders as SLURM batch jobs named ``job_name``, one offloader each.

    store: HOST:PORT of the training job's c10d store, as the compute nodes reach it.
    token_file: the fleet's token, on the shared filesystem.
    sbatch_args: given to every sbatch first (``--partition=cpu``, ``--cpus-per-task=8``, ``--time=4:00:00``).
    daemon_args: given to `dlop offloader` after the store and token (without ``--threads`` the daemon
    gets a compute thread per CPU of its job).
    start_timeout: seconds a job may stay pending before :meth:`check` cancels it.
    stop_timeout: seconds a job may take to drain after its SIGTERM before it is cancelled outright.
    env: the environment of sbatch, squeue and scancel, and so of the jobs (sbatch exports it).
    job_name: what squeue shows (default dlop-offloader-<SLURM_JOB_ID>: whose offloaders they are).
    output_dir: where each job writes ``<job_name>-<id>.out`` (default the current folder), on the shared
    filesystem: :meth:`check` quotes its end.
    command_timeout: seconds sbatch, squeue or scancel may take before ActuatorError.
    """

    name = "slurm"

    def __init__(self, store: str, token_file: str | os.PathLike, *, sbatch_args: Sequence[str] = (),
                 daemon_args: Sequence[str] = (), floor: int = 0, start_timeout: float = 120.0,
                 stop_timeout: float = 60.0, env: Mapping[str, str] | None = None, job_name: str | None = None,
                 output_dir: str | os.PathLike | None = None, command_timeout: float = 60.0) -> None:
        host, _, port = store.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"SlurmActuator: store {store!r} is not HOST:PORT")
        self.token_file = Path(token_file).absolute()
        if not self.token_file.is_file():
            raise ValueError(f"SlurmActuator: token file {self.token_file} does not exist")
        if floor < 0:
            raise ValueError(f"SlurmActuator: floor ({floor}) is negative")
        for what, value in (("sbatch_args", sbatch_args), ("daemon_args", daemon_args)):
            if isinstance(value, str):
                raise ValueError(f"SlurmActuator: {what} is a string ({value!r}); give a list of arguments")
        for what, value in (("start_timeout", start_timeout), ("stop_timeout", stop_timeout),
                            ("command_timeout", command_timeout)):
            if not value > 0:
                raise ValueError(f"SlurmActuator: {what} ({value}) must be positive")
        base = dict(os.environ if env is None else env)
        if job_name is None:
            job_name = "dlop-offloader-" + base["SLURM_JOB_ID"] if base.get("SLURM_JOB_ID") else "dlop-offloader"
        # The trainer's own job variables (SLURM_JOB_*, SLURM_STEP_*, SLURM_PROCID...) would travel into the
        # offloader jobs, which set only some of theirs; SLURM_CONF names the cluster and stays.
        self.env = {k: v for k, v in base.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        self.store, self.job_name, self.sbatch_args = store, job_name, list(sbatch_args)
        self.daemon_args, self._floor = list(daemon_args), floor
        self.start_timeout, self.stop_timeout, self.command_timeout = start_timeout, stop_timeout, command_timeout
        self.output_dir = Path(output_dir if output_dir is not None else os.getcwd()).absolute()
        self._live: list[_Job] = []  # submitted, not stopped nor ended; oldest first
        self._stopping: list[_Job] = []  # sent SIGTERM, still in squeue when last looked

    # ------------------------------------------------ Actuator

    @property
    def floor(self) -> int:
        return self._floor

    def size(self) -> int:
        return self._floor + len(self._live)

    def jobs(self) -> list[str]:
        """The ids of the jobs counted in :meth:`size`, oldest first."""
        return [j.id for j in self._live]

    def scale(self, target: int) -> str:
        target, before = max(target, self._floor), self.size()
        if target > before:
            added = [self._submit() for _ in range(target - before)]
            return f"submitted offloader jobs {', '.join(added)} ({self.job_name}): fleet {before} -> {target}"
        if target < before:
            states = self._states(self._live)
            # Pending jobs give nothing yet: they go first, then the newest running ones.
            order = sorted(reversed(self._live), key=lambda j: states.get(j.id, ("",))[0] not in NOT_STARTED)
            stopped = [self._stop(job, states.get(job.id)) for job in order[:before - target]]
            return (f"stopping offloader jobs {', '.join(stopped)} (scancel --batch --signal=TERM: they "
                    f"drain, then end): fleet {before} -> {target}")
        return f"fleet at {before}"

    def check(self) -> list[str]:
        try:
            states = self._states(self._live + self._stopping)
        except ActuatorError as e:
            return [f"{e}; looking again at the next check"]
        now, problems = time.monotonic(), []
        for job in list(self._live):
            state, reason = states.get(job.id, (None, ""))
            if state in NOT_STARTED and now - job.submitted > self.start_timeout:
                self._live.remove(job)
                problems.append(f"offloader job {job.id} did not start within {self.start_timeout:g} s "
                                f"(squeue: {state}, reason {reason}); {self._cancel(job.id)}")
            elif state is None or state in ENDED:  # ended without being stopped
                self._live.remove(job)
                problems.append(f"offloader job {job.id} {self._end(job.id, state)}; {self._tail(job)}")
        for job in list(self._stopping):
            state, _ = states.get(job.id, (None, ""))
            if state is None or state in ENDED:
                self._stopping.remove(job)
                if state not in (None, "COMPLETED"):
                    problems.append(f"offloader job {job.id}, stopped, {self._end(job.id, state)}; {self._tail(job)}")
            elif state != "COMPLETING" and now - job.stop_sent > self.stop_timeout:
                self._stopping.remove(job)
                problems.append(f"offloader job {job.id} still ran {self.stop_timeout:g} s after its SIGTERM "
                                f"(squeue: {state}); {self._cancel(job.id)}")
        return problems

    def close(self) -> None:
        """Stops every job it submitted and waits up to stop_timeout for them to end; then cancels
        those left. ActuatorError naming the jobs scancel failed for (they may still run)."""
        failed = []
        try:
            states = self._states(self._live)
        except ActuatorError as e:
            failed, states = [str(e)], {job.id: ("PENDING", "") for job in self._live}  # each cancelled outright
        for job in list(self._live):
            try:
                self._stop(job, states.get(job.id))
            except ActuatorError as e:
                failed.append(str(e))
        deadline = time.monotonic() + self.stop_timeout
        while self._stopping and time.monotonic() < deadline:
            try:
                states = self._states(self._stopping)
            except ActuatorError:
                break
            self._stopping = [j for j in self._stopping if states.get(j.id, ("COMPLETED",))[0] not in ENDED]
            if self._stopping:
                time.sleep(0.5)
        for job in self._stopping:
            if self._run(["scancel", job.id], check=False).returncode != 0:
                failed.append(f"scancel {job.id}")
        self._stopping = []
        if failed:
            raise ActuatorError(f"offloader jobs may still run: {'; '.join(failed)}")

    # ------------------------------------------------ sbatch, squeue, scancel

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=self.command_timeout,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise ActuatorError(f"{argv[0]} is not on PATH ({self.env.get('PATH', '')}): "
                                f"`{shlex.join(argv)}` cannot run") from None
        except subprocess.TimeoutExpired:
            raise ActuatorError(f"`{shlex.join(argv)}` did not answer within {self.command_timeout:g} s") \
                from None
        if check and done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).replace("\n", "; ")
            raise ActuatorError(f"`{shlex.join(argv)}` failed (exit {done.returncode}): {said}")
        return done

    def _submit(self) -> str:
        launcher = [sys.executable, "-m", "dlop.cli", "offloader", "--store", self.store,
                    "--token-file", str(self.token_file), *self.daemon_args]
        # exec: the batch step's process is `dlop offloader` itself, which scancel --batch signals.
        script = "exec " + shlex.join(launcher)
        if not any(a == "--threads" or a.startswith("--threads=") for a in self.daemon_args):
            script += ' --threads "${SLURM_CPUS_ON_NODE:-1}"'
        argv = ["sbatch", *self.sbatch_args, "--parsable", f"--job-name={self.job_name}",
                f"--output={self.output_dir}/%x-%j.out", "--wrap", script]
        done = self._run(argv)
        job = done.stdout.strip().split(";")[0]
        if not job.isdigit():
            raise ActuatorError(f"`{shlex.join(argv)}` printed {done.stdout.strip()!r}, not a job id")
        self._live.append(_Job(job, time.monotonic(), self.output_dir / f"{self.job_name}-{job}.out"))
        return job

    def _states(self, jobs: list[_Job]) -> dict[str, tuple[str, str]]:
        """{job id: (state, reason)} of those squeue still lists (ended ones stay for MinJobAge)."""
        if not jobs:
            return {}
        done = self._run(["squeue", "--noheader", "--states=all", "--format=%i|%T|%r",
                          "--jobs=" + ",".join(j.id for j in jobs)], check=False)
        if done.returncode != 0 and "Invalid job id" not in done.stderr:  # squeue's answer when none is left
            raise ActuatorError(f"squeue failed (exit {done.returncode}): {done.stderr.strip()}")
        rows = (line.split("|") for line in done.stdout.splitlines() if line.count("|") == 2)
        return {job: (state, reason) for job, state, reason in rows}

    def _stop(self, job: _Job, state: tuple[str, str] | None) -> str:
        """SIGTERM to a running job's `dlop offloader` (it drains); scancel for a pending one."""
        now = state[0] if state else None  # None: gone from squeue, nothing to stop
        if now not in (None, "COMPLETING", *ENDED, *NOT_STARTED):
            done = self._run(["scancel", "--batch", "--signal=TERM", job.id], check=False)
            if done.returncode != 0:  # refused, as for a job that is not running (any more)
                now = self._states([job]).get(job.id, (None,))[0]
                if now not in (None, "COMPLETING", *ENDED, *NOT_STARTED):
                    raise ActuatorError(f"`scancel --batch --signal=TERM {job.id}` failed (exit "
                                        f"{done.returncode}, job {now}): {done.stderr.strip()}")
        if now in NOT_STARTED:
            self._run(["scancel", job.id])
        elif now is not None and now not in ENDED:
            job.stop_sent = time.monotonic()
            self._stopping.append(job)
        self._live.remove(job)
        return job.id

    def _cancel(self, job: str) -> str:
        try:
            self._run(["scancel", job])
        except ActuatorError as e:
            return f"{e}: it may still run"
        return "cancelled"

    def _end(self, job: str, state: str | None) -> str:
        if state is None:
            return "is gone from squeue (it ended longer ago than MinJobAge)"
        try:
            shown = self._run(["scontrol", "show", "job", "-o", job], check=False).stdout
        except ActuatorError:
            shown = ""
        code = re.search(r"\bExitCode=(\S+)", shown)
        return f"ended: {state}" + (f", exit code {code.group(1)}" if code else "")

    @staticmethod
    def _tail(job: _Job) -> str:
        try:
            lines = [ln.strip() for ln in job.output.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError as e:
            return f"its output {job.output} cannot be read ({e.strerror})"
        return f"{job.output} ends: " + " | ".join(ln[:300] for ln in lines[-TAIL_LINES:]) if lines else \
            f"{job.output} is empty"
