"""python -m bench.train --device dlop_test end to end at tiny sizes, with K = 1 trainer core and one
offloader core: every row of the image headline runs in its own processes and reports finite figures, the
device's ceiling (synthetic) is the fastest row, and where torch's DataLoader in one core cannot feed the device,
dlop's offloaders feed it at least as fast. stock_uint8 ships uint8 from the DataLoader, native_local runs dlop's
pipeline with no offloader, and the three factors of dlop_offload's gain multiply to it; every row's window
starts after each producer's first batch and a drained queue, and counts the samples trained on. --deadline skips
and cuts rows instead of overrunning. The test device's cost model (DLOP_TEST_DEVICE_OP_US and _TFLOPS)
makes compute take modelled time, so that synthetic is bound by the device and stock by its data. Bad options
fail with a message naming them."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import pytest

from processes import offloader

pytest.importorskip("torch")
pytest.importorskip("dlop._C")
pytest.importorskip("dlop.testing._accelerator")
pytest.importorskip("matplotlib")

from bench.train import train, train_device, train_device_report  # noqa: E402

pytestmark = pytest.mark.long_file(seconds=100)

# Per step the tiny CNN costs the device about 20 ms at these rates (above what the test device's emulation
# costs the trainer's core), and one core decodes and crops a batch of 8 800x600 JPEGs in about 70 ms: stock is
# data-bound, and one offloader core makes a batch in under 20 ms.
COST_MODEL = ["--test-op-us", "20", "--test-tflops", "0.005"]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.alone(reason="it compares rows' rates: another test's load during one row would skew them")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the trainer and one for offloaders")
def test_image_headline_on_the_test_device(tmp_path):
    from dlop.data.make_dataset import main as make_dataset

    data = tmp_path / "images"
    assert make_dataset([str(data), "--classes", "2", "--per-class", "24", "--size", "800x600", "--quality", "90",
                         "--jobs", "2"]) == 0
    out, report = tmp_path / "rows.json", tmp_path / "report"
    assert train.main(["--device", "dlop_test", "--kind", "image", "--data", str(data), "--trainer-cores", "1",
                       "--model", "tiny_cnn", "--size", "64", "--batch", "8", "--seconds", "2", "--warmup", "2",
                       "--workers", "1", "--all-cores-workers", "2", *COST_MODEL, "--offloader", offloader(),
                       "--json", str(out), "--report", str(report)]) == 0

    got = json.loads(out.read_text())
    header, rows = got["header"], got["rows"]
    by = {r["row"]: r for r in rows}
    assert list(by) == list(train_device.ROWS)
    assert header["trainer_cores"] == [min(os.sched_getaffinity(0))] and len(header["offloader_cores"]) >= 1
    assert header["test_device_model"] == {"op_us": 20.0, "tflops": 0.005}
    for r in rows:
        for key in train_device_report.COLUMNS:
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]) and r[key] >= 0, (key, r)
        assert r["samples_per_s"] > 0 and 0 < r["device_busy"] <= 1.05 and r["trainer_cpu_ms_per_sample"] > 0, r
        assert r["cores"] == (header["all_cores"] if r["row"] == "stock_all_cores" else header["trainer_cores"]), r
    for name in ("dlop_offload", "dlop_run"):
        assert by[name]["offloader_cpu_ms_per_sample"] > 0, by[name]
    # What each row feeds the device: stock's workers normalise (float32), stock_uint8's ship uint8, and dlop's
    # pipeline ships uint8 whether it runs here (native_local, no offloader at all) or on the offloaders.
    dtypes = {r["row"]: r["input_dtype"] for r in rows}
    assert [dtypes[r] for r in ("stock", "stock_uint8", "native_local", "dlop_offload")] == \
        ["float32", "uint8", "uint8", "uint8"], dtypes
    assert by["native_local"]["offloader_cpu_ms_per_sample"] == 0 and by["native_local"]["threads"] == 1
    assert by["native_local"]["pipeline"] == "native" and by["stock_uint8"]["workers"] == 1
    # Steady state: the window opens after every producer's first batch and with the queue drained; it counts
    # the samples trained on, batch by batch.
    producers = {"stock": 1, "stock_uint8": 1, "stock_all_cores": 2, "gpu_decode": 1, "native_local": 1,
                 "dlop_offload": len(header["offloader_cores"]), "dlop_run": len(header["offloader_cores"])}
    for r in rows:
        assert r["steps"] >= 3 and r["samples_per_s"] * r["wall_s"] == pytest.approx(8 * r["steps"]), r
        if r["row"] != "synthetic":
            assert r["untimed_steps"] >= max(2, producers[r["row"]]) and r["drained_batches"] >= 1, r
    # Where dlop_offload's gain over stock comes from: format x decoder x offloading.
    factors = header["attribution"]
    assert sorted(factors) == ["decoder (native_local/stock_uint8)", "format (stock_uint8/stock)",
                               "offloading (dlop_offload/native_local)"]
    assert math.prod(factors.values()) == pytest.approx(header["ratios"]["dlop_offload/stock"])
    assert by["dlop_run"]["dlop_run_loader"] == "offloaded"  # dlop run took the unchanged script's DataLoader
    assert by["dlop_offload"]["pipeline"] == "native"

    # synthetic is the device's ceiling; a row fed fast enough reaches it, so it is fastest within the noise of
    # a shared 2-core machine.
    fastest = max(r["samples_per_s"] for r in rows if r["row"] != "synthetic")
    assert by["synthetic"]["samples_per_s"] >= 0.9 * fastest, rows
    assert by["synthetic"]["device_busy"] > 0.8, by["synthetic"]
    stock = by["stock"]
    if stock["samples_per_s"] < 0.8 * by["synthetic"]["samples_per_s"] and stock["data_stall_ms"] > 0:
        assert by["dlop_offload"]["samples_per_s"] >= stock["samples_per_s"], rows
    assert header["ratios"]["dlop_offload/stock"] == pytest.approx(
        by["dlop_offload"]["samples_per_s"] / stock["samples_per_s"])
    for base in train_device_report.BASES:
        assert f"dlop_offload/{base}" in header["ratios"]

    md = (report / "train_device.md").read_text()
    for r in rows:
        line = next(x for x in md.splitlines() if x.startswith(f"| {r['row']} |"))
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        assert cells == [train_device_report.cell(k, r[k]) for k in train_device_report.COLUMNS], (line, r)
    assert _png_size(report / "train_device.png") == train_device_report.PNG_SIZE


@pytest.mark.parametrize("argv, message", [
    (["--trainer-cores", "4096"], "--trainer-cores 4096"),
    (["--rows", "stock,nonsense"], "unknown nonsense"),
    (["--model", "r3d_50"], "not a image model"),
    (["--device", "cpu", "--test-op-us", "5"], "give --device dlop_test"),
    (["--kind", "video", "--short-side", "100,90"], "--short-side 100,90"),
    (["--workers", "many"], "--workers 'many'"),
    (["--uint8-workers", "some"], "--uint8-workers 'some'"),
    (["--deadline", "0"], "--deadline 0"),
])
def test_bad_options_say_what_is_wrong(argv, message, capsys):
    argv = (["--device", "dlop_test"] if "--device" not in argv else []) + argv
    with pytest.raises(SystemExit) as failed:
        train.main(argv)
    said = str(failed.value.code) + capsys.readouterr().err
    assert message in said


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the trainer and one for offloaders")
def test_deadline_cuts_and_skips_rows(tmp_path):
    """A row still running at --deadline is cut and the rows after it are not started: each is listed with the
    reason, in the JSON and in the table, and the command ends soon after the deadline."""
    import time

    from dlop.data.make_dataset import main as make_dataset

    data = tmp_path / "images"
    assert make_dataset([str(data), "--classes", "2", "--per-class", "8", "--size", "160x120"]) == 0
    out, report = tmp_path / "rows.json", tmp_path / "report"
    started = time.monotonic()
    assert train.main(["--device", "dlop_test", "--data", str(data), "--trainer-cores", "1", "--model", "tiny_cnn",
                       "--size", "32", "--batch", "4", "--seconds", "60", "--warmup", "1", "--workers", "1",
                       "--rows", "synthetic,stock", "--deadline", "10", *COST_MODEL, "--json", str(out),
                       "--report", str(report)]) == 0
    assert time.monotonic() - started < 10 + 20  # the cut row's process ends at the deadline, and 5 s of grace
    got = json.loads(out.read_text())
    assert got["rows"] == []
    assert got["header"]["skipped"]["synthetic"] == "cut at --deadline 10 s", got["header"]
    assert got["header"]["skipped"]["stock"].startswith("not started:"), got["header"]
    md = (report / "train_device.md").read_text()
    assert "| synthetic | skipped: cut at --deadline 10 s |" in md and "| stock | skipped: not started:" in md


def test_make_dataset_size_and_quality(tmp_path):
    from PIL import Image

    from dlop.data.make_dataset import main as make_dataset

    assert make_dataset([str(tmp_path / "d"), "--classes", "1", "--per-class", "2", "--size", "200x150",
                         "--quality", "90"]) == 0
    for path in sorted((tmp_path / "d").rglob("*.jpg")):
        with Image.open(path) as im:
            assert im.size == (200, 150)
    with pytest.raises(SystemExit):
        make_dataset([str(tmp_path / "e"), "--size", "200by150"])


def test_video_rows_on_the_test_device(tmp_path, monkeypatch):
    """Clips and a 3D CNN: the offloaded row trains from dlop's native video pipeline with multi-hot targets
    from the Charades-like manifest, and gpu_decode is absent with the reason (dlop_test has no decoder)."""
    import shutil

    if shutil.which("ffmpeg") is None:
        pytest.skip("the clips are made with the ffmpeg command-line tool")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the built-in clips, made here
    out = tmp_path / "rows.json"
    assert train.main(["--device", "dlop_test", "--kind", "video", "--samples", "8", "--clip-size", "128x72",
                       "--clip-seconds", "2", "--trainer-cores", "1", "--model", "tiny_3d", "--classes", "10",
                       "--frames", "4", "--short-side", "40,48", "--crop", "32", "--batch", "4", "--steps", "4",
                       "--warmup", "1", "--rows", "synthetic,gpu_decode,dlop_offload", *COST_MODEL,
                       "--offloader", offloader(), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    header, rows = got["header"], got["rows"]
    assert [r["row"] for r in rows] == ["synthetic", "dlop_offload"]
    assert "no video decoder" in header["absent"]["gpu_decode"]
    assert header["classes"] == 10 and header["offload_path"] in ("native", "python")
    for r in rows:
        assert r["steps"] == 4 and all(math.isfinite(r[k]) for k in train_device_report.COLUMNS), r
        assert math.isfinite(r["loss"]) and r["loss"] > 0, r
