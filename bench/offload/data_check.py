"""The data check every image row of ``python -m bench.offload`` passes before it is timed: one epoch with the
samples named, then shapes, dtype and value range; every sample exactly once, with its class's label; and each
class's mean colour close to the DataLoader's. A loader that is fast because it skips work, reads some files twice,
swaps channels or forgets to normalise fails here with the reason in its row."""

from __future__ import annotations

import math
import os

# A class's mean colour is a mean over its images' random crops: two loaders' means differ by chance by about
# sqrt(2) standard errors. Wrong channels or a missing normalisation move them by 0.1 to 1 (pixel values in [0, 1]).
COLOUR_SIGMAS, COLOUR_FLOOR = 6.0, 0.02
RANGE_SLACK = 0.02  # normalised units: resamplers that round in uint8 land a hair outside


class DataCheckError(RuntimeError):
    pass


def _sample_key(name) -> str:
    """A file path's last two parts (class/file), the name every loader can give, whatever prefix it prints."""
    return os.path.join(*os.path.normpath(str(name)).split(os.sep)[-2:])


def check_epoch(batches, files: list[tuple[str, int]], batch: int, size: int, mean, std) -> dict:
    """One epoch of (images, labels, ids) batches, ids being indices into `files` or file paths. Returns the
    per-class mean colours (pixel values in [0, 1]) with their standard errors."""
    import torch

    index = {_sample_key(path): i for i, (path, _) in enumerate(files)}
    mean_t, std_t = torch.tensor(mean).view(1, 3), torch.tensor(std).view(1, 3)
    lo, hi = (0 - mean_t) / std_t - RANGE_SLACK, (1 - mean_t) / std_t + RANGE_SLACK
    seen = [0] * len(files)
    colours: dict[int, list] = {}
    last_partial = False
    for images, labels, ids in batches:
        if last_partial:
            raise DataCheckError("a batch smaller than the batch size came before the epoch's end")
        n = images.shape[0]
        if images.dtype != torch.float32 or tuple(images.shape[1:]) != (3, size, size) or not 0 < n <= batch:
            raise DataCheckError(f"a batch is {tuple(images.shape)} {images.dtype}, not [<= {batch}, 3, {size}, "
                                 f"{size}] float32")
        if not images.is_contiguous():
            raise DataCheckError("a batch is not a contiguous NCHW tensor")
        last_partial = n < batch
        labels = labels.reshape(-1).long()
        if labels.shape[0] != n or ids is None or len(ids) != n:
            raise DataCheckError(f"a batch of {n} images has {labels.shape[0]} labels and "
                                 f"{'no' if ids is None else len(ids)} sample names")
        low = images.amin(dim=(2, 3))
        high = images.amax(dim=(2, 3))
        if bool((low < lo).any()) or bool((high > hi).any()) or not bool(torch.isfinite(images).all()):
            raise DataCheckError(f"values outside the normalised range [{lo.min():.2f}, {hi.max():.2f}]: "
                                 f"min {float(low.min()):.2f}, max {float(high.max()):.2f}")
        pixel = images.mean(dim=(2, 3)) * std_t + mean_t  # each image's mean colour, in [0, 1]
        for k in range(n):
            i = int(ids[k]) if isinstance(ids[k], int) or hasattr(ids[k], "item") else index.get(_sample_key(ids[k]))
            if i is None or not 0 <= i < len(files):
                raise DataCheckError(f"sample {ids[k]!r} is not in the dataset")
            seen[i] += 1
            if int(labels[k]) != files[i][1]:
                raise DataCheckError(f"{files[i][0]} has label {int(labels[k])}, not its class's {files[i][1]}")
            colours.setdefault(files[i][1], []).append(pixel[k])
    twice = [files[i][0] for i, c in enumerate(seen) if c > 1]
    never = [files[i][0] for i, c in enumerate(seen) if c == 0]
    if twice or never:
        raise DataCheckError(f"not every sample once: {len(twice)} more than once (e.g. {twice[:1]}), "
                             f"{len(never)} never (e.g. {never[:1]})")
    out = {}
    for label, rows in colours.items():
        x = torch.stack(rows)
        se = (x.std(dim=0) / math.sqrt(len(rows))).tolist() if len(rows) > 1 else [0.5] * 3
        out[label] = {"mean": x.mean(dim=0).tolist(), "se": se}
    return out


def compare_colours(mine: dict, reference: dict) -> float:
    """The largest gap between a class's mean colour and the reference's, in standard errors of the difference
    past the floor; raises when one is too far."""
    worst = 0.0
    for label, ref in reference.items():
        got = mine[label]
        for c in range(3):
            gap = abs(got["mean"][c] - ref["mean"][c])
            allowed = COLOUR_FLOOR + COLOUR_SIGMAS * math.hypot(got["se"][c], ref["se"][c])
            if gap > allowed:
                raise DataCheckError(f"class {label}'s mean {'RGB'[c]} is {got['mean'][c]:.3f}, the DataLoader's "
                                     f"{ref['mean'][c]:.3f} (allowed +-{allowed:.3f})")
            worst = max(worst, gap)
    return worst
