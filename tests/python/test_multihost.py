"""Collectives across real hosts: ranks in separate network namespaces (bench.netns).

Each host is a network namespace joined to the others through a bridge, so
ranks of different hosts reach each other only over TCP, and dlop must tell
them apart from the real topology (host_identity() includes the network
namespace), not from DLOP_HOST_ID. Each rank runs tests/python/multihost_rank.py
inside its host (``ip netns exec``), with torchrun's variables. Skipped where
namespaces cannot be made (not root).
"""

from __future__ import annotations

import itertools
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.common import netns

RANK_SCRIPT = str(Path(__file__).with_name("multihost_rank.py"))
DEADLINE = 120.0  # seconds for one launch of all ranks (a hang fails, it does not block the suite)
_ports = itertools.count(29500)

ok, why = netns.available()
# Opt-in for now: at load average ~24 on the shared 2-core machine the 2x2
# all-reduces failed with "UCX reported Endpoint timeout" (at load ~8 the
# collective and forced-algorithm tests passed); the kill test's rank script
# was fixed after its last run (survivors left at once and were named instead).
pytestmark = [
    pytest.mark.skipif(not ok, reason=f"cannot make network namespaces here: {why}"),
    pytest.mark.long_file(seconds=130),  # handed out first (conftest.py)
]


@pytest.fixture(scope="module")
def hosts():
    with netns.Hosts(3) as h:
        yield h


def launch(hosts, placement: list[int], scenario: str, env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Starts rank r on host placement[r]; rank 0's host runs the store."""
    port = str(next(_ports))
    procs = []
    for rank, host in enumerate(placement):
        rank_env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(placement)), LOCAL_RANK="0",
                        MASTER_ADDR=hosts.addrs[placement[0]], MASTER_PORT=port, OMP_NUM_THREADS="1",
                        GLOO_SOCKET_IFNAME=hosts.device, **(env or {}))
        rank_env.pop("DLOP_HOST_ID", None)  # the topology must come from the namespaces
        procs.append(hosts.popen(host, [sys.executable, RANK_SCRIPT, scenario], env=rank_env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = DEADLINE) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each rank; ranks still running at the deadline are killed and fail the test."""
    deadline = time.monotonic() + timeout
    results, hung = [], []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            hung.append(rank)
        results.append((proc.returncode, out, err))
    if hung:
        pytest.fail(f"ranks {hung} still running after {timeout:.0f} s:\n" + tails(results))
    return results


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """proc's next stdout line, or "" when none comes within timeout."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        return proc.stdout.readline() if sel.select(timeout) else ""


def tails(results) -> str:
    return "\n".join(f"--- rank {r} (exit {code}):\n{out[-1500:]}{err[-2500:]}" for r, (code, out, err) in
                     enumerate(results))


def run(hosts, placement: list[int], scenario: str, env: dict[str, str] | None = None) -> list[tuple[int, str, str]]:
    results = finish(launch(hosts, placement, scenario, env))
    problems = [f"rank {r}: {line[8:]}" for r, (_, out, _) in enumerate(results) for line in out.splitlines()
                if line.startswith("PROBLEM ")]
    bad = [r for r, (code, out, _) in enumerate(results) if code != 0 or "DONE" not in out]
    assert not problems, "\n".join(problems[:40])
    assert not bad, f"ranks {bad} failed:\n" + tails(results)
    return results


# transport's Endpoints log each endpoint at info: "endpoint to rank B (pid P on HOST)
# (same host|other host, error mode M):" then UCX's description of it, lines starting
# with "#", one per lane as "lane[0]: 2:tcp/dl0.0 ...".
ENDPOINT = re.compile(r"endpoint to rank (\d+) \(pid \d+ on [^()\n]*\) \((same host|other host), "
                      r"error mode (\w+)\):\n((?:#.*\n)*)")


def endpoints(rank: int, stderr: str) -> dict[tuple[int, int], tuple[str, str]]:
    """(rank, peer) -> (where, UCX lanes) from that rank's info log."""
    return {(rank, int(m[1])): (m[2], m[4]) for m in ENDPOINT.finditer(stderr)}


def check_topology(results, placement: list[int]) -> None:
    """Ranks of one namespace share memory; ranks of two talk over tcp and nothing else."""
    for rank, (_, _, err) in enumerate(results):
        found = endpoints(rank, err)
        for peer, host in enumerate(placement):
            if peer == rank:
                continue
            assert (rank, peer) in found, f"rank {rank} logged no endpoint to rank {peer}:\n{err[-3000:]}"
            where, lanes = found[(rank, peer)]
            if host == placement[rank]:
                assert where == "same host", f"rank {rank} -> {peer}: {where}"
            else:
                assert where == "other host", f"rank {rank} -> {peer} are on two namespaces, logged {where}"
                assert "tcp" in lanes, f"rank {rank} -> {peer} has no tcp lane:\n{lanes}"
                shm = re.findall(r"\b(posix|sysv|cma|xpmem|knem)\b", lanes)
                assert not shm, f"rank {rank} -> {peer} on another host uses {shm}:\n{lanes}"


def test_every_collective_two_hosts_two_ranks_each(hosts):
    placement = [0, 0, 1, 1]
    results = run(hosts, placement, "collectives", {"DLOP_LOG_LEVEL": "info"})
    check_topology(results, placement)


def test_every_collective_three_hosts_one_rank_each(hosts):
    placement = [0, 1, 2]
    results = run(hosts, placement, "collectives", {"DLOP_LOG_LEVEL": "info"})
    check_topology(results, placement)


@pytest.mark.parametrize("algorithm", ["hierarchical", "ring"])
def test_forced_allreduce_is_exact_and_selected(hosts, algorithm):
    placement = [0, 1, 0, 1]  # ranks of a host are not neighbours in rank order
    results = run(hosts, placement, "allreduce", {"DLOP_ALGO": f"allreduce:{algorithm}", "DLOP_LOG_LEVEL": "debug"})
    for rank, (_, _, err) in enumerate(results):
        chosen = set(re.findall(r"all_?reduce\S*.*?: algorithm (\S+)", err, re.I))
        assert chosen == {algorithm}, f"rank {rank} ran all-reduce with {chosen or 'nothing logged'}:\n{err[-2000:]}"


def test_rank_killed_on_one_host_is_named_by_the_others(hosts):
    placement = [0, 0, 1, 1]
    victim = 3
    procs = launch(hosts, placement, "loop", {"DLOP_TIMEOUT_MS": "20000"})
    try:
        # Wait (bounded) until the victim is inside its loop of all-reduces, then kill it.
        line = read_line(procs[victim], timeout=DEADLINE)
        assert line.startswith("LOOPING"), f"rank {victim} did not start: {line!r}"
        time.sleep(0.5)
        # ip netns exec execs the command, so the pid is the rank's.
        os.kill(procs[victim].pid, signal.SIGKILL)
        results = finish(procs, timeout=60)
    finally:
        for proc in procs:  # a failed assertion must not leave ranks running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (code, out, err) in enumerate(results):
        if rank == victim:
            assert code == -signal.SIGKILL
            continue
        errors = [line[6:] for line in out.splitlines() if line.startswith("ERROR ")]
        assert errors, f"rank {rank} reported no error:\n{out[-1500:]}{err[-2500:]}"
        assert re.search(rf"\brank {victim}\b", errors[0]), f"rank {rank}'s error does not name rank {victim}: {errors[0]}"

