"""The image loaders users pick instead of the DataLoader, each in the fastest form its project documents, on the
pipeline of ``python -m bench.offload``: the same JPEGs, RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3), a flip
with probability 1/2, normalise, float32 NCHW batches, k threads or processes.

* ``dali_cpu``: NVIDIA DALI's CPU pipeline (``device_id=None``) as in its ResNet-50 example: ``fn.readers.file``,
  ``fn.decoders.image_random_crop`` (decodes only the crop's region), ``fn.resize`` (triangular: antialiased
  linear), ``fn.crop_mirror_normalize`` to float CHW; k threads; ``DALIClassificationIterator``.
* ``spdl``: SPDL's ``spdl.dataloader.DataLoader`` (a thread pipeline, k threads) with FFmpeg decode and a filter
  graph per image doing the crop, the bilinear scale, the flip and the RGB conversion; its aggregator batches the
  frames with ``convert_frames`` and normalises into float NCHW with one strided copy.
* ``ray_data``: Ray Data on a local Ray started for the row with ``num_cpus=k``: ``read_images`` (shuffled files)
  and ``map_batches`` with torchvision's v2 transforms in Ray's worker processes, ``iter_torch_batches`` in the
  trainer.

Each loader yields (images, labels, ids): ids name the samples (file paths or indices) for the data check.
"""

from __future__ import annotations

import math
import os
import random
import warnings
from pathlib import Path

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
IMAGE_PEERS = ("dali_cpu", "spdl", "ray_data")
# The package each peer needs (pyproject.toml's extra "peers"; scripts/install_peers.py installs them).
PACKAGES = {"dali_cpu": "nvidia.dali", "spdl": "spdl.io", "ray_data": "ray.data"}


def image_files(root: str) -> list[tuple[str, int]]:
    """(path, label) as torchvision's ImageFolder lists them: classes sorted, files sorted within each."""
    classes = sorted(d.name for d in Path(root).iterdir() if d.is_dir() and not d.name.startswith("."))
    return [(str(f), label) for label, c in enumerate(classes)
            for f in sorted((Path(root) / c).iterdir()) if f.is_file() and not f.name.startswith(".")]


def missing(peer: str) -> str | None:
    """Why a peer cannot run here, or None."""
    try:
        __import__(PACKAGES[peer])
    except Exception as e:  # a wheel for another platform raises OSError or RuntimeError, not only ImportError
        first = str(e).splitlines()[0] if str(e) else ""
        return (f"import {PACKAGES[peer]} failed ({type(e).__name__}: {first}); python scripts/install_peers.py "
                "installs the peers")
    return None


def crop_box(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
    """(left, top, width, height): torchvision's RandomResizedCrop.get_params, drawn from `rng`."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    if width / height < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif width / height > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


# --- DALI ------------------------------------------------------------------------

class DaliCpu:
    """DALI's ResNet-50 training pipeline on the CPU. With ids, a second output carries each sample's file path
    (``source_info``) and the epoch is read with ``pipe.run()``, since its iterator stacks numeric outputs only."""

    def __init__(self, data: str, batch: int, size: int, threads: int, seed: int = 0, ids: bool = False) -> None:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def

        self.ids, self.batch = ids, batch

        @pipeline_def
        def pipeline():
            jpegs, labels = fn.readers.file(file_root=data, random_shuffle=True, pad_last_batch=True, name="Reader")
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                   random_area=list(SCALE), random_aspect_ratio=list(RATIO),
                                                   num_attempts=10)
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_TRIANGULAR)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                              mirror=fn.random.coin_flip(probability=0.5))
            if ids:
                return images, labels, fn.get_property(jpegs, key="source_info")
            return images, labels

        self.pipe = pipeline(batch_size=batch, num_threads=threads, device_id=None, seed=seed)
        self.pipe.build()
        self.size = self.pipe.reader_meta("Reader")["epoch_size"]
        if not ids:
            from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

            self.it = DALIClassificationIterator(self.pipe, reader_name="Reader",
                                                 last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def epoch(self):
        if self.ids:
            yield from self._epoch_with_ids()
            return
        for out in self.it:
            yield out[0]["data"], out[0]["label"].view(-1).long(), None

    def _epoch_with_ids(self):
        import numpy as np
        import torch

        left = self.size
        while left > 0:
            images, labels, info = self.pipe.run()
            n = min(left, self.batch)
            left -= n
            paths = [bytes(np.asarray(info.at(i))).decode() for i in range(n)]
            yield (torch.from_numpy(np.asarray(images.as_tensor())[:n].copy()),
                   torch.from_numpy(np.asarray(labels.as_tensor()).reshape(-1)[:n].astype(np.int64)), paths)

    def close(self) -> None:
        self.it = self.pipe = None


# --- SPDL ------------------------------------------------------------------------

class _Order:
    """The sample indices of one epoch, shuffled anew by each iteration (SPDL's source is any iterable)."""

    def __init__(self, count: int, seed: int) -> None:
        self.count, self.seed, self.epoch = count, seed, 0

    def __iter__(self):
        order = list(range(self.count))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        self.epoch += 1
        return iter(order)


class Spdl:
    def __init__(self, data: str, batch: int, size: int, threads: int, seed: int = 0, ids: bool = True) -> None:
        import spdl.io
        import torch
        from spdl.dataloader import DataLoader

        files = image_files(data)
        self.size = len(files)
        mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255
        scale = 1 / (torch.tensor(STD).view(1, 3, 1, 1) * 255)
        order = _Order(len(files), seed)

        def decode(index: int):
            path, label = files[index]
            rng = random.Random((seed * 1_000_003 + order.epoch) * 1_000_003 + index)
            packets = spdl.io.demux_image(path)
            left, top, w, h = crop_box(packets.width, packets.height, rng)
            flip = ",hflip" if rng.random() < 0.5 else ""
            graph = f"crop={w}:{h}:{left}:{top},scale={size}:{size}:flags=bilinear{flip},format=rgb24"
            return spdl.io.decode_packets(packets, filter_desc=graph), label, index

        def collate(items):
            frames = spdl.io.to_torch(spdl.io.convert_frames([f for f, _, _ in items]))  # N x H x W x C uint8
            out = torch.empty(len(items), 3, size, size)
            out.copy_(frames.permute(0, 3, 1, 2))  # one strided pass: NHWC uint8 -> NCHW float
            return out.sub_(mean).mul_(scale), torch.tensor([l for _, l, _ in items]), [i for _, _, i in items]

        self.loader = DataLoader(order, preprocessor=decode, batch_size=batch, aggregator=collate,
                                 num_threads=threads, buffer_size=2)

    def epoch(self):
        return iter(self.loader)

    def close(self) -> None:
        self.loader = None


# --- Ray Data ----------------------------------------------------------------------

class RayData:
    """A local Ray (``num_cpus`` = k, no dashboard) started by the row and shut down by close()."""

    def __init__(self, data: str, batch: int, size: int, threads: int, seed: int = 0, ids: bool = True) -> None:
        import logging

        import numpy as np
        import ray
        from ray.data.collate_fn import NumpyBatchCollateFn

        class Collate(NumpyBatchCollateFn):
            """Ray's numpy batch as torch tensors without a copy; the paths stay strings (its default collate
            makes every column a tensor)."""

            def __call__(self, rows: dict):
                import torch

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # read-only arrays: nothing writes to them
                    return torch.from_numpy(rows["image"]), torch.from_numpy(rows["label"]), list(rows["path"])

        self.collate = Collate()
        files = image_files(data)
        self.size = len(files)
        labels = {path: label for path, label in files}
        ray.init(num_cpus=threads, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 logging_level="warning")
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # its per-epoch notices

        def transform(rows: dict) -> dict:
            import torch
            from torchvision.transforms import v2

            torch.set_num_threads(1)  # one Ray task, one CPU
            t = v2.Compose([v2.RandomResizedCrop(size, scale=SCALE, ratio=RATIO, antialias=True),
                            v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
            images = np.stack([t(torch.from_numpy(image).permute(2, 0, 1)).numpy() for image in rows["image"]])
            return {"image": images, "label": np.array([labels[p] for p in rows["path"]]), "path": rows["path"]}

        self.ray = ray
        self.dataset = ray.data.read_images([p for p, _ in files], mode="RGB", include_paths=True,
                                            shuffle="files").map_batches(transform, batch_size=batch,
                                                                         batch_format="numpy")
        self.batch = batch

    def epoch(self):
        return iter(self.dataset.iter_torch_batches(batch_size=self.batch, prefetch_batches=2,
                                                    collate_fn=self.collate))

    def close(self) -> None:
        self.dataset = None
        self.ray.shutdown()


LOADERS = {"dali_cpu": DaliCpu, "spdl": Spdl, "ray_data": RayData}


# --- the rows ----------------------------------------------------------------------

def _reset_peak_rss() -> None:
    """The trainer's peak RSS from now on (Linux >= 4.0): an in-process loader's memory is the trainer's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_peer(name: str, args, data: str, batches: int, files, reference: dict) -> dict:
    """The data check on one epoch, then the timed passes, on one loader (Ray starts once); DALI's check runs on a
    twin pipeline that also outputs the file names. CPU is the whole process tree's: the trainer, with the threads
    of DALI and SPDL in it, and every process it started (Ray's GCS, raylet and workers). Raises DataCheckError."""
    import torch

    from bench.offload.data_check import check_epoch, compare_colours
    from bench.offload.offload_common import descendants, proc_peak_mib, timed_passes

    threads = torch.get_num_threads()
    if name == "spdl":
        torch.set_num_threads(1)  # its aggregator's normalise is one of its k threads, not a second pool
    make = LOADERS[name]
    loader = make(data, args.batch, args.size, args.workers, ids=True)
    try:
        colours = check_epoch(loader.epoch(), files, args.batch, args.size, MEAN, STD)
        gap = compare_colours(colours, reference)
        if name == "dali_cpu":
            loader.close()
            loader = make(data, args.batch, args.size, args.workers, ids=False)
        _reset_peak_rss()
        row = timed_passes(loader.epoch, args.batch, batches, args.reps, lambda: descendants(os.getpid()), desc=name)
        helpers = descendants(os.getpid())
        row["peak_rss_mib"] = proc_peak_mib(os.getpid()) + sum(proc_peak_mib(p) for p in helpers)
        row["processes"] = 1 + len(helpers)
        row["colour_gap"] = gap
        return row
    finally:
        loader.close()
        torch.set_num_threads(threads)
