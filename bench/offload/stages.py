"""python -m bench.offload.stages: where an image's CPU goes, stage by stage, in dlop's native pipeline and
in DALI's CPU pipeline, on the same JPEGs, one thread each.

dlop: each stage timed alone through ``dlop._C``'s ops on every image (read the file, decode it whole, crop and
resize, flip, normalise into float CHW, collate into a batch), then the whole batch as the daemon's batch maker
runs it in-process (``BatchMaker.run_batch``: its fused decode of the crop's region and its own collate), then
through a daemon and ``OffloadLoader`` (the transfer and the trainer's side added). DALI: pipelines that stop
after each operator (reader; + full decode; + the fused crop decode; + resize; + crop_mirror_normalize; + its
torch iterator), each one's CPU per image less the one before it. CPU-seconds per image, medians of ``--reps``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _per_image(fn, count: int, reps: int) -> float:
    runs = []
    for _ in range(reps):
        start = _cpu()
        fn()
        runs.append((_cpu() - start) / count)
    return statistics.median(runs)


def native_stages(files, size: int, batch: int, reps: int, offloader: str | None) -> dict:
    import numpy as np

    from dlop import _C

    ops = _C.media if hasattr(_C, "media") else _C.offload
    paths = [p for p, _ in files]
    blobs = [open(p, "rb").read() for p in paths]
    images = [ops.decode(b) for b in blobs]
    boxes = [ops.random_resized_crop_box(im.shape[0], im.shape[1], 0, 0, i) for i, im in enumerate(images)]
    crops = [ops.resized_crop(im, *box, (size, size)) for im, box in zip(images, boxes)]
    chw = [ops.to_chw(c, "float32", list(MEAN), list(STD)) for c in crops]
    n = len(files)
    out = {
        "read": _per_image(lambda: [open(p, "rb").read() for p in paths], n, reps),
        "decode (whole image)": _per_image(lambda: [ops.decode(b) for b in blobs], n, reps),
        "crop + resize": _per_image(lambda: [ops.resized_crop(im, *box, (size, size))
                                             for im, box in zip(images, boxes)], n, reps),
        "flip": _per_image(lambda: [ops.hflip(c) for c in crops], n, reps),
        "normalise (float CHW)": _per_image(lambda: [ops.to_chw(c, "float32", list(MEAN), list(STD)) for c in crops],
                                            n, reps),
        "collate": _per_image(lambda: [np.stack(chw[i:i + batch]) for i in range(0, n, batch)], n, reps),
    }
    spec = json.dumps({"ops": [{"op": "random_resized_crop", "size": size}, {"op": "hflip", "p": 0.5},
                               {"op": "normalize", "mean": list(MEAN), "std": list(STD)}], "output": "float32"})
    source = ops.open_source(os.path.dirname(os.path.dirname(paths[0])), "image")
    maker = ops.BatchMaker(spec)
    order = list(range(len(source)))
    out["whole batch in-process (fused)"] = _per_image(
        lambda: [maker.run_batch(source, order[i:i + batch], seed=0, epoch=0, threads=1)
                 for i in range(0, len(order), batch)], len(order), reps)
    if offloader:
        out["whole batch through a daemon + OffloadLoader"] = _through_daemon(offloader, spec, source, batch, reps)
    return out


def _through_daemon(exe: str, spec: str, source, batch: int, reps: int) -> float:
    from dlop.data import OffloadLoader

    from bench.offload.offload_common import Daemons

    token = os.urandom(16).hex()
    pool = Daemons(exe, 1, 1, None, token)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            root = os.path.dirname(os.path.dirname(source.name(0)))
            loader = OffloadLoader(root, json.loads(spec), batch, shuffle=True, seed=0, offloaders=pool.addresses,
                                   token=token)
        from bench.offload.offload_common import proc_cpu

        runs = []
        for epoch in range(reps):
            loader.set_epoch(epoch)
            before = sum(proc_cpu(p) for p in pool.pids()) + _cpu()
            count = sum(x.shape[0] for x, _ in loader)
            runs.append((sum(proc_cpu(p) for p in pool.pids()) + _cpu() - before) / count)
        return statistics.median(runs)
    finally:
        pool.close()


def dali_stages(root: str, size: int, batch: int, reps: int, count: int) -> dict:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
    from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

    def make(stop: str):
        @pipeline_def
        def pipeline():
            jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, pad_last_batch=True, name="Reader")
            if stop == "read":
                return jpegs, labels
            if stop == "decode (whole image)":
                return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB), labels
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                   random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                                   num_attempts=10)
            if stop == "fused crop decode":
                return images, labels
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_TRIANGULAR)
            if stop == "resize":
                return images, labels
            return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                            mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                            mirror=fn.random.coin_flip(probability=0.5)), labels

        pipe = pipeline(batch_size=batch, num_threads=1, device_id=None, seed=0)
        pipe.build()
        return pipe

    out, previous = {}, 0.0
    steps = ("read", "decode (whole image)", "fused crop decode", "resize", "flip + normalise (float CHW)",
             "iterator into torch (collate)")
    iterations = -(-count // batch)
    for stop in steps:
        pipe = make(stop)
        if stop == "iterator into torch (collate)":
            it = DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                                            auto_reset=True)
            cost = _per_image(lambda: [b for b in it], count, reps)
        else:
            cost = _per_image(lambda: [pipe.run() for _ in range(iterations)], count, reps)
        base = 0.0 if stop in ("read", "decode (whole image)") else previous
        if stop == "decode (whole image)":
            out[stop] = cost - out["read"]
        else:
            out[stop] = cost - base
            previous = cost
        out[f"total through {stop}"] = cost
        del pipe
    return out


def main(argv=None) -> int:
    from bench.offload.offload_common import offloader_path
    from bench.offload.peers import image_files, missing

    p = argparse.ArgumentParser(prog="python -m bench.offload.stages", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="an image folder (class per sub-folder)")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("-r", "--reps", type=int, default=3)
    p.add_argument("--offloader", help="the dlop-offloader executable (default: next to this Python)")
    p.add_argument("--json", help="write the stages here")
    args = p.parse_args(argv)
    files = image_files(args.data)
    result = {"images": len(files), "load_before": os.getloadavg(),
              "native": native_stages(files, args.size, args.batch, args.reps, offloader_path(args.offloader))}
    result["dali_cpu"] = ({"unavailable": why} if (why := missing("dali_cpu")) else
                          dali_stages(args.data, args.size, args.batch, args.reps, len(files)))
    result["load_after"] = os.getloadavg()
    for name in ("native", "dali_cpu"):
        print(f"# {name}: CPU ms per image, one thread")
        for stage, cost in result[name].items():
            print(f"{stage:>48} {cost * 1e3:8.3f}" if isinstance(cost, float) else f"{stage:>48} {cost}")
    print(f"# load average {result['load_before'][0]:.2f} before, {result['load_after'][0]:.2f} after")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
