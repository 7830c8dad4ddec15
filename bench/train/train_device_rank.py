"""The trainer process of ``python -m bench.train --device DEV``: ``python -m bench.train_device_rank SPEC``.

SPEC is the JSON the driver (bench.train.train_device) writes. The process first
confines itself to SPEC's cores (its DataLoader workers inherit them), then
trains SPEC's model on SPEC's device from the row's input pipeline and writes
its measurements to SPEC's "out". The ``stock`` row's process is also the
``dlop_run`` row's, started unchanged under ``dlop run``.

A step: wait for the batch (the data stall), move it to the device and
normalise it there, then forward + backward + optimiser step between two device
events (the device's busy time). The host runs at most two steps ahead of the
device, as a loop that reads its loss now and then does: it waits for the end
event of the step before last.

The timed window starts from steady state, the same way in every row: after the
warm-up steps (at least one per producer, so that every worker, thread or
daemon has delivered its first batch) the loader's queue is drained, batches
taken without training until one has to be waited for, so that no row times
a head start (a DataLoader's workers fill their queue while the device starts).
The process writes its pid beside SPEC's "out" as it starts: the driver samples
its page-locked memory from outside, so that the sampling costs the trainer's
cores nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

AHEAD = 2  # steps the host may queue ahead of the device
# Draining: a batch that comes within max(2 ms, a tenth of a warm-up step) was queued; at most 2 per producer
# (a DataLoader's prefetch_factor) and 6 more (OffloadLoader's leases ahead and the upload one ahead) are taken.
DRAIN_QUICK_S, DRAIN_QUICK_SHARE, DRAIN_SLACK = 0.002, 0.1, 6


def cpu_seconds(pids) -> float:
    """CPU-seconds so far of each live pid (its reaped children included)."""
    from bench.offload.offload_common import proc_cpu

    total = 0.0
    for pid in pids:
        try:
            total += proc_cpu(pid)
        except (OSError, IndexError):
            pass  # gone in between
    return total


def tree(pid: int) -> list[int]:
    from bench.offload.offload_common import descendants

    return [pid] + descendants(pid)


def offloader_pids(spec: dict) -> list[int]:
    """The offloaders' processes: the driver's daemons, or under `dlop run` its other children (its daemons)."""
    if spec["row"] == "dlop_run":
        mine = set(tree(os.getpid()))
        return [p for p in tree(os.getppid())[1:] if p not in mine]
    return [p for d in spec.get("offloader_pids", []) for p in tree(d)]


def cuda_host_peak_mib(device) -> float:
    """The peak of the device's own pinned-memory allocator where torch reports it (CUDA), else 0."""
    import torch

    if device.type != "cuda" or not hasattr(torch.cuda, "host_memory_stats"):
        return 0.0
    stats = torch.cuda.host_memory_stats()
    return max([v for k, v in stats.items() if "allocated_bytes" in k and "peak" in k] or [0]) / 2**20


def use_device(name: str):
    import torch

    if name.split(":")[0] == "dlop_test":
        import dlop.testing.accelerator  # noqa: F401  (registers the device; its cost model is in the environment)
    device = torch.device(name)
    if device.type != "cpu":
        module = torch.get_device_module(device.type)
        device = torch.device(device.type, module.current_device() if device.index is None else device.index)
        module.set_device(device.index)
    return device


def stock_loader(spec: dict, workers: int):
    """torch's DataLoader as a careful user writes it: the row's dataset, a seeded DistributedSampler (its
    order; dlop's rows shuffle with their own), `workers` processes, pinned batches; for stock_uint8 the workers ship uint8 and the device
    normalises (timm's PrefetchLoader)."""
    from torch.utils.data import DataLoader, DistributedSampler

    from bench.train import train_device_data as data

    kind, collate, uint8 = spec["kind"], None, spec["row"] == "stock_uint8"
    if spec["row"] == "gpu_decode":
        dataset, collate = data.JpegFiles(spec["data"], decode=spec["device"].split(":")[0] != "cuda"), \
            data.list_collate
    elif kind == "image":
        dataset = data.image_folder(spec["data"], spec["size"], uint8=uint8)
    elif kind == "video":
        dataset = data.VideoClips(spec["data"], spec["clip"], spec["video_reader"], uint8=uint8)
    else:
        dataset, collate = data.AudioFeatures(spec["data"], spec["seconds_per_sample"]), data.pad_collate
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)
    return DataLoader(dataset, batch_size=spec["batch"], sampler=sampler, drop_last=True, num_workers=workers,
                      collate_fn=collate, pin_memory=True, persistent_workers=workers > 0,
                      prefetch_factor=2 if workers else None)


def offload_loader(spec: dict, device):
    """dlop's OffloadLoader onto the device: the native pipeline, or the stock dataset on the offloaders'
    Python workers where this build's native pipeline lacks the kind (spec["offload_path"])."""
    import warnings

    from bench.train import train_device_data as data
    from dlop.data import OffloadLoader

    common = dict(batch_size=spec["batch"], shuffle=True, seed=0, drop_last=True, offloaders=spec["offloaders"],
                  token=spec["token"], device=device, process_group=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a local fallback would measure the wrong thing
        if spec["offload_path"] == "python":
            return OffloadLoader(dataset=stock_loader(spec, 0).dataset,
                                 collate_fn=data.pad_collate if spec["kind"] == "audio" else None, **common)
        spec_of = {"image": lambda: data.image_spec(spec["size"]), "video": lambda: data.video_spec(spec["clip"]),
                   "audio": lambda: data.audio_spec(spec["seconds_per_sample"])}
        return OffloadLoader(spec["data"], spec_of[spec["kind"]](), **common)


def native_local_loader(spec: dict, device):
    """dlop's native pipeline in this process, on its K cores (no offloaders), uploaded as dlop_offload's
    batches are."""
    from bench.train import train_device_data as data
    from dlop.data import _device

    spec_of = {"image": lambda: data.image_spec(spec["size"]), "video": lambda: data.video_spec(spec["clip"]),
               "audio": lambda: data.audio_spec(spec["seconds_per_sample"])}
    loader = data.NativeLocal(spec["data"], spec_of[spec["kind"]](), spec["batch"], threads=spec["workers"])
    return loader, lambda batches: _device.to_device(batches, device) if device.type != "cpu" else batches


def synthetic_batch(spec: dict, device):
    """One batch made on the device, shaped as the row's input; the same every step."""
    import torch

    n, g = spec["batch"], torch.Generator().manual_seed(0)
    if spec["kind"] == "image":
        x = torch.randn(n, 3, spec["size"], spec["size"], generator=g)
        y = torch.randint(0, spec["classes"], (n,), generator=g)
    elif spec["kind"] == "video":
        crop = spec["clip"]["crop"]
        x = torch.randn(n, 3, spec["clip"]["frames"], crop, crop, generator=g)
        y = (torch.rand(n, spec["classes"], generator=g) < 0.02).float()
    else:
        frames = int(spec["seconds_per_sample"] * 100) + 1  # a hop of 10 ms
        x = torch.randn(n, 80, frames, generator=g)
        y = torch.randint(0, spec["classes"], (n,), generator=g)
        return x.to(device), y.to(device), torch.full((n,), frames).to(device)
    return x.to(device), y.to(device)


def epochs(loader, upload=None):
    """Endless batches: epoch after epoch, each with its seeded order (through `upload`, when given, which
    moves an iterator's batches to the device)."""
    from torch.utils.data import DataLoader

    def endless():
        epoch = 0
        while True:
            (loader.sampler if isinstance(loader, DataLoader) else loader).set_epoch(epoch)
            yield from loader
            epoch += 1

    return upload(endless()) if upload else endless()


def drain(batches, limit: int, quick: float) -> int:
    """Takes batches without training until one has to be waited for (more than `quick` seconds), at most
    `limit`: the loader's queue is then empty and its producers busy, as in a data-bound steady state."""
    for n in range(1, limit + 1):
        t0 = time.perf_counter()
        next(batches)
        if time.perf_counter() - t0 > quick:
            return n
    return limit


def to_input(spec: dict, batch, device):
    """A batch as the row's loader gives it -> (inputs, targets, lengths or None) on the device, normalised
    there (dlop's batches travel as uint8; gpu_decode decodes and transforms there)."""
    import torch

    from bench.train import train_device_data as data

    if spec["row"] == "gpu_decode":
        images, labels = batch
        if device.type == "cuda":
            from dlop._torchvision_compat import import_torchvision

            images = import_torchvision().io.decode_jpeg(images, device=device)
        return data.device_image_batch(images, spec["size"], device), labels.to(device, non_blocking=True), None
    x, y, lengths = (*batch, None)[:3]
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    lengths = None if lengths is None else lengths.to(device, non_blocking=True)
    if x.dtype == torch.uint8:
        x = x.squeeze(1) if x.dim() == 6 else x  # one view of each clip
        mean, std = (data.VIDEO_MEAN, data.VIDEO_STD) if spec["kind"] == "video" else (data.MEAN, data.STD)
        shape = (1, 3) + (1,) * (x.dim() - 2)
        x = (x.float() - torch.tensor([255 * m for m in mean], device=device).view(shape)) / \
            torch.tensor([255 * s for s in std], device=device).view(shape)
    if spec["kind"] == "video":
        y = y.float()
    return x, y, lengths


def train(spec: dict, device, batches, pids_offloaders) -> dict:
    """Warm-up, then timed steps until spec's seconds (or steps) are done; the row's raw measurements."""
    import contextlib

    import torch
    from torch import nn

    from bench.train import train_device_models

    module = torch.get_device_module(device.type) if device.type != "cpu" else None
    torch.manual_seed(0)
    model = train_device_models.build(spec["model"], spec["kind"], spec["classes"]).to(device)
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}
    if spec["channels_last"]:
        model = model.to(memory_format=torch.channels_last if spec["kind"] == "image" else torch.channels_last_3d)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss() if spec["kind"] == "video" else nn.CrossEntropyLoss()
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if spec["autocast"] == "bf16"
                else contextlib.nullcontext())

    def event():
        return torch.Event(device=device, enable_timing=True) if module else None

    busy, stall, pending, warm, ahead = [], [], [], [], []
    steps, i, start, cpu0, off0, drained, samples = 0, 0, None, 0.0, 0.0, 0, 0
    untimed = max(spec["warmup"], spec.get("producers", 0))
    for i in range(1 << 62):
        if i == untimed:
            if module:
                module.synchronize()
                ahead.clear()
            if spec.get("producers"):
                quick = max(DRAIN_QUICK_S, DRAIN_QUICK_SHARE * sorted(warm)[len(warm) // 2] if warm else 0.0)
                drained = drain(batches, 2 * spec["producers"] + DRAIN_SLACK, quick)
                if module:
                    module.synchronize()  # the drained batches' uploads
            start, cpu0, off0 = time.perf_counter(), cpu_seconds(tree(os.getpid())), cpu_seconds(pids_offloaders())
        if start is not None and (steps >= spec["steps"] if spec["steps"] else
                                  (steps >= 3 and time.perf_counter() - start >= spec["seconds"])):
            break
        t0 = time.perf_counter()
        batch = next(batches)
        waited = time.perf_counter() - t0
        batch_dtype = getattr(batch[0], "dtype", "encoded")
        x, y, lengths = to_input(spec, batch, device)
        if spec["channels_last"] and x.dim() in layout:
            x = x.contiguous(memory_format=layout[x.dim()])
        began, ended, computing = event(), event(), time.perf_counter()
        if began:
            began.record()
        with autocast:
            out = model(x, lengths) if spec["kind"] == "audio" else model(x)
            loss = loss_fn(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ended:
            ended.record()
            ahead.append(ended)
            if len(ahead) > AHEAD:
                ahead.pop(0).synchronize()
        if start is None:
            warm.append(time.perf_counter() - t0)  # a step's time, the host held to AHEAD as when timed
            continue
        samples += int(y.shape[0])
        if not module:  # on the CPU the step computes on this thread: its own time is the busy time
            busy.append(time.perf_counter() - computing)
        steps += 1
        stall.append(waited)
        pending.append((began, ended))
    if module:
        module.synchronize()
    wall = time.perf_counter() - start
    cpu = cpu_seconds(tree(os.getpid())) - cpu0
    offloader_cpu = cpu_seconds(pids_offloaders()) - off0
    if module:
        busy = [b.elapsed_time(e) / 1e3 for b, e in pending]
    return {"steps": steps, "samples": samples, "wall_s": wall, "busy_s": sum(busy), "stall_s": stall,
            "trainer_cpu_s": cpu, "offloader_cpu_s": offloader_cpu, "loss": float(loss), "warmup": untimed,
            "drained": drained, "input_dtype": str(batch_dtype).removeprefix("torch.")}


def main(spec: dict) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(spec["timeout_s"], exit=True)  # a hung row says where it hangs
    os.sched_setaffinity(0, spec["cores"])  # before torch starts threads: they and every worker inherit it
    Path(spec["out"] + ".pid").write_text(str(os.getpid()))  # for the driver's page-locked memory sampler
    import torch

    # On an accelerator the host's intra-op threads have nothing to compute, and on dlop_test, whose kernels run
    # on the host, they would spin against the DataLoader's workers: one thread. The CPU device gets every core.
    torch.set_num_threads(len(spec["cores"]) if spec["device"] == "cpu" else 1)
    loader = None
    if spec["device"].split(":")[0] == "dlop_test":
        import dlop.testing.accelerator  # noqa: F401  (registered, so that pin_memory pins for it; no thread yet)
    if spec["row"] not in ("synthetic", "dlop_offload", "native_local"):
        # The workers fork at the first batch: before the device's threads run, as a fork while they hold
        # a lock can leave a worker waiting for it forever (seen on dlop_test with two video workers).
        loader = stock_loader(spec, spec["workers"])
        batches = epochs(loader)
        batches = itertools.chain([next(batches)], batches)
    device = use_device(spec["device"])
    if spec["row"] == "synthetic":
        fixed = synthetic_batch(spec, device)
        batches = iter(lambda: fixed, None)
    elif spec["row"] == "dlop_offload":
        batches = epochs(offload_loader(spec, device))
    elif spec["row"] == "native_local":
        batches = epochs(*native_local_loader(spec, device))
    result = train(spec, device, batches, lambda: offloader_pids(spec))
    if spec["row"] in ("stock", "stock_uint8", "stock_all_cores", "dlop_run"):
        # Under `dlop run` the loader's iteration went to dlop (dlop.data.run_loaders): say whether it offloaded.
        state = loader.__dict__.get("_dlop_run")
        result["dlop_run"] = None if state is None else type(state).__name__.strip("_").lower()
    result["cuda_host_peak_mib"] = cuda_host_peak_mib(device)
    result["cores"] = sorted(os.sched_getaffinity(0))
    Path(spec["out"]).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # persistent workers and the offloaders' connections go with the process


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
