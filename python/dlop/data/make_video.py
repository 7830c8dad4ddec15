"""A synthetic video folder, made locally with the ffmpeg command-line tool.

    python -m dlop.data.make_video OUT [--classes 4] [--clips-per-class 4] [--seed 0]
        [--size WxH] [--seconds S] [--fps F] [--codec mix|h264] [--gop-seconds MIN,MAX] [--jobs N]

writes ``OUT/<class>/clip<i>.<mp4|mkv|webm>``, the class-folder layout dlop's
video sources read. Clips are 1-2 s of ffmpeg's moving test sources (testsrc2,
mandelbrot, SMPTE bars and the game of life, panned by a moving crop), tinted
by class, in a rotating mix of codecs and containers: H.264 in mp4 and mkv,
H.265 in mkv, VP9 in webm (at an odd width), with keyframe intervals of 16, 24, 48
or 250 frames and two B-frames where the codec has them; one clip in seven has
a variable frame rate. Clip i of class c depends only on (seed, c, i), and
each takes well under a second to make.

The options make training-sized clips instead: ``--size`` (every clip that
size), ``--seconds``, ``--fps``, ``--codec h264`` (H.264 in mp4 with two
B-frames, constant frame rate, for every clip) and ``--gop-seconds MIN,MAX``
(seconds between keyframes, drawn per clip), ``--kbps`` (a cap on the bit
rate); ``--jobs`` encodes that many clips at once.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from dlop.data._sizes import parse_size

# (encoder arguments, container extension, ffmpeg muxer); a clip's index picks one.
_CODECS = (
    (["-c:v", "libx264", "-preset", "veryfast", "-bf", "2", "-pix_fmt", "yuv420p"], "mp4", "mp4"),
    (["-c:v", "libx265", "-preset", "veryfast", "-pix_fmt", "yuv420p"], "mkv", "matroska"),
    (["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-pix_fmt", "yuv420p"], "webm", "webm"),
    (["-c:v", "libx264", "-preset", "veryfast", "-bf", "2", "-pix_fmt", "yuv420p"], "mkv", "matroska"),
)


def _source(kind: str, width: int, height: int, fps: int, rng: random.Random) -> str:
    """A lavfi source twice the clip's size, for the crop to pan over."""
    size = f"{2 * width}x{2 * height}"
    if kind == "mandelbrot":
        return f"mandelbrot=size={size}:rate={fps}:maxiter=64:start_scale={rng.uniform(2.0, 4.0):.3f}"
    if kind == "life":
        return f"life=size={size}:rate={fps}:seed={rng.randrange(1 << 31)}:ratio=0.4:mold=8"
    return f"{kind}=size={size}:rate={fps}"


def _clip_command(path: Path, muxer: str, codec: Sequence[str], cls: int, num_classes: int, rng: random.Random,
                  odd: bool, vfr: bool, size=None, seconds=None, fps=None, gop_seconds=None,
                  kbps=None) -> list[str]:
    kind = rng.choice(("testsrc2", "mandelbrot", "smptebars", "life"))
    fps = fps or rng.choice((24, 25, 30))
    width, height = (161, 121) if odd else rng.choice(((160, 120), (192, 144), (128, 96)))
    width, height = size or (width, height)
    seconds = seconds or rng.uniform(1.0, 2.0)
    gop = rng.choice((16, 24, 48, 250))
    if gop_seconds:
        gop = max(1, round(fps * rng.uniform(*gop_seconds)))
    vx, vy = rng.uniform(5, 40), rng.uniform(5, 30)
    # RGB first: a crop of a 4:2:0 picture would round its size down to even.
    filters = [
        "format=rgb24",
        f"crop={width}:{height}:x='mod(t*{vx:.2f},iw-ow)':y='mod(t*{vy:.2f},ih-oh)'",
        f"hue=h={360 * cls / num_classes:.1f}",
    ]
    timing: list[str] = []
    if vfr:
        # Frame times on a millisecond clock: every fifth frame late by a class- and clip-dependent amount.
        late = rng.randint(5, 15)
        filters += ["settb=1/1000", f"setpts='(N*{1000 // fps}+if(mod(N\\,5)\\,0\\,{late}))/1000/TB'"]
        timing = ["-fps_mode", "vfr", "-enc_time_base", "1/1000"]
    gop_args = ["-g", str(gop)]
    if kbps:  # a cap on the bit rate: noisy sources (the game of life) would otherwise take megabits
        gop_args += ["-maxrate", f"{kbps}k", "-bufsize", f"{2 * kbps}k"]
    if codec[1] == "libx265":
        gop_args = ["-x265-params", f"log-level=error:keyint={gop}:bframes=2"]
    return ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
            _source(kind, width, height, fps, rng), "-t", f"{seconds:.2f}", "-vf", ",".join(filters),
            *timing, *codec, *gop_args, "-an", "-f", muxer, str(path)]


def make_video_dataset(root: str | os.PathLike, classes: int | Sequence[str] = 4, clips_per_class: int = 4,
                       seed: int = 0, size: tuple[int, int] | None = None, seconds: float | None = None,
                       fps: int | None = None, codec: str = "mix", gop_seconds: tuple[float, float] | None = None,
                       jobs: int = 1, kbps: int | None = None) -> list[Path]:
    """Writes ``root/<class>/clip<i>.<ext>`` for each class (a count, named class0, class1, ...; or names) and
    returns the paths written. Each file is written beside its final name and renamed, so an interrupted run leaves
    no partial clip under a clip's name. `size` (W, H), `seconds`, `fps`, `codec` ("mix" or "h264") and
    `gop_seconds` (MIN, MAX) as the module's docstring says; `jobs` ffmpeg processes at once; `kbps` caps the
    bit rate (kbit/s)."""
    from concurrent.futures import ThreadPoolExecutor

    if shutil.which("ffmpeg") is None:
        raise RuntimeError("make_video_dataset needs the ffmpeg command-line tool on PATH")
    names = [f"class{i}" for i in range(classes)] if isinstance(classes, int) else list(classes)
    if not names or clips_per_class < 1:
        raise ValueError("make_video_dataset: need at least one class and one clip per class")
    if codec not in ("mix", "h264"):
        raise ValueError(f"make_video_dataset: codec {codec!r} is mix or h264")
    if (size is not None and min(size) < 16) or (seconds is not None and seconds <= 0) or (fps is not None and fps < 1):
        raise ValueError(f"make_video_dataset: size {size}, seconds {seconds}, fps {fps}: need at least 16x16, "
                         "a positive length and frame rate")

    def one(cls: int, name: str, i: int) -> Path:
        folder = Path(root) / name
        rng = random.Random(f"{seed}/{cls}/{i}")
        encoder, ext, muxer = _CODECS[0 if codec == "h264" else (cls + i) % len(_CODECS)]
        path = folder / f"clip{i}.{ext}"
        partial = folder / f".clip{i}.{ext}.partial"
        odd = encoder[1] == "libvpx-vp9" and size is None
        vfr = codec == "mix" and (cls * clips_per_class + i) % 7 == 6
        command = _clip_command(partial, muxer, encoder, cls, len(names), rng, odd=odd, vfr=vfr, size=size,
                                seconds=seconds, fps=fps, gop_seconds=gop_seconds, kbps=kbps)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"ffmpeg failed making {path}: {done.stderr.strip()}")
        partial.replace(path)
        return path

    for name in names:
        (Path(root) / name).mkdir(parents=True, exist_ok=True)
    todo = [(cls, name, i) for cls, name in enumerate(names) for i in range(clips_per_class)]
    with ThreadPoolExecutor(max(1, jobs)) as pool:  # each clip is an ffmpeg process of one thread
        return list(pool.map(lambda item: one(*item), todo))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--clips-per-class", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", help="WxH of every clip, e.g. 480x270")
    parser.add_argument("--seconds", type=float, help="each clip's length")
    parser.add_argument("--fps", type=int, help="frame rate")
    parser.add_argument("--codec", choices=("mix", "h264"), default="mix")
    parser.add_argument("--gop-seconds", help="MIN,MAX seconds between keyframes")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--kbps", type=int, help="a cap on the bit rate, kbit/s")
    args = parser.parse_args(argv)
    try:
        size = parse_size(args.size)
        gop = None if args.gop_seconds is None else tuple(float(v) for v in args.gop_seconds.split(","))
    except ValueError as e:
        parser.error(str(e))
    paths = make_video_dataset(args.out, args.classes, args.clips_per_class, args.seed, size=size,
                               seconds=args.seconds, fps=args.fps, codec=args.codec, gop_seconds=gop, jobs=args.jobs,
                               kbps=args.kbps)
    print(f"{len(paths)} clips in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
