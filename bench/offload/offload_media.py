"""python -m bench.offload --kind video|audio: clip and audio pipelines, dlop's native one against the tools
users run in a DataLoader today, in the same run on the same files.

Video: H.264 clips (320x240, 30 fps, keyframe intervals of 16 and 250 frames,
two B-frames; made once into a cache folder when ``--data`` is not given);
per sample 16 frames at stride 2 from a random start, short side resized to a
random size in [128, 160], a random 112 x 112 crop, a flip with probability
1/2, uint8 output (N x views x C x T x H x W). Rows:

* ``native``: dlop-offloader with k threads, through ``dlop.data.OffloadLoader``;
* ``torchcodec``: a torch Dataset over torchcodec's ``VideoDecoder(seek_mode="exact")``
  and ``get_frames_at``, run by a DataLoader with k workers;
* ``pyav``: the same over PyAV, seeking to the keyframe before the first
  wanted frame and decoding forward, keeping frames by pts (as SlowFast does);
* ``decode_floor``: not a pipeline but a bound: PyAV in the same DataLoader
  decoding only what an exact pipeline must (from the keyframe before the
  first wanted frame to the last, skipping the non-reference frames that are
  not wanted, as dlop does), with no conversion, resize or collate. No
  pipeline that returns the exact frames through this libavcodec spends less
  CPU per clip, so the best tool's CPU per clip over the floor's is the most
  samples per CPU-second any of them can gain over that tool.

Both baselines resize with ``torch.nn.functional.interpolate`` (bilinear,
antialiased, on uint8), then crop and flip with tensor ops.

Audio: FLAC, WAV and MP3 files of 2-20 s at 16 and 44.1 kHz (speech from
espeak-ng when it is installed, tones and noise otherwise); per sample mono at
16 kHz (soxr HQ), a random 4 s crop, 80 Slaney mel bands over an STFT with
n_fft 400 and hop 160, log, per-utterance normalisation, SpecAugment (two
frequency masks of up to 27 bands, two time masks of up to 40 frames); batches
padded to their longest, with lengths. Rows: ``native`` as above;
``soundfile``: soundfile.read + soxr.resample + torch.stft + the same mel
matrix, in a DataLoader with k workers and a padding collate.

The peers (``bench.offload.peers_media``; ``python scripts/install_peers.py``): video
``spdl`` (SPDL's thread pipeline, ``sample_decode_video`` with an FFmpeg filter
graph per clip) and ``dali_cpu`` (DALI's CPU video reader, which decodes VP8,
VP9 and MJPEG only: on these H.264 clips its row says so); audio ``spdl``
(FFmpeg decode to 16 kHz mono in SPDL's pipeline, then the ``soundfile`` row's
features). They pass a data check before they are timed: shapes and dtype,
and an epoch of the dataset's samples, every class as often.

Figures as in ``python -m bench.offload``: samples/s, CPU-seconds per
sample of every process doing the work, peak RSS; but the trainer's CPU per
sample is what the trainer's host pays: the trainer process and its
DataLoader workers for the tools, the trainer process alone with offloaders
(which run on other machines); ``trainer_process_cpu_s_per_sample`` is the
trainer process alone for both; medians over ``--reps`` passes after a warm-up batch each. Video
runs also check that native frames, decoded at full size, are the frames
torchcodec's exact mode returns (the ``cross_check`` entry of the JSON
header).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

from bench.common import _common
from bench.offload.media_workload import (CROP, FRAMES, FREQ_MASK_WIDTH, FREQ_MASKS, HFLIP, HOP, LOG_OFFSET, N_FFT,
                                         N_MELS, RATE, SECONDS, SHORT_SIDE, STRIDE, TIME_MASK_WIDTH, TIME_MASKS,
                                         VIDEO_FPS, VIDEO_SIZE, SoundfileFeatures, _Files, class_folder,
                                         pad_collate)
from bench.offload.offload_common import (Daemons, descendants, finish, offloader_path, parse_cpus, proc_peak_mib,
                                  timed_passes)

VIDEO_PIPELINES = ("native", "native_fast", "torchcodec", "pyav", "decode_floor", "spdl", "dali_cpu")
# Rows that bound the others rather than compete with them.
BOUNDS = ("decode_floor",)
AUDIO_PIPELINES = ("native", "soundfile", "spdl")
# The loaders users pick instead of a DataLoader (bench.offload.peers_media): in the trainer process.
PEERS = ("spdl", "dali_cpu")



def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.offload --kind video|audio",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=("video", "audio"), required=True)
    p.add_argument("--data", help="a folder by class (root/class/file); default: the built-in clips or audio, made once")
    p.add_argument("--samples", type=int, help="files in the built-in dataset (video 64, audio 256)")
    p.add_argument("-k", "--workers", type=int, default=2, help="DataLoader workers = offloader threads")
    p.add_argument("--batch", type=int, help="samples per batch (video 8, audio 16)")
    p.add_argument("--batches", type=int, default=0, help="timed batches per pass (0: one epoch less the warm-up batch)")
    p.add_argument("-r", "--reps", type=int, default=3, help="timed passes per row (the median is reported)")
    p.add_argument("--pipelines", help="comma-separated: video native,torchcodec,pyav; audio native,soundfile")
    p.add_argument("--check-clips", type=int, default=4, help="video: clips decoded at full size for the cross-check")
    p.add_argument("--trainer-cpus", help="pin the trainer (and its DataLoader workers) to these cores, e.g. 0,1")
    p.add_argument("--offloader-cpus", help="pin the offloader to these cores, e.g. 2-15")
    p.add_argument("--offloader", help="the dlop-offloader executable (default: next to this Python, or DLOP_OFFLOADER)")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    video = args.kind == "video"
    args.samples = args.samples or (64 if video else 256)
    args.batch = args.batch or (8 if video else 16)
    args.pipelines = args.pipelines or ",".join(VIDEO_PIPELINES if video else AUDIO_PIPELINES)
    return args


def _cache(name: str) -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dlop" / name


def _ffmpeg(args: list[str]) -> None:
    done = subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ffmpeg {' '.join(args)} failed: {done.stderr.strip()}")


def _made_once(root: Path, make) -> str:
    """Makes the dataset beside its final name and renames it, so an interrupted run leaves nothing to reuse."""
    if not (root / ".complete").exists():
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        if shutil.which("ffmpeg") is None:
            raise SystemExit("the built-in media datasets are made with the ffmpeg command-line tool: install it")
        make(partial)
        (partial / ".complete").touch()
        partial.rename(root)
    return str(root)


# --- the datasets ---------------------------------------------------------

_VIDEO_SOURCES = ("testsrc2", "smptebars", "mandelbrot", "life")


def builtin_video(clips: int) -> str:
    """Clips of 4-8 s, 4 classes, one moving test source per class panned by a moving crop; even clips have a
    keyframe every 16 frames, odd ones every 250 (one keyframe per clip)."""
    per_class = max(1, clips // 4)

    def make(root: Path) -> None:
        w, h = VIDEO_SIZE
        for cls, kind in enumerate(_VIDEO_SOURCES):
            (root / f"class{cls}").mkdir(parents=True)
            for i in range(per_class):
                rng = random.Random(f"video/{cls}/{i}")
                size = f"{2 * w}x{2 * h}"
                source = (f"mandelbrot=size={size}:rate={VIDEO_FPS}:maxiter=48" if kind == "mandelbrot" else
                          f"life=size={size}:rate={VIDEO_FPS}:seed={cls * 1000 + i}:ratio=0.4:mold=8" if kind == "life"
                          else f"{kind}=size={size}:rate={VIDEO_FPS}")
                vx, vy = rng.uniform(10, 60), rng.uniform(10, 40)
                pan = f"crop={w}:{h}:x='mod(t*{vx:.1f}+{rng.randrange(w)},iw-ow)':y='mod(t*{vy:.1f},ih-oh)'"
                _ffmpeg(["-f", "lavfi", "-i", source, "-frames:v", str(VIDEO_FPS * rng.randint(4, 8)),
                         "-vf", f"format=rgb24,{pan},hue=h={rng.uniform(0, 360):.0f}",
                         "-c:v", "libx264", "-preset", "veryfast", "-bf", "2", "-g", "16" if i % 2 == 0 else "250",
                         "-pix_fmt", "yuv420p", "-an", str(root / f"class{cls}" / f"clip{i}.mp4")])

    return _made_once(_cache(f"bench-offload-video-4x{per_class}"), make)


_WORDS = ("data", "offload", "video", "audio", "the", "model", "reads", "a", "batch", "of", "samples", "from",
          "every", "daemon", "while", "training", "goes", "on", "with", "frames", "and", "features", "at", "speed")


def builtin_audio(files: int) -> str:
    """2-20 s files, 4 classes: FLAC mostly, one in eight WAV and one in eight MP3; at 16 kHz mono or 44.1 kHz
    stereo. Speech (espeak-ng) under quiet pink noise where espeak-ng is installed, else tones under noise."""
    per_class = max(1, files // 4)
    speech = shutil.which("espeak-ng")

    def make(root: Path) -> None:
        for cls in range(4):
            (root / f"class{cls}").mkdir(parents=True)
            for i in range(per_class):
                rng = random.Random(f"audio/{cls}/{i}")
                seconds = rng.uniform(2.0, 20.0)
                ext = {3: "wav", 7: "mp3"}.get(i % 8, "flac")
                rate, channels = (44100, 2) if i % 3 == 0 else (16000, 1)
                out = root / f"class{cls}" / f"utt{i}.{ext}"
                noise = f"anoisesrc=color=pink:amplitude=0.05:duration={seconds:.2f}:seed={cls * 1000 + i}"
                if speech:
                    voice = root / f".utt{i}.wav"
                    text = " ".join(rng.choice(_WORDS) for _ in range(int(seconds * 2.6)))
                    subprocess.run([speech, "-s", str(rng.randint(140, 190)), "-w", str(voice), text], check=True,
                                   capture_output=True)
                    inputs = ["-i", str(voice), "-f", "lavfi", "-i", noise]
                else:
                    tone = f"sine=frequency={rng.randint(110, 880)}:duration={seconds:.2f}"
                    inputs = ["-f", "lavfi", "-i", tone, "-f", "lavfi", "-i", noise]
                _ffmpeg([*inputs, "-filter_complex", "amix=inputs=2:duration=longest", "-t", f"{seconds:.2f}",
                         "-ar", str(rate), "-ac", str(channels), str(out)])
                if speech:
                    voice.unlink()

    return _made_once(_cache(f"bench-offload-audio-4x{per_class}"), make)


# --- the baselines: torch Datasets doing what users write -------------------

def clip_positions(frames: int) -> list[int]:
    """FRAMES positions at STRIDE from a random start; a clip shorter than that repeats its last frame."""
    span = (FRAMES - 1) * STRIDE + 1
    start = random.randint(0, max(0, frames - span))
    return [min(start + t * STRIDE, frames - 1) for t in range(FRAMES)]


def clip_spatial(frames):
    """T x C x H x W uint8 -> 1 x C x T x CROP x CROP: short side to a random size, random crop, random flip."""
    import torch
    import torch.nn.functional as F

    short = random.randint(*SHORT_SIDE)
    h, w = frames.shape[-2:]
    size = (short, round(w * short / h)) if h <= w else (round(h * short / w), short)
    frames = F.interpolate(frames, size=size, mode="bilinear", antialias=True, align_corners=False)
    top, left = random.randint(0, size[0] - CROP), random.randint(0, size[1] - CROP)
    frames = frames[..., top:top + CROP, left:left + CROP]
    if random.random() < HFLIP:
        frames = frames.flip(-1)
    return frames.permute(1, 0, 2, 3).contiguous().unsqueeze(0)


class TorchcodecClips(_Files):
    """One exact-mode decoder per sample (the whole file is scanned for its frame index), one FFmpeg thread."""

    def __getitem__(self, i):
        from torchcodec.decoders import VideoDecoder

        path, label = self.files[i]
        decoder = VideoDecoder(path, seek_mode="exact", num_ffmpeg_threads=1, dimension_order="NCHW")
        frames = decoder.get_frames_at(clip_positions(decoder.metadata.num_frames)).data
        return clip_spatial(frames), label


class PyAVClips(_Files):
    """SlowFast's reader: seek a little before the first wanted frame's pts (the container goes to the keyframe
    before it), decode forward and keep the wanted frames by pts; one decoder thread."""

    SEEK_MARGIN = 1024  # pts, as SlowFast's pyav_decode_stream

    def __getitem__(self, i):
        import av
        import numpy as np
        import torch

        path, label = self.files[i]
        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            rate, base, first = stream.average_rate, stream.time_base, stream.start_time or 0
            count = stream.frames or int(stream.duration * base * rate)
            wanted = clip_positions(count)
            got = self._decode(container, stream, wanted, rate, base, first)
            if len(got) < len(set(wanted)):  # the seek landed after the first frame: decode from the start
                got = self._decode(container, stream, wanted, rate, base, first, from_start=True)
            frames = np.stack([got[k] for k in wanted])
        return clip_spatial(torch.from_numpy(frames).permute(0, 3, 1, 2)), label

    def _decode(self, container, stream, wanted, rate, base, first, from_start=False):
        def pts(k):
            return first + round(k / (rate * base))

        target = set(wanted)
        container.seek(0 if from_start else max(pts(wanted[0]) - self.SEEK_MARGIN, 0), backward=True,
                       any_frame=False, stream=stream)
        got = {}
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            k = round((frame.pts - first) * base * rate)
            if k in target:
                got[k] = frame.to_ndarray(format="rgb24")
            if k >= wanted[-1]:
                break
        return got


class DecodeFloorClips(_Files):
    """The decoding an exact clip pipeline cannot avoid: packets from the keyframe before the first wanted frame to
    the last wanted one, each non-reference packet that is not wanted skipped; frames are neither converted nor
    kept. The sample is the number of frames decoded."""

    def __getitem__(self, i):
        import av
        import torch

        path, label = self.files[i]
        with av.open(path) as container:
            stream = container.streams.video[0]
            codec = stream.codec_context
            codec.thread_count = 1
            rate, base, first = stream.average_rate, stream.time_base, stream.start_time or 0
            count = stream.frames or int(stream.duration * base * rate)
            wanted = {first + round(k / (rate * base)) for k in clip_positions(count)}
            last = max(wanted)
            container.seek(min(wanted), backward=True, any_frame=False, stream=stream)
            decoded = 0
            for packet in container.demux(stream):
                if packet.dts is not None and packet.dts > last:
                    break  # decode order passed the last wanted frame: what follows references nothing wanted
                codec.skip_frame = "DEFAULT" if packet.pts in wanted else "NONREF"
                decoded += len(packet.decode())
        return torch.tensor([decoded]), label


# --- the specs ------------------------------------------------------------

def video_spec() -> dict:
    return {"kind": "video", "frames": FRAMES, "stride": STRIDE, "views": 1, "start": "random",
            "short_side": list(SHORT_SIDE), "crop": CROP, "hflip": HFLIP, "layout": "CTHW", "output": "uint8"}


def audio_spec() -> dict:
    return {"kind": "audio", "sample_rate": RATE, "seconds": SECONDS, "crop": "random", "n_fft": N_FFT, "hop": HOP,
            "n_mels": N_MELS, "mel_scale": "slaney", "log_offset": LOG_OFFSET, "freq_masks": FREQ_MASKS,
            "freq_mask_width": FREQ_MASK_WIDTH, "time_masks": TIME_MASKS, "time_mask_width": TIME_MASK_WIDTH}


def missing(pipeline: str) -> str | None:
    """Why a baseline cannot run here, or None."""
    modules = {"torchcodec": ("torchcodec.decoders",), "pyav": ("av",), "decode_floor": ("av",),
               "soundfile": ("soundfile", "soxr")}
    for module in modules.get(pipeline, ()):
        try:
            __import__(module)
        except Exception as e:  # torchcodec raises OSError or RuntimeError when its libraries do not load
            return f"import {module} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


# --- running them -----------------------------------------------------------

def run_dataloader(args, dataset, collate_fn, batches: int, unit: str) -> dict:
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        collate_fn=collate_fn, persistent_workers=args.workers > 0,
                        prefetch_factor=2 if args.workers else None, generator=torch.Generator().manual_seed(0))
    row = timed_passes(lambda: iter(loader), args.batch, batches, args.reps, lambda: descendants(os.getpid()),
                       desc=args.current, unit=unit)
    row["peak_rss_mib"] = max([proc_peak_mib(p) for p in descendants(os.getpid())] or [0.0])
    # A DataLoader's workers run on the trainer's host, so the host pays their CPU as well as the trainer's.
    row["trainer_process_cpu_s_per_sample"] = row["trainer_cpu_s_per_sample"]
    row["trainer_cpu_s_per_sample"] = row["cpu_s_per_sample"]
    del loader  # persistent workers end here
    return row


def run_native(args, data: str, spec: dict, batches: int, unit: str) -> dict:
    from dlop.data import OffloadLoader

    token = os.urandom(16).hex()
    pool = Daemons(args.offloader_exe, 1, args.workers, parse_cpus(args.offloader_cpus), token)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a local fallback would measure the wrong thing
            loader = OffloadLoader(data, spec, args.batch, shuffle=True, seed=0, offloaders=pool.addresses,
                                   token=token)
        epochs = iter(range(1 << 30))

        def one_epoch():
            loader.set_epoch(next(epochs))
            return iter(loader)

        row = timed_passes(one_epoch, args.batch, batches, args.reps, pool.pids, desc="native", unit=unit)
        row["peak_rss_mib"] = sum(proc_peak_mib(p) for p in pool.pids())
        # The offloaders run on other machines: the trainer's host pays the trainer process alone.
        row["trainer_process_cpu_s_per_sample"] = row["trainer_cpu_s_per_sample"]
        row["offloaders"] = 1
        return row
    finally:
        pool.close()


# --- the cross-check: native frames at full size against torchcodec's -------

def _ffmpeg_rgb(path: str, flags: str | None):
    """Every frame of `path` as ffmpeg's command line converts it to RGB24 (with `flags`, else its defaults)."""
    import numpy as np

    scale = ["-sws_flags", flags] if flags else []
    out = subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-i", path, "-map", "0:v:0",
                          "-fps_mode", "passthrough", *scale, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                         capture_output=True, check=True).stdout
    return np.frombuffer(out, np.uint8)


def cross_check(data: str, clips: int) -> dict:
    """Clips decoded by the native pipeline at full size (no short side, a centred crop the frame's size, start
    "uniform": the middle of the clip) against torchcodec's exact mode at the same positions; both also against
    ffmpeg's command line, with the colour-conversion flags each documents or uses, to tell a different frame
    from a different conversion of the same frame."""
    import numpy as np

    from dlop import _C

    why = missing("torchcodec")
    if why is not None:
        return {"skipped": why}
    from torchcodec.decoders import VideoDecoder

    source = _C.media.open_source(data, "video")
    picks = sorted({round(k * len(source) / clips) for k in range(min(clips, len(source)))})
    stats = {"clips": 0, "frames": 0, "pixels": 0, "equal": 0, "max_abs_diff": 0, "abs_diff_sum": 0,
             "native_vs_ffmpeg_bitexact_equal": 0, "torchcodec_vs_ffmpeg_default_equal": 0, "fast_equal": 0}
    for index in picks:
        path = source.name(index)
        decoder = VideoDecoder(path, seek_mode="exact", num_ffmpeg_threads=1, dimension_order="NHWC")
        count, h, w = decoder.metadata.num_frames, decoder.metadata.height, decoder.metadata.width
        spec = {"kind": "video", "frames": min(FRAMES, count), "stride": 1 if count < (FRAMES - 1) * STRIDE + 1
                else STRIDE, "views": 1, "start": "uniform", "crop": [h, w], "crop_position": "center"}
        maker = _C.media.BatchMaker(json.dumps(spec))
        span = (spec["frames"] - 1) * spec["stride"] + 1
        positions = [(count - span) // 2 + t * spec["stride"] for t in range(spec["frames"])]
        native = maker.run_batch(source, [index], seed=0, epoch=0, threads=1)[0][0, 0]  # C x T x H x W
        native = np.ascontiguousarray(native.transpose(1, 2, 3, 0))  # T x H x W x C, as torchcodec's NHWC
        fast = _C.media.BatchMaker(json.dumps({**spec, "rgb": "fast"})).run_batch(source, [index], threads=1)[0][0, 0]
        fast = np.ascontiguousarray(fast.transpose(1, 2, 3, 0))
        theirs = decoder.get_frames_at(positions).data.numpy()
        stats["fast_equal"] += int((fast == theirs).sum())
        diff = np.abs(native.astype(np.int16) - theirs.astype(np.int16))
        stats["clips"] += 1
        stats["frames"] += len(positions)
        stats["pixels"] += diff.size
        stats["equal"] += int((diff == 0).sum())
        stats["abs_diff_sum"] += int(diff.sum())
        stats["max_abs_diff"] = max(stats["max_abs_diff"], int(diff.max()))
        bitexact = _ffmpeg_rgb(path, "bicubic+bitexact+accurate_rnd").reshape(-1, h, w, 3)[positions]
        default = _ffmpeg_rgb(path, None).reshape(-1, h, w, 3)[positions]
        stats["native_vs_ffmpeg_bitexact_equal"] += int((native == bitexact).sum())
        stats["torchcodec_vs_ffmpeg_default_equal"] += int((theirs == default).sum())
    pixels = max(stats["pixels"], 1)
    return {"clips": stats["clips"], "frames": stats["frames"], "max_abs_diff": stats["max_abs_diff"],
            "mean_abs_diff": stats["abs_diff_sum"] / pixels, "equal_fraction": stats["equal"] / pixels,
            "native_fast_equal_fraction": stats["fast_equal"] / pixels,
            "native_vs_ffmpeg_bitexact_equal_fraction": stats["native_vs_ffmpeg_bitexact_equal"] / pixels,
            "torchcodec_vs_ffmpeg_default_equal_fraction": stats["torchcodec_vs_ffmpeg_default_equal"] / pixels}


def print_cross_check(check: dict) -> None:
    if "skipped" in check:
        print(f"# cross-check skipped: {check['skipped']}")
        return
    print(f"# cross-check, {check['frames']} frames of {check['clips']} clips at full size: native vs torchcodec "
          f"exact mode: max |diff| {check['max_abs_diff']}, mean |diff| {check['mean_abs_diff']:.3f}, "
          f"{100 * check['equal_fraction']:.2f}% of values equal")
    print(f"#   same frames, other RGB conversion? native = ffmpeg -sws_flags bicubic+bitexact+accurate_rnd on "
          f"{100 * check['native_vs_ffmpeg_bitexact_equal_fraction']:.2f}% of values, torchcodec = ffmpeg's default "
          f"conversion on {100 * check['torchcodec_vs_ffmpeg_default_equal_fraction']:.2f}%")
    print(f"# native with \"rgb\": \"fast\" (swscale's default conversion) vs torchcodec exact mode: "
          f"{100 * check['native_fast_equal_fraction']:.2f}% of values equal")


# --- the report -------------------------------------------------------------

def print_ratios(rows: list[dict]) -> None:
    by = {r["pipeline"]: r for r in rows if "unavailable" not in r}
    baselines = [r for name, r in by.items() if not name.startswith("native") and name not in BOUNDS]
    for native in [r for name, r in by.items() if name.startswith("native")]:
        if not baselines:
            return
        name = native["pipeline"]
        for base in baselines:
            per_cpu = base["cpu_s_per_sample"] / native["cpu_s_per_sample"]
            trainer = native["trainer_cpu_s_per_sample"] / base["trainer_cpu_s_per_sample"]
            print(f"# {name} vs {base['pipeline']}: {per_cpu:.2f}x samples per CPU-second; trainer CPU per sample "
                  f"{trainer:.3f} of its; throughput {native['samples_per_s'] / base['samples_per_s']:.2f}x")
        best_cpu = min(baselines, key=lambda r: r["cpu_s_per_sample"])
        best_trainer = min(baselines, key=lambda r: r["trainer_cpu_s_per_sample"])
        per_cpu = best_cpu["cpu_s_per_sample"] / native["cpu_s_per_sample"]
        trainer = native["trainer_cpu_s_per_sample"] / best_trainer["trainer_cpu_s_per_sample"]
        if floor := by.get("decode_floor"):
            bound = best_cpu["cpu_s_per_sample"] / floor["cpu_s_per_sample"]
            print(f"# bound: {best_cpu['pipeline']} / decode_floor = {bound:.2f}x: no exact pipeline over this "
                  f"libavcodec gains more samples per CPU-second over {best_cpu['pipeline']}; {name} reaches "
                  f"{per_cpu:.2f}x")
        peers = [r for n, r in by.items() if n in PEERS]
        if peers:
            best_peer = min(peers, key=lambda r: r["cpu_s_per_sample"])
            vs_peer = best_peer["cpu_s_per_sample"] / native["cpu_s_per_sample"]
            print(f"# {name} vs the best peer ({best_peer['pipeline']}): {vs_peer:.2f}x samples per CPU-second "
                  f"(target >= 1.2: {'met' if vs_peer >= 1.2 else 'NOT met'})")
        print(f"# targets, {name}: samples per CPU-second {per_cpu:.2f}x the best baseline ({best_cpu['pipeline']}; "
              f"target >= 2: {'met' if per_cpu >= 2 else 'NOT met'}); trainer CPU per sample {trainer:.3f} of the "
              f"lowest ({best_trainer['pipeline']}; target <= 0.1: {'met' if trainer <= 0.1 else 'NOT met'})")


def audio_filters(spec: dict):
    """The native pipeline's own mel matrix, so that every audio row computes the same features; None for video."""
    if spec["kind"] != "audio":
        return None
    import torch

    from dlop import _C

    return torch.from_numpy(_C.media.audio.mel_filter_bank(json.dumps(spec)))


def main(argv=None) -> int:
    args = parse_args(argv)
    video = args.kind == "video"
    known = VIDEO_PIPELINES if video else AUDIO_PIPELINES
    pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    if unknown := set(pipelines) - set(known):
        raise SystemExit(f"unknown pipelines {sorted(unknown)} for --kind {args.kind}: choose from {', '.join(known)}")
    if cpus := parse_cpus(args.trainer_cpus):
        os.sched_setaffinity(0, cpus)
    data = args.data or (builtin_video if video else builtin_audio)(args.samples)
    files = class_folder(data)
    batches = args.batches or max(1, len(files) // args.batch - 1)
    if any(p.startswith("native") for p in pipelines):
        args.offloader_exe = offloader_path(args.offloader)
    spec = video_spec() if video else audio_spec()
    unit = "clip" if video else "utterance"
    header = _common.run_header(benchmark=f"offload_{args.kind}", data=data, samples=len(files), batch=args.batch,
                                workers=args.workers, timed_batches=batches, reps=args.reps, spec=spec)
    print(_common.header_comment(header))
    print(f"# {header['command']}")
    if video:
        print(f"# {len(files)} clips in {data}; batch {args.batch}; T={FRAMES} stride {STRIDE}, random start, "
              f"short side {list(SHORT_SIDE)}, crop {CROP}, flip {HFLIP}, uint8")
    else:
        print(f"# {len(files)} files in {data}; batch {args.batch}; {RATE} Hz mono, {SECONDS:g} s random crop, "
              f"n_fft {N_FFT} hop {HOP}, {N_MELS} Slaney mels, log, normalise, SpecAugment; padded with lengths")
    print(f"# k = {args.workers}; {batches} timed batches per pass after 1 warm-up batch, median of {args.reps} "
          "passes")
    print("# cpu s/sample: trainer + its DataLoader workers, or trainer + offloader; trainer s/sample: what the "
          "trainer's host pays: the trainer and its DataLoader workers, or the trainer alone with offloaders (they run "
          "on other machines; the JSON's trainer_process_cpu_s_per_sample is the trainer process alone); per core: "
          "samples per CPU-second")
    if _common.cpu_count() < args.workers + 1:
        print(f"# WARNING: {_common.cpu_count()} cores for the trainer and {args.workers} workers: they share cores")
    if video:
        check = cross_check(data, args.check_clips)
        header["cross_check"] = check
        print_cross_check(check)
    rows = []
    for name in pipelines:
        row = {"pipeline": name, "workers": args.workers}
        args.current = name
        if not name.startswith("native") and name not in PEERS and (why := missing(name)):
            row["unavailable"] = why
        elif name == "native":
            row.update(run_native(args, data, spec, batches, unit))
        elif name in PEERS:
            from bench.offload.data_check import DataCheckError
            from bench.offload.peers_media import media_missing, run_media_peer

            if why := media_missing(name, video, files):
                row["unavailable"] = why
            else:
                try:
                    row.update(run_media_peer(name, args, files, data, batches, unit, audio_filters(spec)))
                except DataCheckError as e:
                    row["unavailable"] = f"data check failed: {e}"
        elif name == "native_fast":
            row.update(run_native(args, data, {**spec, "rgb": "fast"}, batches, unit))
        elif video:
            dataset = {"torchcodec": TorchcodecClips, "pyav": PyAVClips, "decode_floor": DecodeFloorClips}[name](files)
            row.update(run_dataloader(args, dataset, None, batches, unit))
        else:
            row.update(run_dataloader(args, SoundfileFeatures(files, audio_filters(spec)), pad_collate, batches, unit))
        rows.append(row)
    return finish(args.json, header, rows, print_ratios)


if __name__ == "__main__":
    sys.exit(main())
