"""DDP training throughput on CPU: dlop against Gloo, and linearity.

    python -m bench.ddp --ranks 2 --json out.json          # spawns its ranks
    torchrun --nproc-per-node 2 -m bench.ddp --json out.json

Per model, three modes run in alternating repetitions: DDP over dlop (the
default group), DDP over Gloo (a second group over the same ranks), and the
model alone on rank 0 (no DDP; the other ranks wait), all with the same
threads per rank (cores / ranks), so linearity = N-rank throughput / 1-rank
throughput / N measures what communication costs (1.0: nothing). Throughput =
ranks x batch x steps / the slowest rank's time; the median over repetitions
is reported. Models and sizes: bench/ddp/ddp_models.py. ``--backends
dlop,gloo,ideal`` adds DDP with a comm hook that communicates nothing: the
ceiling any backend could reach here.
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
from bench.common import _common
from bench.ddp import thread_groups
from bench.ddp.ddp_models import MODELS, gradient_bytes, resnet18_source

BACKENDS = ("dlop", "gloo")
# DDP whose comm hook communicates nothing: every rank trains alone on DDP's buckets. No backend can be faster, so
# its samples/s over Gloo's is the most any backend could gain on this machine (`--backends dlop,gloo,ideal`).
IDEAL = "ideal"
HOOKS = ("none", "fp16", "bf16", "powersgd")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SINGLE = "none"  # the backend field of the one-process rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.ddp", description=__doc__.split("\n\n")[0])
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
    p.add_argument("--hook", choices=sorted(HOOKS), default="none",
                   help="a DDP comm hook (powersgd: rank 2, from the 2nd step, one bucket: see make_hook)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="the parameters' and so the gradients' dtype")
    p.add_argument("--autocast", choices=("none", "bfloat16", "float16"), default="none",
                   help="run forward and loss under torch.autocast('cpu', dtype)")
    p.add_argument("--bucket-view", action="store_true", help="DDP(..., gradient_as_bucket_view=True)")
    p.add_argument("--pin-cores", action="store_true",
                   help="bind each rank to its share of this machine's cores, as mpirun --bind-to core does (ranks "
                        "on one machine, or on namespace hosts of one machine; see pinned_cores)")
    p.add_argument("--json", help="write the rows to this file (rank 0)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="a progress bar on stderr (rank 0, when stderr is a terminal)")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [m for m in args.models if m not in MODELS] + [b for b in args.backends if b not in (*BACKENDS, IDEAL)]
    if unknown:
        p.error(f"unknown model or backend: {', '.join(unknown)}")
    return args


def make_hook(name: str, group):
    """(state, hook) for DDP.register_comm_hook, or None."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        return group, default_hooks.fp16_compress_hook
    if name == "bf16":
        # DDP refuses a hook named bf16_compress_hook without CUDA and NCCL, though it only needs a bfloat16
        # all-reduce: call it under another name.
        def bf16_on_cpu(state, bucket):
            return default_hooks.bf16_compress_hook(state, bucket)

        return group, bf16_on_cpu
    if name == "powersgd":
        # PowerSGD issues collectives from future callbacks while the backward pass issues the next buckets':
        # with several buckets their order differs between ranks, which any backend matching collectives by
        # order (Gloo's tags, dlop's sequence) may pair wrongly, so the bench runs it with one bucket.
        return powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                           min_compression_rate=1, random_seed=7), powerSGD_hook.powerSGD_hook
    return None


def no_communication(state, bucket):
    """A comm hook that leaves the bucket as it is: DDP's own work without the all-reduce."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def train_steps(model: nn.Module, optimizer, inputs, labels, steps: int, autocast: str = "none"
                ) -> tuple[float, dict[str, float]]:
    """Runs `steps` SGD steps on one fixed batch; returns (wall seconds, CPU seconds of this process's threads
    by group: thread_groups.GROUPS, "training" holding the caller's thread)."""
    loss_fn = nn.CrossEntropyLoss()
    autocast_dtype = DTYPES.get(autocast)  # None: "none"
    threads, start = thread_groups.snapshot(), time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
    wall = time.perf_counter() - start
    return wall, thread_groups.by_group(threads, thread_groups.snapshot())


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
    base = make_model().to(DTYPES[args.dtype])
    inputs, labels = make_batch(batch, torch.Generator().manual_seed(1000 + rank))
    if inputs.is_floating_point():
        inputs = inputs.to(DTYPES[args.dtype])
    # PowerSGD: one bucket (make_hook says why).
    cap = gradient_bytes(base) / 2**20 + 1 if args.hook == "powersgd" else args.bucket_cap_mb
    modes = {}
    for backend in args.backends:
        group = None if backend == "dlop" else control
        model = DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=cap,
                    gradient_as_bucket_view=args.bucket_view)
        if backend == IDEAL:
            model.register_comm_hook(None, no_communication)
        elif (hook := make_hook(args.hook, group or dist.group.WORLD)) is not None:
            model.register_comm_hook(*hook)
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
                cpu_seconds[mode].append([0.0] * len(thread_groups.GROUPS))
                continue
            model, optimizer = modes[mode]
            train_steps(model, optimizer, inputs, labels, args.warmup, args.autocast)
            wall, cpu = train_steps(model, optimizer, inputs, labels, args.steps, args.autocast)
            seconds[mode].append(wall)
            cpu_seconds[mode].append([cpu[g] for g in thread_groups.GROUPS])
    bar.close()
    gc.enable()
    dist.barrier(group=control)
    slowest = torch.tensor([seconds[mode] for mode in order], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=control)
    cpu = torch.tensor([cpu_seconds[mode] for mode in order], dtype=torch.float64)  # [mode, repetition, group]
    dist.all_reduce(cpu, group=control)  # summed over ranks
    synced = {backend: params_in_sync(modes[backend][0].module, control) for backend in args.backends
              if backend != IDEAL}  # the ideal mode's ranks never exchange their gradients
    # Both backends trained their copy of one model for the same steps on the same data: how far apart they ended.
    apart = None
    if set(BACKENDS) <= set(args.backends):
        with torch.no_grad():
            apart = max((a.double() - b.double()).abs().max().item()
                        for a, b in zip(modes["dlop"][0].parameters(), modes["gloo"][0].parameters()))
        apart = torch.tensor([apart], dtype=torch.float64)
        dist.all_reduce(apart, op=dist.ReduceOp.MAX, group=control)
        apart = apart.item()
    rows, single = [], None
    for i, mode in enumerate(order):
        workers = 1 if mode == SINGLE else ranks
        rates = [workers * batch * args.steps / s for s in slowest[i].tolist()]
        rate = _common.median(rates)
        if mode == SINGLE:
            single = rate
        per_step = 1e3 / workers / args.steps  # CPU seconds summed over ranks -> ms per rank and step
        by_thread = {g: per_step * _common.median(cpu[i, :, k].tolist()) for k, g in enumerate(thread_groups.GROUPS)}
        comm_ms = by_thread.get(mode, 0.0)  # the backend's own threads
        rows.append({"model": name, "backend": mode, "ranks": workers, "samples_per_s": rate,
                     "samples_per_s_runs": rates,
                     "batch_per_rank": batch, "steps": args.steps, "repetitions": args.repetitions,
                     "step_ms": 1e3 * workers * batch / rate, "gradient_mib": gradient_bytes(base) / 2**20,
                     "cpu_ms_per_step": per_step * _common.median(cpu[i].sum(dim=1).tolist()),
                     "cpu_ms_per_step_by_thread": by_thread, "comm_thread_cpu_ms_per_step": comm_ms,
                     "comm_thread_cpu_ns_per_gradient_byte": 1e6 * comm_ms / gradient_bytes(base),
                     "params_in_sync": synced.get(mode, None if mode == IDEAL else True),
                     "max_param_diff_vs_gloo": apart,
                     "hook": args.hook, "dtype": args.dtype, "autocast": args.autocast,
                     "gradient_as_bucket_view": args.bucket_view})
    for row in rows:
        row["linearity"] = row["samples_per_s"] / single / row["ranks"] if single else None
    return rows


_LINE = "{:>12} {:>8} {:>5} {:>8} {:>10} {:>9} {:>9} | {:>9} {:>9} {:>7} {:>7} | {:>9} {:>7} {:>7} {:>7}"


def print_columns() -> None:
    print(_LINE.format("# model", "backend", "ranks", "grad", "samples/s", "step", "linearity", "cpu/rank", "training",
                       "comm", "comm", "samples/s", "cpu", "in sync", ""))
    print(_LINE.format("#", "", "", "(MiB)", "", "(ms)", "", "(ms/step)", "(ms/step)", "(ms)", "(ns/B)", "vs gloo",
                       "vs gloo", "", ""), flush=True)


def print_rows(rows: list[dict]) -> None:
    gloo = {r["model"]: r for r in rows if r["backend"] == "gloo"}
    for r in rows:
        peer = gloo.get(r["model"]) if r["backend"] != SINGLE else None
        rate = f"{r['samples_per_s'] / peer['samples_per_s']:.2f}" if peer else "-"
        cpu = f"{r['cpu_ms_per_step'] / peer['cpu_ms_per_step']:.2f}" if peer and peer["cpu_ms_per_step"] else "-"
        linearity = f"{r['linearity']:.3f}" if r["linearity"] is not None else "-"
        comm = r["backend"] != SINGLE
        print(_LINE.format(r["model"], r["backend"], r["ranks"], f"{r['gradient_mib']:.1f}", f"{r['samples_per_s']:.1f}",
                           f"{r['step_ms']:.1f}", linearity, f"{r['cpu_ms_per_step']:.1f}",
                           f"{r['cpu_ms_per_step_by_thread']['training']:.1f}",
                           f"{r['comm_thread_cpu_ms_per_step']:.2f}" if comm else "-",
                           f"{r['comm_thread_cpu_ns_per_gradient_byte']:.3f}" if comm else "-", rate, cpu,
                           "-" if r["backend"] == IDEAL else "yes" if r["params_in_sync"] else "NO", ""),
              flush=True)


def pinned_cores(rank: int, ranks: int, cpus: list[int]) -> set[int] | None:
    """The cores --pin-cores binds global rank `rank` of `ranks` to when they all share `cpus`: an equal block each
    (a remainder idles), or with more ranks than cores, core rank mod cores; None when the ranks cannot share the
    cores evenly (3 ranks on 2 cores): bound, one core would carry more ranks than the other."""
    if ranks <= len(cpus):
        per = len(cpus) // ranks
        return set(cpus[rank * per:(rank + 1) * per])
    return {cpus[rank % len(cpus)]} if ranks % len(cpus) == 0 else None


def worker(args, threads: int) -> None:
    # Before torch starts its threads, which inherit the mask.
    pinned = pinned_cores(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                          sorted(os.sched_getaffinity(0))) if args.pin_cores else None
    if pinned is not None:
        os.sched_setaffinity(0, pinned)
    torch.set_num_threads(threads)
    dist.init_process_group(backend="dlop")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    control = dist.new_group(backend="gloo")
    header = _common.run_header(benchmark="ddp", ranks=ranks, threads_per_rank=threads, steps=args.steps,
                                warmup=args.warmup, repetitions=args.repetitions, bucket_cap_mb=args.bucket_cap_mb,
                                resnet18=resnet18_source(), optimizer="SGD lr 0.01 momentum 0.9", hook=args.hook,
                                dtype=args.dtype, autocast=args.autocast, gradient_as_bucket_view=args.bucket_view,
                                pinned=sorted(pinned) if pinned else None)
    if rank == 0:
        print(_common.header_comment(header))
        print(f"# {header['command']}")
        print(f"# bench.ddp: {ranks} ranks x {threads} torch thread(s); DDP bucket_cap_mb {args.bucket_cap_mb}; "
              f"{args.repetitions} repetitions of {args.warmup} untimed + {args.steps} timed steps, modes alternating; "
              f"resnet18 from {header['resnet18']}; comm hook {args.hook}, {args.dtype} parameters, autocast "
              f"{args.autocast}, gradient_as_bucket_view {args.bucket_view}")
        print("# samples/s = ranks x batch x steps / the slowest rank's time, median of repetitions; "
              "linearity = N-rank / 1-rank samples/s / N (1-rank: the model alone, same threads, no DDP); "
              "cpu/rank: CPU time of each rank's process (all its threads) per step, median of repetitions; "
              "training: its caller's and torch's threads (they also run what a backend does inline); "
              "comm: the backend's own threads (dlop-*, or Gloo's pt_gloo_runloop and gloo_tcp_loop), "
              "per step and per gradient byte")
        print_columns()
    rows = []
    for name in args.models:
        rows += bench_model(name, args, control, rank, ranks)
        if rank == 0:
            print_rows([r for r in rows if r["model"] == name])
            apart = rows[-1]["max_param_diff_vs_gloo"]
            if apart is not None:
                print(f"# {name}: parameters after training, dlop against Gloo: largest difference {apart:.3g}")
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

        # Forked, not spawned: each rank would import torch again (seconds each).
        mp.start_processes(_spawned, args=(args, ranks, free_port(), threads), nprocs=ranks, join=True,
                           start_method="fork")
    return 0


if __name__ == "__main__":
    sys.exit(main())
