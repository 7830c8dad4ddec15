"""`dlop run --offloaders auto --scaler slurm` as a SLURM job, end to end: the
real slurmctld and three slurmd in namespaces (slurm_cluster.py), the
trainer's job on n1, its offloader jobs on n2 and n3.

The training script knows nothing of dlop. Its Dataset costs a set time
per sample (a sleep read from a file on the shared folder, which the test
makes cheap), its step is fixed, and it trains whole epochs until the test
says stop. From its first offloader job the fleet must grow to 3 through
sbatch while the data is costly, and shrink through scancel once it is
cheap. Each time the fleet settles, squeue must list exactly the offloader
jobs the trainer's controller counts (its decision in the fleet's store);
the drained jobs end COMPLETED with exit code 0, none is left when the job
ends, and every epoch holds each sample once, every batch bit-identical to
a fixed fleet's.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import costly_dataset

torch = pytest.importorskip("torch")

import slurm_cluster  # noqa: E402
from processes import wait_for  # noqa: E402

BIN = Path(sys.executable).parent
TOKEN = "slurm-autoscale-job-token-0123456789"
DEADLINE = 40.0  # seconds for each phase of the job (a hang fails, it does not block the suite)
SETTLE = 4.0  # seconds a fleet size must hold before squeue is compared with it (a job starts or drains)

pytestmark = pytest.mark.long_file(seconds=60)  # handed out first (conftest.py)

SCRIPT = costly_dataset.HEAD + r'''
cost_file, step, stop_file, most = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
loader = DataLoader(Costly(cost_file, 48), batch_size=4, shuffle=True)
epochs = []
while len(epochs) < most and not os.path.exists(stop_file):
    batches = []
    for x, ids in loader:
        batches.append([ids.tolist(), hashlib.sha1(x.numpy().tobytes()).hexdigest()])
        time.sleep(step)
    epochs.append(batches)
print("RESULT " + json.dumps({"epochs": epochs}), flush=True)
'''

# One offloader job (one CPU, one worker) makes a batch of 4 in 0.2 s: 5 steps' worth, so the
# estimate is well above 3 and the fleet grows 1 -> 3 at once. MOST bounds the training (a hang fails).
STEP, SAMPLE, MOST = 0.04, 0.05, 200
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # n1 for the trainer; n2 and n3 (a CPU a job, 2 CPUs a node at least) for 3 offloader jobs.
    with slurm_cluster.for_module(tmp_path_factory, nodes=3) as c:
        yield c


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLOP_RUN_", "DLOP_OFFLOAD_TOKEN"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _result(text: str) -> dict:
    (line,) = [x for x in text.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def _job(cluster, job: str) -> tuple[str, str]:
    """(state, exit code) as scontrol shows it."""
    shown = cluster.run(["scontrol", "show", "job", "-o", job]).stdout
    state, code = re.search(r"JobState=(\w+)", shown), re.search(r"ExitCode=(\S+)", shown)
    return (state.group(1), code.group(1)) if state and code else ("", "")


class Fleet:
    """What squeue lists of the trainer's offloader jobs beside what its controller decided, as it changes."""

    def __init__(self, cluster, name: str, store_address: str) -> None:
        from torch.distributed import TCPStore

        from dlop.fleet.scaling import figures

        host, port = store_address.rsplit(":", 1)
        # The trainer advertises its node's name, which resolves on the nodes only.
        self.store = TCPStore(cluster.addrs[host], int(port), is_master=False, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=10))
        self.key, self.cluster, self.name = figures.DECISION, cluster, name
        self.decision: dict = {}  # the latest
        self.seen: set[str] = set()  # every offloader job squeue ever listed
        self.counts: list[int] = []  # how many jobs squeue listed, each time that changed
        self.size, self._since = None, time.monotonic()  # the decision's size, and since when

    def squeue(self) -> dict[str, str]:
        """{job id: state} of the offloader jobs not yet ended."""
        done = self.cluster.run(["squeue", "--noheader", f"--name={self.name}", "--format=%i %T"])
        assert done.returncode == 0, done.stderr
        jobs = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        self.seen |= set(jobs)
        if not self.counts or self.counts[-1] != len(jobs):
            self.counts.append(len(jobs))
        return jobs

    def settled(self, wanted) -> bool:
        """Whether the controller's fleet size has held for SETTLE s at a size wanted(size) accepts;
        polls squeue meanwhile."""
        self.squeue()
        if self.store.check([self.key]):
            self.decision = json.loads(self.store.get(self.key))
        if self.decision.get("size") != self.size:
            self.size, self._since = self.decision.get("size"), time.monotonic()
        return self.size is not None and wanted(self.size) and time.monotonic() - self._since >= SETTLE


def test_the_fleet_grows_through_sbatch_and_shrinks_through_scancel_and_squeue_agrees(cluster, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    cost, stop, token = tmp_path / "cost", tmp_path / "stop", tmp_path / "token"
    cost.write_text(str(SAMPLE))
    token.write_text(TOKEN)
    token.chmod(0o600)
    run = [str(BIN / "dlop"), "run", "--offloaders", "auto", "--scaler", "slurm", "--token-file", str(token),
           "--max", "3", "--window", "1", "--hysteresis", "2", "--cooldown-steps", "10", "--stall-target", "0.05",
           "--sbatch-args=--exclude=n1", "--", sys.executable, "train.py", str(cost), str(STEP), str(stop), str(MOST)]
    done = cluster.run(["sbatch", "--parsable", "--job-name=trainer", "--nodelist=n1", "--exclusive", "--time=3",
                        f"--chdir={tmp_path}", "--output=trainer-%j.out", "--error=trainer-%j.err",
                        "--wrap", "exec " + shlex.join(run)], env={**_env(), "DLOP_LOG_LEVEL": "info"})
    assert done.returncode == 0, done.stderr
    jid, name = done.stdout.strip(), f"dlop-offloader-{done.stdout.strip()}"
    out, err = tmp_path / f"trainer-{jid}.out", tmp_path / f"trainer-{jid}.err"
    log = lambda: err.read_text() if err.exists() else ""  # noqa: E731
    try:
        m = wait_for(lambda: re.search(r"the fleet's store is (\S+)\n", log()), DEADLINE, "dlop run's store", [err])
        fleet = Fleet(cluster, name, m.group(1))

        # Costly: from its first offloader job the fleet grows to 3, and squeue lists exactly those 3, running.
        wait_for(lambda: fleet.settled(lambda n: n == 3), DEADLINE, "the fleet to grow to 3 and hold", [err],
                 interval=0.25)
        first = re.search(rf"slurm fleet: submitted offloader jobs (\d+) \({name}\): fleet 0 -> 1", log())
        grown = re.search(rf"growing 1 -> 3; slurm: submitted offloader jobs (\d+), (\d+) \({name}\): "
                          r"fleet 1 -> 3", log())
        assert first and grown, log()
        jobs = [first.group(1), grown.group(1), grown.group(2)]
        assert fleet.squeue() == dict.fromkeys(jobs, "RUNNING"), (fleet.decision, log())
        # Each job's daemon announces itself, and the trainer takes batches from all three.
        wait_for(lambda: fleet.settled(lambda n: n == 3) and fleet.decision["live"] == 3, DEADLINE,
                 "the trainer to use the 3 offloaders", [err], interval=0.25)

        # Cheap: the fleet shrinks through scancel to --min (idle offloaders: the estimate is 1); the drained
        # jobs leave squeue, the oldest stays. Waiting for the floor, not for any smaller size that held a
        # while: on a busy machine 3 -> 2 can hold for SETTLE s before 2 -> 1, which would then race the checks.
        cost.write_text("0")
        wait_for(lambda: fleet.settled(lambda n: n == 1), DEADLINE,
                 "the fleet to shrink to one and hold", [err], interval=0.25)
        size = fleet.size
        # 3 -> 1 at once where the estimate says so, else through 2; each shrink stops the newest jobs first.
        shrinks = re.findall(r"shrinking (\d) -> (\d); slurm: stopping offloader jobs ([\d, ]+) "
                             r"\(scancel --batch --signal=TERM: they drain, then end\)", log())
        assert [int(a) for a, _, _ in shrinks] == [3] + [int(b) for _, b, _ in shrinks[:-1]], log()
        assert int(shrinks[-1][1]) == size
        assert [j for _, _, said in shrinks for j in said.split(", ")] == jobs[size:][::-1], log()
        assert fleet.squeue() == dict.fromkeys(jobs[:size], "RUNNING"), (fleet.decision, log())
        assert fleet.decision["live"] == size
        stop.touch()
        wait_for(lambda: _job(cluster, jid)[0] in ENDED, DEADLINE, "the trainer's job to end", [err],
                 interval=0.25)
    finally:
        stop.touch()
        if _job(cluster, jid)[0] not in ENDED:
            cluster.run(["scancel", jid])
            cluster.run(["scancel", f"--name={name}"])
    assert _job(cluster, jid) == ("COMPLETED", "0:0"), log()
    assert fleet.squeue() == {}  # dlop run stopped its last offloader job before it ended
    assert fleet.seen == set(jobs)
    # squeue listed 1 job, then up to 3 (the two sbatch follow each other), then down to none.
    peak = fleet.counts.index(3)
    assert fleet.counts[0] == 1 and fleet.counts[:peak] == sorted(fleet.counts[:peak]), fleet.counts
    assert fleet.counts[peak:] == sorted(fleet.counts[peak:], reverse=True) and fleet.counts[-1] == 0, fleet.counts
    for job in jobs:  # each drained (the last when dlop run ended) and exited 0
        assert _job(cluster, job) == ("COMPLETED", "0:0")
        said = (tmp_path / f"{name}-{job}.out").read_text()
        assert re.search(r"offloader: drained: \d+ batches sent since SIGTERM, \d+ leases refused; exiting",
                         said), said

    # Every epoch each sample once; every batch bit-identical to a fixed local fleet's, made by the offloaders.
    got = _result(out.read_text())
    epochs = len(got["epochs"])
    assert epochs >= 2
    for epoch in got["epochs"]:
        assert sorted(i for ids, _ in epoch for i in ids) == list(range(48))
    assert f"dlop run: {12 * epochs} batches made by dlop-offloader, 0 made locally" in log(), log()
    free = tmp_path / "free"
    free.write_text("0")
    fixed = subprocess.run([str(BIN / "dlop"), "run", "--local-offloaders", "1", "--", sys.executable,
                            str(tmp_path / "train.py"), str(free), "0", str(tmp_path / "never"), str(epochs)],
                           capture_output=True, text=True, timeout=60, env=_env())
    assert fixed.returncode == 0, fixed.stderr
    assert got["epochs"] == _result(fixed.stdout)["epochs"]
