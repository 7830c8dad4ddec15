"""Offloaders as Ray actors (dlop.fleet.scaling.ray) on a real Ray cluster of namespace hosts.

Host 0 is the trainer's: the Ray head (no CPUs of its own to lend), the
fleet's store and the trainer, a Ray driver. Hosts 1 and 2 are Ray worker
nodes of 2 CPUs each (``ray start --address``). The trainer reads a fixed
dataset through an unchanged OffloadLoader while the actuator grows and
shrinks the fleet between batches; new offloaders reach the loader through
the store the actuator announces them in. Its batches must equal, bit for
bit and in order, those of a fixed fleet of one daemon on the same cluster,
with every sample once per epoch. Starting the cluster takes tens of seconds
on 2 cores, so one cluster serves the module.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dlop.fleet.scaling.actuator import ActuatorError

# Each test starts a trainer and Ray actors on a cluster that takes tens of seconds to answer on 2 busy cores.
pytestmark = [pytest.mark.long_file(seconds=340), pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent
WORKER_CPUS = 2

SCRIPT = r'''
import hashlib, json, os, sys, time
import ray
from torch.distributed import TCPStore
from dlop.data import OffloadLoader
from dlop.fleet import discovery
from dlop.fleet.scaling.actuator import ActuatorError
from dlop.fleet.scaling.ray import RayActuator

mode, address, data, token_file = sys.argv[1:5]
ray.init(address=address, log_to_driver=False)
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
token = open(token_file).read().strip()
SPEC = {"ops": [{"op": "center_crop", "size": 8}], "output": "uint8"}


def run(actuator, plan, epochs=3):
    """Batches of `epochs` epochs; plan[k]: what to do after batch k."""
    loader = OffloadLoader(data, SPEC, 4, shuffle=True, seed=7, offloaders=actuator.addresses, token=token)
    joined, out, k = set(actuator.addresses), [], 0
    for _ in range(epochs):
        batches = []
        for x, _y in loader:
            batches.append([hashlib.sha1(s.numpy().tobytes()).hexdigest() for s in x])
            k += 1
            if k in plan:
                plan[k](actuator)
            for a in discovery.discover(store):  # the announced offloaders join between batches
                if a not in joined:
                    loader.add_offloader(a)
                    joined.add(a)
        out.append(batches)
    return out


def scale(n):
    def act(actuator):
        actuator.scale(n)
        sizes.append(actuator.size())
    return act


def kill_first(actuator):
    a = actuator.actors[0]
    os.kill(a.pid, 9)  # the daemon's leases are lost, not drained
    ray.kill(a.handle)
    time.sleep(1)
    problems.extend(actuator.check())
    sizes.append(actuator.size())


sizes, problems, result = [], [], {}
node = ray.get_runtime_context().get_node_id()
if mode == "fleet":
    fixed = RayActuator(store, token_file, num_cpus=1)
    fixed.scale(1)
    result["fixed"] = run(fixed, {})
    fixed.close()
    grown = RayActuator(store, token_file, num_cpus=1, trainer_node=False)
    grown.scale(1)
    result["grown"] = run(grown, {3: scale(3), 8: scale(4), 14: scale(1), 22: scale(2)})
    result["hosts"] = sorted({a.host for a in grown.actors})
    result["trainer"] = ray.util.get_node_ip_address()
    grown.close()
    result["after_close"] = grown.size()
elif mode == "kill":
    fixed = RayActuator(store, token_file, num_cpus=1)
    fixed.scale(1)
    result["fixed"] = run(fixed, {}, epochs=2)
    fixed.close()
    actuator = RayActuator(store, token_file, num_cpus=1)
    actuator.scale(2)
    result["killed"] = run(actuator, {6: kill_first}, epochs=2)
    actuator.close()
elif mode == "bad":
    actuator = RayActuator(store, token_file, num_cpus=1, trainer_node=False, start_timeout=45)
    t = time.monotonic()
    try:
        actuator.scale(2 * int(sys.argv[5]) + 1)
    except ActuatorError as e:
        result["full"] = str(e)
    result["full_seconds"] = time.monotonic() - t
    result["full_size"] = actuator.size()
    actuator.close()
    broken = RayActuator(store, token_file, num_cpus=1, daemon_args=["--no-such-option"], start_timeout=20)
    try:
        broken.scale(1)
    except ActuatorError as e:
        result["broken"] = str(e)
    result["broken_size"] = broken.size()
result["sizes"], result["problems"] = sizes, problems
print("RESULT " + json.dumps(result), flush=True)
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray", reason="ray is not installed (the extra: pip install 'dlop[ray]')")
    pytest.importorskip("torch")
    from bench.common import netns

    ok, why = netns.available()
    if not ok:
        pytest.skip(f"cannot make network namespaces here: {why}")
    from processes import offloader

    offloader()  # or a skip
    from dlop.data.make_dataset import main as make_dataset

    root = tmp_path_factory.mktemp("ray")
    data = root / "data"
    assert make_dataset([str(data), "--classes", "4", "--per-class", "10", "--seed", "3", "--size", "32x24"]) == 0
    token = root / "token"
    token.write_text(secrets.token_hex(16) + "\n")
    token.chmod(0o600)
    # Token authentication, as `ray start --head` turns it on, with a token of the cluster's own. The raylet
    # gives its agents 30 s to start and then aborts; on a busy 2-core machine they take longer.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
               RAY_raylet_start_wait_time_s="300", RAY_agent_register_timeout_ms="300000",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env = {k: v for k, v in env.items() if not k.startswith(("DLOP_RUN_", "DLOP_OFFLOAD_TOKEN"))}
    with netns.Hosts(3) as hosts:
        head = f"{hosts.addrs[0]}:6379"
        procs = []

        def ray_start(host: int, *args: str) -> None:
            log = open(root / f"ray-{host}.log", "w")
            procs.append(hosts.popen(host, [str(BIN / "ray"), "start", "--block", f"--node-ip-address={hosts.addrs[host]}",
                                            f"--temp-dir={root}/ray-{host}", *args],
                                     env=env, process_group=0, stdout=log, stderr=subprocess.STDOUT))

        try:
            ray_start(0, "--head", "--port=6379", "--num-cpus=0", "--include-dashboard=false")
            for host in (1, 2):
                ray_start(host, f"--address={head}", f"--num-cpus={WORKER_CPUS}")
            yield {"hosts": hosts, "env": env, "data": data, "token": token, "head": head, "root": root}
        finally:
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def _trainer(cluster, mode: str, timeout: float = 400) -> dict:
    script = cluster["root"] / "train.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, str(script), mode, cluster["head"], str(cluster["data"]), str(cluster["token"]),
            str(WORKER_CPUS)]
    proc = cluster["hosts"].popen(0, argv, env=cluster["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"the trainer failed ({proc.returncode}):\n{out}\n{err[-6000:]}"
    return json.loads(lines[0][len("RESULT "):])


def _exactly_once(epochs: list) -> None:
    every = sorted(s for b in epochs[0] for s in b)
    assert len(every) == 40 and len(set(every)) == 40
    for epoch in epochs:
        assert sorted(s for b in epoch for s in b) == every


def test_the_fleet_grows_and_shrinks_off_the_trainers_node_and_every_batch_is_a_fixed_fleets(cluster):
    got = _trainer(cluster, "fleet")
    _exactly_once(got["fixed"])
    assert got["grown"] == got["fixed"]  # bit for bit, batch by batch, in order
    assert got["sizes"] == [3, 4, 1, 2]
    assert got["trainer"] not in got["hosts"] and got["hosts"]  # hard placement: off the trainer's node
    assert got["after_close"] == 0 and got["problems"] == []


def test_a_killed_actors_leases_are_reissued(cluster):
    got = _trainer(cluster, "kill")
    _exactly_once(got["fixed"])
    assert got["killed"] == got["fixed"]
    assert got["sizes"] == [1]
    (problem,) = got["problems"]
    assert "the actor died" in problem or "exited with status" in problem


def test_a_full_cluster_and_a_daemon_that_cannot_start_are_named(cluster):
    got = _trainer(cluster, "bad")
    full, want = got["full"], 2 * WORKER_CPUS + 1
    assert f"started {2 * WORKER_CPUS} of {want}" in full and "1 found no room in 45 s" in full, full
    assert "request_resources" in full and "off the trainer's node" in full
    assert got["full_seconds"] < 120 and got["full_size"] == 2 * WORKER_CPUS
    broken = got["broken"]
    assert "started 0 of 1" in broken and "dlop-offloader did not start on node 10.214.0." in broken, broken
    assert "no-such-option" in broken  # the daemon's own stderr
    assert got["broken_size"] == 0


def test_without_ray_the_actuator_names_the_extra(monkeypatch, tmp_path):
    from dlop.fleet.scaling.ray import RayActuator

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError, as where it is not installed
    token = tmp_path / "token"
    token.write_text("t\n")
    with pytest.raises(ActuatorError, match=r"ray package is not installed.*pip install 'dlop\[ray\]'"):
        RayActuator(object(), token)
