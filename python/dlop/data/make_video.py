"""A synthetic video folder, made locally with the ffmpeg command-line tool.

    python -m dlop.data.make_video OUT [--classes 4] [--clips-per-class 4] [--seed 0]

writes ``OUT/<class>/clip<i>.<mp4|mkv|webm>``, the class-folder layout dlop's
video sources read. Clips are 1-2 s of ffmpeg's moving test sources (testsrc2,
mandelbrot, SMPTE bars and the game of life, panned by a moving crop), tinted
by class, in a rotating mix of codecs and containers: H.264 in mp4 and mkv,
H.265 in mkv, VP9 in webm (at an odd width), with keyframe intervals of 16, 24, 48
or 250 frames and two B-frames where the codec has them; one clip in seven has
a variable frame rate. Clip i of class c depends only on (seed, c, i), and
each takes well under a second to make.
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
                  odd: bool, vfr: bool) -> list[str]:
    kind = rng.choice(("testsrc2", "mandelbrot", "smptebars", "life"))
    fps = rng.choice((24, 25, 30))
    width, height = (161, 121) if odd else rng.choice(((160, 120), (192, 144), (128, 96)))
    seconds = rng.uniform(1.0, 2.0)
    gop = rng.choice((16, 24, 48, 250))
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
    if codec[1] == "libx265":
        gop_args = ["-x265-params", f"log-level=error:keyint={gop}:bframes=2"]
    return ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
            _source(kind, width, height, fps, rng), "-t", f"{seconds:.2f}", "-vf", ",".join(filters),
            *timing, *codec, *gop_args, "-an", "-f", muxer, str(path)]


def make_video_dataset(root: str | os.PathLike, classes: int | Sequence[str] = 4, clips_per_class: int = 4,
                       seed: int = 0) -> list[Path]:
    """Writes ``root/<class>/clip<i>.<ext>`` for each class (a count, named class0, class1, ...; or names) and
    returns the paths written. Each file is written beside its final name and renamed, so an interrupted run leaves
    no partial clip under a clip's name."""
    if shutil.which("ffmpeg") is None:
        raise RuntimeError("make_video_dataset needs the ffmpeg command-line tool on PATH")
    names = [f"class{i}" for i in range(classes)] if isinstance(classes, int) else list(classes)
    if not names or clips_per_class < 1:
        raise ValueError("make_video_dataset: need at least one class and one clip per class")
    written = []
    for cls, name in enumerate(names):
        folder = Path(root) / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(clips_per_class):
            rng = random.Random(f"{seed}/{cls}/{i}")
            codec, ext, muxer = _CODECS[(cls + i) % len(_CODECS)]
            path = folder / f"clip{i}.{ext}"
            partial = folder / f".clip{i}.{ext}.partial"
            command = _clip_command(partial, muxer, codec, cls, len(names), rng, odd=codec[1] == "libvpx-vp9",
                                    vfr=(cls * clips_per_class + i) % 7 == 6)
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                raise RuntimeError(f"ffmpeg failed making {path}: {done.stderr.strip()}")
            partial.replace(path)
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--clips-per-class", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = make_video_dataset(args.out, args.classes, args.clips_per_class, args.seed)
    print(f"{len(paths)} clips in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
