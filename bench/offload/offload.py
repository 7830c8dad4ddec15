"""python -m bench.offload: the ImageNet-like input pipeline, local DataLoader against dlop's offload.

The pipeline: JPEG decode, RandomResizedCrop 224, horizontal flip, normalise,
batches of 64, on the built-in synthetic dataset (``dlop make-dataset``; made
once into a cache folder when ``--data`` is not given). Rows, same run, same k:

* ``dataloader``: torch DataLoader over torchvision's ImageFolder with
  torchvision's transforms, k worker processes;
* ``native``: dlop's native pipeline on local dlop-offloader daemons with k
  threads in all, batches through ``dlop.data.OffloadLoader``;
* ``python``: dlop's generic Python path (the same torchvision dataset run by
  the offloaders' worker processes), where this dlop has it;
* the loaders users pick instead, each in its fastest documented form
  (``bench.offload.peers``; ``python scripts/install_peers.py``): ``dali_cpu`` (NVIDIA
  DALI's CPU pipeline with the fused crop decode), ``spdl`` (SPDL's thread
  pipeline over FFmpeg), ``ray_data`` (Ray Data on a local Ray started for the
  row). A peer that is not installed says so in its row.

Before it is timed, every row passes a data check on one epoch
(``bench.offload.data_check``): shapes, dtype and value range, every sample once
with its class's label, each class's mean colour close to the DataLoader's.
A row that fails it is reported with the reason, not timed.

For each: samples/s; CPU-seconds per sample of every process doing the work
(the trainer and its DataLoader workers, the trainer and the daemons with
their children, or the trainer and every process it started: Ray's GCS,
raylet and workers); the trainer's own CPU-seconds per sample (what the GPU
host pays; DALI and SPDL work in it); peak RSS of the workers or daemons, or,
for the peers, of the trainer and the processes it started. ``--scaling``
adds native rows with 1 and 2 daemons (k threads each). Medians over
``--reps`` timed passes, each after one untimed warm-up batch.

``--kind video`` and ``--kind audio`` run the clip and audio pipelines against
the tools users load them with today (``bench.offload.offload_media``), SPDL and
DALI among them (``bench.offload.peers_media``). The JSON header records the
load average before and after the run and the machine's memcpy rate.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import sys
import warnings
from pathlib import Path

from bench.common import _common
from bench.offload.data_check import DataCheckError, check_epoch, compare_colours
from bench.offload.offload_common import (Daemons, descendants, finish, memcpy_gb_s, offloader_path, parse_cpus,
                                  proc_peak_mib, timed_passes)
from bench.offload.peers import IMAGE_PEERS, image_files, missing, run_peer

PIPELINES = ("dataloader", "native", "python", *IMAGE_PEERS)

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.offload", description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=("image", "video", "audio"), default="image",
                   help="video and audio: see python -m bench.offload --kind video --help")
    p.add_argument("--data", help="an image folder (class per sub-folder); default: the built-in dataset, made once")
    p.add_argument("--images", type=int, default=640, help="images of the built-in dataset (10 classes)")
    p.add_argument("--image-size", default="500x375",
                   help="WxH of the built-in dataset's images (ImageNet's average); 'mixed': 300-640 wide")
    p.add_argument("-k", "--workers", type=int, default=2, help="DataLoader workers = offloader threads = Python workers")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's output size")
    p.add_argument("--batches", type=int, default=0, help="timed batches per pass (0: one epoch less the warm-up batch)")
    p.add_argument("-r", "--reps", type=int, default=3, help="timed passes per row (the median is reported)")
    p.add_argument("--pipelines", default=",".join(PIPELINES), help=f"comma-separated, of {', '.join(PIPELINES)}")
    p.add_argument("--scaling", action="store_true", help="also native with 1 and with 2 offloaders (k threads each)")
    p.add_argument("--trainer-cpus", help="pin the trainer (and its DataLoader workers) to these cores, e.g. 0,1")
    p.add_argument("--offloader-cpus", help="pin the offloaders to these cores, e.g. 2-15")
    p.add_argument("--offloader", help="the dlop-offloader executable (default: next to this Python, or DLOP_OFFLOADER)")
    p.add_argument("--json", help="write the rows here")
    return p.parse_args(argv)


def builtin_dataset(images: int, size: str = "mixed") -> str:
    from dlop.data.make_dataset import main as make_dataset

    per_class = max(1, images // 10)
    suffix = "" if size == "mixed" else f"-{size}"
    root = (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dlop"
            / f"bench-offload-10x{per_class}{suffix}")
    if not (root / ".complete").exists():
        shutil.rmtree(root, ignore_errors=True)
        sized = [] if size == "mixed" else ["--size", size]
        if make_dataset([str(root), "--classes", "10", "--per-class", str(per_class), "--seed", "0", *sized]) != 0:
            raise RuntimeError(f"dlop make-dataset {root} failed")
        (root / ".complete").touch()
    return str(root)


# --- the pipelines ------------------------------------------------------

def torchvision_transform(size: int):
    from dlop._torchvision_compat import import_torchvision

    T = import_torchvision().transforms
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def native_spec(size: int) -> dict:
    return {"ops": [{"op": "random_resized_crop", "size": size}, {"op": "hflip", "p": 0.5},
                    {"op": "normalize", "mean": MEAN, "std": STD}], "output": "float32"}


def run_dataloader(args, data: str, batches: int) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from dlop._torchvision_compat import import_torchvision

    dataset = import_torchvision().datasets.ImageFolder(data, transform=torchvision_transform(args.size))
    loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0, prefetch_factor=2 if args.workers else None,
                        generator=torch.Generator().manual_seed(0))
    row = timed_passes(lambda: iter(loader), args.batch, batches, args.reps, lambda: descendants(os.getpid()),
                       desc="dataloader")
    row["peak_rss_mib"] = max([proc_peak_mib(p) for p in descendants(os.getpid())] or [0.0])
    del loader  # persistent workers end here
    return row


def run_offloaded(args, data: str, batches: int, daemons: int, threads: int, python_path: bool,
                  reference: dict | None = None) -> dict:
    """With the DataLoader's per-class colours as `reference`, the data check first (raises DataCheckError)."""
    from dlop.data import OffloadLoader

    token = os.urandom(16).hex()
    pool = Daemons(args.offloader_exe, daemons, threads, parse_cpus(args.offloader_cpus), token)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a local fallback would measure the wrong thing
            if python_path:
                from dlop._torchvision_compat import import_torchvision

                dataset = import_torchvision().datasets.ImageFolder(data, transform=torchvision_transform(args.size))
                loader = OffloadLoader(dataset=dataset, batch_size=args.batch, shuffle=True, seed=0,
                                       offloaders=pool.addresses, token=token)
            else:
                loader = OffloadLoader(data, native_spec(args.size), args.batch, shuffle=True, seed=0,
                                       offloaders=pool.addresses, token=token)
        if reference is not None:
            check = compare_colours(check_offloaded(loader, args, image_files(data)), reference)
        epochs = iter(range(1 << 30))

        def one_epoch():
            loader.set_epoch(next(epochs))
            return iter(loader)

        row = timed_passes(one_epoch, args.batch, batches, args.reps, pool.pids,
                           desc=f"{'python' if python_path else 'native'} x {daemons}")
        row["peak_rss_mib"] = sum(proc_peak_mib(p) for p in pool.pids())
        if reference is not None:
            row["colour_gap"] = check
        return row
    finally:
        pool.close()


def python_path_missing() -> str | None:
    from dlop.data import OffloadLoader

    if "dataset" not in inspect.signature(OffloadLoader).parameters:
        return "this dlop's OffloadLoader has no generic Python path (dataset=...) yet"
    return None


# --- the data check -----------------------------------------------------

class _Named:
    """A dataset whose samples also carry their index, so the check can tell which samples a batch holds."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        return (*self.dataset[i], i)


def check_dataloader(args, data: str, files) -> dict:
    """The DataLoader's epoch through the data check: its per-class colours are the reference of the others."""
    import torch
    from torch.utils.data import DataLoader

    from dlop._torchvision_compat import import_torchvision

    dataset = import_torchvision().datasets.ImageFolder(data, transform=torchvision_transform(args.size))
    loader = DataLoader(_Named(dataset), batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        generator=torch.Generator().manual_seed(1))
    return check_epoch(iter(loader), files, args.batch, args.size, MEAN, STD)


def check_offloaded(loader, args, files) -> dict:
    """An OffloadLoader's epoch through the data check, its samples named by the epoch's plan."""
    loader.set_epoch(1 << 20)  # an epoch the timed passes do not repeat
    plan = loader._plan().batches(1 << 20)
    return check_epoch(((x, y, ids) for (x, y), ids in zip(loader, plan, strict=True)), files, args.batch,
                       args.size, MEAN, STD)


# --- the report ---------------------------------------------------------

def print_ratios(rows: list[dict], memcpy: float | None = None) -> None:
    by = {(r["pipeline"], r.get("offloaders", 0)): r for r in rows if "unavailable" not in r}
    base = by.get(("dataloader", 0))
    for name in ("native", "python"):
        r = by.get((name, 1))
        if base is None or r is None:
            continue
        per_core = base["cpu_s_per_sample"] / r["cpu_s_per_sample"]
        trainer = r["trainer_cpu_s_per_sample"] / base["trainer_cpu_s_per_sample"]
        target = "target >= 1.5" if name == "native" else "no target: the generic path trades CPU for generality"
        print(f"# {name} vs dataloader: {per_core:.2f}x samples per CPU-second ({target}); "
              f"trainer CPU per sample {trainer:.3f} of the DataLoader's (target <= 0.1); "
              f"throughput {r['samples_per_s'] / base['samples_per_s']:.2f}x")
    gaps = [f"{r['pipeline']} {r['colour_gap']:.3f}" for r in rows if "colour_gap" in r]
    if gaps:
        print(f"# data check passed; largest gap of a class's mean colour from the DataLoader's: {', '.join(gaps)}")
    native = by.get(("native", 1))
    peers = [r for (name, _), r in by.items() if name in IMAGE_PEERS]
    if native is not None and peers:
        best = min(peers, key=lambda r: r["cpu_s_per_sample"])
        ratio = best["cpu_s_per_sample"] / native["cpu_s_per_sample"]
        print(f"# native vs the best peer per CPU-second ({best['pipeline']}): {ratio:.2f}x samples per CPU-second "
              f"(target >= 1.5: {'met' if ratio >= 1.5 else 'NOT met'}); throughput "
              f"{native['samples_per_s'] / best['samples_per_s']:.2f}x")
        in_process = [r for r in peers if r["pipeline"] in ("dali_cpu", "spdl")]
        if in_process:
            low = min(in_process, key=lambda r: r["trainer_cpu_s_per_sample"])
            share = native["trainer_cpu_s_per_sample"] / low["trainer_cpu_s_per_sample"]
            print(f"# native trainer CPU per sample {share:.3f} of the lowest in-process peer's ({low['pipeline']}; "
                  f"target <= 0.1: {'met' if share <= 0.1 else 'NOT met'})")
    if native is not None:
        per_cpu = 1 / native["cpu_s_per_sample"]
        rate = f" on a machine whose one-thread memcpy moves {memcpy:.1f} GB/s" if memcpy else ""
        print(f"# native: {per_cpu:.0f} images per CPU-second (target >= 800){rate}")
    one, two = by.get(("native", 1)), by.get(("native", 2))
    if one is not None and two is not None:
        print(f"# scaling: 2 offloaders / 1 offloader = {two['samples_per_s'] / one['samples_per_s']:.2f}x "
              "(target >= 1.8 where each offloader has cores of its own)")


def main(argv=None) -> int:
    kind = argparse.ArgumentParser(add_help=False)
    kind.add_argument("--kind", default="image")
    if kind.parse_known_args(argv)[0].kind in ("video", "audio"):
        from bench.offload import offload_media  # its own options: a parser of its own

        return offload_media.main(argv)
    args = parse_args(argv)
    pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    if unknown := set(pipelines) - set(PIPELINES):
        raise SystemExit(f"unknown pipelines {sorted(unknown)}: choose from {', '.join(PIPELINES)}")
    if cpus := parse_cpus(args.trainer_cpus):
        os.sched_setaffinity(0, cpus)
    data = args.data or builtin_dataset(args.images, args.image_size)
    images = sum(1 for _ in Path(data).glob("*/*"))
    batches = args.batches or max(1, images // args.batch - 1)
    if "native" in pipelines or "python" in pipelines or args.scaling:
        args.offloader_exe = offloader_path(args.offloader)
    header = _common.run_header(benchmark="offload", data=data, images=images, batch=args.batch, size=args.size,
                                workers=args.workers, timed_batches=batches, reps=args.reps,
                                load_before=os.getloadavg(), memcpy_gb_s=memcpy_gb_s())
    print(_common.header_comment(header))
    print(f"# {header['command']}")
    print(f"# {images} images in {data}; batch {args.batch}; RandomResizedCrop {args.size} + flip + normalise; "
          f"k = {args.workers}; {batches} timed batches per pass after 1 warm-up batch, median of {args.reps} passes")
    print(f"# load average {header['load_before'][0]:.2f} at the start; one-thread memcpy "
          f"{header['memcpy_gb_s']:.1f} GB/s")
    print("# cpu s/sample: trainer + its workers (dataloader), trainer + offloaders (native, python), trainer + "
          "the processes it started (peers: Ray's); trainer s/sample: the trainer process alone; per core: samples "
          "per CPU-second; every row passed the data check first (colour gap: the largest of a class's mean colour "
          "from the DataLoader's)")
    offloaded_cores = 2 * args.workers if args.scaling else args.workers
    if _common.cpu_count() < offloaded_cores + 1:
        print(f"# WARNING: {_common.cpu_count()} cores for the trainer and {offloaded_cores} offloader threads: "
              "offloaders share cores with the trainer and each other, so scaling cannot show here")
    files = image_files(data)
    reference = check_dataloader(args, data, files)  # the colours every row's check compares with
    rows = []
    for name in pipelines:
        row = {"pipeline": name, "workers": args.workers}
        try:
            if name == "dataloader":
                row.update(run_dataloader(args, data, batches), colour_gap=0.0)
            elif name == "python" and (why := python_path_missing()):
                row["unavailable"] = why
            elif name in IMAGE_PEERS:
                if why := missing(name):
                    row["unavailable"] = why
                else:
                    row.update(run_peer(name, args, data, batches, files, reference))
            else:
                row.update(run_offloaded(args, data, batches, 1, args.workers, name == "python", reference),
                           offloaders=1)
        except DataCheckError as e:
            row["unavailable"] = f"data check failed: {e}"
        rows.append(row)
    if args.scaling:
        rows.append({"pipeline": "native", "workers": args.workers, "offloaders": 2,
                     **run_offloaded(args, data, batches, 2, args.workers, False)})
        if not any(r["pipeline"] == "native" and r.get("offloaders") == 1 for r in rows):
            rows.insert(-1, {"pipeline": "native", "workers": args.workers, "offloaders": 1,
                             **run_offloaded(args, data, batches, 1, args.workers, False)})
    header["load_after"] = os.getloadavg()
    return finish(args.json, header, rows, lambda rows: print_ratios(rows, header["memcpy_gb_s"]))


if __name__ == "__main__":
    sys.exit(main())
