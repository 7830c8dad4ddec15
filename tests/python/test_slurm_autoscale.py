"""SlurmActuator (dlop.fleet.scaling.slurm) on a real SLURM cluster: Debian's
munged, slurmctld and two slurmd in namespaces (slurm_cluster.py), started
once for the module.

The test stands in for the training job: it hosts the fleet's TCPStore on
the cluster's bridge (the controller's address, which the nodes reach) and
a token file, and drives the actuator as the autoscaling controller would.
With a floor of 1 (a het group of one, started by nobody here) the fleet
grows to 3: two sbatch jobs, each a `dlop offloader` whose daemon announces
itself in the store and answers an authenticated connection, and squeue
lists exactly those jobs. Shrunk to 1, the jobs drain on SIGTERM, exit 0,
withdraw their announcements and leave squeue. sbatch failing, an
offloader job that never starts and one that fails are each one clear
message, and the fleet counts what it still has.
"""

from __future__ import annotations

import datetime
import re
import time

import pytest

torch = pytest.importorskip("torch")

import slurm_cluster  # noqa: E402
from processes import wait_for  # noqa: E402

from dlop.fleet import discovery  # noqa: E402
from dlop.fleet.scaling.actuator import ActuatorError  # noqa: E402
from dlop.fleet.scaling.slurm import SlurmActuator  # noqa: E402

DEADLINE = 60.0  # seconds for a job to start, announce itself or end (a hang fails, it does not block the suite)
TOKEN = "slurm-autoscale-test-token-0123456789"

pytestmark = pytest.mark.long_file(seconds=20)  # handed out first (conftest.py)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster.for_module(tmp_path_factory, nodes=2) as c:
        yield c


@pytest.fixture
def fleet(cluster, tmp_path):
    """(the store, its HOST:PORT on the bridge, the token file, the environment of the commands)."""
    from torch.distributed import TCPStore

    store = TCPStore(cluster.ctl_addr, 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=10))
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    # DLOP_LOG_LEVEL=info: the daemons say when they drain (sbatch exports the environment to the jobs).
    yield store, f"{cluster.ctl_addr}:{store.port}", token, {**cluster.env, "DLOP_LOG_LEVEL": "info"}


def _actuator(fleet, tmp_path, name: str, **kw) -> SlurmActuator:
    _, address, token, env = fleet
    kw = {"floor": 1, "env": env, "job_name": name, "output_dir": tmp_path, "daemon_args": ["--threads", "1"], **kw}
    return SlurmActuator(address, token, **kw)


def _squeue(cluster, name: str) -> list[tuple[str, str]]:
    """(id, name) of the jobs named `name` that are pending, running or ending."""
    done = cluster.run(["squeue", "--noheader", f"--name={name}", "--format=%i %j"])
    assert done.returncode == 0, done.stderr
    return sorted(tuple(line.split()) for line in done.stdout.splitlines())


def _ended(cluster, job: str) -> tuple[str, str]:
    """(state, exit code) of a job, as scontrol shows it."""
    shown = cluster.run(["scontrol", "show", "job", "-o", job]).stdout
    return re.search(r"JobState=(\w+)", shown).group(1), re.search(r"ExitCode=(\S+)", shown).group(1)


def test_the_fleet_grows_through_sbatch_and_shrinks_through_scancel(cluster, fleet, tmp_path):
    from dlop._C import offload

    store, name = fleet[0], "dlop-offloader-grow"
    act = _actuator(fleet, tmp_path, name)
    try:
        assert act.size() == 1 and act.jobs() == []
        said = act.scale(3)
        jobs = act.jobs()
        assert said == f"submitted offloader jobs {jobs[0]}, {jobs[1]} ({name}): fleet 1 -> 3"
        assert act.size() == 3
        assert _squeue(cluster, name) == sorted((job, name) for job in jobs)  # the actuator's jobs, no other
        outputs = [tmp_path / f"{name}-{job}.out" for job in jobs]
        wait_for(lambda: len(discovery.discover(store)) == 2, DEADLINE, "both offloader jobs to announce", outputs)
        addresses = discovery.discover(store)
        for address in addresses:
            host, port = address.rsplit(":", 1)
            assert host in cluster.addrs.values()  # a node's address, as the route to the store gives it
            counters = offload.daemon_stats(host, int(port), TOKEN, 20.0)["counters"]  # authenticated with the token
            assert (counters["batches_ready"], counters["open_connections"]) == (0, 1)
        for output in outputs:
            assert re.search(r"dlop offloader: announced \S+ in the store at " + re.escape(fleet[1]),
                             output.read_text())
        assert act.check() == []

        said = act.scale(1)
        assert said == (f"stopping offloader jobs {jobs[1]}, {jobs[0]} (scancel --batch --signal=TERM: "
                        "they drain, then end): fleet 3 -> 1")  # the newest first
        assert act.size() == 1 and act.jobs() == []
        wait_for(lambda: _squeue(cluster, name) == [], DEADLINE, "the stopped jobs to leave squeue", outputs)
        assert discovery.discover(store) == []  # both announcements withdrawn
        for job, output in zip(jobs, outputs):
            assert _ended(cluster, job) == ("COMPLETED", "0:0")  # `dlop offloader` and its daemon exited 0
            assert "offloader: drained: 0 batches sent since SIGTERM, 0 leases refused; exiting" in output.read_text()
        assert act.check() == []
        assert act.scale(0) == "fleet at 1"  # the floor stays
    finally:
        act.close()
    assert _squeue(cluster, name) == []


def test_sbatch_failing_names_the_command_and_its_message_and_keeps_the_fleet(cluster, fleet, tmp_path):
    name = "dlop-offloader-fails"
    act = _actuator(fleet, tmp_path, name, sbatch_args=["--partition=nosuch"])
    with pytest.raises(ActuatorError, match=r"`sbatch --partition=nosuch --parsable .*` failed \(exit 1\): "
                                            r".*Invalid partition name specified"):
        act.scale(3)
    assert act.size() == 1 and _squeue(cluster, name) == []

    act = _actuator(fleet, tmp_path, name, env={**fleet[3], "PATH": str(tmp_path)})
    with pytest.raises(ActuatorError, match=rf"sbatch is not on PATH \({tmp_path}\): `sbatch --parsable "):
        act.scale(2)
    assert act.size() == 1

    # A partition an administrator made inactive: the job submitted before stays counted.
    act = _actuator(fleet, tmp_path, name)
    try:
        act.scale(2)
        (first,) = act.jobs()
        assert cluster.run(["scontrol", "update", "PartitionName=test", "State=INACTIVE"]).returncode == 0
        with pytest.raises(ActuatorError, match=r"Required partition not available \(inactive or drain\)"):
            act.scale(3)
        assert act.size() == 2 and act.jobs() == [first]
        assert _squeue(cluster, name) == [(first, name)]
    finally:
        assert cluster.run(["scontrol", "update", "PartitionName=test", "State=UP"]).returncode == 0
        act.close()
    assert _squeue(cluster, name) == []


def test_an_offloader_job_that_never_starts_is_cancelled_and_reported(cluster, fleet, tmp_path):
    name = "dlop-offloader-pending"
    act = _actuator(fleet, tmp_path, name, sbatch_args=["--begin=now+1hour"], start_timeout=2)
    try:
        act.scale(2)
        (job,) = act.jobs()
        assert act.check() == [] and act.size() == 2  # pending, within its start_timeout
        time.sleep(2.1)
        assert act.check() == [f"offloader job {job} did not start within 2 s (squeue: PENDING, reason BeginTime); "
                               "cancelled"]
        assert act.size() == 1 and act.jobs() == []
        assert _ended(cluster, job)[0] == "CANCELLED"
        assert act.check() == []  # said once
    finally:
        act.close()


def test_an_offloader_job_that_fails_is_dropped_and_reported_with_its_output(cluster, fleet, tmp_path):
    name = "dlop-offloader-dies"
    act = _actuator(fleet, tmp_path, name, floor=0, daemon_args=["--no-such-option"])
    try:
        act.scale(1)
        (job,) = act.jobs()
        output = tmp_path / f"{name}-{job}.out"
        problems: list[str] = []

        def ended() -> bool:
            problems.extend(act.check())
            return bool(problems)

        wait_for(ended, DEADLINE, "check() to see the job end", [output])
        assert problems == [f"offloader job {job} ended: FAILED, exit code 1:0; {output} ends: The following "
                            "argument was not expected: --no-such-option | Run with --help for more information. | "
                            "dlop offloader: dlop-offloader exited with status 109 before listening"]
        assert act.size() == 0 and act.jobs() == []
    finally:
        act.close()


@pytest.mark.parametrize("change, message", [
    ({"store": "nohost"}, "store 'nohost' is not HOST:PORT"),
    ({"token_file": "/nonexistent/token"}, "token file /nonexistent/token does not exist"),
    ({"floor": -1}, "floor (-1) is negative"),
    ({"start_timeout": 0}, "start_timeout (0) must be positive"),
    ({"sbatch_args": "--partition=cpu --time=1:00:00"}, "sbatch_args is a string"),
])
def test_bad_arguments_are_named(tmp_path, change, message):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    kw = {"store": "10.0.0.1:29500", "token_file": token, **change}
    with pytest.raises(ValueError, match=re.escape(message)):
        SlurmActuator(kw.pop("store"), kw.pop("token_file"), **kw)


def test_offloader_jobs_are_named_after_the_trainers_job(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {"SLURM_JOB_ID": "4321", "SLURM_PROCID": "0", "SLURM_CONF": "/etc/slurm/slurm.conf", "PATH": "/usr/bin"}
    act = SlurmActuator("10.0.0.1:29500", token, env=env)
    assert act.job_name == "dlop-offloader-4321"
    # The trainer's job variables stay out of the offloader jobs' environment; the cluster's configuration stays.
    assert act.env == {"SLURM_CONF": "/etc/slurm/slurm.conf", "PATH": "/usr/bin"}
