"""The clip and audio loaders users pick instead of a DataLoader, on the workloads of
``python -m bench.offload --kind video|audio``, each in the form its project documents:

* video ``spdl``: SPDL's thread pipeline (``spdl.dataloader.DataLoader``, k threads): ``demux_video`` and
  ``sample_decode_video``, which decodes only what the wanted frames need, with one FFmpeg filter graph per clip
  for the resize of the short side, the crop, the flip and the RGB conversion;
* video ``dali_cpu``: DALI's CPU video reader (``fn.experimental.readers.video``, ``device_id=None``) with
  ``fn.resize`` and ``fn.crop_mirror_normalize``; its CPU backend decodes VP8, VP9 and MJPEG, so on H.264 clips
  the row says what DALI answered;
* audio ``spdl``: SPDL's thread pipeline: FFmpeg decode with a filter to 16 kHz mono, then the features of the
  ``soundfile`` row (the same torch code and mel matrix).

Each loader has ``epoch()``, batches as the benchmark's other rows give them, and ``close()``.
"""

from __future__ import annotations

import random

from bench.offload.media_workload import (CROP, FRAMES, HFLIP, RATE, SECONDS, SHORT_SIDE, STRIDE, SoundfileFeatures,
                                 class_folder, pad_collate)
from bench.offload.peers import missing  # noqa: F401  (the media rows say why a peer is absent the same way)

VIDEO_PEERS = ("spdl", "dali_cpu")
AUDIO_PEERS = ("spdl",)


def _clip_box(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int, bool]:
    """(scaled width, scaled height, left, top, flip): the short side to a random size, a random crop, a flip."""
    short = rng.randint(*SHORT_SIDE)
    w, h = (round(width * short / height), short) if height <= width else (short, round(height * short / width))
    return w, h, rng.randint(0, w - CROP), rng.randint(0, h - CROP), rng.random() < HFLIP


class SpdlClips:
    def __init__(self, data: str, batch: int, threads: int, seed: int = 0) -> None:
        import spdl.io
        import torch
        from spdl.dataloader import DataLoader

        from bench.offload.peers import _Order

        files = class_folder(data)
        order = _Order(len(files), seed)
        span = (FRAMES - 1) * STRIDE + 1

        def decode(index: int):
            path, label = files[index]
            rng = random.Random((seed * 1_000_003 + order.epoch) * 1_000_003 + index)
            packets = spdl.io.demux_video(path)
            count = len(packets)
            start = rng.randint(0, max(0, count - span))
            wanted = [min(start + t * STRIDE, count - 1) for t in range(FRAMES)]
            w, h, left, top, flip = _clip_box(packets.width, packets.height, rng)
            graph = (f"scale={w}:{h}:flags=bilinear,crop={CROP}:{CROP}:{left}:{top}{',hflip' if flip else ''},"
                     "format=rgb24")
            unique = sorted(set(wanted))
            frames = spdl.io.sample_decode_video(packets, unique, filter_desc=graph)
            clip = spdl.io.to_torch(spdl.io.convert_frames(frames))  # T' x H x W x C
            if len(unique) != len(wanted):  # a clip shorter than the span repeats its last frame
                clip = clip[[unique.index(k) for k in wanted]]
            return clip.permute(3, 0, 1, 2).unsqueeze(0), label  # 1 x C x T x H x W

        def collate(items):
            return torch.stack([c for c, _ in items]), torch.tensor([label for _, label in items])

        self.loader = DataLoader(order, preprocessor=decode, batch_size=batch, aggregator=collate,
                                 num_threads=threads, buffer_size=2)

    def epoch(self):
        return iter(self.loader)

    def close(self) -> None:
        self.loader = None


class DaliClips:
    """DALI's CPU video reader: sequences of FRAMES at STRIDE, the short side resized, a random crop and flip."""

    def __init__(self, data: str, batch: int, threads: int, seed: int = 0) -> None:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        files = class_folder(data)

        @pipeline_def
        def pipeline():
            video, labels = fn.experimental.readers.video(
                device="cpu", filenames=[f for f, _ in files], labels=[label for _, label in files],
                sequence_length=FRAMES, stride=STRIDE, random_shuffle=True, pad_last_batch=True, name="Reader")
            video = fn.resize(video, resize_shorter=fn.random.uniform(range=list(SHORT_SIDE)),
                              interp_type=types.INTERP_LINEAR, antialias=True)
            video = fn.crop_mirror_normalize(video, crop=(CROP, CROP), crop_pos_x=fn.random.uniform(range=[0, 1]),
                                             crop_pos_y=fn.random.uniform(range=[0, 1]), dtype=types.UINT8,
                                             mirror=fn.random.coin_flip(probability=HFLIP), output_layout="CFHW")
            return video, labels

        self.pipe = pipeline(batch_size=batch, num_threads=threads, device_id=None, seed=seed)
        self.pipe.build()
        self.it = DALIGenericIterator(self.pipe, ["video", "label"], reader_name="Reader",
                                      last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def epoch(self):
        for out in self.it:
            yield out[0]["video"].unsqueeze(1), out[0]["label"].view(-1).long()

    def close(self) -> None:
        self.it = self.pipe = None


class SpdlAudio:
    def __init__(self, data: str, batch: int, threads: int, filters, seed: int = 0) -> None:
        import spdl.io
        from spdl.dataloader import DataLoader

        from bench.offload.peers import _Order

        files = class_folder(data)
        order = _Order(len(files), seed)
        graph = spdl.io.get_audio_filter_desc(sample_rate=RATE, num_channels=1, sample_fmt="flt")
        features = SoundfileFeatures(files, filters)
        crop = int(SECONDS * RATE)

        def decode(index: int):
            path, label = files[index]
            mono = spdl.io.to_numpy(spdl.io.load_audio(path, filter_desc=graph)).reshape(-1)
            if len(mono) > crop:
                start = random.randint(0, len(mono) - crop)
                mono = mono[start:start + crop]
            return features.features(mono), label

        self.loader = DataLoader(order, preprocessor=decode, batch_size=batch, aggregator=pad_collate,
                                 num_threads=threads, buffer_size=2)

    def epoch(self):
        return iter(self.loader)

    def close(self) -> None:
        self.loader = None


# --- the rows ----------------------------------------------------------------------

DALI_CPU_VIDEO_CODECS = ("vp8", "vp9", "mjpeg")  # its CPU backend's; H.264, HEVC and AV1 are its GPU's only


def _dali_video_missing(files) -> str | None:
    import av

    codecs = set()
    for path, _ in files:
        with av.open(path) as container:
            codecs.add(container.streams.video[0].codec_context.name)
    if bad := sorted(codecs - set(DALI_CPU_VIDEO_CODECS)):
        return (f"DALI's CPU video reader decodes {', '.join(DALI_CPU_VIDEO_CODECS)} only; these clips are "
                f"{', '.join(bad)} (DALI: \"Codec 27 (h264) is not supported by the CPU variant of this operator\")")
    return None


def media_missing(name: str, video: bool, files) -> str | None:
    why = missing("dali_cpu" if name == "dali_cpu" else "spdl")
    if why is None and name == "dali_cpu" and video:
        why = _dali_video_missing(files)
    return why


def check_media_epoch(batches, files, video: bool, batch: int) -> None:
    """Shapes and dtype as the native rows give them; the epoch's samples are the dataset's, every class as often
    (SPDL and DALI do not name their samples in these rows: the labels' counts stand for every sample once)."""
    from collections import Counter

    import torch

    from bench.offload.data_check import DataCheckError
    from bench.offload.media_workload import N_MELS

    seen: Counter = Counter()
    total = 0
    for got in batches:
        x, labels = got[0], got[1]
        n = x.shape[0]
        if video:
            ok = x.dtype == torch.uint8 and tuple(x.shape[1:]) == (1, 3, FRAMES, CROP, CROP)
            want = f"[<= {batch}, 1, 3, {FRAMES}, {CROP}, {CROP}] uint8"
        else:
            ok = (x.dtype == torch.float32 and x.dim() == 3 and x.shape[1] == N_MELS and len(got) == 3
                  and bool(torch.isfinite(x).all()))
            want = f"[<= {batch}, {N_MELS}, frames] float32 with lengths"
        if not ok or not 0 < n <= batch or labels.shape[0] != n:
            raise DataCheckError(f"a batch is {tuple(x.shape)} {x.dtype}, not {want}")
        seen.update(int(v) for v in labels)
        total += n
    expected = Counter(label for _, label in files)
    if total != len(files) or seen != expected:
        raise DataCheckError(f"an epoch gave {total} samples, labels {dict(seen)}; the dataset has {len(files)}, "
                             f"labels {dict(expected)}")


def run_media_peer(name: str, args, files, data: str, batches: int, unit: str, filters=None) -> dict:
    """The data check on one epoch, then the timed passes. The peers work in the trainer process: the trainer's
    host pays all their CPU."""
    import os

    import torch

    from bench.offload.offload_common import descendants, proc_peak_mib, timed_passes
    from bench.offload.peers import _reset_peak_rss

    video = args.kind == "video"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the features' torch ops run in the peer's k threads
    if video:
        loader = (SpdlClips if name == "spdl" else DaliClips)(data, args.batch, args.workers)
    else:
        loader = SpdlAudio(data, args.batch, args.workers, filters)
    try:
        check_media_epoch(loader.epoch(), files, video, args.batch)
        _reset_peak_rss()
        row = timed_passes(loader.epoch, args.batch, batches, args.reps, lambda: descendants(os.getpid()),
                           desc=name, unit=unit)
        row["peak_rss_mib"] = proc_peak_mib(os.getpid())
        row["trainer_process_cpu_s_per_sample"] = row["trainer_cpu_s_per_sample"]
        return row
    finally:
        loader.close()
        torch.set_num_threads(threads)
