"""Hosts' CPU sets (bench.netns): split_cpus gives trainer and offloader hosts disjoint cores, and a
host's processes run on its set. Skipped where namespaces cannot be made (not root)."""

from __future__ import annotations

import os
import subprocess

import pytest

from bench.common import netns

ok, why = netns.available()

@pytest.mark.parametrize("groups, cpus, expected", [
    ([2, 1], [0, 1], [{0}, {0}, {1}]),  # this machine: trainers share a core, the offloader has its own
    ([2, 1], [0, 1, 2], [{0}, {1}, {2}]),
    ([2, 1], list(range(16)), [{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}, {11, 12, 13, 14, 15}]),
    ([1, 1], [3, 7], [{3}, {7}]),
])
def test_split_cpus_gives_each_group_of_hosts_its_own_cores(groups, cpus, expected):
    assert netns.split_cpus(groups, cpus) == expected


def test_split_cpus_refuses_fewer_cores_than_groups():
    with pytest.raises(ValueError, match="1 core"):
        netns.split_cpus([2, 1], [0])


@pytest.mark.skipif(not ok, reason=f"cannot make network namespaces here: {why}")
def test_a_hosts_processes_run_on_its_cores():
    cores = sorted(os.sched_getaffinity(0))
    sets = [{cores[0]}, {cores[-1]}]
    with netns.Hosts(2, cpus=sets) as h:
        for host, want in enumerate(sets):
            out = h.popen(host, ["sh", "-c", "grep Cpus_allowed_list /proc/self/status"], stdout=subprocess.PIPE,
                          text=True).communicate(timeout=30)[0]
            assert out.split()[-1] == str(*want), (host, out)
        assert f"cpus {cores[-1]}" in h.describe()
        with pytest.raises(RuntimeError, match="has hosts already"):
            netns.Hosts(1)
    with pytest.raises(ValueError, match="one non-empty CPU set per host"):
        netns.Hosts(2, cpus=[{0}])
