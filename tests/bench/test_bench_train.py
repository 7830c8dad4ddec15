"""python -m bench.train end to end on a tiny run (tiny model, few steps, this host): every config's row,
the JSON and the markdown agreeing, each row's samples/s counting the very samples the sampler's order puts in
the timed steps (no warm-up batch, none lost or counted twice), a real PNG, and a bad --link refused; the same
for --kind video on built-in clips made for the test."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from processes import offloader

pytest.importorskip("torch")
pytest.importorskip("dlop._C")
pytest.importorskip("matplotlib")

from bench.train import train, train_report  # noqa: E402

pytestmark = pytest.mark.long_file(seconds=95)  # handed out first (conftest.py)

POSITIVE = ("samples_per_s", "step_ms", "compute_ms", "allreduce_p50_ms", "allreduce_p99_ms",
            "allreduce_p99_idle_ms", "allreduce_p99_replay_ms")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def _timed_labels_sha1(data: Path, config: str, world: int, batch: int, warmup: int, steps: int) -> str:
    """bench.train's labels_sha1 as the loader's order dictates: per rank, epoch after epoch (the last
    incomplete batch dropped), the batches after the warm-up ones; labels by ImageFolder's class order. The
    DataLoader rows follow DistributedSampler(seed 0), the offloaded rows dlop's own EpochPlan (seed 0)."""
    import hashlib

    from torch.utils.data import DistributedSampler

    from bench.train.train_device_data import class_folder
    from dlop import _C

    labels = [label for _, label in class_folder(str(data))]
    epochs = -(-(warmup + steps) * batch * world // len(labels)) + 1
    per_rank = []
    for rank in range(world):
        order = []
        for epoch in range(epochs):
            if config.startswith("dlop_offload"):
                plan = _C.offload.EpochPlan(len(labels), batch, 0, True, True, rank, world, [])
                order += [i for b in plan.batches(epoch) for i in b]
            else:
                sampler = DistributedSampler(labels, world, rank, shuffle=True, seed=0, drop_last=True)
                sampler.set_epoch(epoch)
                per_epoch = list(sampler)
                order += per_epoch[:len(per_epoch) // batch * batch]
        timed = order[warmup * batch:(warmup + steps) * batch]
        per_rank.append(f"{rank}:" + ",".join(str(labels[i]) for i in timed))
    return hashlib.sha1(";".join(per_rank).encode()).hexdigest()


def test_bench_train_tiny_run(tmp_path, capsys):
    from dlop.data.make_dataset import main as make_dataset

    data = tmp_path / "data"
    assert make_dataset([str(data), "--classes", "2", "--per-class", "12", "--seed", "1"]) == 0
    out, report = tmp_path / "rows.json", tmp_path / "report"
    assert train.main(["--data", str(data), "--ranks", "2", "--batch", "4", "--size", "32", "--hidden", "16",
                       "--steps", "3", "--warmup", "1", "--idle-reps", "2", "--offloader", offloader(),
                       "--json", str(out), "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "offloaded batches travel as uint8" in printed

    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == list(train.CONFIGS)
    for r in rows:
        for key in train_report.COLUMNS:
            assert key in r and math.isfinite(r[key]) and r[key] >= 0, (key, r)
        for key in POSITIVE:
            assert r[key] > 0, (key, r)
        assert r["ranks"] == 2 and r["buckets"] >= 1
        assert r["step_ms"] >= r["compute_ms"]
        # The samples counted are those trained on in the timed steps, in the sampler's order (dlop's order is
        # DistributedSampler's): a warm-up batch counted, a batch lost or one seen twice changes the digest.
        assert r["samples"] == 2 * 4 * 3, r
        assert r["labels_sha1"] == _timed_labels_sha1(data, r["config"], 2, 4, 1, 3), r["config"]
        assert r["allreduce_p99_ms"] >= r["allreduce_p50_ms"]
        # samples/s and step_ms describe the same steps: ranks x batch per step time, within the ranks' skew
        assert r["samples_per_s"] == pytest.approx(2 * 4 * 1e3 / r["step_ms"], rel=0.5)

    # The markdown's table holds the JSON's figures, as the report prints them.
    md = (report / "train.md").read_text()
    for r in rows:
        line = next(x for x in md.splitlines() if x.startswith(f"| {r['config']} |"))
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        assert cells == [train_report.cell(k, r[k]) for k in train_report.COLUMNS], (line, r)
    assert _png_size(report / "train.png") == train_report.PNG_SIZE


def test_bench_train_tiny_video_run(tmp_path, monkeypatch, capsys):
    pytest.importorskip("av")
    import shutil

    if shutil.which("ffmpeg") is None:
        pytest.skip("the built-in clips are made with the ffmpeg command-line tool")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the built-in clips, made here
    out = tmp_path / "rows.json"
    assert train.main(["--kind", "video", "--clips", "20", "--ranks", "2", "--batch", "2", "--frames", "4",
                       "--size", "24", "--short-side", "28,32", "--hidden", "8", "--stem-stride", "2", "--steps", "2",
                       "--warmup", "1", "--idle-reps", "2", "--configs", "stock,dlop_offload",
                       "--offloader", offloader(), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "clips of 4 frames at stride 2" in printed and "3D CNN" in printed
    assert (tmp_path / "cache/dlop/bench-train-video-10x2/class9/clip1.mp4").is_file()

    saved = json.loads(out.read_text())
    header, rows = saved["header"], saved["rows"]
    assert header["benchmark"] == "train_video" and header["kind"] == "video"
    assert header["clip"] == {"frames": 4, "stride": 2, "short_side": [28, 32], "crop": 24, "hflip": 0.5}
    assert header["sample_values"] == 3 * 4 * 24 * 24
    assert [r["config"] for r in rows] == ["stock", "dlop_offload"]
    # a 3D stem of 16 x 3 x 3 x 7 x 7 (+ 16) and the head 1152 -> 8 -> 8 -> 10, in float32
    params = 16 * 3 * 3 * 7 * 7 + 16 + 1152 * 8 + 8 + 8 * 8 + 8 + 8 * 10 + 10
    for r in rows:
        for key in train_report.COLUMNS:
            assert key in r and math.isfinite(r[key]) and r[key] >= 0, (key, r)
        for key in POSITIVE:
            assert r[key] > 0, (key, r)
        assert r["gradient_mib"] == pytest.approx(4 * params / 2**20)
        assert r["samples"] == 2 * 2 * 2, r  # ranks x batch x timed steps, counted from the batches trained on
        clips = tmp_path / "cache/dlop/bench-train-video-10x2"
        assert r["labels_sha1"] == _timed_labels_sha1(clips, r["config"], 2, 2, 1, 2), r["config"]
    assert any(line.startswith("dlop_offload / stock samples/s") for line in saved["header"]["ratios"])


@pytest.mark.parametrize("link, why", [("fast", "not a tc rate"), ("1gbit,soon", "not a tc delay"),
                                       ("1gbit", "give --hosts too")])
def test_bench_train_refuses_a_bad_link(link, why, capsys):
    with pytest.raises(SystemExit) as exit_:
        train.main(["--link", link])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--link" in err and why in err, err


def test_bench_train_refuses_a_delay_without_netem(capsys):
    from bench.common import netns

    if not netns.available()[0]:
        pytest.skip(f"network namespaces: {netns.available()[1]}")
    if netns.netem_available():
        pytest.skip("this kernel has netem: a delay is shaped, not refused")
    with pytest.raises(SystemExit) as exit_:
        train.main(["--hosts", "2", "--link", "1gbit,100us", "--configs", "stock"])
    assert "no netem" in str(exit_.value) and "--link 1gbit,100us" in str(exit_.value)


@pytest.mark.parametrize("argv, why", [(["--configs", "stock,fast"], "unknown config(s) fast"),
                                       (["--kind", "video", "--short-side", "64"], "give MIN,MAX"),
                                       (["--kind", "video", "--size", "72"], "need --size 72 <= MIN <= MAX"),
                                       (["--hosts", "1"], "leaves no trainer host"),
                                       (["--steps", "0"], "must be at least 1")])
def test_bench_train_refuses_bad_arguments(argv, why, capsys):
    with pytest.raises(SystemExit) as exit_:
        train.main(argv)
    assert exit_.value.code == 2
    assert why in capsys.readouterr().err
