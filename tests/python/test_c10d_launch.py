"""Ways to start backend "dlop": init methods tcp://, file://, env://; torchrun;
mpirun with dlop.init(); and an unmodified script that never imports dlop and
only names backend="dlop" (torch finds it through dlop's entry points).

This file is also the script the launchers run: ``python test_c10d_launch.py CASE``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from c10d_harness import Setup, free_port, python_env, run_ranks, venv_bin

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


if __name__ == "__main__":
    {"plain": script_plain, "mpi": script_mpi}[sys.argv[1]]()
