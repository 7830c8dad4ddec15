"""The shipped SLURM template on a real SLURM cluster: `sbatch` of
examples/slurm/dlop_hetjob.sbatch runs the training under `dlop run` in het
group 0 (node n1) and `dlop offloader` in het group 1 (node n2), with no
address, port or token given by the test.

The cluster (slurm_cluster.py) is Debian's munged, slurmctld and two slurmd,
each node in its own network, UTS and mount namespace, started by the module
and stopped after it, also on failure. The training script is
test_dlop_run's, which knows nothing of dlop: it initialises torch.distributed
from the variables `dlop run` sets under srun and prints each batch's samples
(label and a digest of the image). They must be dlop's plan for each epoch,
each sample as this host's own pipeline makes it (the reference). The
trainer's log names the daemon on n2 it got its batches from, the offloader
names its node, and its counters, read during the job, count the batches it
made. In the second epoch the test cancels the offloader component
(`scancel JOB+1`, a lost spot node) mid-epoch: the training finishes the
epoch on its own node after one warning, each sample exactly once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import slurm_cluster  # noqa: E402
import test_dlop_run as run_test  # noqa: E402  (its training script, which knows nothing of dlop)

from processes import wait_for  # noqa: E402

from dlop.fleet import dns, slurm  # noqa: E402
from dlop.cli import main as dlop_main  # noqa: E402
from dlop.fleet.run import environment  # noqa: E402

BIN = Path(sys.executable).parent
TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "dlop_hetjob.sbatch"
BATCH, EPOCHS = 4, 2  # as in test_dlop_run's script, whose training this job runs
DEADLINE = 120.0  # seconds for the whole job (a hang fails, it does not block the suite)

pytestmark = pytest.mark.long_file(seconds=120)  # handed out first (conftest.py)

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster.for_module(tmp_path_factory, nodes=2) as c:
        yield c


def _reference_keys(data: Path) -> list:
    """Each sample's (label, digest) as this host's pipeline makes it: what the job's batches must hold."""
    from dlop._C import media

    source = media.open_source(str(data))
    images, labels, _ = media.ImagePipeline(json.dumps(run_test.SPEC)).run_batch(source, list(range(len(source))),
                                                                             seed=0, epoch=0)
    return [[int(labels[i]), hashlib.sha1(images[i].tobytes()).hexdigest()[:16]] for i in range(len(source))]


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _job_state(cluster, job: str) -> str:
    done = cluster.run(["scontrol", "show", "job", "-o", job])
    m = re.search(r"JobState=(\w+)", done.stdout)
    return m.group(1) if m else ""


@pytest.fixture(scope="module")
def job(cluster, tmp_path_factory):
    """One sbatch of the template; after the first batch of epoch 1 the offloader component is cancelled.

    Returns the job's output, its working folder, the samples' reference keys and what the test saw."""
    pytest.importorskip("dlop._C")
    work = tmp_path_factory.mktemp("job")
    data = work / "images"
    assert dlop_main(["make-dataset", str(data), "--classes", "3", "--per-class", "16", "--seed", "3"]) == 0
    (work / "train.py").write_text(run_test.SCRIPT)
    keys = _reference_keys(data)

    gate = work / "go"
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "DLOP_LOG_LEVEL": "info",
           "TEST_GATE_MID": str(gate), "TEST_GATE_MID_EPOCH": "1"}
    done = cluster.run(["sbatch", "--parsable", f"--chdir={work}", str(TEMPLATE), "python", "train.py", str(data)],
                       env=env)
    assert done.returncode == 0, done.stderr
    jid = done.stdout.strip().split(";")[0]
    output, seen = work / f"slurm-{jid}.out", {"job": jid}
    text = lambda: output.read_text() if output.exists() else ""  # noqa: E731
    try:
        wait_for(lambda: "PAUSED TEST_GATE_MID" in text() or _job_state(cluster, jid) in ENDED, DEADLINE,
                 "the trainer to reach epoch 1", [output])
        assert "PAUSED TEST_GATE_MID" in text(), text()
        m = re.search(r"dlop offloader: on (\S+) for SLURM job (\d+), port (\d+)", text())
        assert m, text()
        seen["offloader_host"], port = m.group(1), int(m.group(3))
        # The daemon's counters, read from outside the job over the bridge: the batches it made so far.
        address = f"{cluster.addrs[seen['offloader_host']]}:{port}"
        token = work / f".dlop-job-{jid}.token"
        seen["token_mode"] = token.stat().st_mode & 0o777
        stats = subprocess.run([str(BIN / "dlop"), "offloader-stats", address, "--json", "--token-file", str(token)],
                               capture_output=True, text=True, timeout=60)
        assert stats.returncode == 0, stats.stderr
        seen["stats"] = json.loads(stats.stdout)
        # A lost spot node: the offloader component is cancelled while the trainer is mid-epoch.
        cancelled = cluster.run(["scancel", f"{jid}+1"])
        assert cancelled.returncode == 0, cancelled.stderr
        wait_for(lambda: dns.answers(address, timeout=0.5) is not None, 30, f"the offloader at {address} to go")
        gate.touch()
        wait_for(lambda: _job_state(cluster, jid) in ENDED, DEADLINE, "the job to end", [output])
        seen["state"] = _job_state(cluster, jid)
    finally:
        gate.touch()
        if _job_state(cluster, jid) not in ENDED:
            cluster.run(["scancel", jid])
    return text(), work, keys, seen


# ------------------------------------------------ what each side reads from the job (no cluster needed)

HET = {"SLURM_JOB_ID": "43210", "SLURM_JOB_NODELIST_HET_GROUP_1": "node[01-02],gpu7",
       "SLURM_TASKS_PER_NODE_HET_GROUP_1": "2(x2),1"}


@pytest.mark.parametrize("text, counts", [("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("4(x1)", [4])])
def test_tasks_per_node_lists_expand(text, counts):
    assert slurm.tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "2(x)", "x", "2(x3)1"])
def test_malformed_tasks_per_node_lists_are_named(text):
    with pytest.raises(ValueError, match="is not N or N"):
        slurm.tasks_per_node(text)


def test_the_offloaders_of_het_group_1_are_its_tasks_on_the_jobs_port():
    # 10000 + 43210 % 10000 = 13210 on every node, +1 for a node's second task.
    assert slurm.het_offloaders(HET) == ["node01:13210", "node01:13211", "node02:13210", "node02:13211",
                                          "gpu7:13210"]
    assert slurm.het_offloaders({**HET, "DLOP_SLURM_OFFLOADER_PORT": "7001"})[:2] == ["node01:7001", "node01:7002"]
    one_each = {k: v for k, v in HET.items() if not k.startswith("SLURM_TASKS")}
    assert slurm.het_offloaders(one_each) == ["node01:13210", "node02:13210", "gpu7:13210"]
    assert slurm.het_offloaders({"SLURM_JOB_ID": "5"}) is None  # not a het job


@pytest.mark.parametrize("change, message", [
    ({"SLURM_TASKS_PER_NODE_HET_GROUP_1": "1(x2)"}, "counts 2 nodes"),
    ({"SLURM_JOB_NODELIST_HET_GROUP_1": "node[02-01]"}, "runs backwards"),
    ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not a job id"),
    ({"DLOP_SLURM_OFFLOADER_PORT": "70000"}, "DLOP_SLURM_OFFLOADER_PORT='70000' is not a port number"),
])
def test_unreadable_job_variables_are_named(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        slurm.het_offloaders({**HET, **change})


def test_dlop_run_in_a_het_job_step_takes_the_offloaders_and_ranks_from_the_job(tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text("x" * 32)
    step = {**HET, "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
            "SLURM_STEP_NODELIST": "n[3-4]", "DLOP_OFFLOAD_TOKEN_FILE": str(token), "LOCAL_RANK": "7"}
    command, env, local = environment(["--", "python", "train.py"], step)
    assert local is None and command == ["python", "train.py"]
    assert env["DLOP_RUN_OFFLOADERS"] == ",".join(slurm.het_offloaders(HET)) and env["DLOP_RUN_WAIT"] == "120"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("3", "4", "7")  # what is set stays
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("n3", str(20000 + 43210 % 20000))
    assert "the offloaders of het group 1: node01:13210" in capsys.readouterr().err
    # Named offloaders win over the job's; outside a het job the default stays local daemons.
    _, env, _ = environment(["--offloaders", "h:1", "--", "python"], step)
    assert env["DLOP_RUN_OFFLOADERS"] == "h:1" and "DLOP_RUN_WAIT" not in env
    plain = {k: v for k, v in step.items() if "HET_GROUP" not in k}
    assert environment(["--local-offloaders", "2", "--", "python"], plain)[2].count == 2
    with pytest.raises(SystemExit, match="no token.*dlop slurm-template"):
        environment(["--", "python"], {k: v for k, v in step.items() if k != "DLOP_OFFLOAD_TOKEN_FILE"})
    with pytest.raises(SystemExit, match="token file /nonexistent: No such file"):
        environment(["--", "python"], {**step, "DLOP_OFFLOAD_TOKEN_FILE": "/nonexistent"})


def test_local_offloaders_under_srun_share_the_nodes_cpus_between_its_tasks():
    from dlop.fleet.local import default_count

    step = {"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2,4(x2)", "SLURM_NODEID": "1",
            "SLURM_CPUS_ON_NODE": "32"}
    assert default_count(["python", "train.py"], step) == (32 - 4) // 4  # 4 tasks here, each 1 rank
    assert default_count(["torchrun", "--nproc-per-node", "2", "t.py"], step) == (32 - 4 * 2) // 4
    assert default_count(["python"], {**step, "SLURM_NODEID": "0"}) == (32 - 2) // 2
    assert default_count(["python"], {**step, "SLURM_CPUS_ON_NODE": "3"}) == 1  # at least one
    with pytest.raises(SystemExit, match="SLURM_NODEID='x' is not a number"):
        default_count(["python"], {**step, "SLURM_NODEID": "x"})


def test_dlop_offloader_outside_a_job_or_without_the_jobs_token_says_what_is_missing(monkeypatch, capsys):
    for name in [n for n in os.environ if n.startswith(("SLURM_", "DLOP_OFFLOAD_TOKEN"))]:
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit):
        dlop_main(["offloader"])
    assert "--store is required outside a SLURM job" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    with pytest.raises(SystemExit, match="no token: DLOP_OFFLOAD_TOKEN_FILE is unset"):
        dlop_main(["offloader"])


def test_dlop_slurm_template_prints_the_shipped_example(capsys):
    assert dlop_main(["slurm-template"]) == 0
    printed = capsys.readouterr().out
    assert printed == TEMPLATE.read_text()
    assert subprocess.run(["bash", "-n", str(TEMPLATE)]).returncode == 0  # it parses as a shell script
    assert "#SBATCH hetjob" in printed and "srun --het-group=1 dlop offloader" in printed


# ------------------------------------------------ the cluster


def _plan(keys: list, epoch: int) -> list:
    from dlop._C import offload

    plan = offload.EpochPlan(len(keys), BATCH, 0, True, False, 0, 1).batches(epoch)
    return [[keys[i] for i in batch] for batch in plan]


def test_the_trainers_batches_are_made_on_the_offloader_node(job):
    out, work, keys, seen = job
    assert seen["state"] == "COMPLETED", out
    (result,) = run_test.results(out)
    # The training ran on n1; it was given the offloader of het group 1 (n2) by the job alone.
    assert seen["offloader_host"] == "n2"
    m = re.search(r"dlop run on n1: SLURM job (\d+): the offloaders of het group 1: (\S+)", out)
    assert m and m.group(1) == seen["job"] and m.group(2).startswith("n2:"), out
    assert re.search(rf"offload client: connected to {m.group(2)} \(dlop-offloader on n2\b", out), out
    assert f"configured: {work / 'images'}" in out  # the daemon's own log: it served this dataset
    # Epoch 0 wholly from n2, in dlop's plan order, each sample made as this host's pipeline makes it.
    assert result["epochs"][0] == _plan(keys, 0)
    batch_stage = next(s for s in seen["stats"]["stages"] if s["name"] == "batch")
    assert batch_stage["items"] >= len(_plan(keys, 0)) + 1  # epoch 0 and the first batch of epoch 1, at least
    # The token was the job's: made by the batch script, for its user only, gone with the job.
    assert seen["token_mode"] == 0o600
    assert not (work / f".dlop-job-{seen['job']}.token").exists()


def test_cancelling_the_offloader_component_mid_epoch_keeps_the_epoch_exactly_once(job):
    out, _, keys, _ = job
    (result,) = run_test.results(out)
    assert result["epochs"][1] == _plan(keys, 1)  # every sample once, in plan order, although n2 went away
    assert sorted(s for b in result["epochs"][1] for s in b) == sorted(keys)
    assert out.count("making batches locally") == 1, out  # said once
    m = re.search(r"dlop run: (\d+) batches made by dlop-offloader, (\d+) made locally", out)
    assert m, out
    by_daemon, local = int(m.group(1)), int(m.group(2))
    per_epoch = len(_plan(keys, 0))
    assert by_daemon + local == EPOCHS * per_epoch
    assert by_daemon > per_epoch and local >= 1  # the daemon made all of epoch 0 and some of epoch 1


def test_dlop_run_under_plain_srun_maps_the_ranks_and_starts_local_offloaders(cluster, tmp_path):
    """`srun -n 2 dlop run -- python train.py` in a job without group 1: each task is a rank of
    torch.distributed (from srun's variables), with a dlop-offloader of its own on its node."""
    from dlop._C import offload

    data = tmp_path / "images"
    assert dlop_main(["make-dataset", str(data), "--classes", "3", "--per-class", "4", "--seed", "2"]) == 0
    (tmp_path / "train.py").write_text(run_test.SCRIPT)
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = cluster.run(["sbatch", "--parsable", f"--chdir={tmp_path}", "--nodes=1", "--ntasks=2", "--wrap",
                        f"srun dlop run -- python train.py {data}"], env=env)
    assert done.returncode == 0, done.stderr
    jid = done.stdout.strip()
    output = tmp_path / f"slurm-{jid}.out"
    try:
        wait_for(lambda: _job_state(cluster, jid) in ENDED, DEADLINE, "the job to end", [output])
    finally:
        if _job_state(cluster, jid) not in ENDED:
            cluster.run(["scancel", jid])
    out = output.read_text()
    assert _job_state(cluster, jid) == "COMPLETED", out
    assert out.count("dlop run: started 1 local dlop-offloader daemon(s)") == 2, out
    assert out.count("dlop run: 4 batches made by dlop-offloader, 0 made locally") == 2, out
    ranks = run_test.results(out)
    assert [r["rank"] for r in ranks] == [0, 1]  # RANK and WORLD_SIZE from SLURM_PROCID and SLURM_NTASKS
    keys = _reference_keys(data)
    for epoch in range(EPOCHS):
        for r in ranks:  # sharded as DistributedSampler shards between 2 ranks, each sample once
            plan = offload.EpochPlan(len(keys), BATCH, 0, True, False, r["rank"], 2).batches(epoch)
            assert r["epochs"][epoch] == [[keys[i] for i in batch] for batch in plan]
