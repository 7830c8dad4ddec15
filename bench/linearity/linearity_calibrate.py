"""The scaling model's terms, each measured by the benchmark that isolates it (dlop/report/scaling_model.py).

Every function runs one benchmark once and returns its raw figures; the
caller repeats them (the spread of the repeats is the prediction's band):

- ``intra_dlop``: ``dlop-bench allreduce --local 2`` on this host (shm/cma);
- ``intra_c10d``: a 2-rank all-reduce through torch on this host: Gloo's
  link, and both backends' CPU per byte;
- ``crowded_c10d``: a ring all-reduce through torch on this host with more
  ranks than cores: both backends' CPU per byte there (crowding);
- ``network``: ``dlop-bench p2p`` between two namespace hosts;
- ``network_cpu``: a 2-rank all-reduce through torch between two namespace
  hosts: both backends' CPU per byte there;
- ``split``: the model alone, forward and backward timed apart;
- ``ddp_local``: ``bench.ddp`` on this host (1 rank: compute and DDP's
  overhead; 2 ranks: the backend's CPU per step).

The Python benchmarks run forked from this process (bench/common/forked.py).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import _common, forked
from dlop.report.linearity_terms import CPU_BYTES, cpu_per_byte, crowded_ranks, link_of, p2p_link

INTRA_SIZES = "8,64K,1M,4M"
# Timed calls per size and repetition for Gloo's intra-host link: its median needs no more, and the c10d
# benchmark's default (up to 1000 calls at 8 B) took most of a 10-second term.
INTRA_GLOO_ITERS = 30
RUN_TIMEOUT_S = 900


class CpuMeter:
    """How many cores processes other than this one's children kept busy while they ran: the machine's busy time
    (/proc/stat) less the children's CPU time (getrusage), over the wall time. On a shared machine this background
    load takes cores from the ranks like any other contention."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        hz = os.sysconf("SC_CLK_TCK")
        return (sum(fields[:8]) - idle) / hz, children.ru_utime + children.ru_stime, time.monotonic()

    def background_cores(self) -> float:
        busy, ours, wall = (b - a for a, b in zip(self.start, self._sample()))
        return max(0.0, (busy - ours) / wall) if wall > 0 else 0.0


def dlop_bench() -> str:
    found = shutil.which("dlop-bench") or str(Path(sys.executable).with_name("dlop-bench"))
    if not os.path.exists(found):
        raise SystemExit("dlop-bench not found on PATH or beside python: `make build` installs it")
    return found


def _run(argv: list[str], log: Path, env: dict | None = None) -> None:
    with open(log, "w") as f:
        done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}); see {log}")


def _wait_all(procs: list[subprocess.Popen], what: str, log: Path) -> None:
    """Waits for every rank; one failed rank leaves the others waiting on it, so the first failure stops all."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    if any(codes):
        raise RuntimeError(f"{what} failed (exits {codes}); see {log}")


def intra_dlop(out: Path, tag: str) -> dict:
    path = out / f"intra_dlop_{tag}.json"
    _run([dlop_bench(), "allreduce", "--local", "2", "-b", "8", "-e", "4M", "-f", "8", "--reps", "3", "--inplace",
          "1", "-c", "0", "--json", str(path)], out / f"intra_dlop_{tag}.txt")
    _, rows = _common.read_rows(str(path))
    return link_of([r for r in rows if r["impl"] == "dlop"], 2)


def c10d_args(impls: str, sizes: str, repetitions: int, json_path: Path | None, check: bool = False,
              iters: int = 0) -> list[str]:
    """`python -m bench.c10d`'s arguments for an all-reduce run."""
    args = ["--ops", "all_reduce", "--impls", impls, "--sizes", sizes, "-r", str(repetitions), "-c", str(int(check)),
            "-n", str(iters)]
    return args + (["--json", str(json_path)] if json_path else [])


def _local_c10d(name: str, out: Path, port: int, ranks: int, args_of, env: dict) -> list[dict]:
    """bench.c10d's rows of `ranks` ranks on this host, forked from this process."""
    path, log = out / f"{name}.json", out / f"{name}.txt"
    with open(log, "w") as f:
        procs = [forked.start("bench.c10d", args_of(path if r == 0 else None),
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", **env),
                              stdout=f) for r in range(ranks)]
        _wait_all(procs, f"{ranks}-rank all-reduce through torch", log)
    return _common.read_rows(str(path))[1]


def intra_c10d(out: Path, tag: str, port: int) -> dict:
    """Gloo's intra-host link (fitted on its all-reduce times) and both backends' CPU per byte on this host."""
    rows = _local_c10d(f"intra_c10d_{tag}", out, port, 2,
                       lambda path: c10d_args("dlop,gloo", INTRA_SIZES, 3, path, iters=INTRA_GLOO_ITERS), {})
    return {"gloo": link_of([r for r in rows if r["impl"] == "gloo"], 2), "cpu_ns_per_byte": cpu_per_byte(rows)}


def crowded_c10d(out: Path, tag: str, port: int, cores: int, repetitions: int) -> dict:
    """Both backends' CPU per byte each rank sends in a ring all-reduce on this host with crowded_ranks(cores)
    ranks: {"ranks", "cores", "cpu_ns_per_byte": {impl: ns}}. Ring for both, so that a rank sends 2(N-1)/N of the
    buffer as in the 2-rank run, whose per-byte CPU it is compared with."""
    ranks = crowded_ranks(cores)
    rows = _local_c10d(f"crowded_c10d_{tag}", out, port, ranks,
                       lambda path: c10d_args("dlop,gloo", str(CPU_BYTES), repetitions, path),
                       {"DLOP_ALGO": "allreduce:ring"})
    sent = 2 * (ranks - 1) / ranks
    return {"ranks": ranks, "cores": cores,
            "cpu_ns_per_byte": {impl: ns / sent for impl, ns in cpu_per_byte(rows).items()}}


def launch_ranks(hosts, n_hosts: int, per_host: int, module: str, args_of, env_extra: dict, log: Path, what: str,
                 port: int) -> None:
    """`python -m module args_of(rank)` for every rank, rank r on host r // per_host (torchrun's placement)."""
    world = n_hosts * per_host
    with open(log, "w") as f:
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_host),
                       MASTER_ADDR=hosts.addrs[0], MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       GLOO_SOCKET_IFNAME=hosts.device, **env_extra)
            env.pop("DLOP_HOST_ID", None)  # the topology comes from the namespaces
            procs.append(hosts.start_module(rank // per_host, module, args_of(rank), env=env, stdout=f))
        _wait_all(procs, f"{what} on {n_hosts} hosts x {per_host} ranks", log)


def network_cpu(hosts, out: Path, tag: str, port: int, repetitions: int) -> dict[str, float]:
    """Both backends' CPU per byte across hosts 0 and 1: a 2-rank ring all-reduce between them."""
    path = out / f"net_cpu_{tag}.json"
    launch_ranks(hosts, 2, 1, "bench.c10d",
                 lambda r: c10d_args("dlop,gloo", str(CPU_BYTES), repetitions, path if r == 0 else None),
                 {"DLOP_ALGO": "allreduce:ring"}, out / f"net_cpu_{tag}.txt", "all-reduce", port)
    return cpu_per_byte(_common.read_rows(str(path))[1])


def network(hosts, out: Path, tag: str, port: int, repetitions: int) -> dict:
    """Hosts 0 and 1's link from two sizes only, 8 B and 2 MiB (which reaches a tbf link's rate); the sizes
    between would take most of a test's minute. Each repetition moves 64 MiB each way at 2 MiB (a second on
    1 Gbit/s)."""
    path, log = out / f"net_{tag}.json", out / f"net_{tag}.txt"
    with open(log, "w") as f:
        procs = [hosts.popen(r, [dlop_bench(), "p2p", "--rank", str(r), "--size", "2", "--store",
                                 f"{hosts.addrs[0]}:{port}", "-b", "8", "-e", "2M", "-f", "262144",
                                 "-r", str(repetitions)]
                             + (["--json", str(path)] if r == 0 else []), stdout=f, stderr=subprocess.STDOUT)
                 for r in range(2)]
        _wait_all(procs, "dlop-bench p2p between namespace hosts", log)
    return p2p_link(_common.read_rows(str(path))[1])


def split(model: str, batch: int, threads: int, steps: int) -> dict:
    """The model alone: seconds per step, CPU seconds per step, and backward's share of the step."""
    import torch
    from torch import nn

    from bench.ddp.ddp_models import MODELS

    torch.set_num_threads(threads)
    make_model, make_batch, default_batch = MODELS[model]
    torch.manual_seed(0)
    net = make_model()
    inputs, labels = make_batch(batch or default_batch, torch.Generator().manual_seed(1000))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    backward, total, cpu = [], [], []
    for i in range(steps + 1):
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(inputs), labels)
        middle = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        optimizer.step()
        if i:  # the first step allocates the gradients and the optimizer's state
            backward.append(end - middle)
            total.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
    return {"compute_s": _common.median(total), "compute_cpu_s": _common.median(cpu),
            "backward_share": _common.median([b / t for b, t in zip(backward, total)])}


def ddp_local(ddp_args: list[str], ranks: int, out: Path, tag: str) -> list[dict]:
    """bench.ddp's rows, each with the background load (cores) it ran beside."""
    path, log = out / f"ddp_local{ranks}_{tag}.json", out / f"ddp_local{ranks}_{tag}.txt"
    meter = CpuMeter()
    with open(log, "w") as f:
        _wait_all([forked.start("bench.ddp", [*ddp_args, "--ranks", str(ranks), "--json", str(path)], stdout=f)],
                  f"a {ranks}-rank bench.ddp run", log)
    background = meter.background_cores()
    return [dict(r, background_cores=background) for r in _common.read_rows(str(path))[1]]
