"""One trainer rank of bench.train (``python -m bench.train_rank SPEC``, spawned by the driver).

SPEC is the JSON the driver writes: the config, the kind of data (images or
clips), the data, the model's size and the steps. The rank trains, trains on with its last batch resident (no
data moving), replays its all-reduces alone, and writes its
measurements to rank<R>.json beside SPEC's "out"; what each one means is in
bench.train's docstring.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from bench.common import _common

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
VIDEO_MEAN, VIDEO_STD = (0.45, 0.45, 0.45), (0.225, 0.225, 0.225)  # Kinetics', as PyTorchVideo normalises


def augment_clip(video, clip: dict, normalise: bool = True):
    """T x C x H x W uint8 frames -> C x T x crop x crop, normalised float32 (or uint8 without `normalise`):
    the short side resized to a random size in clip["short_side"], a random crop, a flip with probability
    clip["hflip"] (the native pipeline's ops)."""
    import torch
    import torch.nn.functional as F

    short, crop = random.randint(*clip["short_side"]), clip["crop"]
    h, w = video.shape[-2:]
    size = (short, round(w * short / h)) if h <= w else (round(h * short / w), short)
    video = F.interpolate(video, size=size, mode="bilinear", antialias=True, align_corners=False)
    top, left = random.randint(0, size[0] - crop), random.randint(0, size[1] - crop)
    video = video[..., top:top + crop, left:left + crop]
    if random.random() < clip["hflip"]:
        video = video.flip(-1)
    if not normalise:
        return video.permute(1, 0, 2, 3).contiguous()
    mean = torch.tensor([255 * m for m in VIDEO_MEAN]).view(1, 3, 1, 1)
    std = torch.tensor([255 * s for s in VIDEO_STD]).view(1, 3, 1, 1)
    return ((video.float() - mean) / std).permute(1, 0, 2, 3).contiguous()


# --- the model and the data (used by the ranks) -------------------------

def make_model(hidden: int, stem_stride: int = 4, classes: int = 10):
    """A strided conv stem and a wide fully-connected head: little compute per byte of gradient, so the
    step's communication is visible on a slow link even with CPU-only training. The stem's stride sets the
    compute (stride 4: about 1.5x a step's compute at stride 8) without changing the gradient."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 16, kernel_size=8, stride=stem_stride), nn.ReLU(), nn.AdaptiveAvgPool2d(12),
                         nn.Flatten(), nn.Linear(16 * 12 * 12, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, classes))


def make_video_model(hidden: int, stem_stride: int = 1, classes: int = 10):
    """The video counterpart of make_model: a Conv3d stem over (T, H, W), pooled to 2 x 6 x 6, and the same
    wide head, so the gradient is mostly the head's; the stem's spatial stride sets the compute."""
    from torch import nn

    return nn.Sequential(nn.Conv3d(3, 16, kernel_size=(3, 7, 7), stride=(1, stem_stride, stem_stride),
                                   padding=(1, 3, 3)), nn.ReLU(), nn.AdaptiveAvgPool3d((2, 6, 6)),
                         nn.Flatten(), nn.Linear(16 * 2 * 6 * 6, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, classes))


def native_spec(size: int, wire: str) -> dict:
    ops = [{"op": "random_resized_crop", "size": size}, {"op": "hflip", "p": 0.5}]
    if wire == "float32":
        ops.append({"op": "normalize", "mean": list(MEAN), "std": list(STD)})
    return {"ops": ops, "output": wire}


def native_video_spec(clip: dict, wire: str) -> dict:
    """`clip` (frames, stride, short_side, crop, hflip) as a video spec; one view, N x 1 x C x T x H x W."""
    spec = {"kind": "video", "frames": clip["frames"], "stride": clip["stride"], "views": 1, "start": "random",
            "short_side": list(clip["short_side"]), "crop": clip["crop"], "hflip": clip["hflip"], "layout": "CTHW",
            "output": wire}
    if wire == "float32":
        spec["normalize"] = {"mean": list(VIDEO_MEAN), "std": list(VIDEO_STD)}
    return spec


class VideoClips:
    """What users run in a DataLoader today: offload_media's PyAV reader (seek to the keyframe before the
    clip, decode forward, keep frames by pts) with the run's clip parameters, then the same spatial ops as the
    native spec (short side to a random size, random crop, flip, drawn once per clip) and normalisation;
    C x T x H x W float32."""

    def __init__(self, root: str, clip: dict) -> None:
        from bench.offload.offload_media import PyAVClips, class_folder

        self.reader, self.clip = PyAVClips(class_folder(root)), clip

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, i):
        import av
        import numpy as np
        import torch

        frames, stride = self.clip["frames"], self.clip["stride"]
        path, label = self.reader.files[i]
        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            rate, base, first = stream.average_rate, stream.time_base, stream.start_time or 0
            count = stream.frames or int(stream.duration * base * rate)
            start = random.randint(0, max(0, count - ((frames - 1) * stride + 1)))
            wanted = [min(start + t * stride, count - 1) for t in range(frames)]
            got = self.reader._decode(container, stream, wanted, rate, base, first)
            if len(got) < len(set(wanted)):
                got = self.reader._decode(container, stream, wanted, rate, base, first, from_start=True)
            video = torch.from_numpy(np.stack([got[k] for k in wanted])).permute(0, 3, 1, 2)  # T x C x H x W
        return augment_clip(video, self.clip), label


class Batches:
    """Endless (inputs, labels) for this rank: epochs in turn, float32 normalised images (N x C x H x W) or
    clips (N x C x T x H x W) whatever the wire."""

    def __init__(self, spec: dict, rank: int, world: int) -> None:
        import torch

        self.spec, self.epoch = spec, 0
        video = spec.get("kind") == "video"
        if spec["config"].startswith("dlop_offload"):
            from dlop.data import OffloadLoader

            transform = (native_video_spec(spec["clip"], spec["wire"]) if video else
                         native_spec(spec["size"], spec["wire"]))
            self.loader = OffloadLoader(spec["data"], transform, spec["batch"],
                                        shuffle=True, seed=0, drop_last=True, offloaders=spec["offloaders"],
                                        token=spec["token"])
            if not self.loader.offloaded:
                raise RuntimeError("no dlop-offloader answered: an offload row would measure local batches")
            self.sampler = None
        else:
            from torch.utils.data import DataLoader, DistributedSampler

            from bench.offload.offload import torchvision_transform
            from dlop._torchvision_compat import import_torchvision

            dataset = (VideoClips(spec["data"], spec["clip"]) if video else
                       import_torchvision().datasets.ImageFolder(spec["data"],
                                                                 transform=torchvision_transform(spec["size"])))
            self.sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=0, drop_last=True)
            self.loader = DataLoader(dataset, batch_size=spec["batch"], sampler=self.sampler, drop_last=True,
                                     num_workers=spec["workers"], persistent_workers=True, prefetch_factor=2)
        shape = (1, 3, 1, 1, 1) if video else (1, 3, 1, 1)
        self.scale = torch.tensor([255 * s for s in (VIDEO_STD if video else STD)]).view(shape)
        self.shift = torch.tensor([255 * m for m in (VIDEO_MEAN if video else MEAN)]).view(shape)
        self.it = self._epoch_iter()

    def _epoch_iter(self):
        (self.sampler or self.loader).set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.loader)

    def next_raw(self):
        """The next batch as the loader gives it (the data wait)."""
        try:
            return next(self.it)
        except StopIteration:
            self.it = self._epoch_iter()
            return next(self.it)

    def to_input(self, images):
        """uint8 CHW -> normalised float32 on the trainer (compute); float32 batches are copied once, as the
        offloader's buffer is reused at the next batch. Offloaded clips come as N x views x C x T x H x W with
        one view."""
        if images.dim() == 6:
            images = images.squeeze(1)
        if images.dtype == self.scale.dtype:
            return images.clone() if self.spec["config"].startswith("dlop_offload") else images
        return (images.float() - self.shift) / self.scale

    def close(self) -> None:
        """Stops the loader (its workers, its leases and prefetching), so that no more data moves."""
        import gc

        self.it = None
        self.loader = None
        gc.collect()


# --- one rank -----------------------------------------------------------

class BucketTimer:
    """A DDP comm hook: all-reduce (mean) each bucket, noting when it was handed over and when it finished."""

    def __init__(self) -> None:
        self.launched: list[tuple[float, int]] = []  # (time, elements) per bucket this step
        self.finished: dict[int, float] = {}  # bucket's launch index -> completion time

    def hook(self, group, bucket):
        import torch.distributed as dist

        tensor = bucket.buffer()
        index = len(self.launched)
        self.launched.append((time.perf_counter(), tensor.numel()))
        world = dist.get_world_size(group)
        future = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(fut):
            self.finished[index] = time.perf_counter()
            return fut.value()[0].div_(world)

        return future.then(done)

    def take(self) -> list[tuple[float, float, int]]:
        """This step's buckets as (handed over, finished, elements); DDP waited for all of them."""
        buckets = [(t, self.finished[i], n) for i, (t, n) in enumerate(self.launched)]
        self.launched, self.finished = [], {}
        return buckets


def run_rank(spec: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dlop  # noqa: F401  (registers the backend)

    torch.set_num_threads(spec["threads"])
    dist.init_process_group(backend="gloo" if spec["config"] == "stock" else "dlop")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    build = make_video_model if spec.get("kind") == "video" else make_model
    model = DDP(build(spec["hidden"], spec["stem_stride"]), bucket_cap_mb=spec["bucket_cap_mb"])
    timer = BucketTimer()
    model.register_comm_hook(None, timer.hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batches = Batches(spec, rank, world)
    steps = {"step": [], "data": [], "exposed": [], "buckets": [], "labels": []}
    launches = []  # per timed step: (offset from the step's first hand-over, elements) per bucket

    def train_step(images, labels):
        """forward + backward + optimiser step on one batch; its buckets as the comm hook saw them."""
        inputs = batches.to_input(images)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), labels.long()).backward()
        optimizer.step()
        return timer.take()

    dist.barrier()
    for i in range(spec["warmup"] + spec["steps"]):
        if i == spec["warmup"]:
            dist.barrier()
            start = time.perf_counter()
        t0 = time.perf_counter()
        images, labels = batches.next_raw()
        t1 = time.perf_counter()
        buckets = train_step(images, labels)
        t2 = time.perf_counter()
        if i < spec["warmup"]:
            continue
        launches.append([(t - buckets[0][0], n) for t, _, n in buckets])
        steps["step"].append(t2 - t0)
        steps["data"].append(t1 - t0)
        steps["exposed"].append(max(0.0, max(f for _, f, _ in buckets) - max(t for t, _, _ in buckets)))
        steps["buckets"].append([(t, f) for t, f, _ in buckets])
        steps["labels"].append(labels.tolist())  # what was trained on: the samples the row counts
    wall = time.perf_counter() - start
    resident = images.clone(), labels.clone()  # the loader's buffer is reused; this batch stays in memory
    batches.close()
    dist.barrier()
    # The same training steps with no data moving anywhere (the batch is already here): the idle all-reduce.
    quiet = [[(t, f) for t, f, _ in train_step(*resident)] for _ in range(spec["idle_reps"])]
    # DDP may rebuild its buckets after the first step: the last step's are the ones it keeps.
    sizes = [n for _, n in launches[-1]]
    alike = [step for step in launches if [n for _, n in step] == sizes]
    offsets = [_common.median([step[b][0] for step in alike]) for b in range(len(sizes))]
    replay = replay_buckets(sizes, offsets, spec["idle_reps"], _common.median(steps["step"]))
    result = {"rank": rank, "wall_s": wall, "idle": quiet, "replay": replay, "bucket_elements": sizes,
              "gradient_bytes": 4 * sum(p.numel() for p in model.parameters()), **steps}
    Path(spec["out"]).with_name(f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def replay_buckets(sizes: list[int], offsets: list[float], reps: int,
                   period: float) -> list[list[tuple[float, float]]]:
    """The training step's bucket all-reduces again, same sizes, same hand-over times within a round and
    rounds a training step apart (so links and threads idle between them as in training), with no data
    moving and nothing computing; per round, each bucket's (handed over, finished) as in training."""
    import torch
    import torch.distributed as dist

    tensors = [torch.ones(n) for n in sizes]
    rounds = []
    for _ in range(reps):
        dist.barrier()
        start, futures = time.perf_counter(), []
        for tensor, offset in zip(tensors, offsets):
            time.sleep(max(0.0, start + offset - time.perf_counter()))
            launched = time.perf_counter()
            future = dist.all_reduce(tensor, async_op=True).get_future()
            futures.append(future.then(lambda _, t=launched: (t, time.perf_counter())))
        rounds.append([f.wait() for f in futures])
        time.sleep(max(0.0, start + period - time.perf_counter()))
    return rounds


if __name__ == "__main__":
    run_rank(json.loads(sys.argv[1]))
