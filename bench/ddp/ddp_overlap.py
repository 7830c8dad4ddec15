"""How much of DDP's communication the backward pass hides, on an accelerator.

Launch with torchrun (2 ranks)::

    torchrun --nproc-per-node 2 -m bench.ddp_overlap --device dlop_test --json out.json

Per backend (dlop, and Gloo where Gloo serves the device), in the same run,
on the same model (an MLP of ``--layers`` layers of ``--width``, batch
``--batch``):

* ``compute_ms``: the same DDP step with a communication hook that sends
  nothing (its future done at once): forward, backward, DDP's own bucketing
  and optimiser step, so that only the communication differs from ``step_ms``;
* ``comm_ms``: the step's bucket all-reduces alone, on an idle device, handed
  over back to back in DDP's order;
* ``step_ms``: the DDP step;
* ``overlap``: (compute + comm - step) / comm: 1 when the communication is
  fully hidden, 0 when none of it is.

Each is the slowest rank's median over ``--steps`` steps, each step ending
with the device synchronised and every rank done with it (a CPU barrier). Per bucket of the last DDP step (rank 0):
when DDP handed it over (host), when its gradients were computed (an event
recorded on the current stream at hand-over), and when its future completed
(host), in ms from the step's start. With ``--trace DIR`` dlop also writes
its Chrome trace there, and per bucket the staged call's copy out done, host
operation start and end, and copies back done come from its "staged" spans;
``late_start_ms`` is the most any host operation started after its copy out.
``device_path`` says how dlop moved the device tensors: ``staged``, ``shared``
(the ranks share one device: reduced in its memory) or ``delegated``.

On ``dlop_test`` the device's cost model is set from ``--op-us``,
``--tflops`` and ``--copy-gbps`` (docs/test_accelerator.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import dlop  # noqa: F401  (registers the backend)
from bench.common import _common


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.ddp_overlap", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="accelerator type (auto: cuda if present, else dlop_test)")
    p.add_argument("--backends", default="dlop,gloo", help="comma-separated; gloo is left out where it cannot serve")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bucket-cap-mb", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=3, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--op-us", type=int, default=50, help="dlop_test: every operator's least time")
    # A slow device, so that the 2-core machine's scheduling (milliseconds) is
    # small beside what is measured; comm is then about a third of compute.
    p.add_argument("--tflops", type=float, default=0.0002, help="dlop_test: the device's matmul rate")
    p.add_argument("--copy-gbps", type=float, default=0.027, help="dlop_test: the copy engines' rate")
    p.add_argument("--trace", help="dlop's Chrome trace folder (sets DLOP_TRACE before the group is made)")
    p.add_argument("--json", help="write the rows here (rank 0)")
    return p.parse_args(argv)


def _device(kind: str, local_rank: int) -> torch.device:
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "dlop_test"
    if kind == "dlop_test":
        import dlop.testing.accelerator  # noqa: F401
    module = torch.get_device_module(kind)
    return torch.device(kind, local_rank % module.device_count())


def _model(args, device) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def _slowest_median(samples: list[float], control) -> float:
    value = torch.tensor([_common.median(samples)], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=control)
    return value.item()


class Timeline:
    """A comm hook that all-reduces each bucket and notes when it was handed over and done."""

    def __init__(self, module, device):
        self.module, self.device = module, device
        self.start = 0.0
        self.buckets: list[dict] = []
        self.sizes: list[int] = []

    def begin(self) -> None:
        self.buckets = []
        self.start_event = torch.Event(device=self.device, enable_timing=True)
        self.start_event.record()
        self.start = time.perf_counter()

    def hook(self, group, bucket):
        buffer = bucket.buffer()
        entry = {"bytes": buffer.numel() * buffer.element_size(),
                 "handed_ms": (time.perf_counter() - self.start) * 1e3,
                 "computed": torch.Event(device=self.device, enable_timing=True)}
        entry["computed"].record()
        self.buckets.append(entry)
        buffer.div_(dist.get_world_size(group))
        future = dist.all_reduce(buffer, group=group, async_op=True).get_future()

        def done(fut):
            entry["future_ms"] = (time.perf_counter() - self.start) * 1e3
            return fut.value()[0]

        return future.then(done)

    def finish(self) -> list[dict]:
        rows = []
        for b in self.buckets:
            rows.append({"bytes": b["bytes"], "handed_ms": b["handed_ms"],
                         "computed_ms": self.start_event.elapsed_time(b["computed"]),
                         "future_ms": b.get("future_ms", float("nan"))})
        return rows


def _step(model, optimizer, x) -> None:
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)


def _no_communication(_state, bucket):
    """A DDP communication hook that sends nothing: the bucket as it is, at once."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def measure(args, backend: str, device, control) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    module = torch.get_device_module(device.type)
    group = dist.new_group(backend=backend)
    x = torch.randn(args.batch, args.width, device=device)

    def timed(fn, reps) -> list[float]:
        samples = []
        for _ in range(reps):
            module.synchronize(device)
            dist.barrier(group=control)
            t = time.perf_counter()
            fn()
            module.synchronize(device)
            # Until the slowest rank is done with this step: a DDP step waits
            # for it, so every measure does, or their noise differs.
            dist.barrier(group=control)
            samples.append(time.perf_counter() - t)
        return samples

    silent = DDP(_model(args, device), process_group=group, bucket_cap_mb=args.bucket_cap_mb)
    silent.register_comm_hook(None, _no_communication)
    silent_opt = torch.optim.SGD(silent.parameters(), lr=1e-3)
    timed(lambda: _step(silent, silent_opt, x), args.warmup)
    compute = _slowest_median(timed(lambda: _step(silent, silent_opt, x), args.steps), control)

    ddp = DDP(_model(args, device), process_group=group, bucket_cap_mb=args.bucket_cap_mb)
    timeline = Timeline(module, device)
    ddp.register_comm_hook(group, timeline.hook)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def ddp_step():
        timeline.begin()
        _step(ddp, ddp_opt, x)

    timed(ddp_step, args.warmup)
    step = _slowest_median(timed(ddp_step, args.steps), control)
    buckets = timeline.finish()

    buffers = [torch.zeros(b["bytes"] // 4, device=device) for b in buckets]

    def replay():
        for work in [dist.all_reduce(b, group=group, async_op=True) for b in buffers]:
            work.wait()

    timed(replay, args.warmup)
    comm = _slowest_median(timed(replay, args.steps), control)
    path = _device_path(group, device) if backend == "dlop" else None
    dist.destroy_process_group(group)
    return {"backend": backend, "compute_ms": compute * 1e3, "comm_ms": comm * 1e3, "step_ms": step * 1e3,
            "overlap": (compute + comm - step) / comm if comm > 0 else float("nan"), "buckets": buckets,
            "device_path": path}


def _device_path(group, device) -> str:
    """How dlop moved the group's device tensors."""
    pg = group._get_backend(device)
    if getattr(pg, "shared_device", None):
        return "shared"  # the ranks share the device: reduced in its memory
    return "delegated" if getattr(pg, "device_backend", None) is not None else "staged"


def staged_spans(trace_dir: str) -> list[dict]:
    """This process's "staged" spans from dlop's Chrome trace, in start order."""
    events = []
    for path in glob.glob(os.path.join(trace_dir, f"dlop-trace-*-{os.getpid()}.json")):
        with open(path) as f:
            events += [e for e in json.load(f)["traceEvents"] if e.get("name", "").startswith("staged ")]
    return sorted(events, key=lambda e: e["ts"])


def late_start_ms(spans: list[dict]) -> float:
    """The most a host operation started after its copy out was done."""
    lates = [(s["args"]["host_start_us"] - s["args"]["copy_out_us"]) / 1e3 for s in spans
             if s["args"].get("host_start_us", -1) >= 0 and s["args"].get("copy_out_us", -1) >= 0]
    return max(lates, default=float("nan"))


def main(argv=None) -> int:
    args = parse_args(argv)
    if not _common.launched_by_torchrun("bench.ddp_overlap"):
        return 2
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
        os.environ["DLOP_TRACE"] = args.trace
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    device = _device(args.device, local_rank)
    if device.type == "dlop_test":
        import dlop.testing.accelerator as acc

        acc.configure(op_us=args.op_us, tflops=args.tflops, copy_gbps=args.copy_gbps)
    torch.get_device_module(device.type).set_device(device)
    dist.init_process_group(backend="dlop")
    control = dist.new_group(backend="gloo")
    rows, absent = [], {}
    for backend in args.backends.split(","):
        if backend == "gloo" and device.type not in ("cuda",):
            absent["gloo"] = f"Gloo serves CPU and CUDA tensors, not {device.type}"
            continue
        rows.append(measure(args, backend, device, control))
    device_path = next((r["device_path"] for r in rows if r["backend"] == "dlop"), None)
    late = float("nan")
    if args.trace and "dlop" in args.backends:
        import dlop._C

        dlop._C._trace_flush()
        late = late_start_ms(staged_spans(args.trace))
    lates = torch.tensor([late], dtype=torch.float64)
    dist.all_reduce(lates, op=dist.ReduceOp.MAX, group=control)
    if dist.get_rank() == 0:
        header = _common.run_header(benchmark="ddp_overlap", ranks=dist.get_world_size(), device=str(device),
                                    layers=args.layers, width=args.width, batch=args.batch, absent=absent,
                                    late_start_ms=lates.item(), device_path=device_path)
        print(_common.header_comment(header))
        print(f"# dlop's device path: {device_path}")
        print(f"# {'backend':>8} {'compute ms':>10} {'comm ms':>8} {'step ms':>8} {'overlap':>8}")
        for r in rows:
            print(f"  {r['backend']:>8} {r['compute_ms']:>10.2f} {r['comm_ms']:>8.2f} {r['step_ms']:>8.2f} "
                  f"{r['overlap']:>8.3f}")
        for name, why in absent.items():
            print(f"# {name}: absent ({why})")
        if args.json:
            _common.write_json(args.json, header, rows)
    return _common.end_run(control)


if __name__ == "__main__":
    sys.exit(main())
