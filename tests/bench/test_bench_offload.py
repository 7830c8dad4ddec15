"""python -m bench.offload end to end on tiny datasets: every row's fields,
finite positive figures, the python row (images) or a baseline's library (video,
audio) either measured or said unavailable, the video run's frame cross-check,
and the peers (DALI, SPDL, Ray Data) measured after their data check wherever
they are installed (make check-bench installs them)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from processes import offloader

pytest.importorskip("torch")
pytest.importorskip("dlop._C")

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("pipeline", "workers", "samples_per_s", "cpu_s_per_sample", "trainer_cpu_s_per_sample", "peak_rss_mib")


def test_bench_offload_smoke(tmp_path):
    from dlop.data.make_dataset import main as make_dataset

    data = tmp_path / "data"
    assert make_dataset([str(data), "--classes", "3", "--per-class", "8", "--seed", "1"]) == 0
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "bench.offload", "--data", str(data), "--batch", "4", "--size", "32",
           "-k", "1", "-r", "1", "--batches", "3", "--scaling", "--pipelines", "dataloader,native,python",
           "--offloader", offloader(), "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["pipeline"] for r in rows] == ["dataloader", "native", "python", "native"]
    assert [r.get("offloaders") for r in rows if r["pipeline"] == "native"] == [1, 2]
    for r in rows:
        if "unavailable" in r:
            assert r["pipeline"] == "python", r  # only the generic path may be missing
            continue
        for field in FIELDS:
            assert field in r, (field, r)
        for field in FIELDS[2:]:
            assert math.isfinite(r[field]) and r[field] > 0, (field, r)
    assert "samples per CPU-second" in run.stdout and "scaling: 2 offloaders" in run.stdout


PEER_MODULES = {"dali_cpu": "nvidia.dali", "spdl": "spdl.io", "ray_data": "ray.data"}


def _installed(peer: str) -> bool:
    try:
        return importlib.util.find_spec(PEER_MODULES[peer]) is not None
    except ModuleNotFoundError:
        return False


def _peer_rows(rows: list[dict], peers: list[str]) -> None:
    """Each peer measured with the fields of every row where it is installed, else said to be missing."""
    for r in rows:
        if r["pipeline"] not in peers:
            continue
        if not _installed(r["pipeline"]):
            assert "unavailable" in r and "install_peers" in r["unavailable"], r
            continue
        assert "unavailable" not in r, r
        for field in FIELDS[2:]:
            assert math.isfinite(r[field]) and r[field] > 0, (field, r)


@pytest.mark.timeout(300)
def test_bench_offload_peers_smoke(tmp_path):
    """The image peers beside the DataLoader and native, each through the data check first."""
    from dlop.data.make_dataset import main as make_dataset

    data = tmp_path / "data"
    assert make_dataset([str(data), "--classes", "3", "--per-class", "8", "--seed", "1"]) == 0
    out = tmp_path / "rows.json"
    peers = ["dali_cpu", "spdl", "ray_data"]
    cmd = [sys.executable, "-m", "bench.offload", "--data", str(data), "--batch", "4", "--size", "32", "-k", "1",
           "-r", "1", "--batches", "3", "--pipelines", ",".join(["dataloader", "native", *peers]),
           "--offloader", offloader(), "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["pipeline"] for r in rows] == ["dataloader", "native", *peers]
    assert all("unavailable" not in r for r in rows[:2]), rows
    _peer_rows(rows, peers)
    measured = [r for r in rows if "unavailable" not in r]
    assert all(r["colour_gap"] >= 0 for r in measured), measured  # each passed the data check
    assert result["header"]["memcpy_gb_s"] > 0 and len(result["header"]["load_before"]) == 3
    assert "data check passed" in run.stdout
    if any(r["pipeline"] in peers for r in measured):
        assert "native vs the best peer per CPU-second" in run.stdout


def _media_run(tmp_path, kind: str, extra: list[str]) -> tuple[dict, str]:
    """The media benchmark on its built-in dataset, made small in a cache folder of the test's own."""
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "bench.offload", "--kind", kind, "-k", "1", "-r", "1", "--batch", "2",
           *extra, "--offloader", offloader(), "--json", str(out)]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text()), run.stdout


def _check_rows(rows: list[dict], names: list[str]) -> None:
    assert [r["pipeline"] for r in rows] == names
    for r in rows:
        if "unavailable" in r:
            assert not r["pipeline"].startswith("native"), r  # only a baseline's library may be missing
            continue
        for field in FIELDS:
            assert field in r, (field, r)
        for field in FIELDS[2:]:
            assert math.isfinite(r[field]) and r[field] > 0, (field, r)


@pytest.mark.timeout(180)
def test_bench_offload_video_smoke(tmp_path):
    if shutil.which("ffmpeg") is None:
        pytest.skip("the built-in clips are made with the ffmpeg command-line tool")
    result, stdout = _media_run(tmp_path, "video", ["--samples", "4", "--check-clips", "2"])
    _check_rows(result["rows"], ["native", "native_fast", "torchcodec", "pyav", "decode_floor", "spdl", "dali_cpu"])
    _peer_rows(result["rows"], ["spdl"])
    dali = result["rows"][-1]
    if _installed("dali_cpu"):  # its CPU reader does not decode these H.264 clips, and says so
        assert "h264" in dali["unavailable"], dali
    check = result["header"]["cross_check"]
    try:
        import torchcodec.decoders  # noqa: F401
    except Exception:
        assert "skipped" in check, check
        pytest.skip(f"torchcodec does not load here: {check['skipped']}")
    assert check["clips"] == 2 and check["frames"] == 32, check
    # Both decoders' frames are ffmpeg's frames at the same positions, each under its own RGB conversion: a frame
    # off by one, or a conversion flag changed, makes one of these fall below 1.
    assert check["native_vs_ffmpeg_bitexact_equal_fraction"] == 1.0, check
    assert check["torchcodec_vs_ffmpeg_default_equal_fraction"] == 1.0, check
    # With swscale's default conversion, dlop's frames are torchcodec's exact-mode frames, pixel for pixel.
    assert check["native_fast_equal_fraction"] == 1.0, check
    assert 0.0 <= check["equal_fraction"] <= 1.0 and check["max_abs_diff"] >= 0, check
    assert "cross-check" in stdout and "samples per CPU-second" in stdout
    if "unavailable" not in next(r for r in result["rows"] if r["pipeline"] == "decode_floor"):
        assert "bound: " in stdout


@pytest.mark.timeout(180)
def test_bench_offload_audio_smoke(tmp_path):
    if shutil.which("ffmpeg") is None:
        pytest.skip("the built-in audio files are made with the ffmpeg command-line tool")
    result, stdout = _media_run(tmp_path, "audio", ["--samples", "8"])
    _check_rows(result["rows"], ["native", "soundfile", "spdl"])
    _peer_rows(result["rows"], ["spdl"])
    assert result["header"]["spec"]["kind"] == "audio"
    assert "samples per CPU-second" in stdout
