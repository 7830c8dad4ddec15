"""The clip and audio workloads bench.offload's media rows share: the numbers every row reads, the
class folder's order and labels, and the torch baseline's audio features and collate (the peers reuse
them, so every row computes the same features from the same samples)."""

from __future__ import annotations

import random
from pathlib import Path

# The clip workload; every row reads the same numbers.
FRAMES, STRIDE, SHORT_SIDE, CROP, HFLIP = 16, 2, (128, 160), 112, 0.5
VIDEO_SIZE, VIDEO_FPS = (320, 240), 30
# Whisper-like features.
RATE, SECONDS, N_FFT, HOP, N_MELS = 16000, 4.0, 400, 160, 80
FREQ_MASKS, FREQ_MASK_WIDTH, TIME_MASKS, TIME_MASK_WIDTH = 2, 27, 2, 40
LOG_OFFSET = 1e-6


def class_folder(root: str) -> list[tuple[str, int]]:
    """(path, label) in the order and with the labels dlop's folder sources give (torchvision's: sorted)."""
    classes = sorted(d.name for d in Path(root).iterdir() if d.is_dir() and not d.name.startswith("."))
    return [(str(f), label) for label, c in enumerate(classes)
            for f in sorted((Path(root) / c).iterdir()) if f.is_file() and not f.name.startswith(".")]


class _Files:
    """A map-style dataset over (path, label) pairs; subclasses read a sample."""

    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)


class SoundfileFeatures(_Files):
    """soundfile.read + soxr.resample + torch.stft + a mel matrix: log-mel features with SpecAugment."""

    def __init__(self, files, filters):
        super().__init__(files)
        self.filters, self.window = filters, None

    def __getitem__(self, i):
        import soundfile
        import soxr

        path, label = self.files[i]
        audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
        mono = audio.mean(axis=1, dtype="float32")
        if rate != RATE:
            mono = soxr.resample(mono, rate, RATE)
        crop = int(SECONDS * RATE)
        if len(mono) > crop:
            start = random.randint(0, len(mono) - crop)
            mono = mono[start:start + crop]
        return self.features(mono), label

    def features(self, mono):
        """16 kHz mono float32 samples -> the normalised, masked log-mel features (mels x frames)."""
        import torch

        if self.window is None:
            self.window = torch.hann_window(N_FFT, periodic=True)
        spec = torch.stft(torch.from_numpy(mono.copy()), N_FFT, HOP, window=self.window, center=True,
                          pad_mode="reflect", return_complex=True)
        mel = torch.log(self.filters @ spec.abs().square() + LOG_OFFSET)
        mel = (mel - mel.mean()) / (mel.std() + 1e-5)
        mels, frames = mel.shape
        for _ in range(FREQ_MASKS):
            width = random.randint(0, FREQ_MASK_WIDTH)
            at = random.randint(0, mels - width)
            mel[at:at + width] = 0
        for _ in range(TIME_MASKS):
            width = random.randint(0, min(TIME_MASK_WIDTH, frames))
            at = random.randint(0, frames - width)
            mel[:, at:at + width] = 0
        return mel


def pad_collate(batch):
    import torch

    lengths = torch.tensor([m.shape[1] for m, _ in batch])
    out = torch.zeros(len(batch), batch[0][0].shape[0], int(lengths.max()))
    for k, (m, _) in enumerate(batch):
        out[k, :, :m.shape[1]] = m
    return out, torch.tensor([label for _, label in batch]), lengths
