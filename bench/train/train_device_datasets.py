"""The built-in data of ``python -m bench.train --device DEV``, made once into the cache (``dlop make-dataset``).

* image: ImageNet-sized JPEGs (``--image-size``, 500x375 by default, quality 90), 10 classes;
* video: H.264 clips (``--clip-size`` 480x270, ``--clip-seconds`` 10, 30 fps, two B-frames, a keyframe every
  2-10 s), 8 classes; the benchmark writes their Charades-like manifest;
* audio: the built-in audio set (speech and tones, FLAC, Opus and other formats, 1-4 s), 4 classes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

DEFAULT_SAMPLES = {"image": 5000, "video": 96, "audio": 64}
CLASSES = {"image": 10, "video": 8, "audio": 4}


def cache(name: str) -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dlop" / name


def builtin(args) -> str:
    """The folder for args.kind with args' sizes, made beside its final name on first use."""
    from dlop.data.make_dataset import main as make_dataset

    kind, classes = args.kind, CLASSES[args.kind]
    per_class = max(1, -(-(args.samples or DEFAULT_SAMPLES[kind]) // classes))
    options = ["--kind", kind, "--classes", str(classes), "--per-class", str(per_class), "--jobs",
               str(len(os.sched_getaffinity(0)))]
    if kind == "image":
        options += ["--size", args.image_size, "--quality", "90"]
        name = f"train-device-image-{classes}x{per_class}-{args.image_size}"
    elif kind == "video":
        options += ["--size", args.clip_size, "--seconds", f"{args.clip_seconds:g}", "--codec", "h264",
                    "--gop-seconds", "2,10", "--kbps", "300"]
        name = f"train-device-video-{classes}x{per_class}-{args.clip_size}-{args.clip_seconds:g}s"
    else:
        name = f"train-device-audio-{classes}x{per_class}"
    root = cache(name)
    if not (root / ".complete").exists():
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        if make_dataset([str(partial), *options]) != 0:
            raise SystemExit(f"dlop make-dataset {partial} {' '.join(options)} failed")
        (partial / ".complete").touch()
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
    return str(root)
