"""The image rows' data check (bench.offload.data_check) on epochs made by hand: a correct one passes; a sample read
twice, a wrong label, an image left unnormalised, channels swapped or the wrong shape each fail with the reason."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bench.offload.data_check import DataCheckError, check_epoch, compare_colours  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZE, BATCH = 8, 4
# Three classes of four files, each class one colour (pixel values in [0, 1]).
COLOURS = ((0.9, 0.2, 0.1), (0.1, 0.8, 0.3), (0.2, 0.3, 0.9))
FILES = [(f"/data/class_{c}/img_{i}.jpg", c) for c in range(3) for i in range(4)]


def _images(indices, colour_of=lambda c: COLOURS[c], normalise=True):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in indices:
        rgb = torch.tensor(colour_of(FILES[i][1])).view(3, 1, 1)
        x = (rgb + 0.05 * torch.rand(3, SIZE, SIZE, generator=g)).clamp(0, 1)
        out.append((x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1) if normalise else x)
    return torch.stack(out)


def _epoch(order=None, names=False, **kw):
    order = list(range(len(FILES))) if order is None else order
    for at in range(0, len(order), BATCH):
        ids = order[at:at + BATCH]
        labels = torch.tensor([FILES[i][1] for i in ids])
        yield _images(ids, **kw), labels, [FILES[i][0] for i in ids] if names else torch.tensor(ids)


def _check(batches):
    return check_epoch(batches, FILES, BATCH, SIZE, MEAN, STD)


def test_a_correct_epoch_passes_and_matches_itself():
    reference = _check(_epoch())
    shuffled = _check(_epoch(order=[5, 0, 11, 3, 8, 1, 10, 2, 7, 4, 9, 6], names=True))  # paths name samples too
    assert compare_colours(shuffled, reference) < 0.01  # the same images, their noise drawn in another order
    assert reference[0]["mean"][0] == pytest.approx(0.925, abs=0.01)


def test_every_sample_once():
    with pytest.raises(DataCheckError, match="more than once"):
        _check(_epoch(order=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10]))
    with pytest.raises(DataCheckError, match="not in the dataset"):
        _check((x, y, ["/elsewhere/img.jpg"] * len(y)) for x, y, _ in _epoch())


def test_labels_shapes_and_range():
    def relabel(batches):
        for x, y, ids in batches:
            yield x, (y + 1) % 3, ids

    with pytest.raises(DataCheckError, match="label"):
        _check(relabel(_epoch()))
    with pytest.raises(DataCheckError, match="float32"):
        _check((x.double(), y, ids) for x, y, ids in _epoch())
    with pytest.raises(DataCheckError, match="float32"):
        _check((x[:, :, :-1], y, ids) for x, y, ids in _epoch())
    with pytest.raises(DataCheckError, match="range"):
        _check((x * 255, y, ids) for x, y, ids in _epoch(normalise=False))  # 0-255, never normalised


def test_colours_far_from_the_dataloaders_fail():
    reference = _check(_epoch())
    swapped = _check(_epoch(colour_of=lambda c: COLOURS[c][::-1]))  # BGR for RGB
    with pytest.raises(DataCheckError, match="mean"):
        compare_colours(swapped, reference)
