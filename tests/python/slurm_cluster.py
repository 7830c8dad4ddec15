"""A real SLURM cluster on this machine, for tests: munged, slurmctld and
slurmd from Debian's packages, each node a network + UTS + mount namespace.

- The nodes ``n1``, ``n2``, ... are network namespaces on a bridge (their
  own subnet 10.77.X.0/24, X from the creator's pid); the bridge holds the
  controller's address, .254, in the root namespace.
- Each slurmd runs as ``nsenter --net=/run/netns/NODE unshare --uts --mount``
  with the node's host name and a private /etc/hosts bind-mounted over the
  machine's, so node names resolve on the nodes as a cluster's DNS would.
  Not ``ip netns exec``: it remounts /sys, and slurmd 22.05 then fails.
- munged has its own key and socket (``AuthInfo=socket=``), so a system
  munged, or another test's cluster, is never touched.
- Everything runs in the foreground as children of the creator, without
  systemd; :meth:`SlurmCluster.close` stops them and every process left in
  a node's namespace (job steps included), then removes the namespaces.
  Should the creator die without closing, the daemons get SIGTERM from the
  kernel (PR_SET_PDEATHSIG), and the next cluster removes what is left.

``python tests/python/slurm_cluster.py DIR`` brings one up by hand and
keeps it until Ctrl-C (``export SLURM_CONF=DIR/slurm.conf`` to use it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from processes import wait_for

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "squeue", "sinfo", "nsenter",
            "unshare", "ip")


def unavailable() -> str | None:
    """Why a cluster cannot be made here, or None."""
    if os.geteuid() != 0:
        return "a SLURM cluster in namespaces needs root (munged, slurmd, ip netns)"
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return f"not installed: {', '.join(missing)} (scripts/setup-system.sh installs slurmctld, slurmd, munge)"
    return None


@contextlib.contextmanager
def for_module(tmp_path_factory, nodes: int):
    """A test module's cluster of `nodes` nodes, or a skip naming what it lacks (root, SLURM's
    packages, a built dlop-offloader and dlop._C)."""
    import pytest

    why_not = unavailable()
    if why_not:
        pytest.skip(why_not)
    if not os.access(Path(sys.executable).parent / "dlop-offloader", os.X_OK):
        pytest.skip("dlop-offloader is not built (make build)")
    pytest.importorskip("dlop._C")
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=nodes) as cluster:
        yield cluster


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and done.returncode != 0:
        raise RuntimeError(f"'{' '.join(argv)}' failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _free_subnet() -> str:
    """A 10.77.X.0/24 no route of this machine uses (X from the pid first, so concurrent runs differ)."""
    routes = _run(["ip", "-4", "route", "show"]).stdout
    for k in range(250):
        subnet = f"10.77.{(os.getpid() + k) % 250}"
        if f"{subnet}.0/24" not in routes:
            return subnet
    raise RuntimeError("no free 10.77.X.0/24 subnet for the SLURM test cluster")


def _kill_all_in(namespace: str) -> None:
    for pid in _run(["ip", "netns", "pids", namespace], check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _die_with_creator(creator: int) -> None:
    """preexec_fn: SIGTERM to the daemon when the test process dies, even by SIGKILL (survives exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != creator:
        os._exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=dlop
SlurmctldHost={ctl}({ctl_addr})
SlurmctldPort={ctl_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=60
MessageTimeout=10
NodeName=DEFAULT CPUs={cpus} RealMemory=1000 State=UNKNOWN
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """`nodes` SLURM nodes on this machine; `env` is the environment client commands need."""

    def __init__(self, folder: Path, nodes: int = 2, cpus: int | None = None, start_timeout: float = 60.0) -> None:
        why = unavailable()
        if why:
            raise RuntimeError(why)
        self.dir = Path(folder)
        self.tag = f"dls{os.getpid()}"
        subnet = _free_subnet()
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.addrs = {n: f"{subnet}.{i + 1}" for i, n in enumerate(self.nodes)}
        self.ctl, self.ctl_addr = "dlopctl", f"{subnet}.254"
        self._namespaces = [f"{self.tag}-{n}" for n in self.nodes]
        self._bridge = f"{self.tag}b"
        self._procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}
        for var in [v for v in self.env if v.startswith(("SLURM_", "SBATCH_", "SRUN_")) and v != "SLURM_CONF"]:
            del self.env[var]  # a test run inside a SLURM job must not leak that job's settings into these
        try:
            self._network()
            self._munge()
            self._configure(cpus or os.cpu_count())
            self._controller()
            for node, namespace in zip(self.nodes, self._namespaces):
                self._slurmd(node, namespace)
            logs = [self.dir / "slurmctld.log"] + [self.dir / f"slurmd-{n}.log" for n in self.nodes]
            wait_for(self._all_idle, start_timeout, "the nodes to come up idle", logs, interval=0.1)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ set-up

    @staticmethod
    def _sweep() -> None:
        """Removes what a crashed run left: its nodes' processes (job steps), namespaces, bridge and veths."""
        for namespace in _run(["ip", "netns", "list"]).stdout.split():
            m = re.match(r"dls(\d+)-", namespace)
            if m and not Path(f"/proc/{m.group(1)}").exists():
                _kill_all_in(namespace)
                _run(["ip", "netns", "del", namespace], check=False)
        for link, owner in re.findall(r"^\d+: (dls(\d+)[bv]\d*)[:@]", _run(["ip", "-o", "link", "show"]).stdout, re.M):
            if not Path(f"/proc/{owner}").exists():
                _run(["ip", "link", "del", link], check=False)

    def _network(self) -> None:
        self._sweep()
        _run(["ip", "link", "add", self._bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.ctl_addr}/24", "dev", self._bridge])
        _run(["ip", "link", "set", self._bridge, "up"])
        for i, (node, namespace) in enumerate(zip(self.nodes, self._namespaces)):
            outer = f"{self.tag}v{i}"
            _run(["ip", "netns", "add", namespace])
            _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", outer + "i"])
            _run(["ip", "link", "set", outer + "i", "netns", namespace])
            _run(["ip", "-n", namespace, "link", "set", outer + "i", "name", "eth0"])
            _run(["ip", "-n", namespace, "addr", "add", f"{self.addrs[node]}/24", "dev", "eth0"])
            _run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
            _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
            _run(["ip", "link", "set", outer, "master", self._bridge])
            _run(["ip", "link", "set", outer, "up"])
        hosts = [f"127.0.0.1 localhost", f"{self.ctl_addr} {self.ctl}"]
        hosts += [f"{addr} {node}" for node, addr in self.addrs.items()]
        (self.dir / "hosts").write_text("\n".join(hosts) + "\n")

    def _start(self, argv: list[str], log: str) -> subprocess.Popen:
        creator = os.getpid()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=(self.dir / log).open("w"),
                                stderr=subprocess.STDOUT, start_new_session=True, env=self.env,
                                preexec_fn=lambda: _die_with_creator(creator))
        self._procs.append(proc)
        return proc

    def _munge(self) -> None:
        folder = self.dir / "munge"
        folder.mkdir()
        folder.chmod(0o711)  # munged wants its socket's folder searchable by the clients
        key = folder / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self.munge_socket = folder / "munge.socket"
        self._start(["munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                     f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                     f"--seed-file={folder}/munged.seed"], "munged.out")
        wait_for(self.munge_socket.exists, 20, "munged to open its socket", [folder / "munged.log"])

    def _configure(self, cpus: int) -> None:
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir()
        self.ctl_port = _free_port()
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} NodeHostname={n}" for n, a in self.addrs.items())
        (self.dir / "slurm.conf").write_text(SLURM_CONF.format(
            ctl=self.ctl, ctl_addr=self.ctl_addr, ctl_port=self.ctl_port, slurmd_port=6818,
            munge_socket=self.munge_socket, dir=self.dir, cpus=cpus, nodes=nodes))

    def _in_namespace(self, hostname: str, argv: list[str], namespace: str | None) -> list[str]:
        """argv in a UTS + mount namespace (and a network one) with `hostname` and this cluster's /etc/hosts."""
        inner = (f"hostname {hostname} && mount --bind {self.dir}/hosts /etc/hosts && exec "
                 + " ".join(f"'{a}'" for a in argv))
        enter = ["nsenter", f"--net=/run/netns/{namespace}"] if namespace else []
        return enter + ["unshare", "--uts", "--mount", "sh", "-c", inner]

    def _controller(self) -> None:
        argv = ["slurmctld", "-D", "-i", "-f", str(self.dir / "slurm.conf")]
        self._start(self._in_namespace(self.ctl, argv, None), "slurmctld.out")

    def _slurmd(self, node: str, namespace: str) -> None:
        (self.dir / "spool" / node).mkdir()
        argv = ["slurmd", "-D", "-N", node, "-f", str(self.dir / "slurm.conf")]
        self._start(self._in_namespace(node, argv, namespace), f"slurmd-{node}.out")

    def _all_idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    # ------------------------------------------------------------ use

    def run(self, argv: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        """A client command (sbatch, squeue, scancel...) against this cluster."""
        return subprocess.run(argv, capture_output=True, text=True, env={**self.env, **kw.pop("env", {})},
                              timeout=timeout, **kw)

    def close(self) -> None:
        """Stops the daemons and every process in the nodes' namespaces; removes the network. Idempotent."""
        for namespace in self._namespaces:
            _kill_all_in(namespace)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs = []
        for namespace in self._namespaces:
            _run(["ip", "netns", "del", namespace], check=False)
        for i in range(len(self.nodes)):
            _run(["ip", "link", "del", f"{self.tag}v{i}"], check=False)
        _run(["ip", "link", "del", self._bridge], check=False)

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that the cluster is closed
    with SlurmCluster(folder, nodes=int(sys.argv[2]) if len(sys.argv) > 2 else 2) as cluster:
        print(f"up: export SLURM_CONF={folder}/slurm.conf; Ctrl-C stops it", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
