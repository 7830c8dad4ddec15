"""The dlop-offloader daemons `dlop run` starts on this host when it is given
neither --offloaders nor --discover, and stops when the command exits.

Their lifetime is bound to `dlop run`'s process three ways:
- the command exits (or `dlop run` takes SIGINT/SIGTERM/SIGHUP, which it
  forwards to the command unless it started with the signal ignored): `dlop run` sends each daemon SIGTERM, waits for it,
  then SIGKILLs one that has not exited within a few seconds;
- `dlop run` is SIGKILLed: every daemon, and the command, was started with
  prctl(PR_SET_PDEATHSIG, SIGTERM), so the kernel sends each SIGTERM when
  `dlop run` dies (the daemon takes SIGTERM through its signalfd and stops;
  the command, its offloaders gone, stops as SIGTERM makes it);
- each daemon runs in a process group of its own, so a terminal's Ctrl-C
  reaches the training command but not the daemons it is still using.

The token is fresh per `dlop run` (secrets.token_hex), in a file of mode 0600
inside a private temporary folder (``dlop-run-<pid>-*``) that is removed at
the end; after a SIGKILL, which runs no code of ours, the next `dlop run` on
the host removes it (only folders of this user whose `dlop run` is dead).
`dlop run` prints its path, for `dlop offloader-stats` while the command runs.

Options reach the daemons from `dlop run` (LocalDaemons): their compute
threads, a metrics port (daemon k serves PORT + k, or any free port for 0),
and any other dlop-offloader argument as it is.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dlop.fleet.launcher import daemon_path, die_with_parent



def trainer_ranks(command: list[str]) -> int:
    """How many training processes COMMAND starts on this host: torchrun's
    --nproc-per-node / mpirun's -np when given as a number, else 1."""
    names = {"torchrun": ("--nproc-per-node", "--nproc_per_node"),
             "mpirun": ("-np", "-n", "--np"), "mpiexec": ("-np", "-n", "--np")}
    program = Path(command[0]).name if command else ""
    if program.startswith("python") and command[1:3] == ["-m", "torch.distributed.run"]:
        program, command = "torchrun", command[2:]
    flags = names.get(program, ())
    for k, arg in enumerate(command[1:], start=1):
        name, eq, value = arg.partition("=")
        if name in flags:
            value = value if eq else (command[k + 1] if k + 1 < len(command) else "")
            if value.isdigit() and int(value) > 0:
                return int(value)
    return 1


def default_count(command: list[str], env=os.environ) -> int:
    """One daemon per core the trainer's ranks leave spare; at least one.

    Under srun each of the node's tasks runs a `dlop run` of its own: they
    share the node's CPUs of the job (SLURM_CPUS_ON_NODE) out between them."""
    cores, tasks = len(os.sched_getaffinity(0)), 1
    if "SLURM_STEP_ID" in env:
        from dlop.fleet import slurm

        try:
            tasks = slurm.tasks_on_this_node(env)
        except ValueError as e:
            raise SystemExit(f"dlop run: {e}") from None
        cpus = env.get("SLURM_CPUS_ON_NODE") or ""
        cores = int(cpus) if cpus.isdigit() and int(cpus) > 0 else cores
    return max(1, (cores - tasks * trainer_ranks(command)) // tasks)


def run_command(command: list[str], env: dict[str, str]) -> int:
    """Runs the training command as this process's child, forwarding SIGINT, SIGTERM and SIGHUP to it;
    its exit status (128+N when signal N killed it, as a shell reports it)."""
    parent = os.getpid()
    # The command goes with `dlop run` too, should that be SIGKILLed: its offloaders are gone then.
    child = subprocess.Popen(command, env=env, preexec_fn=lambda: die_with_parent(parent))

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # One ignored on entry (nohup's SIGHUP, SIGINT in a shell's background job) stays ignored, as
        # it is in the command, which inherited the ignore: forwarding it would change nothing.
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, forward)
    code = child.wait()
    return code if code >= 0 else 128 - code


def _started_at(pid: int) -> str | None:
    """The start time of process pid (field 22 of /proc/<pid>/stat), None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def remove_stale_folders() -> list[Path]:
    """Removes the token folders that SIGKILLed `dlop run`s of this user left; the ones removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob("dlop-run-*-*"):
        parts = folder.name.split("-")
        try:
            pid, started, owner = int(parts[2]), parts[3], folder.lstat().st_uid
        except (ValueError, IndexError, OSError):
            continue
        if owner == os.getuid() and folder.is_dir() and _started_at(pid) != started:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def token_folder() -> tuple[Path, Path]:
    """(a private folder, the fresh token file in it), for daemons of this process."""
    remove_stale_folders()
    # Named after this process (pid and start time), so that the next `dlop run` knows when it is stale.
    me = os.getpid()
    folder = Path(tempfile.mkdtemp(prefix=f"dlop-run-{me}-{_started_at(me)}-"))  # mode 0700
    token_file = folder / "token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(24) + "\n")
    return folder, token_file


@dataclass(frozen=True)
class LocalDaemons:
    """The dlop-offloaders `dlop run` starts here, and what it passes to each."""

    count: int
    threads: int = 1
    metrics_port: int | None = None  #: daemon k serves its metrics on this + k; 0: any free port; None: none
    args: tuple[str, ...] = ()  #: more dlop-offloader arguments, as they are

    def extra(self, k: int) -> list[str]:
        """Daemon k's arguments after --threads."""
        out = []
        if self.metrics_port is not None:
            out += ["--metrics-port", str(self.metrics_port + k if self.metrics_port else 0)]
        return out + list(self.args)


def start_daemon(token_file: Path, threads: int = 1, args: list[str] | tuple[str, ...] = ()) -> subprocess.Popen:
    """A dlop-offloader on 127.0.0.1, in a process group of its own, that goes when this process does
    (:func:`daemon_address` reads where it listens); `args` follow --threads."""
    parent = os.getpid()
    return subprocess.Popen(
        [daemon_path(), "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--threads", str(threads),
         *args],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, process_group=0,
        preexec_fn=lambda: die_with_parent(parent))


def daemon_endpoints(proc: subprocess.Popen, timeout: float) -> tuple[str, str | None]:
    """("127.0.0.1:PORT" a daemon of :func:`start_daemon` listens on, "127.0.0.1:M" of its metrics or
    None), once it says so on its ready line."""
    timer = threading.Timer(timeout, proc.kill)  # readline has no timeout of its own
    timer.start()
    try:
        line = proc.stdout.readline()
    finally:
        timer.cancel()
    if "listening on" not in line:
        code = proc.wait()
        raise SystemExit(f"dlop run: a local dlop-offloader did not start (exit status {code}; "
                         f"its error is above, or it took over {timeout:g} s)")
    # Anything more it prints goes on to ours; a full pipe must never stall it.
    threading.Thread(target=shutil.copyfileobj, args=(proc.stdout, sys.stdout), daemon=True).start()
    metrics = line.partition("(metrics on ")[2].partition(")")[0]
    return "127.0.0.1:" + line.strip().rsplit(":", 1)[1], metrics or None


def daemon_address(proc: subprocess.Popen, timeout: float) -> str:
    """The "127.0.0.1:PORT" a daemon of :func:`start_daemon` listens on, once it says so."""
    return daemon_endpoints(proc, timeout)[0]


class LocalOffloaders:
    """`plan.count` dlop-offloader daemons on 127.0.0.1 with a fresh shared token.

    Use as a context manager: the daemons are stopped and the token removed on exit."""

    def __init__(self, plan: LocalDaemons, start_timeout: float = 30.0) -> None:
        if plan.count < 1:
            raise SystemExit(f"dlop run: --local-offloaders {plan.count}: at least 1")
        self.folder, self.token_file = token_folder()
        self.procs: list[subprocess.Popen] = []
        self.addresses: list[str] = []
        self.metrics: list[str] = []  # each daemon's metrics HOST:PORT, with a metrics port
        try:
            for k in range(plan.count):
                self.procs.append(start_daemon(self.token_file, plan.threads, plan.extra(k)))
            for proc in self.procs:  # they start in parallel; each prints its address first
                address, metrics = daemon_endpoints(proc, start_timeout)
                self.addresses.append(address)
                if metrics:
                    self.metrics.append(metrics)
        except BaseException:
            self.stop()
            raise

    def describe(self) -> str:
        daemons = ", ".join(f"{a} (pid {p.pid})" for a, p in zip(self.addresses, self.procs))
        lines = [f"dlop run: started {len(self.procs)} local dlop-offloader daemon(s): {daemons}; "
                 "they stop when the command exits",
                 f"dlop run: their token file: {self.token_file} (dlop offloader-stats {self.addresses[0]} "
                 f"--token-file {self.token_file})"]
        if self.metrics:
            lines.append("dlop run: their metrics: " + ", ".join(f"http://{m}/metrics" for m in self.metrics))
        return "\n".join(lines)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "LocalOffloaders":
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()
