"""A synthetic ImageNet-like image folder, generated locally (no download).

    dlop make-dataset OUT [--force] [--kind image|video|audio] [--classes N] [--per-class N] [--seed 0]
        [--size WxH] [--quality Q] [--jobs N]                        (images; --size also for video)
        [--seconds S] [--fps F] [--codec mix|h264] [--gop-seconds MIN,MAX] [--kbps K]   (video)

``--kind video`` and ``--kind audio`` write the built-in video and audio
sets instead (dlop.data.make_video, dlop.data.make_audio: real codecs made
with ffmpeg and espeak-ng; 4 classes of 4 clips by default).

``OUT`` must be empty or new: ``--force`` writes into a folder that holds
files already (those of the same names are replaced, the others stay).

writes ``OUT/<class>/<class>_<i>.jpg``: JPEGs of varied sizes around 500x375
(300-640 wide), one folder per class, the layout torchvision's ImageFolder and
dlop's native sources read. Each class has its own palette, gradient direction
and kind of shapes, so a small model can learn them; noise and texture keep
the JPEGs from being trivially compressible (typically 40-90 KB, like
ImageNet's). Pixels depend only on (seed, class, index), so a larger
``--per-class`` adds images without changing the first ones. ``--size WxH``
makes every image that size instead, ``--quality`` fixes the JPEG quality
(default: 80-95, drawn per image), ``--jobs`` writes with that many processes.
"""

from __future__ import annotations

import argparse
import colorsys
import io
import os
import sys
import time

import numpy as np

from dlop.data._sizes import parse_size

SHAPES = ("discs", "boxes", "stripes", "rings")


def _encoder():
    """dlop's own JPEG encoder (libjpeg-turbo) when the extension is built, else Pillow."""
    try:
        from dlop._C import media

        return lambda pixels, quality: media.encode_jpeg(pixels, quality)
    except (ImportError, AttributeError):
        from PIL import Image

        def encode(pixels, quality):
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, "JPEG", quality=quality)
            return buf.getvalue()

        return encode


def _rgb(hue: float, sat: float, val: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(hue % 1.0, sat, val), dtype=np.float32) * 255.0


def make_image(seed: int, cls: int, num_classes: int, index: int, size: tuple[int, int] | None = None) -> np.ndarray:
    """One (H, W, 3) uint8 image of class `cls`; `size` (W, H) fixes its size."""
    rng = np.random.default_rng([seed, cls, index])
    w = int(rng.integers(300, 641))
    h = int(np.clip(round(w * rng.uniform(0.6, 0.95)), 200, 480))
    if size is not None:
        w, h = size
    hue = cls / num_classes
    # Row and column coordinates in [0, 1); 2-D arrays come from broadcasting.
    y = (np.arange(h, dtype=np.float32) / h)[:, None]
    x = (np.arange(w, dtype=np.float32) / w)[None, :]

    # Background: a two-colour gradient whose direction belongs to the class.
    angle = 2 * np.pi * cls / num_classes + rng.normal(0, 0.3)
    t = np.clip(np.float32(np.cos(angle)) * (x - 0.5) + np.float32(np.sin(angle)) * (y - 0.5) + 0.5, 0, 1)[..., None]
    c1 = _rgb(hue + rng.normal(0, 0.03), rng.uniform(0.5, 0.9), rng.uniform(0.6, 1.0))
    c2 = _rgb(hue + 0.5 + rng.normal(0, 0.05), rng.uniform(0.2, 0.6), rng.uniform(0.2, 0.6))
    img = c1 + (c2 - c1) * t

    # Foreground shapes of the class's kind, each drawn inside its bounding box.
    kind = SHAPES[cls % len(SHAPES)]
    for _ in range(int(rng.integers(3, 9))):
        colour = _rgb(hue + rng.normal(0, 0.08) + (cls // len(SHAPES)) * 0.13, rng.uniform(0.4, 1), rng.uniform(0.3, 1))
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.25)
        extent = 2 * r  # in units of the height
        y0, y1 = max(int((cy - extent) * h), 0), min(int((cy + extent) * h) + 1, h)
        x0, x1 = max(int((cx - extent * h / w) * w), 0), min(int((cx + extent * h / w) * w) + 1, w)
        if y0 >= y1 or x0 >= x1:
            continue
        dx, dy = (x[:, x0:x1] - cx) * np.float32(w / h), y[y0:y1] - cy
        if kind == "discs":
            mask = dx * dx + dy * dy < r * r
        elif kind == "boxes":
            mask = (np.abs(dx) < r) & (np.abs(dy) < r * rng.uniform(0.4, 1.6))
        elif kind == "stripes":
            a = rng.normal(cls, 0.2)
            wave = np.sin((np.float32(np.cos(a)) * dx + np.float32(np.sin(a)) * dy) * np.float32(20 + 4 * cls))
            mask = (wave > 0.3) & (dx * dx + dy * dy < 4 * r * r)
        else:
            d2 = dx * dx + dy * dy
            mask = (d2 < r * r) & (d2 > 0.36 * r * r)
        region = img[y0:y1, x0:x1]
        np.copyto(region, region * 0.25 + colour * 0.75, where=mask[..., None])

    # Texture (a product of two waves) and sensor-like noise, drawn at half
    # resolution and doubled: as hard for JPEG as ImageNet's grain, 4x cheaper.
    fx, fy = rng.uniform(2, 12, size=2)
    wave_x = np.sin(2 * np.pi * (fx * x + rng.uniform())).astype(np.float32)
    wave_y = np.sin(2 * np.pi * (fy * y)).astype(np.float32)
    img += (12 * wave_y * wave_x)[..., None]
    noise = rng.standard_normal(((h + 1) // 2, (w + 1) // 2, 3), dtype=np.float32) * 6
    img += noise.repeat(2, axis=0).repeat(2, axis=1)[:h, :w]
    return np.clip(img, 0, 255).astype(np.uint8)


def class_name(cls: int) -> str:
    return f"class_{cls:02d}"


def _write_image(out: str, seed: int, cls: int, classes: int, i: int, size, quality) -> int:
    """Writes image i of class cls beside its name and renames it; its bytes."""
    rng = np.random.default_rng([seed, cls, i, 1])
    data = _encoder()(make_image(seed, cls, classes, i, size), quality or int(rng.integers(80, 96)))
    path = os.path.join(out, class_name(cls), f"{class_name(cls)}_{i:05d}.jpg")
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return len(data)


def make_dataset(out: str | os.PathLike, classes: int = 10, per_class: int = 100, seed: int = 0,
                 progress: bool = False, size: tuple[int, int] | None = None, quality: int | None = None,
                 jobs: int = 1) -> dict:
    """Writes the dataset under `out` (created; existing files of the same names are replaced). `progress`: a
    bar on stderr while stderr is a terminal; `size` (W, H) and `quality` fix those; `jobs` processes write."""
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    if classes < 1 or per_class < 1:
        raise ValueError("classes and per_class must be at least 1")
    if size is not None and min(size) < 16:
        raise ValueError(f"image size {size[0]}x{size[1]}: at least 16x16")
    if quality is not None and not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality {quality}: 1 to 100")
    for cls in range(classes):
        os.makedirs(os.path.join(out, class_name(cls)), exist_ok=True)
    work = [(os.fspath(out), seed, cls, classes, i, size, quality) for cls in range(classes) for i in range(per_class)]
    bar = tqdm(total=len(work), unit="image", desc="make-dataset", disable=None if progress else True,
               file=sys.stderr, dynamic_ncols=True, leave=False)
    total = 0
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            for written in pool.map(_write_image, *zip(*work), chunksize=16):
                total += written
                bar.update()
    else:
        for item in work:
            total += _write_image(*item)
            bar.update()
    bar.close()
    return {"root": os.fspath(out), "classes": classes, "images": classes * per_class, "bytes": total}


def _not_writable(out: str, force: bool) -> str | None:
    """Why make-dataset must not write into `out`, or None: a dataset written over another one would be a
    mix of both that an ImageFolder reads as one."""
    if os.path.exists(out) and not os.path.isdir(out):
        return f"{out} exists and is not a folder"
    if not force and os.path.isdir(out) and any(os.scandir(out)):
        return f"{out} is not empty: choose a new folder, or pass --force to write into it anyway"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlop make-dataset", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to write (created; it must be empty unless --force)")
    parser.add_argument("--force", action="store_true",
                        help="write into a folder that is not empty (files of the same names are replaced, the "
                             "others stay)")
    parser.add_argument("--kind", choices=("image", "video", "audio"), default="image")
    parser.add_argument("--classes", type=int, help="default: 10 for images, 4 for video and audio")
    parser.add_argument("--per-class", type=int, help="default: 100 images, 4 clips")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", help="WxH of every image or clip, e.g. 500x375 (default: images 300-640 wide, "
                                       "clips a mix of small sizes)")
    parser.add_argument("--quality", type=int, help="images: JPEG quality 1-100 (default: 80-95 per image)")
    parser.add_argument("--jobs", type=int, default=1, help="processes writing images or clips")
    parser.add_argument("--seconds", type=float, help="video: each clip's length (default: 1-2 s)")
    parser.add_argument("--fps", type=int, help="video: frame rate (default: 24, 25 or 30 per clip)")
    parser.add_argument("--codec", choices=("mix", "h264"), default="mix",
                        help="video: a mix of codecs and containers, or H.264 in mp4 with two B-frames")
    parser.add_argument("--gop-seconds", help="video: MIN,MAX seconds between keyframes, drawn per clip")
    parser.add_argument("--kbps", type=int, help="video: a cap on the bit rate, kbit/s")
    args = parser.parse_args(argv)
    try:
        size = parse_size(args.size)
        gop = None if args.gop_seconds is None else tuple(float(v) for v in args.gop_seconds.split(","))
        if gop is not None and (len(gop) != 2 or not 0 < gop[0] <= gop[1]):
            raise ValueError(f"--gop-seconds {args.gop_seconds!r}: give MIN,MAX with 0 < MIN <= MAX")
    except ValueError as e:
        parser.error(str(e))
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    why = _not_writable(args.out, args.force)
    if why:
        parser.error(why)
    video_only = [n for n in ("seconds", "fps", "gop_seconds", "kbps") if getattr(args, n) is not None]
    if args.kind != "video" and (video_only or args.codec != "mix"):
        parser.error("--seconds, --fps, --codec, --gop-seconds and --kbps are options of --kind video")
    if args.kind != "image" and args.quality is not None:
        parser.error("--quality is an option of --kind image")
    start = time.perf_counter()
    if args.kind == "audio":
        from dlop.data.make_audio import make_audio_dataset

        if size is not None:
            parser.error("--size is an option of --kind image and video")
        paths = make_audio_dataset(args.out, args.classes or 4, args.per_class or 4, seed=args.seed)
        print(f"{len(paths)} audio clips in {args.out} ({time.perf_counter() - start:.1f} s)")
        return 0
    if args.kind == "video":
        from dlop.data.make_video import make_video_dataset

        paths = make_video_dataset(args.out, args.classes or 4, args.per_class or 4, seed=args.seed, size=size,
                                   seconds=args.seconds, fps=args.fps, codec=args.codec, gop_seconds=gop,
                                   jobs=args.jobs, kbps=args.kbps)
        print(f"{len(paths)} video clips in {args.out} ({time.perf_counter() - start:.1f} s)")
        return 0
    args.classes, args.per_class = args.classes or 10, args.per_class or 100
    stats = make_dataset(args.out, args.classes, args.per_class, args.seed, progress=True, size=size,
                         quality=args.quality, jobs=args.jobs)
    print(
        f"{stats['images']} images in {stats['classes']} classes, {stats['bytes'] / 1e6:.1f} MB, "
        f"in {args.out} ({time.perf_counter() - start:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
