"""dlop's native pipeline (dlop._C.media) against PIL and torchvision on the
same pixels. Each comparison states its tolerance:

- decode: exact against PIL's ``Image.open(f).convert("RGB")`` (JPEG 4:4:4,
  4:2:2, 4:2:0, gray, CMYK; PNG RGB, RGBA, L, LA, P, P with tRNS, 1-bit);
  16-bit gray PNGs keep their high byte where PIL clips to 255 (documented).
- resize / resized_crop (bilinear, antialias): exact against torchvision on
  PIL images (PIL's fixed-point kernel, re-implemented); within 1 level of
  torchvision on uint8 tensors (torch's own kernel).
- center_crop, hflip, crop: exact; ToTensor + Normalize: exact (bitwise) in
  float32 against torchvision's v1 transforms, within 1e-6 of v2's.
- RandomResizedCrop parameters: the same algorithm, not the same random
  stream: the fallback box is exact, and the distribution of areas and
  aspect ratios matches torchvision's within sampling error.
"""

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
_C = pytest.importorskip("dlop._C")
media = getattr(_C, "media", None)
if media is None:
    pytest.skip("dlop._C was built without the media bindings", allow_module_level=True)

from dlop.data.make_dataset import make_dataset, make_image  # noqa: E402

from dlop._torchvision_compat import import_torchvision  # noqa: E402

tv = import_torchvision()
from torchvision.transforms import functional as F1  # noqa: E402
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def encode_pil(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def pil_rgb(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture(scope="module")
def pixels():
    return make_image(0, 3, 10, 7)  # (H, W, 3) uint8, about 500 x 375


def chw(a):
    return torch.from_numpy(np.array(a)).permute(2, 0, 1).contiguous()


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("subsampling", [0, 1, 2])
def test_decode_jpeg_equals_pil(pixels, subsampling):
    data = encode_pil(Image.fromarray(pixels), "JPEG", quality=90, subsampling=subsampling)
    np.testing.assert_array_equal(media.decode(data), pil_rgb(data))


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_decode_gray_and_cmyk_jpeg_equal_pil_convert(pixels, mode):
    data = encode_pil(Image.fromarray(pixels).convert(mode), "JPEG", quality=90)
    np.testing.assert_array_equal(media.decode(data), pil_rgb(data))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "1"])
def test_decode_png_equals_pil_convert(pixels, mode):
    data = encode_pil(Image.fromarray(pixels).convert(mode), "PNG")
    np.testing.assert_array_equal(media.decode(data), pil_rgb(data))


def test_decode_palette_with_transparency_drops_it_like_pil(pixels):
    data = encode_pil(Image.fromarray(pixels).convert("P"), "PNG", transparency=3)
    np.testing.assert_array_equal(media.decode(data), pil_rgb(data))


def test_decode_16bit_gray_png_keeps_the_high_byte(pixels):
    gray16 = pixels[..., 0].astype(np.uint16) * 257 + 3
    data = encode_pil(Image.fromarray(gray16), "PNG")
    out = media.decode(data)
    np.testing.assert_array_equal(out, np.repeat((gray16 >> 8).astype(np.uint8)[..., None], 3, axis=2))


@pytest.mark.parametrize(
    "cut, reason",
    [(lambda d: b"", "empty file"), (lambda d: d[: len(d) // 2], "truncated"), (lambda d: d[:-2], "truncated")],
    ids=["empty", "half", "no-end-marker"],
)
def test_bad_jpeg_raises_sample_error_like_pil(pixels, cut, reason):
    data = cut(encode_pil(Image.fromarray(pixels), "JPEG", quality=90))
    with pytest.raises(media.SampleError, match=f"sample bad.jpg: .*{reason}"):
        media.decode(data, "bad.jpg")
    with pytest.raises(Exception):  # PIL refuses them too
        Image.open(io.BytesIO(data)).load()


def test_decode_takes_any_contiguous_buffer(pixels):
    data = encode_pil(Image.fromarray(pixels), "PNG")
    for buf in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        np.testing.assert_array_equal(media.decode(buf), pixels)
    with pytest.raises(ValueError, match="contiguous"):
        media.decode(memoryview(data)[::2])


def test_corrupt_png_raises_sample_error(pixels):
    data = bytearray(encode_pil(Image.fromarray(pixels), "PNG"))
    data[20] ^= 0xFF
    with pytest.raises(media.SampleError, match="corrupt PNG"):
        media.decode(bytes(data), "bad.png")
    assert issubclass(media.SampleError, ValueError)


# ---------------------------------------------------------------- resize and crops


RESIZES = [(224, 224), (100, 333), (375, 200), (600, 800), (17, 9)]


@pytest.mark.parametrize("size", RESIZES)
def test_resize_equals_torchvision_on_pil(pixels, size):
    want = np.asarray(F1.resize(Image.fromarray(pixels), list(size), antialias=True))
    np.testing.assert_array_equal(media.resize(pixels, size), want)


@pytest.mark.parametrize("size", RESIZES)
def test_resize_within_one_level_of_torchvision_on_tensors(pixels, size):
    want = F.resize(chw(pixels), list(size), antialias=True).permute(1, 2, 0).numpy()
    diff = np.abs(media.resize(pixels, size).astype(int) - want)
    assert diff.max() <= 1, diff.max()


def test_resize_shorter_side_as_torchvision(pixels):
    h, w = pixels.shape[:2]
    for size, max_size in [(256, None), (224, None), (100, 120)]:
        want = F1.resize(Image.fromarray(pixels), size, max_size=max_size).size[::-1]
        assert media.resize_shorter_side(h, w, size, max_size or 0) == want


@pytest.mark.parametrize("index", range(6))
def test_resized_crop_equals_torchvision(pixels, index):
    h, w = pixels.shape[:2]
    top, left, bh, bw = media.random_resized_crop_box(h, w, seed=1, epoch=0, index=index)
    ours = media.resized_crop(pixels, top, left, bh, bw, (224, 224))
    pil = np.asarray(F1.resized_crop(Image.fromarray(pixels), top, left, bh, bw, [224, 224], antialias=True))
    np.testing.assert_array_equal(ours, pil)
    tensor = F.resized_crop(chw(pixels), top, left, bh, bw, [224, 224], antialias=True).permute(1, 2, 0).numpy()
    assert np.abs(ours.astype(int) - tensor).max() <= 1


@pytest.mark.parametrize("size", [(224, 224), (375, 100), (400, 600), (101, 51)])
def test_center_crop_equals_torchvision(pixels, size):
    want = F.center_crop(chw(pixels), list(size)).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(media.center_crop(pixels, size), want)


def test_hflip_and_crop_equal_torchvision(pixels):
    np.testing.assert_array_equal(media.hflip(pixels), F.horizontal_flip(chw(pixels)).permute(1, 2, 0).numpy())
    np.testing.assert_array_equal(media.crop(pixels, 10, 20, 30, 40), pixels[10:40, 20:60])


def test_to_tensor_and_normalize_bitwise_equal_torchvision(pixels):
    want = F1.normalize(F1.to_tensor(Image.fromarray(pixels)), MEAN, STD).numpy()
    ours = media.to_chw(pixels, "float32", MEAN, STD)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, want)
    np.testing.assert_array_equal(media.to_chw(pixels, "float32"), F1.to_tensor(Image.fromarray(pixels)).numpy())
    v2_out = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])(chw(pixels)).numpy()
    np.testing.assert_allclose(ours, v2_out, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(media.to_chw(pixels, "uint8"), chw(pixels).numpy())


# ---------------------------------------------------------------- RandomResizedCrop parameters


def test_random_resized_crop_fallback_equals_torchvision():
    # Every try fails on these shapes, so both take the clamped centre crop.
    for h, w in [(10, 1000), (1000, 10)]:
        ours = media.random_resized_crop_box(h, w, seed=0, epoch=0, index=0)
        want = tv.transforms.RandomResizedCrop.get_params(torch.zeros(3, h, w), (0.08, 1.0), (3 / 4, 4 / 3))
        assert ours == tuple(want)


def test_random_resized_crop_distribution_matches_torchvision():
    h, w, n = 375, 500, 4000  # torchvision's get_params takes about 1 ms a call
    ours = np.array([media.random_resized_crop_box(h, w, seed=5, epoch=0, index=i)[2:] for i in range(n)], float)
    torch.manual_seed(0)
    theirs = np.array(
        [tv.transforms.RandomResizedCrop.get_params(torch.zeros(1, h, w), (0.08, 1.0), (3 / 4, 4 / 3))[2:] for _ in range(n)],
        float,
    )
    for name, f in [("area", lambda b: b[:, 0] * b[:, 1] / (h * w)), ("log aspect", lambda b: np.log(b[:, 1] / b[:, 0]))]:
        a, b = f(ours), f(theirs)
        # Means within 4 standard errors (0.024 for the area); quartiles within
        # 0.03, about 2.5 standard errors of a difference of quartiles at this n.
        assert abs(a.mean() - b.mean()) < 4 * np.sqrt(a.var() / n + b.var() / n), name
        np.testing.assert_allclose(np.quantile(a, [0.25, 0.5, 0.75]), np.quantile(b, [0.25, 0.5, 0.75]), atol=0.03)


# ---------------------------------------------------------------- whole pipelines


TRAIN = (
    '{"ops": [{"op": "random_resized_crop", "size": 224}, {"op": "hflip", "p": 1.0},'
    ' {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}]}'
)


def test_pipeline_equals_torchvision_composition(pixels):
    data = encode_pil(Image.fromarray(pixels), "JPEG", quality=90)
    img = Image.open(io.BytesIO(data)).convert("RGB")
    pipe = media.ImagePipeline(TRAIN)
    for index in range(4):
        box = media.random_resized_crop_box(img.height, img.width, seed=3, epoch=1, index=index, stream=0)
        want = F1.normalize(F1.to_tensor(F1.hflip(F1.resized_crop(img, *box, [224, 224], antialias=True))), MEAN, STD)
        np.testing.assert_array_equal(pipe.run(data, seed=3, epoch=1, index=index), want.numpy())


def test_pipeline_eval_spec_equals_torchvision(pixels):
    data = encode_pil(Image.fromarray(pixels), "PNG")
    pipe = media.ImagePipeline('{"ops": [{"op": "resize", "size": 256}, {"op": "center_crop", "size": 224}], "output": "uint8"}')
    want = F1.center_crop(F1.resize(Image.fromarray(pixels), 256, antialias=True), 224)
    np.testing.assert_array_equal(pipe.run(data), chw(np.asarray(want)).numpy())


def test_pipeline_is_deterministic_and_keyed(pixels):
    data = encode_pil(Image.fromarray(pixels), "JPEG", quality=90)
    pipe = media.ImagePipeline(TRAIN.replace('"p": 1.0', '"p": 0.5'))
    a = pipe.run(data, seed=1, epoch=2, index=3)
    np.testing.assert_array_equal(a, media.ImagePipeline(pipe.spec).run(data, seed=1, epoch=2, index=3))
    assert not np.array_equal(a, pipe.run(data, seed=1, epoch=3, index=3))
    assert not np.array_equal(a, pipe.run(data, seed=2, epoch=2, index=3))


def test_spec_errors_are_clear():
    with pytest.raises(Exception, match=r"ops\[0\] \(blur\): unknown op"):
        media.ImagePipeline('{"ops": [{"op": "blur"}]}')
    with pytest.raises(Exception, match=r'"p" must be a number in \[0, 1\]'):
        media.ImagePipeline('{"ops": [{"op": "hflip", "p": "often"}]}')


def test_op_table_describes_what_the_parser_does():
    import json

    from dlop.data.wrap import _torchvision_ops

    ops = {o["op"]: o["params"] for o in json.loads(media.transform_ops())}
    assert set(ops) == {"random_resized_crop", "resize", "center_crop", "hflip", "normalize"}
    # Every torchvision transform that dlop.data.offload maps becomes an op of the table.
    assert {op for _, op, _ in _torchvision_ops(tv.transforms)} <= set(ops)
    with pytest.raises(Exception, match="known: " + ", ".join(ops)):
        media.ImagePipeline('{"ops": [{"op": "blur"}]}')
    # An op given only its required parameters gets exactly the described defaults.
    some = {"size": 8, "size_or_side": 8, "channels": [0.5, 0.25, 2.0]}
    for name, params in ops.items():
        given = {p["name"]: some[p["kind"]] for p in params if p["required"]}
        parsed = json.loads(media.ImagePipeline(json.dumps({"ops": [{"op": name, **given}]})).spec)["ops"][0]
        assert set(parsed) == {"op"} | {p["name"] for p in params}, name
        for p in params:
            if p["required"]:
                assert parsed[p["name"]] in (given[p["name"]], [given[p["name"]]] * 2), (name, p)
            else:
                assert parsed[p["name"]] == pytest.approx(p["default"]), (name, p)
                bad = {"bool": 3, "number": -1, "integer": -1, "range": [2, 1], "size": 0}[p["kind"]]
                with pytest.raises(Exception, match=rf'ops\[0\] \({name}\): "{p["name"]}" must be'):
                    media.ImagePipeline(json.dumps({"ops": [{"op": name, **given, p["name"]: bad}]}))


# ---------------------------------------------------------------- dataset, sources, pack, batches


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds") / "train"
    make_dataset(root, classes=3, per_class=4, seed=11)
    return root


def test_image_folder_order_and_labels_equal_torchvision(dataset):
    folder = media.open_source(str(dataset))
    theirs = tv.datasets.ImageFolder(str(dataset))
    assert folder.classes == theirs.classes
    assert len(folder) == len(theirs.samples)
    for i, (path, label) in enumerate(theirs.samples):
        assert folder.name(i) == path
        assert folder.label(i) == label


def test_pack_round_trip_and_batches(dataset, tmp_path):
    stats = media.pack(str(dataset), str(tmp_path / "train.dlop"))
    assert stats["records"] == 12 and stats["classes"] == 3
    folder = media.open_source(str(dataset))
    records = media.open_source(str(tmp_path / "train.dlop"))
    assert records.classes == folder.classes
    for i in range(len(folder)):
        assert records.read(i) == folder.read(i)
        assert records.label(i) == folder.label(i)
    pipe = media.ImagePipeline(TRAIN.replace('"p": 1.0', '"p": 0.5'))
    indices = [7, 0, 11, 3, 5]
    images, labels, skipped = pipe.run_batch(records, indices, seed=4, epoch=1, threads=2)
    assert images.shape == (5, 3, 224, 224) and images.dtype == np.float32
    assert labels.dtype == np.int64 and list(labels) == [folder.label(i) for i in indices]
    assert skipped == []
    same, _, _ = pipe.run_batch(folder, indices, seed=4, epoch=1, threads=1)
    np.testing.assert_array_equal(images, same)
    for k, i in enumerate(indices):
        np.testing.assert_array_equal(images[k], pipe.run(folder.read(i), seed=4, epoch=1, index=i))


def test_pack_command_line(dataset, tmp_path, capsys):
    from dlop.data import pack

    assert pack.main([str(dataset), str(tmp_path / "cli.dlop")]) == 0
    assert "12 records in 3 classes" in capsys.readouterr().out
    assert len(media.open_source(str(tmp_path / "cli.dlop"))) == 12
    with pytest.raises(Exception, match="not a folder"):
        pack.main([str(tmp_path / "missing"), str(tmp_path / "x.dlop")])


def test_corrupt_record_file_is_a_clear_error(dataset, tmp_path):
    path = tmp_path / "bad.dlop"
    media.pack(str(dataset), str(path))
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="malformed: index checksum mismatch"):
        media.open_source(str(path))


def test_skip_policy_in_batches(dataset, tmp_path):
    root = tmp_path / "mixed"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            (root / cls / f"{i}.jpg").write_bytes((dataset / "class_00" / f"class_00_{i:05d}.jpg").read_bytes())
    (root / "b" / "1.jpg").write_bytes(b"")
    (root / "a" / "2.jpg").write_bytes((root / "a" / "2.jpg").read_bytes()[:5000])
    source = media.open_source(str(root))
    spec = '{"ops": [{"op": "center_crop", "size": 64}], "output": "uint8", "on_error": "%s"}'
    images, labels, skipped = media.ImagePipeline(spec % "skip").run_batch(source, list(range(6)), threads=2)
    assert images.shape == (4, 3, 64, 64) and images.dtype == np.uint8
    assert list(labels) == [0, 0, 1, 1]
    assert [i for i, _ in skipped] == [2, 4]
    assert "truncated" in skipped[0][1] and "empty file" in skipped[1][1]
    with pytest.raises(media.SampleError, match="a/2.jpg"):
        media.ImagePipeline(spec % "raise").run_batch(source, list(range(6)))


def test_make_dataset_is_deterministic_and_imagenet_like(dataset, tmp_path):
    again = tmp_path / "again"
    stats = make_dataset(again, classes=3, per_class=4, seed=11)
    assert stats["images"] == 12
    for path in sorted(dataset.rglob("*.jpg")):
        assert (again / path.relative_to(dataset)).read_bytes() == path.read_bytes()
    sizes = [Image.open(p).size for p in dataset.rglob("*.jpg")]
    assert all(300 <= w <= 640 and 200 <= h <= 480 for w, h in sizes)
    assert len(set(sizes)) > 6
    # Not trivially compressible: a few bits per pixel, as photos are.
    bits = [8 * p.stat().st_size / (Image.open(p).size[0] * Image.open(p).size[1]) for p in dataset.rglob("*.jpg")]
    assert min(bits) > 1.0
    assert not np.array_equal(make_image(11, 0, 3, 0), make_image(12, 0, 3, 0))
