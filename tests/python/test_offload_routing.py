"""Which path dlop.data.offload (and so `dlop run`) picks for a stock image DataLoader.

The loader of torchvision's reference scripts (an ImageFolder of JPEGs,
RandomResizedCrop, flip, ToTensor, Normalize, a DistributedSampler, pinned
batches, persistent workers) must run on the native pipeline: on the
generic Python path the same batches cost the daemons several times the
CPU. It ships float32, normalised on the daemon, because that is what torch
yields for it.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL.Image")
pytest.importorskip("dlop._C")

from dlop._torchvision_compat import import_torchvision  # noqa: E402
from dlop.data.make_dataset import make_dataset  # noqa: E402
from dlop.data.wrap import native_source  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def stock_loader(root):
    tv = import_torchvision()
    T = tv.transforms
    dataset = tv.datasets.ImageFolder(str(root), transform=T.Compose([
        T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]))
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0,
                                                  drop_last=True)
    return torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler, drop_last=True, num_workers=1,
                                       pin_memory=True, persistent_workers=True, prefetch_factor=2)


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "train"
    make_dataset(root, classes=2, per_class=3, seed=5)
    (root / ".complete").touch()  # a marker file beside the classes, as dataset caches leave
    return root


def test_the_stock_image_loader_runs_natively_and_ships_what_torch_yields(folder):
    from PIL import Image

    Image.new("RGB", (40, 30), (9, 80, 200)).save(folder / sorted(p.name for p in folder.iterdir()
                                                                   if p.is_dir())[0] / "extra.png")
    root, spec = native_source(stock_loader(folder))
    assert root == str(folder)
    assert spec["output"] == "float32"
    assert [op["op"] for op in spec["ops"]] == ["random_resized_crop", "hflip", "normalize"]
    assert spec["ops"][-1]["mean"] == pytest.approx(MEAN) and spec["ops"][-1]["std"] == pytest.approx(STD)


def test_a_file_the_native_decoders_do_not_read_sends_it_to_the_python_path_naming_it(folder):
    from PIL import Image

    Image.new("RGB", (40, 30)).save(folder / sorted(p.name for p in folder.iterdir() if p.is_dir())[0] / "x.bmp")
    with pytest.raises(ValueError, match=r"1 file\(s\) are neither JPEG nor PNG \(.*x\.bmp\)"):
        native_source(stock_loader(folder))
