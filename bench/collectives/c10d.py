"""Collectives through torch.distributed: dlop against Gloo in the same run.

Launch with torchrun (any world size)::

    torchrun --nproc-per-node 2 -m bench.c10d -b 8 -e 256M -f 4 --json out.json

The default group is dlop; a second group over the same ranks is Gloo, and a
third is torch's FakeProcessGroup, which communicates nothing: its time is
the floor of torch.distributed's own per-call cost (dispatch, Work, tensor
checks) that no backend can beat. Per op and size all run on the same
buffers, repetitions alternating (dlop, gloo, fake, dlop, ...), so a noisy
neighbour hits them alike. time = the slowest rank's
median over every timed call of every repetition; algbw = S / time, busbw =
algbw x the nccl-tests factor. The table looks like dlop-bench's; --json
writes rows with dlop-bench's fields (op names are torch's).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

import dlop  # noqa: F401  (registers the backend)
from bench.common import _common
from bench.collectives.c10d_ops import CASES, DTYPES

IMPLS = ("dlop", "gloo", "nccl", "fake")  # fake: results are not computed, only the call's cost
ROTATE_BYTES = 64 << 20  # rotate buffer sets through this much memory ...
ROTATE_UP_TO = 8 << 20  # ... for sizes up to this (larger ones do not fit in any cache here)
MAX_SETS = 256
_LINE = ("{:1}{:>11} {:>11} {:>8} {:>5} {:>4} {:>5} | {:>10} {:>9} {:>7} {:>7} {:>6} | {:>10} {:>9} {:>7} {:>7} {:>6}"
         " | {:>6} {:>6} {:>6} | {:>10} {:>9} {:>6}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.c10d", description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (8, 4K, 1M ...)")
    p.add_argument("-e", "--maxbytes", default="256M", help="largest size")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplication factor")
    p.add_argument("--sizes", help="comma-separated sizes (8,64M), instead of -b/-e/-f")
    p.add_argument("--ops", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    p.add_argument("-d", "--dtype", default="float", choices=sorted(DTYPES))
    p.add_argument("--impls", default="dlop,gloo,fake", help="any of " + ", ".join(IMPLS) +
                   "; the first two (not fake) are the table's columns")
    p.add_argument("--device", default="cpu",
                   help="where the buffers live: cpu, or an accelerator (cuda, dlop_test, ...); calls are timed "
                        "to the device's completion (dlop stages or delegates as DLOP_DEVICE_BACKEND says)")
    p.add_argument("-n", "--iters", type=int, default=0, help="timed calls per repetition (0: 32 MiB / S in [3, 1000])")
    p.add_argument("-w", "--warmup", type=int, default=-1, help="warm-up calls (-1: as many as timed for S <= 8 MiB, else 1)")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1, help="1: check results (#wrong), 0: do not")
    p.add_argument("--json", help="write the rows to this file (rank 0)")
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = [o for o in args.ops if o not in CASES] + [i for i in args.impls if i not in IMPLS]
    if unknown:
        p.error(f"unknown op or impl: {', '.join(unknown)}")
    return args


def plan(size: int, args) -> tuple[int, int, int]:
    """(timed calls per repetition, warm-up calls, buffer sets) for a size, the same rule as dlop-bench."""
    iters = args.iters or min(max((32 << 20) // max(size, 1), 3), 1000)
    warmup = args.warmup if args.warmup >= 0 else (iters if size <= ROTATE_UP_TO else 1)
    sets = min(max(ROTATE_BYTES // max(size, 1), 1), MAX_SETS) if size <= ROTATE_UP_TO else 1
    return iters, warmup, sets


def _synchronize(device) -> None:
    """Waits for an accelerator's buffers: a call counts until its results are there."""
    if device.type != "cpu":
        getattr(torch, device.type).synchronize(device)


def time_calls(case, group, calls: int, first: int) -> list[float]:
    """Per-call seconds of `calls` back-to-back calls, rotating buffer sets from `first`."""
    times, sets = [], case.sets
    for i in range(calls):
        buffers = sets[(first + i) % len(sets)]
        start = time.perf_counter()
        case.call(buffers, group)
        _synchronize(case.device)
        times.append(time.perf_counter() - start)
    return times


def measure(case, groups: dict, control, args) -> dict:
    """{impl: (time_us, wrong, cpu_us)} for one case: checks, warm-up, then alternating repetitions. cpu_us: CPU
    time per call of a rank's process (every thread: the caller's and the backend's), mean over ranks."""
    iters, warmup, _ = plan(case.bytes, args)
    with case.device:
        wrong = {impl: case.check(groups[impl]) if args.check and impl != "fake" else 0 for impl in groups}
    for impl, group in groups.items():
        time_calls(case, group, warmup, 0)
    samples = {impl: [] for impl in groups}
    cpu = dict.fromkeys(groups, 0.0)
    for rep in range(args.repetitions):
        for impl, group in groups.items():
            dist.barrier(group=control)  # all ranks start a repetition together
            start = time.process_time()
            samples[impl] += time_calls(case, group, iters, rep * iters)
            cpu[impl] += time.process_time() - start
    # The slowest rank's median, and the sum of wrong elements, agreed over the control group.
    local = torch.tensor([_common.median(samples[impl]) * 1e6 for impl in groups], dtype=torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.MAX, group=control)
    wrongs = torch.tensor([wrong[impl] for impl in groups], dtype=torch.int64)
    dist.all_reduce(wrongs, group=control)
    cpu_us = torch.tensor([cpu[impl] * 1e6 / (args.repetitions * iters) for impl in groups], dtype=torch.float64)
    dist.all_reduce(cpu_us, group=control)
    cpu_us /= dist.get_world_size(control)
    checked = {impl: args.check and impl != "fake" for impl in groups}
    return {impl: (local[i].item(), int(wrongs[i].item()) if checked[impl] else -1, cpu_us[i].item())
            for i, impl in enumerate(groups)}


def make_row(case, impl: str, dtype: str, time_us: float, wrong: int, cpu_us: float) -> dict:
    algbw = case.bytes / (time_us * 1e-6) / 1e9 if case.bytes and time_us > 0 else 0.0
    return {
        "op": case.op, "bytes": case.bytes, "count": case.count, "dtype": dtype if case.bytes else "-",
        "ranks": case.ranks, "impl": impl, "inplace": case.inplace, "redop": case.redop, "root": case.root,
        "time_us": time_us, "algbw_gbps": algbw, "busbw_gbps": algbw * case.busbw_factor(), "wrong": wrong,
        "cpu_us": cpu_us,
    }


def _fixed(value, digits=2):
    return f"{value:.{digits}f}"


def columns(impls: list[str]) -> list[str]:
    """The two implementations the table sets side by side (fake has a column of its own)."""
    return ([i for i in impls if i != "fake"] + ["-", "-"])[:2]


def print_case_rows(rows: dict, impls: list[str]) -> None:
    """One table line for one case: both implementations side by side and their ratios."""
    first = rows[impls[0]]
    left, right = columns(impls)
    cells = []
    for impl in (left, right):
        row = rows.get(impl)
        if row is None:
            cells += ["-", "-", "-", "-", "-"]
            continue
        data = row["bytes"] > 0
        cells += [_fixed(row["time_us"]), _fixed(row["cpu_us"]), _fixed(row["algbw_gbps"]) if data else "-",
                  _fixed(row["busbw_gbps"]) if data else "-", str(row["wrong"]) if row["wrong"] >= 0 else "-"]
    both = left in rows and right in rows  # the fake floor is optional
    bw_ratio = time_ratio = cpu_ratio = "-"
    if both and rows[right]["time_us"] > 0:
        time_ratio = _fixed(rows[left]["time_us"] / rows[right]["time_us"], 3)
        if first["bytes"] > 0 and rows[right]["busbw_gbps"] > 0:
            bw_ratio = _fixed(rows[left]["busbw_gbps"] / rows[right]["busbw_gbps"])
    if both and rows[right]["cpu_us"] > 0:
        cpu_ratio = _fixed(rows[left]["cpu_us"] / rows[right]["cpu_us"], 3)
    fake_time = _fixed(rows["fake"]["time_us"]) if "fake" in rows else "-"
    fake_cpu = _fixed(rows["fake"]["cpu_us"]) if "fake" in rows else "-"
    fake_ratio = "-"
    if "dlop" in rows and "fake" in rows and rows["fake"]["time_us"] > 0:
        fake_ratio = _fixed(rows["dlop"]["time_us"] / rows["fake"]["time_us"], 3)
    print(_LINE.format(" ", first["bytes"], first["count"], first["dtype"], first["redop"], first["root"],
                       "in" if first["inplace"] else "out", *cells, bw_ratio, time_ratio, cpu_ratio, fake_time,
                       fake_cpu, fake_ratio), flush=True)


def print_header(header: dict, args) -> None:
    print(_common.header_comment(header))
    print(f"# {header['command']}")
    print(f"# bench.c10d: {header['ranks']} ranks, {args.dtype}; dlop = the default group, gloo = dist.new_group(backend='gloo') over the same ranks")
    print("# time: per call, the slowest rank's median over the timed calls of all repetitions "
          f"({args.repetitions} repetitions of N = {args.iters or '32 MiB / S in [3, 1000]'} calls; warm-up "
          f"{args.warmup if args.warmup >= 0 else 'N calls for S <= 8 MiB, else 1'}); dlop and gloo alternate repetitions")
    print(f"# buffers: shared by both; rotate through 64 MiB (at most {MAX_SETS} sets) for S <= 8 MiB; "
          "S = one rank's buffer (all_reduce, broadcast) or the full array (all_gather, reduce_scatter, all_to_all)")
    print("# algbw = S / time; busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter, all_to_all), 1 (broadcast)")
    print("# #wrong: elements that differ from the expected values in one checked call, summed over ranks")
    print("# cpu: CPU time per call of a rank's process (all its threads: the caller's and the backend's), "
          "mean over ranks and over the timed calls")
    print("# ratios: busbw dlop/gloo (> 1: dlop faster), time and cpu dlop/gloo (< 1: dlop faster, cheaper)")
    print("# fake: dist.new_group(backend='fake') (FakeProcessGroup: no communication, results not computed), "
          "the floor of torch.distributed's per-call cost; d/f = dlop time / fake time")


def print_op_header(op: str, impls: list[str]) -> None:
    left, right = columns(impls)
    ratio = f"{left[0]}/{right[0]}"
    print(f"#\n# {op}")
    print(_LINE.format("#", "size", "count", "type", "redop", "root", "place", f"{left} time", "cpu", "algbw", "busbw",
                       "#wrong", f"{right} time", "cpu", "algbw", "busbw", "#wrong", "busbw", "time", "cpu",
                       "fake time", "cpu", "time"))
    print(_LINE.format("#", "(B)", "(elements)", "", "", "", "", "(us)", "(us/call)", "(GB/s)", "(GB/s)", "", "(us)",
                       "(us/call)", "(GB/s)", "(GB/s)", "", ratio, ratio, ratio, "(us)", "(us/call)", "d/f"), flush=True)


def print_footer(all_rows: list[dict], impls: list[str]) -> None:
    for impl in impls:
        if impl == "fake":
            print("# fake: not checked (it communicates nothing)")
            continue
        mine = [r for r in all_rows if r["impl"] == impl]
        wrong = sum(max(r["wrong"], 0) for r in mine)
        data = [r["busbw_gbps"] for r in mine if r["bytes"] > 0]
        average = f"{sum(data) / len(data):.3f} GB/s over {len(data)} rows" if data else "-"
        print(f"# {impl}: #wrong {wrong} {'OK' if wrong == 0 else 'WRONG'}; avg bus bandwidth {average}")


def main(argv=None) -> int:
    args = parse_args(argv)
    args.buffer_device = torch.device("cpu")
    # torch 2.13 calls all_gather_into_tensor / reduce_scatter_tensor deprecated (for *_single); we keep the
    # names every torch >= 2.0 has, and the rows carry them.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    if not _common.launched_by_torchrun("bench.c10d"):
        return 2
    if args.device != "cpu":
        if args.device.startswith("dlop_test"):
            import dlop.testing.accelerator  # noqa: F401
        device = torch.device(args.device)
        module = getattr(torch, device.type)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device(device.type, device.index if device.index is not None else
                              local_rank % module.device_count())
        module.set_device(device.index)
        args.buffer_device = device  # every buffer of the cases (not the control group's)
        args.impls = [i for i in args.impls if i != "fake"]  # torch's fake group serves the CPU only
    dist.init_process_group(backend="dlop")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    control = dist.new_group(backend="gloo")
    fake = dist.new_group(backend="fake") if "fake" in args.impls else None
    # The default group passed as an object, like the others: group=None costs
    # torch a default-group look-up per call (0.4 us here) that the fake floor
    # would not pay, which is no cost of the backend's.
    nccl = dist.new_group(backend="nccl") if "nccl" in args.impls else None
    by_impl = {"dlop": dist.group.WORLD, "gloo": control, "nccl": nccl, "fake": fake}
    groups = {impl: by_impl[impl] for impl in IMPLS if impl in args.impls}
    if args.sizes:
        sizes = [_common.parse_size(size) for size in args.sizes.split(",")]
    else:
        sizes = _common.size_range(_common.parse_size(args.minbytes), _common.parse_size(args.maxbytes), args.stepfactor)
    header = _common.run_header(benchmark="c10d", ranks=ranks, dtype=args.dtype, repetitions=args.repetitions,
                                rotate_bytes=ROTATE_UP_TO, impls=list(groups), ops=args.ops, device=args.device,
                                device_backend=os.environ.get("DLOP_DEVICE_BACKEND", "auto"))
    if rank == 0:
        print_header(header, args)
    all_rows = []
    gc.disable()  # a collection inside a timed loop would be charged to whichever implementation ran then
    bar = _common.progress(total=sum(1 if op == "barrier" else len(sizes) for op in args.ops), desc="c10d",
                           unit="case", show=rank == 0)
    for op in args.ops:
        if rank == 0:
            print_op_header(op, list(groups))
        for size in ([0] if op == "barrier" else sizes):
            bar.set_postfix_str(f"{op} {_common.format_size(size)}")
            bar.update()
            with args.buffer_device:
                case = CASES[op](size, DTYPES[args.dtype], ranks, rank, plan(size, args)[2])
            case.device = args.buffer_device
            results = measure(case, groups, control, args)
            rows = {impl: make_row(case, impl, args.dtype, *results[impl]) for impl in groups}
            all_rows += rows.values()
            if rank == 0:
                print_case_rows(rows, list(groups))
            del case
            gc.collect()
    bar.close()
    gc.enable()
    if rank == 0:
        print("#")
        print_footer(all_rows, list(groups))
        if args.json:
            _common.write_json(args.json, header, all_rows)
    return _common.end_run(control)


if __name__ == "__main__":
    sys.exit(main())
