"""DDP training throughput on CPU: dlop against Gloo, and linearity.

    python -m dlop.bench.ddp --ranks 2 --json out.json          # spawns its ranks
    torchrun --nproc-per-node 2 -m dlop.bench.ddp --json out.json

Per model, three modes run in alternating repetitions: DDP over dlop (the
default group), DDP over Gloo (a second group over the same ranks), and the
model alone on rank 0 (no DDP; the other ranks wait), all with the same
threads per rank (cores / ranks), so linearity = N-rank throughput / 1-rank
throughput / N measures what communication costs (1.0: nothing). Throughput =
ranks x batch x steps / the slowest rank's time; the median over repetitions
is reported. Models and sizes: dlop/bench/ddp_models.py.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dlop  # noqa: F401  (registers the backend)
from dlop.bench import _common
from dlop.bench.ddp_models import MODELS, gradient_bytes, resnet18_source

BACKENDS = ("dlop", "gloo")
SINGLE = "none"  # the backend field of the one-process rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m dlop.bench.ddp", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--ranks", type=int, default=2, help="ranks to spawn when not under torchrun")
    p.add_argument("--steps", type=int, default=8, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before each repetition")
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--batch", type=int, default=0, help="samples per rank and step (0: the model's default)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (torch's default 25)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    p.add_argument("--no-single", action="store_true", help="skip the one-process runs (no linearity)")
    p.add_argument("--json", help="write the rows to this file (rank 0)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="a progress bar on stderr (rank 0, when stderr is a terminal)")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [m for m in args.models if m not in MODELS] + [b for b in args.backends if b not in BACKENDS]
    if unknown:
        p.error(f"unknown model or backend: {', '.join(unknown)}")
    return args


def train_steps(model: nn.Module, optimizer, inputs, labels, steps: int) -> tuple[float, float]:
    """Runs `steps` SGD steps on one fixed batch; returns (wall seconds, CPU seconds of this process: every
    thread, the backend's communication threads included)."""
    loss_fn = nn.CrossEntropyLoss()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), labels).backward()
        optimizer.step()
    return time.perf_counter() - start, time.process_time() - cpu


def params_in_sync(model: nn.Module, control) -> bool:
    """True when every rank holds the same parameters (DDP kept them equal)."""
    with torch.no_grad():
        digest = torch.stack([p.double().sum() for p in model.parameters()]).sum().reshape(1)
    low, high = digest.clone(), digest.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=control)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=control)
    return bool(low.item() == high.item())


def bench_model(name: str, args, control, rank: int, ranks: int) -> list[dict]:
    make_model, make_batch, default_batch = MODELS[name]
    batch = args.batch or default_batch
    torch.manual_seed(0)  # the same initial model everywhere
    base = make_model()
    inputs, labels = make_batch(batch, torch.Generator().manual_seed(1000 + rank))
    modes = {}
    for backend in args.backends:
        group = None if backend == "dlop" else control
        model = DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=args.bucket_cap_mb)
        modes[backend] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    if not args.no_single and rank == 0:
        model = copy.deepcopy(base)
        modes[SINGLE] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    order = list(args.backends) + ([] if args.no_single else [SINGLE])
    seconds = {mode: [] for mode in order}
    cpu_seconds = {mode: [] for mode in order}
    gc.disable()
    bar = _common.progress(total=args.repetitions * len(order), desc=f"{name} x {ranks}", unit="run",
                           show=args.progress and rank == 0)
    for _ in range(args.repetitions):
        for mode in order:
            bar.update()
            dist.barrier(group=control)
            if mode == SINGLE and rank != 0:
                seconds[mode].append(0.0)  # wait at the next barrier (Gloo blocks, it does not spin)
                cpu_seconds[mode].append(0.0)
                continue
            model, optimizer = modes[mode]
            train_steps(model, optimizer, inputs, labels, args.warmup)
            wall, cpu = train_steps(model, optimizer, inputs, labels, args.steps)
            seconds[mode].append(wall)
            cpu_seconds[mode].append(cpu)
    bar.close()
    gc.enable()
    dist.barrier(group=control)
    slowest = torch.tensor([seconds[mode] for mode in order], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=control)
    cpu = torch.tensor([cpu_seconds[mode] for mode in order], dtype=torch.float64)
    dist.all_reduce(cpu, group=control)  # summed over ranks
    synced = {backend: params_in_sync(modes[backend][0].module, control) for backend in args.backends}
    rows, single = [], None
    for i, mode in enumerate(order):
        workers = 1 if mode == SINGLE else ranks
        rate = _common.median([workers * batch * args.steps / s for s in slowest[i].tolist()])
        if mode == SINGLE:
            single = rate
        rows.append({"model": name, "backend": mode, "ranks": workers, "samples_per_s": rate,
                     "batch_per_rank": batch, "steps": args.steps, "repetitions": args.repetitions,
                     "step_ms": 1e3 * workers * batch / rate, "gradient_mib": gradient_bytes(base) / 2**20,
                     "cpu_ms_per_step": 1e3 * _common.median(cpu[i].tolist()) / workers / args.steps,
                     "params_in_sync": synced.get(mode, True)})
    for row in rows:
        row["linearity"] = row["samples_per_s"] / single / row["ranks"] if single else None
    return rows


_LINE = "{:>12} {:>8} {:>5} {:>8} {:>10} {:>10} {:>10} {:>9} {:>10} {:>8}"


def print_columns() -> None:
    print(_LINE.format("# model", "backend", "ranks", "grad", "samples/s", "step", "cpu/rank", "linearity", "vs gloo",
                       "in sync"))
    print(_LINE.format("#", "", "", "(MiB)", "", "(ms)", "(ms/step)", "", "", ""), flush=True)


def print_rows(rows: list[dict]) -> None:
    line = _LINE
    gloo = {r["model"]: r["samples_per_s"] for r in rows if r["backend"] == "gloo"}
    for r in rows:
        ratio = f"{r['samples_per_s'] / gloo[r['model']]:.2f}" if r["model"] in gloo and r["backend"] != SINGLE else "-"
        linearity = f"{r['linearity']:.3f}" if r["linearity"] is not None else "-"
        print(line.format(r["model"], r["backend"], r["ranks"], f"{r['gradient_mib']:.1f}", f"{r['samples_per_s']:.1f}",
                          f"{r['step_ms']:.1f}", f"{r['cpu_ms_per_step']:.1f}", linearity, ratio, "yes" if r["params_in_sync"] else "NO"), flush=True)


def worker(args, threads: int) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group(backend="dlop")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    control = dist.new_group(backend="gloo")
    header = _common.run_header(benchmark="ddp", ranks=ranks, threads_per_rank=threads, steps=args.steps,
                                warmup=args.warmup, repetitions=args.repetitions, bucket_cap_mb=args.bucket_cap_mb,
                                resnet18=resnet18_source(), optimizer="SGD lr 0.01 momentum 0.9")
    if rank == 0:
        print(_common.header_comment(header))
        print(f"# {header['command']}")
        print(f"# dlop.bench.ddp: {ranks} ranks x {threads} torch thread(s); DDP bucket_cap_mb {args.bucket_cap_mb}; "
              f"{args.repetitions} repetitions of {args.warmup} untimed + {args.steps} timed steps, modes alternating; "
              f"resnet18 from {header['resnet18']}")
        print("# samples/s = ranks x batch x steps / the slowest rank's time, median of repetitions; "
              "linearity = N-rank / 1-rank samples/s / N (1-rank: the model alone, same threads, no DDP); "
              "cpu/rank: CPU time of each rank's process (all its threads) per step")
        print_columns()
    rows = []
    for name in args.models:
        rows += bench_model(name, args, control, rank, ranks)
        if rank == 0:
            print_rows([r for r in rows if r["model"] == name])
        gc.collect()
    if rank == 0 and args.json:
        _common.write_json(args.json, header, rows)
    dist.barrier(group=control)
    dist.destroy_process_group()


def rank_env(rank: int, ranks: int, local_rank: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The torchrun-style variables a rank of this benchmark reads (it then runs as if under torchrun)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(ranks),
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}


def _spawned(local_rank: int, args, ranks: int, port: int, threads: int) -> None:
    os.environ.update(rank_env(local_rank, ranks, local_rank, "127.0.0.1", port))
    worker(args, threads)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    ranks = int(os.environ["WORLD_SIZE"]) if under_launcher else args.ranks
    threads = args.threads or max(1, _common.cpu_count() // ranks)
    if under_launcher:
        worker(args, threads)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(args, ranks, free_port(), threads), nprocs=ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
