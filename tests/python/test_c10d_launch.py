"""Ways to start backend "dlop": init methods tcp://, file://, env://; torchrun;
mpirun and srun (its environment, set here as srun sets it) with dlop.init();
and an unmodified script that never imports dlop and
only names backend="dlop" (torch finds it through dlop's entry points).

This file is also the script the launchers run: ``python test_c10d_launch.py CASE``.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys

import pytest

from c10d_harness import Setup, free_port, python_env, run_ranks, venv_bin

pytestmark = pytest.mark.long_file(seconds=80)  # handed out first (conftest.py)

HERE = os.path.abspath(__file__)


# ---------------------------------------------------------------------------
# The script side (run by torchrun / mpirun).


def _report_and_check() -> None:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    outs = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(outs, torch.tensor([float(rank)]))
    backend = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    ok = x.tolist() == [world * (world + 1) / 2] * 5 and [o.item() for o in outs] == list(range(world))
    line = f"RESULT rank={rank} world={world} backend={dist.get_backend()} impl={backend} ok={ok}"
    # Into a file per rank: the launchers interleave the ranks' output.
    with open(os.path.join(os.environ["C10D_RESULTS"], f"rank{rank}"), "w") as f:
        f.write(line + "\n")
    dist.destroy_process_group()


def script_plain() -> None:
    """An unmodified script: no `import dlop`, only backend="dlop" (env:// from torchrun)."""
    import torch.distributed as dist

    dist.init_process_group(backend="dlop")
    _report_and_check()


def script_mpi() -> None:
    import dlop

    dlop.init()
    _report_and_check()


SLURM_SIZES = (0, 1, 7, 100003)  # elements: empty, one, odd, more than one chunk


def _slurm_input(rank: int, size: int, dtype):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + size)
    return torch.randint(-1000, 1000, (size,), generator=g).to(dtype)  # integers: every sum order is exact


def script_slurm() -> None:
    """dlop.init() under srun: sums of every rank's integers against a sum in int64 of the
    inputs of all ranks, which every rank can make (they are seeded by rank)."""
    import torch
    import torch.distributed as dist

    import dlop

    dlop.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = True
    for dtype in (torch.float32, torch.int64):
        for size in SLURM_SIZES:
            x = _slurm_input(rank, size, dtype)
            dist.all_reduce(x)
            want = sum(_slurm_input(r, size, torch.int64) for r in range(world))
            ok = ok and x.to(torch.int64).tolist() == want.to(torch.int64).tolist()
    line = (f"RESULT rank={rank} world={world} local={os.environ['LOCAL_RANK']} "
            f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} ok={ok}")
    with open(os.path.join(os.environ["C10D_RESULTS"], f"rank{rank}"), "w") as f:
        f.write(line + "\n")
    dist.destroy_process_group()



# ---------------------------------------------------------------------------
# Tests.


def _results(results_dir, output: str, world: int) -> list[str]:
    lines = sorted(p.read_text().strip() for p in results_dir.iterdir())
    assert len(lines) == world, (lines, output[-4000:])
    for rank, line in enumerate(lines):
        assert line == f"RESULT rank={rank} world={world} backend=dlop impl=ProcessGroupDlop ok=True", output[-4000:]
    return lines


def rank_check_init(ctx) -> tuple:
    import torch
    import torch.distributed as dist

    x = torch.full((3,), float(ctx.rank))
    dist.all_reduce(x)
    return dist.get_backend(), x.tolist(), "dlop" in sys.modules


@pytest.mark.parametrize("init", ("tcp", "file", "env"))
@pytest.mark.parametrize("world", (1, 2, 3))
def test_init_methods(init, world):
    results = run_ranks(rank_check_init, world, setup=Setup(init=init, gloo=False), timeout=180)
    expected = [float(sum(range(world)))] * 3
    assert [r[:2] for r in results] == [("dlop", expected)] * world


def test_torchrun_env_init(tmp_path):
    """`torchrun --nproc-per-node 2 script.py`, where the script passes backend="dlop" and nothing else."""
    torchrun = venv_bin("torchrun")
    if not os.path.exists(torchrun):
        pytest.skip(f"no {torchrun}")
    env = python_env({"C10D_RESULTS": str(tmp_path)})
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", HERE, "plain"],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    _results(tmp_path, proc.stdout + proc.stderr, 2)


def test_unmodified_script_finds_dlop_through_entry_points(tmp_path):
    """No `import dlop` anywhere and TORCH_DEVICE_BACKEND_AUTOLOAD unset: torch loads the entry point."""
    env = python_env({"C10D_RESULTS": str(tmp_path)})
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, HERE, "plain"],
            env={**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": "2"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for r in range(2)
    ]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        outputs.append(out + err)
        assert p.returncode == 0, out[-3000:] + err[-5000:]
    _results(tmp_path, "".join(outputs), 2)


@pytest.mark.parametrize("world", (2, 3))
def test_mpirun_dlop_init(world, tmp_path):
    """`mpirun -np N python script.py` where the script calls dlop.init() (no torchrun)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun")
    env = python_env({"MASTER_PORT": str(free_port()), "C10D_RESULTS": str(tmp_path)})
    for k in [k for k in env if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")]:
        del env[k]
    cmd = [mpirun, "--oversubscribe", "-np", str(world)] + [a for k in ("MASTER_PORT", "OMP_NUM_THREADS", "C10D_RESULTS") for a in ("-x", k)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    proc = subprocess.run(cmd + [sys.executable, HERE, "mpi"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    _results(tmp_path, proc.stdout + proc.stderr, world)


# Launchers' variables a test's own environment may carry (this suite may itself run under one).
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_", "OMPI_", "PMI_",
                  "PMIX_", "MPI_LOCALRANKID", "SLURM_")


def _srun_env(rank: int, tasks_per_node: list[int], nodelist: str, job_id: int) -> dict[str, str]:
    """The variables srun sets for task `rank` of a step with block distribution
    (tasks_per_node[i] tasks on node i; task 0 on the first node)."""
    node = next(i for i in range(len(tasks_per_node)) if rank < sum(tasks_per_node[:i + 1]))
    tasks, nodes = sum(tasks_per_node), len(tasks_per_node)
    per_node = ",".join(str(n) for n in tasks_per_node)
    first = sum(tasks_per_node[:node])
    return {
        "SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(tasks), "SLURM_NPROCS": str(tasks),
        "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_LOCALID": str(rank - first), "SLURM_NODEID": str(node),
        "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": per_node, "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_SRUN_COMM_PORT": "6818",
        "SLURM_GTIDS": ",".join(str(first + k) for k in range(tasks_per_node[node])),
        "SLURM_TASK_PID": str(os.getpid()), "SLURM_CPUS_ON_NODE": "2", "SLURM_CLUSTER_NAME": "test",
    }


def _slurm_job_id_with_free_port() -> tuple[int, int]:
    """A job id whose derived MASTER_PORT (20000 + id % 20000) is free now."""
    for _ in range(200):
        job_id = random.randrange(100000, 10000000)
        port = 20000 + job_id % 20000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return job_id, port
    raise AssertionError("no free port in 20000-39999")


def _run_srun_like(tmp_path, tasks_per_node: list[int], nodelist: str,
                   job_id: int) -> list[subprocess.CompletedProcess]:
    env = {k: v for k, v in python_env({"C10D_RESULTS": str(tmp_path)}).items() if not k.startswith(_LAUNCHER_VARS)}
    procs = [subprocess.Popen([sys.executable, HERE, "slurm"],
                              env={**env, **_srun_env(r, tasks_per_node, nodelist, job_id)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(sum(tasks_per_node))]
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
        return [subprocess.CompletedProcess(p.args, p.returncode, *o) for p, o in zip(procs, outputs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("tasks_per_node, nodelist, master", [
    ([2], "127.0.0.1", "127.0.0.1"),
    # Two "nodes" that are both this host's loopback: the compressed list's first entry is the rendezvous.
    ([2, 1], "127.0.0.[1-2]", "127.0.0.1"),
    ([1, 1, 2], "127.0.0.[1,3-4]", "127.0.0.1"),
])
def test_srun_dlop_init(tasks_per_node, nodelist, master, tmp_path):
    """Ranks started with srun's variables only (no torchrun, MPI or MASTER_*): dlop.init() takes rank,
    size and local rank from SLURM_*, MASTER_ADDR from the node list and MASTER_PORT from the job id."""
    job_id, port = _slurm_job_id_with_free_port()
    done = _run_srun_like(tmp_path, tasks_per_node, nodelist, job_id)
    for p in done:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    world = sum(tasks_per_node)
    lines = sorted(p.read_text().strip() for p in tmp_path.iterdir())
    local = [k for n in tasks_per_node for k in range(n)]  # block distribution: 0..n-1 on each node
    assert lines == [f"RESULT rank={r} world={world} local={local[r]} master={master}:{port} ok=True"
                     for r in range(world)]


@pytest.mark.parametrize("nodelist, expected", [
    ("node01", ["node01"]),
    ("node[01-03]", ["node01", "node02", "node03"]),
    ("node[8-10],login1", ["node8", "node9", "node10", "login1"]),
    ("gpu[001,010-011]", ["gpu001", "gpu010", "gpu011"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a-[1-2].cluster", ["a-1.cluster", "a-2.cluster"]),
])
def test_slurm_hostlists_expand(nodelist, expected):
    from dlop.fleet.slurm import expand_hostlist

    assert expand_hostlist(nodelist) == expected


@pytest.mark.parametrize("nodelist, message", [
    ("node[01-", "'[' without ']'"),
    ("node[a-b]", "is not a number or a range"),
    ("node[3-1]", "runs backwards"),
    ("node1,,node2", "empty host name"),
])
def test_an_unreadable_slurm_nodelist_is_named(nodelist, message, tmp_path):
    """dlop.init() fails at once, naming the variable, instead of waiting for a rendezvous that cannot happen."""
    env = {k: v for k, v in python_env({"C10D_RESULTS": str(tmp_path)}).items() if not k.startswith(_LAUNCHER_VARS)}
    env.update(_srun_env(0, [1, 1], nodelist, 1234))
    del env["SLURM_STEP_NODELIST"]  # the job's list is the fallback, and the one named
    p = subprocess.run([sys.executable, HERE, "slurm"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert f"SLURM_JOB_NODELIST={nodelist!r} is not a Slurm host list" in p.stderr and message in p.stderr, p.stderr


def test_srun_on_several_nodes_without_a_nodelist_is_named(tmp_path):
    env = {k: v for k, v in python_env({"C10D_RESULTS": str(tmp_path)}).items() if not k.startswith(_LAUNCHER_VARS)}
    env.update({k: v for k, v in _srun_env(0, [1, 1], "x", 1234).items() if "NODELIST" not in k})
    p = subprocess.run([sys.executable, HERE, "slurm"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "neither MASTER_ADDR nor SLURM_STEP_NODELIST" in p.stderr, p.stderr


if __name__ == "__main__":
    {"plain": script_plain, "mpi": script_mpi, "slurm": script_slurm}[sys.argv[1]]()
