"""The input pipelines of ``python -m bench.train --device DEV``: what users run today, and dlop's specs.

Every dataset here is a plain map-style torch Dataset that pickles, so that
``dlop run`` can hand it, unchanged, to the offloaders' Python workers when the
native pipeline cannot reproduce it.

* images: torchvision's ImageFolder with RandomResizedCrop, a flip, ToTensor
  and Normalize (``stock``); the JPEG bytes for decoding on the device
  (``gpu_decode``, :class:`JpegFiles` and :func:`device_image_batch`);
* video: :class:`VideoClips`, a clip of ``frames`` frames at ``stride`` from a
  random start, read with PyAV (SlowFast's reader) or, where PyAV is missing,
  OpenCV's ``cv2.VideoCapture``; short side to a random size, random crop, flip,
  Kinetics' normalisation; multi-hot targets from a Charades-like CSV manifest
  (:func:`write_charades_manifest`);
* dlop's native pipeline in the trainer's own process (``native_local``):
  :class:`NativeLocal`;
* audio: :class:`AudioFeatures`, soundfile + soxr + torch.stft: 80-bin log-mel
  features of a random 4 s crop with SpecAugment, padded per batch.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from bench.offload.offload_media import pad_collate  # noqa: F401  (the audio rows' collate_fn)
from bench.train.train_rank import VIDEO_MEAN, VIDEO_STD, augment_clip  # noqa: F401

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
AUDIO = {"sample_rate": 16000, "n_fft": 400, "hop": 160, "n_mels": 80, "log_offset": 1e-6, "freq_masks": 2,
         "freq_mask_width": 27, "time_masks": 2, "time_mask_width": 40}


def class_folder(root: str) -> list[tuple[str, int]]:
    """(path, label) in the order and with the labels of torchvision's ImageFolder and dlop's folder sources."""
    classes = sorted(d.name for d in Path(root).iterdir() if d.is_dir() and not d.name.startswith("."))
    return [(str(f), label) for label, c in enumerate(classes)
            for f in sorted((Path(root) / c).iterdir()) if f.is_file() and not f.name.startswith(".")]


# --- images ---------------------------------------------------------------

def image_folder(root: str, size: int, uint8: bool = False):
    """The stock image pipeline, as torchvision's reference scripts write it; with `uint8` the workers stop at
    PILToTensor and the device normalises, as timm's PrefetchLoader and NVIDIA's examples do."""
    from dlop._torchvision_compat import import_torchvision

    tv = import_torchvision()
    T = tv.transforms
    tail = [T.PILToTensor()] if uint8 else [T.ToTensor(), T.Normalize(MEAN, STD)]
    return tv.datasets.ImageFolder(root, transform=T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
                                                              *tail]))


def image_spec(size: int) -> dict:
    """dlop's native spec for the same pipeline; uint8 on the wire, normalised on the device."""
    return {"ops": [{"op": "random_resized_crop", "size": size}, {"op": "hflip", "p": 0.5}], "output": "uint8"}


class JpegFiles:
    """(JPEG bytes as a uint8 tensor, label), or with `decode` the decoded C x H x W uint8 image (on hosts whose
    device has no JPEG decoder: then the workers decode, and only the transforms run on the device)."""

    def __init__(self, root: str, decode: bool) -> None:
        self.files, self.decode = class_folder(root), decode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        import numpy as np
        import torch

        path, label = self.files[i]
        if not self.decode:
            return torch.from_numpy(np.fromfile(path, dtype=np.uint8)), label
        from PIL import Image

        with Image.open(path) as im:
            return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).contiguous(), label


def list_collate(batch):
    import torch

    return [x for x, _ in batch], torch.tensor([y for _, y in batch])


def device_image_batch(images, size: int, device):
    """Variable-sized C x H x W uint8 images (on the device, or uploaded here) -> the normalised N x 3 x size x
    size batch: RandomResizedCrop's parameters drawn per image, crop and resize, flip, all on the device."""
    import torch
    import torch.nn.functional as F

    from dlop._torchvision_compat import import_torchvision

    RandomResizedCrop = import_torchvision().transforms.RandomResizedCrop
    out = []
    for img in images:
        img = img.to(device, non_blocking=True)
        top, left, h, w = RandomResizedCrop.get_params(img, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        crop = img[None, :, top:top + h, left:left + w].float()
        crop = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append(crop.flip(-1) if random.random() < 0.5 else crop)
    batch = torch.cat(out)
    mean = torch.tensor([255 * m for m in MEAN], device=device).view(1, 3, 1, 1)
    std = torch.tensor([255 * s for s in STD], device=device).view(1, 3, 1, 1)
    return (batch - mean) / std


# --- video ----------------------------------------------------------------

def write_charades_manifest(root: str, out: str, classes: int, seed: int = 0) -> str:
    """A Charades-like CSV manifest of the clips under `root` (path, labels): each clip has its folder's class
    and up to two more drawn from `classes` (Charades has 157 and several actions per video); the first clip
    holds the last class, so a source reading the manifest sees all `classes`."""
    files = class_folder(root)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "labels"])
        for i, (path, label) in enumerate(files):
            rng = random.Random(f"{seed}/{i}")
            labels = {label % classes} | {rng.randrange(classes) for _ in range(rng.randint(0, 2))}
            if i == 0:
                labels.add(classes - 1)
            w.writerow([path, ";".join(str(k) for k in sorted(labels))])
    return out


def read_manifest(path: str) -> tuple[list[tuple[str, list[int]]], int]:
    """(path, labels) per line and the number of classes (0 .. the largest label, as dlop's manifests count)."""
    with open(path, newline="") as f:
        rows = [(r["path"], [int(k) for k in r["labels"].split(";")]) for r in csv.DictReader(f)]
    return rows, 1 + max(k for _, labels in rows for k in labels)


def video_reader() -> str | None:
    """The clip reader a stock script can use here: PyAV, else OpenCV, else None."""
    for module, name in (("av", "pyav"), ("cv2", "opencv")):
        try:
            __import__(module)
            return name
        except ImportError:
            continue
    return None


class VideoClips:
    """One clip per sample: C x T x crop x crop float32, normalised (with `uint8`: uint8, for the device to
    normalise), and its multi-hot labels."""

    def __init__(self, manifest: str, clip: dict, reader: str, uint8: bool = False) -> None:
        self.rows, self.classes = read_manifest(manifest)
        self.clip, self.reader, self.uint8 = clip, reader, uint8

    def __len__(self) -> int:
        return len(self.rows)

    def _frames_pyav(self, path: str):
        import av
        import numpy as np

        from bench.offload.offload_media import PyAVClips

        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            rate, base, first = stream.average_rate, stream.time_base, stream.start_time or 0
            wanted = self._positions(stream.frames or int(stream.duration * base * rate))
            reader = PyAVClips([])
            got = reader._decode(container, stream, wanted, rate, base, first)
            if len(got) < len(set(wanted)):  # the seek landed after the first frame: decode from the start
                got = reader._decode(container, stream, wanted, rate, base, first, from_start=True)
            return np.stack([got[k] for k in wanted])

    def _frames_opencv(self, path: str):
        import cv2
        import numpy as np

        cap = cv2.VideoCapture(path)
        try:
            wanted = self._positions(int(cap.get(cv2.CAP_PROP_FRAME_COUNT)))
            cap.set(cv2.CAP_PROP_POS_FRAMES, wanted[0])
            got, k = {}, wanted[0]
            while k <= wanted[-1]:
                ok, frame = cap.read()
                if not ok:
                    break
                if k in wanted:
                    got[k] = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
                k += 1
            last = got[max(got)]
            return np.stack([got.get(k, last) for k in wanted])
        finally:
            cap.release()

    def _positions(self, count: int) -> list[int]:
        span = (self.clip["frames"] - 1) * self.clip["stride"] + 1
        start = random.randint(0, max(0, count - span))
        return [min(start + t * self.clip["stride"], count - 1) for t in range(self.clip["frames"])]

    def __getitem__(self, i):
        import torch

        path, labels = self.rows[i]
        frames = self._frames_pyav(path) if self.reader == "pyav" else self._frames_opencv(path)
        video = torch.from_numpy(frames).permute(0, 3, 1, 2)  # T x C x H x W uint8
        target = torch.zeros(self.classes)
        target[labels] = 1
        return augment_clip(video, self.clip, normalise=not self.uint8), target


# --- dlop's native pipeline in the trainer ----------------------------------

class NativeLocal:
    """dlop's native pipeline (``BatchMaker``) on `threads` threads of this process, no offloaders: each thread
    makes whole batches (the GIL is released while it does), 2 per thread in flight, in dlop's sample order
    (``EpochPlan``, as OffloadLoader's). Yields (samples, labels[, lengths]) CPU tensors."""

    def __init__(self, source: str, spec: dict, batch: int, threads: int, seed: int = 0) -> None:
        import json

        from dlop import _C

        self.maker = _C.media.BatchMaker(json.dumps(spec))
        self.source = _C.media.open_source(source, self.maker.kind)
        self.plan = _C.offload.EpochPlan(len(self.source), batch, seed, True, True, 0, 1, [])
        self.threads, self.seed, self.epoch = max(1, threads), seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batch(self, indices: list[int]):
        import torch

        samples, labels, lengths, _ = self.maker.run_batch(self.source, indices, seed=self.seed, epoch=self.epoch)
        out = (torch.from_numpy(samples), torch.from_numpy(labels))
        return out if lengths is None else (out[0][..., :int(lengths.max())], out[1], torch.from_numpy(lengths))

    def __iter__(self):
        import collections
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.threads, thread_name_prefix="native-local") as pool:
            window, todo = collections.deque(), iter(self.plan.batches(self.epoch))
            while True:
                while len(window) < 2 * self.threads and (indices := next(todo, None)) is not None:
                    window.append(pool.submit(self._batch, indices))
                if not window:
                    return
                yield window.popleft().result()


def video_spec(clip: dict) -> dict:
    return {"kind": "video", "frames": clip["frames"], "stride": clip["stride"], "views": 1, "start": "random",
            "short_side": list(clip["short_side"]), "crop": clip["crop"], "hflip": clip["hflip"], "layout": "CTHW",
            "output": "uint8"}


# --- audio ----------------------------------------------------------------

class AudioFeatures:
    """soundfile.read + soxr.resample + torch.stft + a mel matrix: log-mel features of a random crop of
    `seconds`, normalised per sample, with SpecAugment; (mels x frames, label)."""

    def __init__(self, root: str, seconds: float) -> None:
        self.files, self.seconds, self.filters, self.window = class_folder(root), seconds, None, None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        import soundfile
        import soxr
        import torch

        a = AUDIO
        if self.window is None:
            self.window = torch.hann_window(a["n_fft"], periodic=True)
            self.filters = torch.from_numpy(slaney_mel(a["sample_rate"], a["n_fft"], a["n_mels"]))
        path, label = self.files[i]
        audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
        mono = audio.mean(axis=1, dtype="float32")
        if rate != a["sample_rate"]:
            mono = soxr.resample(mono, rate, a["sample_rate"])
        crop = int(self.seconds * a["sample_rate"])
        if len(mono) > crop:
            start = random.randint(0, len(mono) - crop)
            mono = mono[start:start + crop]
        spec = torch.stft(torch.from_numpy(mono.copy()), a["n_fft"], a["hop"], window=self.window, center=True,
                          pad_mode="reflect", return_complex=True)
        mel = torch.log(self.filters @ spec.abs().square() + a["log_offset"])
        mel = (mel - mel.mean()) / (mel.std() + 1e-5)
        mels, frames = mel.shape
        for _ in range(a["freq_masks"]):
            width = random.randint(0, a["freq_mask_width"])
            at = random.randint(0, mels - width)
            mel[at:at + width] = 0
        for _ in range(a["time_masks"]):
            width = random.randint(0, min(a["time_mask_width"], frames))
            at = random.randint(0, frames - width)
            mel[:, at:at + width] = 0
        return mel, label


def slaney_mel(rate: int, n_fft: int, n_mels: int):
    """librosa's default mel filter bank (Slaney's scale and area normalisation), n_mels x (n_fft / 2 + 1)."""
    import numpy as np

    step, knee, log_step = 200.0 / 3, 1000.0, np.log(6.4) / 27

    def to_mel(hz):
        return np.where(hz < knee, hz / step, knee / step + np.log(np.maximum(hz, 1e-9) / knee) / log_step)

    def to_hz(mel):
        return np.where(mel < knee / step, mel * step, knee * np.exp(log_step * (mel - knee / step)))

    edges = to_hz(np.linspace(0.0, float(to_mel(np.float64(rate / 2))), n_mels + 2))
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    rising = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    falling = (edges[2:, None] - freqs[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    bank = np.maximum(0, np.minimum(rising, falling)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return bank.astype(np.float32)




def audio_spec(seconds: float) -> dict:
    return {"kind": "audio", "seconds": seconds, "crop": "random", "mel_scale": "slaney", **AUDIO}
