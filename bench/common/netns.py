"""Several real hosts on one machine: network namespaces joined through a bridge.

Each host is a network namespace with one veth (named ``dl0`` inside, address
10.214.0.<i+1>/24) whose other end is enslaved to a bridge in the root
namespace. With ``rate`` (and ``delay``), each host's link is shaped in both
directions: the egress of the inside end (host -> bridge) and of the bridge end
(bridge -> host). A rate alone uses tbf; a delay needs the kernel's netem
qdisc (``netem delay D rate R``), and Hosts refuses a delay where netem is
missing rather than run unshaped.

The bridge carries no address of the root namespace and each set of hosts has
its own bridge, so every set uses the same addresses without clashing.

Names carry the creator's pid (``dlh<pid>-<i>`` namespaces, ``dlh<pid>b``
bridge, ``dlh<pid>v<i>`` veths) so that concurrent tests never collide, and a
new Hosts first removes those whose creator is dead (a test that crashed).
``python -m bench.netns up N [RATE[,DELAY]]`` makes long-lived hosts
named ``dlhs-<i>`` for benchmarks by hand; ``down`` removes them.

A process joins a host with ``Hosts.popen`` (``ip netns exec``) or, for a
freshly spawned Python process, ``enter(name)`` (netns_join.py) before it
imports UCX.

A namespace separates the network, not the CPUs: every host runs on all of
this machine's cores unless given ``cpus``, one CPU set per host, which
``popen`` applies as the process's affinity (inherited by its threads and
children). ``split_cpus`` makes such sets so that two kinds of hosts (the
trainers' and the offloaders') do not share cores.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import os
import re
import shutil
import subprocess
import sys

from bench.common import forked

PREFIX = "dlh"  # every name this module makes starts with it (the stale sweep's key)
STATIC = PREFIX + "s"  # hosts made by the CLI, which outlive their creator
DEVICE = "dl0"  # each host's interface, the same name in every namespace
SUBNET = "10.214.0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed: {proc.stderr.strip()}")
    return proc


def _tc(namespace: str | None, *args: str) -> None:
    argv = (["ip", "netns", "exec", namespace] if namespace else []) + ["tc", *args]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"'{' '.join(argv)}' failed: {proc.stderr.strip()}")


@functools.cache
def available() -> tuple[bool, str]:
    """Whether namespaces, veths and a bridge can be made here; if not, why."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (ip netns add)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return False, f"{' and '.join(missing)} not found (iproute2)"
    name = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", name)
        _ip("-n", name, "link", "add", "probe0", "type", "bridge")
        _ip("-n", name, "link", "add", "probe1", "type", "veth", "peer", "name", "probe2")
        _tc(name, "qdisc", "add", "dev", "probe1", "root", "tbf", "rate", "1gbit", "burst", "128kb", "latency", "50ms")
    except RuntimeError as e:
        return False, f"cannot make namespaces, bridges or tbf here: {e}"
    finally:
        _ip("netns", "del", name, check=False)
    return True, "ok"


@functools.cache
def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (needed for delays)."""
    if not available()[0]:
        return False
    name = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", name)
        _tc(name, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us")
        return True
    except RuntimeError:
        return False
    finally:
        _ip("netns", "del", name, check=False)


def rate_bytes(rate: str) -> float:
    """Bytes per second of a tc rate ("1gbit", "100mbit", "10mbps")."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(bit|bps)?", rate.strip().lower())
    if not m:
        raise ValueError(f"not a tc rate: {rate!r} (e.g. 1gbit, 100mbit)")
    value = float(m.group(1)) * 1000 ** " kmgt".index(m.group(2) or " ")
    return value if m.group(3) == "bps" else value / 8


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sweep_stale() -> list[str]:
    """Removes namespaces and links of this module whose creator pid is dead; their names."""
    owned = re.compile(rf"{PREFIX}(\d+)[-bv]")
    removed = []
    namespaces = _ip("netns", "list", check=False).stdout.split()
    for name in namespaces:
        m = owned.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    links = re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show", check=False).stdout, re.M)
    for link in links:
        m = owned.match(link)
        if m and not _pid_alive(int(m.group(1))):
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def split_cpus(groups: list[int], cpus: list[int] | None = None) -> list[set[int]]:
    """CPU sets for hosts in groups (e.g. [2, 1]: 2 trainer hosts, then 1 offloader host).

    The cores are shared out between the groups in proportion to their hosts,
    at least one core each, and then within a group an equal core range per
    host when there are enough cores (a remainder stays unused), else the
    whole group's cores for each of its hosts. ValueError when there are fewer cores than groups.
    """
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    if len(cpus) < len(groups) or min(groups, default=0) < 1:
        raise ValueError(f"split_cpus: {len(cpus)} core(s) cannot give {len(groups)} groups of hosts "
                         f"{groups} a core each")
    total, sets, start = sum(groups), [], 0
    for i, hosts in enumerate(groups):
        rest = len(groups) - i - 1  # groups after this one need a core each
        share = len(cpus) - start - rest if rest == 0 else max(1, round(len(cpus) * hosts / total))
        share = min(share, len(cpus) - start - rest)
        mine = cpus[start:start + share]
        start += share
        if len(mine) >= hosts:
            per = len(mine) // hosts
            sets += [set(mine[h * per:(h + 1) * per]) for h in range(hosts)]  # equal hosts; a remainder idles
        else:
            sets += [set(mine) for _ in range(hosts)]
    return sets


def describe_cpus(cpus: set[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    ordered, parts = sorted(cpus), []
    for c in ordered:
        if parts and parts[-1][1] == c - 1:
            parts[-1][1] = c
        else:
            parts.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


class Hosts:
    """n hosts (network namespaces) on one bridge, shaped if asked; removed on exit. One set per process at a
    time (besides the CLI's static ones)."""

    _open_in_process = False

    def __init__(self, n: int, rate: str | None = None, delay: str | None = None, *, static: bool = False,
                 cpus: list[set[int]] | None = None):
        if n < 1 or n > 250:
            raise ValueError(f"Hosts: n must be in [1, 250], not {n}")
        if cpus is not None and (len(cpus) != n or not all(cpus)):
            raise ValueError(f"Hosts: cpus needs one non-empty CPU set per host ({n}), not {cpus}")
        ok, why = available()
        if not ok:
            raise RuntimeError(f"Hosts: {why}")
        if delay and not netem_available():
            raise RuntimeError(f"Hosts: a delay ({delay}) needs the netem qdisc, which this kernel lacks "
                               "(modprobe sch_netem); shape the rate alone or run elsewhere")
        if rate:
            rate_bytes(rate)  # a clear error before anything is made
        self.rate, self.delay, self.cpus = rate, delay, cpus
        tag = STATIC if static else f"{PREFIX}{os.getpid()}"
        if not static and Hosts._open_in_process:
            raise RuntimeError("Hosts: this process has hosts already (names carry the pid, so a second set would "
                               "clash): close them first")
        self.names = [f"{tag}-{i}" for i in range(n)]
        self.addrs = [f"{SUBNET}.{i + 1}" for i in range(n)]
        self.device = DEVICE
        self._bridge = f"{tag}b"
        self._outer = [f"{tag}v{i}" for i in range(n)]
        self._up = False
        sweep_stale()
        if not static:
            atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        self._up = True
        Hosts._open_in_process = not self.names[0].startswith(STATIC)
        _ip("link", "add", self._bridge, "type", "bridge")
        _ip("link", "set", self._bridge, "up")
        for name, outer, addr in zip(self.names, self._outer, self.addrs):
            _ip("netns", "add", name)
            _ip("link", "add", outer, "type", "veth", "peer", "name", outer + "i")
            _ip("link", "set", outer + "i", "netns", name)
            _ip("-n", name, "link", "set", outer + "i", "name", DEVICE)
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", DEVICE)
            _ip("-n", name, "link", "set", DEVICE, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("link", "set", outer, "master", self._bridge)
            _ip("link", "set", outer, "up")
            if self.rate or self.delay:
                self._shape(name, DEVICE)  # host -> bridge
                self._shape(None, outer)  # bridge -> host

    def _shape(self, namespace: str | None, device: str) -> None:
        if self.delay:
            extra = ["rate", self.rate] if self.rate else []
            # A queue of 10000 packets so that netem does not drop a 16 MiB burst.
            _tc(namespace, "qdisc", "add", "dev", device, "root", "netem", "delay", self.delay, *extra, "limit", "10000")
            return
        # Burst: 1 ms at the rate, at least 128 KiB so that a GSO packet (64 KiB) always fits.
        burst = max(int(rate_bytes(self.rate) / 1000), 128 << 10)
        _tc(namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate", self.rate, "burst", str(burst),
            "latency", "100ms")

    def close(self) -> None:
        """Removes the namespaces (with their veths) and the bridge; idempotent."""
        if not self._up:
            return
        self._up = False
        if not self.names[0].startswith(STATIC):
            Hosts._open_in_process = False
        for name in self.names:
            _ip("netns", "del", name, check=False)
        for outer in self._outer:
            _ip("link", "del", outer, check=False)
        _ip("link", "del", self._bridge, check=False)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def popen(self, host: int, argv: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
        """Runs argv inside host `host` (``ip netns exec``, on the host's CPUs); env as for subprocess."""
        if self.cpus is not None:
            cpus = self.cpus[host]
            kw["preexec_fn"] = lambda: os.sched_setaffinity(0, cpus)
        return subprocess.Popen(["ip", "netns", "exec", self.names[host], *argv], env=env, **kw)

    def start_module(self, host: int, module: str, args: list[str], env: dict | None = None, stdout=None):
        """`python -m module args` inside host `host`, forked from this process where that is safe
        (bench/common/forked.py); its output and errors to `stdout`."""
        return forked.start(module, args, env=env, stdout=stdout, netns=self.names[host],
                            cpus=self.cpus[host] if self.cpus is not None else None)

    def describe(self) -> str:
        shaping = ", ".join(x for x in (self.rate and f"rate {self.rate}", self.delay and f"delay {self.delay}") if x)
        lines = [f"{len(self.names)} host(s) on bridge {self._bridge} ({shaping or 'unshaped'}; device {DEVICE}):"]
        for i, (name, addr) in enumerate(zip(self.names, self.addrs)):
            lines.append(f"  {name}  {addr}" + (f"  cpus {describe_cpus(self.cpus[i])}" if self.cpus else ""))
        return "\n".join(lines)


def _static_down() -> list[str]:
    removed = []
    for name in _ip("netns", "list", check=False).stdout.split():
        if name.startswith(STATIC + "-"):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    links = re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show", check=False).stdout, re.M)
    for link in links:
        if re.fullmatch(rf"{STATIC}(b|v\d+)", link):
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.netns", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make N hosts named dlhs-<i> (replacing any)")
    up.add_argument("n", type=int)
    up.add_argument("shape", nargs="?", default="", help="RATE[,DELAY], e.g. 1gbit,100us")
    sub.add_parser("down", help="remove the hosts made by up")
    sub.add_parser("check", help="say whether namespaces can be made here")
    args = p.parse_args(argv)
    if args.command == "check":
        ok, why = available()
        print(why if ok else f"unavailable: {why}")
        return 0 if ok else 1
    if args.command == "down":
        print("removed:", " ".join(_static_down()) or "nothing")
        return 0
    _static_down()
    rate, _, delay = args.shape.partition(",")
    try:
        hosts = Hosts(args.n, rate or None, delay or None, static=True)
    except (RuntimeError, ValueError) as e:
        print(e, file=sys.stderr)
        return 1
    print(hosts.describe())
    print(f"run in one: ip netns exec {hosts.names[0]} COMMAND; remove: python -m bench.netns down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
