"""A synthetic audio folder, made locally with espeak-ng and ffmpeg (no download).

    python -m dlop.data.make_audio OUT [--classes 4] [--clips-per-class 4] [--seed 0]

writes ``OUT/<class>/clip<i>.<wav|flac|ogg|opus|mp3>``: class ``speech`` holds
sentences spoken by espeak-ng (voices and speeds vary), the other classes
tones and noise of their own pitch range (``tone0``, ``tone1``, ...). Clips
are 1-4 s at 8, 16, 22.05, 44.1 or 48 kHz, mono or stereo, in a rotating mix
of formats (WAV, FLAC, Ogg Vorbis, Ogg Opus, MP3), so the pipeline's decoding
and resampling are exercised. Clip i of class c depends only on (seed, c, i).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_WORDS = ("data", "offload", "gradient", "batch", "epoch", "tensor", "signal", "network", "training", "model",
          "audio", "sample", "rank", "host", "speech", "video")
# (extension, ffmpeg encoder arguments); a clip's index picks one.
_FORMATS = (("wav", ["-c:a", "pcm_s16le"]), ("flac", ["-c:a", "flac"]), ("ogg", ["-c:a", "libvorbis"]),
            ("opus", ["-c:a", "libopus", "-b:a", "32k"]), ("mp3", ["-c:a", "libmp3lame", "-b:a", "64k"]))
_RATES = (8000, 16000, 22050, 44100, 48000)


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *args], check=True)


def _speech(path: Path, rng: random.Random, tmp: str) -> list[str]:
    """espeak-ng's WAV of a random sentence, as ffmpeg input arguments."""
    wav = os.path.join(tmp, "speech.wav")
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 7)))
    voice = rng.choice(("en", "en-us", "en+f3", "en+m3"))
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(rng.randint(140, 200)), "-w", wav, words], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return ["-i", wav]


def _tone(cls: int, rng: random.Random) -> list[str]:
    low = 150 * (cls + 1)
    f1, f2 = rng.uniform(low, 2 * low), rng.uniform(low, 2 * low)
    seconds = rng.uniform(1.0, 4.0)
    expr = f"0.3*sin(2*PI*{f1:.1f}*t)+0.2*sin(2*PI*{f2:.1f}*t*(1+0.1*t))+0.02*(random(0)-0.5)"
    return ["-f", "lavfi", "-i", f"aevalsrc={expr}:s=48000:d={seconds:.2f}"]


def make_audio_dataset(root: str | os.PathLike, classes: int = 4, clips_per_class: int = 4,
                       seed: int = 0) -> list[Path]:
    """Writes ``root/<class>/clip<i>.<ext>`` (class ``speech``, then ``tone0``, ...) and returns the paths.
    Each file is written beside its final name and renamed."""
    for tool in ("ffmpeg", "espeak-ng"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"make_audio_dataset needs the {tool} command-line tool on PATH")
    if classes < 1 or clips_per_class < 1:
        raise ValueError("classes and clips_per_class must be at least 1")
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for cls in range(classes):
            name = "speech" if cls == 0 else f"tone{cls - 1}"
            (Path(root) / name).mkdir(parents=True, exist_ok=True)
            for i in range(clips_per_class):
                rng = random.Random(f"{seed}/{cls}/{i}")
                ext, codec = _FORMATS[(cls + i) % len(_FORMATS)]
                rate = rng.choice(_RATES if ext != "opus" else (48000,))
                channels = rng.choice((1, 2))
                source = _speech(Path(tmp), rng, tmp) if cls == 0 else _tone(cls, rng)
                path = Path(root) / name / f"clip{i}.{ext}"
                partial = path.with_name(f".{path.name}.partial.{ext}")
                _ffmpeg(*source, "-ar", str(rate), "-ac", str(channels), *codec, str(partial))
                os.replace(partial, path)
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlop.data.make_audio", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to write (created)")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--clips-per-class", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = make_audio_dataset(args.out, args.classes, args.clips_per_class, args.seed)
    print(f"{len(paths)} clips in {args.classes} classes in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
