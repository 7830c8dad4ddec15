"""Accelerator tensors through dlop: staging overlap and delegation cost, with peers in the same run.

Launch with torchrun (2 ranks)::

    torchrun --nproc-per-node 2 -m bench.device --json out.json

Two measurements:

* staging: an all-reduce of S bytes (default 64 MiB) on accelerator tensors,
  staged through pinned host memory in chunks, against its parts measured
  in the same run: the copies (device to host, then host to device, of S
  bytes on one stream) and dlop's all-reduce of the same bytes on host
  tensors. Without overlap it would take copy + host; chunked, it should
  take little more than max(copy, host): the ratio printed. On the test
  accelerator (the default when no GPU is present) the copies are given a
  bandwidth (--copy-gbps, default 25 GB/s, a PCIe link) and, as a second
  row, the bandwidth at which the copies take as long as the host
  all-reduce, where overlap matters most.
* delegation: per-call time of a blocking all-reduce of 8 B on CPU tensors
  through Gloo, and through a dlop group delegating to Gloo
  (DLOP_DEVICE_BACKEND=gloo), calls alternating one by one: what dlop's
  delegation (and its gradient accounting) adds per call.

time = the slowest rank's median.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import dlop  # noqa: F401  (registers the backend)
from bench.common import _common


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.device", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="accelerator type (auto: cuda if present, else dlop_test)")
    p.add_argument("--size", default="64M", help="staging: bytes of the all-reduce")
    p.add_argument("--copy-gbps", default="25,match",
                   help="dlop_test only: copy bandwidths to model (GB/s; 'match': copies as long as the host all-reduce)")
    p.add_argument("-r", "--repetitions", type=int, default=7)
    p.add_argument("--small-iters", type=int, default=2000, help="delegation: calls per repetition")
    p.add_argument("--json", help="write the rows to this file (rank 0)")
    return p.parse_args(argv)


def _slowest_median(samples: list[float], control) -> float:
    value = torch.tensor([_common.median(samples)], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=control)
    return value.item()


def _device(kind: str, rank: int) -> torch.device:
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "dlop_test"
    if kind == "dlop_test":
        import dlop.testing.accelerator  # noqa: F401
    module = getattr(torch, kind)
    return torch.device(kind, rank % module.device_count())


def time_copies(device, nbytes: int, reps: int) -> list[float]:
    """S bytes each way at once, on two streams, as staging copies (out on one stream, back on another)."""
    module = getattr(torch, device.type)
    source, target = torch.zeros(nbytes // 4, device=device), torch.zeros(nbytes // 4, device=device)
    host_in, host_out = torch.empty(nbytes // 4).pin_memory(), torch.zeros(nbytes // 4).pin_memory()
    out_stream, in_stream = module.Stream(device), module.Stream(device)
    samples = []
    for _ in range(reps):
        module.synchronize(device)
        start = time.perf_counter()
        with module.stream(out_stream):
            host_in.copy_(source, non_blocking=True)
        with module.stream(in_stream):
            target.copy_(host_out, non_blocking=True)
        module.synchronize(device)
        samples.append(time.perf_counter() - start)
    return samples


def time_allreduce(tensor, group, reps: int, control) -> list[float]:
    module = getattr(torch, tensor.device.type) if tensor.device.type != "cpu" else None
    samples = []
    for _ in range(reps):
        if module is not None:
            module.synchronize(tensor.device)
        dist.barrier(group=control)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if module is not None:
            module.synchronize(tensor.device)
        samples.append(time.perf_counter() - start)
    return samples


def time_chunked_allreduce(tensor, chunk_bytes: int, reps: int, control) -> list[float]:
    """The host half of a staged all-reduce: the same bytes in the same chunks, all in flight at once."""
    chunks = tensor.split(max(1, chunk_bytes // tensor.element_size()))
    samples = []
    for _ in range(reps):
        dist.barrier(group=control)
        start = time.perf_counter()
        for work in [dist.all_reduce(c, async_op=True) for c in chunks]:
            work.wait()
        samples.append(time.perf_counter() - start)
    return samples


def staging_rows(args, device, control) -> list[dict]:
    nbytes = _common.parse_size(args.size)
    chunk_bytes = int(os.environ.get("DLOP_DEVICE_CHUNK_BYTES", 4 << 20))
    host_tensor = torch.zeros(nbytes // 4).pin_memory()
    on_device = torch.zeros(nbytes // 4, device=device)
    time_allreduce(host_tensor, None, 2, control)  # warm-up: connections, pinned pool
    time_allreduce(on_device, None, 2, control)
    host_whole = _slowest_median(time_allreduce(host_tensor, None, args.repetitions, control), control)
    host = _slowest_median(time_chunked_allreduce(host_tensor, chunk_bytes, args.repetitions, control), control)
    rates: list[float | None] = [None]
    if device.type == "dlop_test":
        rates = []
        for rate in args.copy_gbps.split(","):
            rates.append(nbytes / host / 1e9 if rate.strip() == "match" else float(rate))
    rows = []
    for rate in rates:
        if rate is not None:
            import dlop.testing.accelerator as accelerator

            accelerator.configure(copy_gbps=rate)
        copy = _slowest_median(time_copies(device, nbytes, args.repetitions), control)
        staged = _slowest_median(time_allreduce(on_device, None, args.repetitions, control), control)
        rows.append({"bench": "staging", "device": device.type, "bytes": nbytes, "copy_gbps": rate,
                     "chunk_bytes": chunk_bytes, "copy_ms": copy * 1e3, "host_allreduce_ms": host * 1e3,
                     "host_whole_allreduce_ms": host_whole * 1e3, "staged_allreduce_ms": staged * 1e3,
                     "vs_max": staged / max(copy, host), "vs_sum": staged / (copy + host)})
    return rows


def delegation_rows(args, control) -> list[dict]:
    os.environ["DLOP_DEVICE_BACKEND"] = "gloo"  # read when the group is made
    delegating = dist.new_group(backend="dlop")
    del os.environ["DLOP_DEVICE_BACKEND"]
    gloo = dist.new_group(backend="gloo")
    groups = {"gloo": gloo, "dlop->gloo": delegating}
    tensor = torch.zeros(2)  # 8 B
    for group in groups.values():
        for _ in range(200):
            dist.all_reduce(tensor, group=group)
    # Calls alternate one by one (a call through Gloo costs hundreds of us
    # here, and drifts by tens between repetitions: only neighbours compare).
    samples: dict[str, list[float]] = {name: [] for name in groups}
    order = list(groups.items())
    dist.barrier(group=control)
    for i in range(args.repetitions * args.small_iters):
        for name, group in order if i % 2 else order[::-1]:
            start = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            samples[name].append(time.perf_counter() - start)
    dlop_samples = []
    for _ in range(args.small_iters):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        dlop_samples.append(time.perf_counter() - start)
    us = {name: _slowest_median(s, control) * 1e6 for name, s in samples.items()}
    return [{"bench": "delegation", "bytes": 8, "gloo_us": us["gloo"], "delegated_us": us["dlop->gloo"],
             "dlop_us": _slowest_median(dlop_samples, control) * 1e6, "added_us": us["dlop->gloo"] - us["gloo"]}]


def main(argv=None) -> int:
    args = parse_args(argv)
    if not _common.launched_by_torchrun("bench.device"):
        return 2
    dist.init_process_group(backend="dlop")
    rank = dist.get_rank()
    device = _device(args.device, dist.get_local_rank() if hasattr(dist, "get_local_rank") else rank)
    control = dist.new_group(backend="gloo")
    header = _common.run_header(benchmark="device", ranks=dist.get_world_size(), device=str(device),
                                repetitions=args.repetitions)
    rows = staging_rows(args, device, control) + delegation_rows(args, control)
    if rank == 0:
        print(_common.header_comment(header))
        print(f"# {header['command']}")
        print("# staging: an all-reduce of accelerator tensors against its parts (the slowest rank's medians);")
        print("# host = dlop's all-reduce of the same bytes on pinned host tensors in the same chunks, all in flight")
        print(f"# {'bytes':>10} {'copy GB/s':>9} {'copy ms':>8} {'host ms':>8} {'staged ms':>9} "
              f"{'staged/max':>10} {'staged/sum':>10}")
        for r in (r for r in rows if r["bench"] == "staging"):
            gbps = f"{r['copy_gbps']:.1f}" if r["copy_gbps"] else "-"
            print(f"  {r['bytes']:>10} {gbps:>9} {r['copy_ms']:>8.2f} {r['host_allreduce_ms']:>8.2f} "
                  f"{r['staged_allreduce_ms']:>9.2f} {r['vs_max']:>10.3f} {r['vs_sum']:>10.3f}")
        print("# staged/max: staged time / max(copy, host) (1: perfect overlap); staged/sum: / (copy + host) "
              "(1: no overlap)")
        whole = next((r for r in rows if r["bench"] == "staging"), None)
        if whole:
            print(f"# (host all-reduce of the {whole['bytes']} B as one call: {whole['host_whole_allreduce_ms']:.2f} ms)")
        print("# delegation: blocking all-reduce of 8 B on CPU tensors, per call")
        for r in (r for r in rows if r["bench"] == "delegation"):
            print(f"  gloo {r['gloo_us']:.2f} us; dlop delegating to gloo {r['delegated_us']:.2f} us "
                  f"(+{r['added_us']:.2f} us); dlop itself {r['dlop_us']:.2f} us")
        if args.json:
            _common.write_json(args.json, header, rows)
    return _common.end_run(control)


if __name__ == "__main__":
    sys.exit(main())
