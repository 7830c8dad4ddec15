"""Video clips and audio features through dlop.data.OffloadLoader and real
dlop-offloader daemons: each epoch bit-identical to the batch maker run in
this process, with lengths and multi-hot labels, also when a daemon is
SIGKILLed mid-epoch, and the same from the local fallback."""

from __future__ import annotations

import json
import warnings
import wave

import numpy as np
import pytest

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
media = pytest.importorskip("dlop._C").media

from dlop.data import OffloadLoader  # noqa: E402
from dlop.data.make_video import make_video_dataset  # noqa: E402
from test_offload_loader import TOKEN  # noqa: E402  (the daemons fixture is in conftest.py)

SEED, BATCH = 5, 3
AUDIO = {"kind": "audio", "seconds": 1.5, "n_mels": 40, "freq_masks": 1, "freq_mask_width": 8,
         "time_masks": 1, "time_mask_width": 20}
VIDEO = {"kind": "video", "frames": 4, "stride": 2, "views": 2, "short_side": [40, 56], "crop": 32, "hflip": 0.5}


@pytest.fixture(scope="module")
def audio_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("audio")
    rng = np.random.default_rng(0)
    lines = ["path,labels"]
    for k in range(7):
        seconds = [0.4, 1.0, 2.2][k % 3]
        pcm = (0.3 * np.sin(2 * np.pi * (200 + 50 * k) * np.arange(int(16000 * seconds)) / 16000)
               + 0.01 * rng.standard_normal(int(16000 * seconds)))
        with wave.open(str(root / f"{k}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes((pcm * 32767).astype("<i2").tobytes())
        lines.append(f"{k}.wav," + ";".join(["speech", "music", "noise"][: 1 + k % 3]))
    (root / "m.csv").write_text("\n".join(lines) + "\n")
    return str(root / "m.csv")


@pytest.fixture(scope="module")
def video_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("video")
    make_video_dataset(root, classes=2, clips_per_class=3, seed=1)
    return str(root)


def reference(source_path, spec, epoch):
    maker = media.BatchMaker(json.dumps(spec))
    source = media.open_source(source_path, maker.kind)
    plan = offload.EpochPlan(len(source), BATCH, SEED, True, False, 0, 1)
    out = []
    for indices in plan.batches(epoch):
        samples, labels, lengths, _ = maker.run_batch(source, indices, seed=SEED, epoch=epoch)
        if lengths is not None:
            out.append((samples[..., : lengths.max() if len(lengths) else 0], labels, lengths))
        else:
            out.append((samples, labels))
    return out


def collect(loader):
    return [tuple(t.numpy().copy() for t in batch) for batch in loader]


def assert_same(got, want):
    assert len(got) == len(want) > 0
    for k, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), f"batch {k}: {len(g)} tensors, not {len(w)}"
        for a, b in zip(g, w):
            assert a.shape == b.shape and a.tobytes() == b.tobytes(), f"batch {k} differs"


@pytest.mark.parametrize("kind", ["audio", "video"])
def test_offloaded_epochs_equal_the_batch_maker_even_when_a_daemon_dies(kind, audio_set, video_set, daemons):  # noqa: F811
    path, spec = (audio_set, AUDIO) if kind == "audio" else (video_set, VIDEO)
    loader = OffloadLoader(path, spec, BATCH, seed=SEED, offloaders=[d.address for d in daemons], token=TOKEN)
    assert loader.offloaded
    loader.set_epoch(1)
    assert_same(collect(loader), reference(path, spec, 1))
    loader.set_epoch(2)
    got = []
    for k, batch in enumerate(loader):
        got.append(tuple(t.numpy().copy() for t in batch))
        if k == 0:
            daemons[0].kill()
    assert_same(got, reference(path, spec, 2))


def test_audio_batches_carry_lengths_and_multi_hot_labels(audio_set):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no daemon: the local fallback
        loader = OffloadLoader(audio_set, AUDIO, BATCH, seed=SEED, shuffle=False, workers=1)
    assert not loader.offloaded
    batches = collect(loader)
    plan = offload.EpochPlan(7, BATCH, SEED, False, False, 0, 1)
    assert plan.batches(0)[0] == [0, 1, 2]
    features, labels, lengths = batches[0]
    assert labels.tolist() == [[0, 0, 1], [1, 0, 1], [1, 1, 1]]  # classes sorted: music, noise, speech
    assert lengths.tolist() == [1 + 6400 // 160, 101, 151]
    assert features.shape == (3, 40, 151)
    assert not features[0, :, lengths[0]:].any()


def test_video_from_the_local_fallback_equals_the_batch_maker(video_set):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        loader = OffloadLoader(video_set, VIDEO, BATCH, seed=SEED, workers=1)
    got = collect(loader)
    assert_same(got, reference(video_set, VIDEO, 0))
    assert got[0][0].shape == (BATCH, 2, 3, 4, 32, 32) and got[0][0].dtype == np.uint8


def test_packed_video_carries_its_frame_index_and_gives_the_same_batches(video_set, tmp_path):
    from dlop.data.pack import pack

    out = tmp_path / "clips.dlrec"
    stats = pack(video_set, str(out), kind="video")
    folder, records = media.open_source(video_set, "video"), media.open_source(str(out))
    assert stats["records"] == len(folder) == len(records) and records.classes == folder.classes
    maker = media.BatchMaker(json.dumps(VIDEO))
    indices = list(range(len(folder)))
    a, b = maker.run_batch(folder, indices, seed=3, epoch=1), maker.run_batch(records, indices, seed=3, epoch=1)
    assert a[0].tobytes() == b[0].tobytes() and a[1].tolist() == b[1].tolist()
    assert [records.read(i) for i in indices] == [folder.read(i) for i in indices]


def test_a_packed_manifest_keeps_labels_and_time_spans(audio_set, tmp_path):
    from dlop.data.pack import pack

    root = tmp_path / "m.jsonl"
    lines = [{"path": f"{audio_set.rsplit('/', 1)[0]}/{k}.wav", "labels": ["a", "b"][: 1 + k % 2],
              "start": 0.1 * k, "end": 0.1 * k + 0.3} for k in range(4)]
    root.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    pack(str(root), str(tmp_path / "m.dlrec"), kind="audio")
    manifest, records = media.open_source(str(root)), media.open_source(str(tmp_path / "m.dlrec"))
    assert records.multi_label and records.classes == manifest.classes == ["a", "b"]
    for i in range(4):
        assert records.labels(i) == manifest.labels(i)
        assert records.time_span(i) == pytest.approx(manifest.time_span(i))
    maker = media.BatchMaker(json.dumps(AUDIO))
    a, b = maker.run_batch(manifest, [0, 1, 2, 3], seed=1), maker.run_batch(records, [0, 1, 2, 3], seed=1)
    # 0.3 s spans are 31 frames, but file 3 lasts 0.4 s: its span 0.3-0.6 s holds 0.1 s.
    assert a[0].tobytes() == b[0].tobytes() and a[2].tolist() == b[2].tolist() == [31, 31, 31, 11]


@pytest.mark.parametrize("kind", ["audio", "video"])
def test_bad_files_are_skipped_by_every_daemon_alike_and_the_epoch_stays_exactly_once(
        kind, audio_set, video_set, daemons, tmp_path):  # noqa: F811
    """A corrupt file and a truncated one: the skip policy leaves exactly those out, on every daemon alike
    (batches equal the batch maker's), and the daemons keep serving."""
    import shutil

    src = audio_set.rsplit("/", 1)[0] if kind == "audio" else video_set
    root = tmp_path / "data"
    shutil.copytree(src, root)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in (".csv",))
    files[1].write_bytes(b"not a media file at all")
    files[3].write_bytes(files[3].read_bytes()[: 200])
    if kind == "audio":
        (root / "m.csv").write_text("path,label\n" + "".join(f"{p.name},x\n" for p in files))
        path, spec = str(root / "m.csv"), {**AUDIO, "on_error": "skip"}
    else:
        path, spec = str(root), {**VIDEO, "on_error": "skip"}
    source = media.open_source(path, kind)
    loader = OffloadLoader(path, spec, BATCH, seed=SEED, offloaders=[d.address for d in daemons], token=TOKEN)
    assert loader.offloaded
    got = collect(loader)
    want = reference(path, spec, 0)
    assert_same(got, want)
    assert sum(len(b[0]) for b in got) == len(source) - 2
    loader.set_epoch(1)
    assert sum(len(b[0]) for b in collect(loader)) == len(source) - 2  # the daemons still serve


@pytest.mark.parametrize("offloaded", [True, False])
def test_a_transcript_manifest_gives_each_batch_its_transcripts(audio_set, tmp_path, daemons, offloaded):  # noqa: F811
    """Transcripts stay on the trainer: each batch's are those of its plan's samples, in order, less skipped ones."""
    folder = audio_set.rsplit("/", 1)[0]
    words = ["zero one", "one, two", 'say "three"', "four", "five six seven", "", "eight"]
    (tmp_path / "bad.wav").write_bytes(b"corrupt")
    lines = [{"path": f"{folder}/{k}.wav", "transcript": w} for k, w in enumerate(words)]
    lines.insert(2, {"path": str(tmp_path / "bad.wav"), "transcript": "never seen"})
    manifest = tmp_path / "speech.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    csv_manifest = tmp_path / "speech.csv"
    import csv

    with open(csv_manifest, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["path", "transcript"])
        out.writerows([line["path"], line["transcript"]] for line in lines)
    spec = {**AUDIO, "on_error": "skip"}
    for path in (manifest, csv_manifest):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            loader = OffloadLoader(str(path), spec, BATCH, seed=SEED, workers=1, token=TOKEN,
                                   offloaders=[d.address for d in daemons] if offloaded else [])
        assert loader.offloaded == offloaded
        plan = offload.EpochPlan(len(lines), BATCH, SEED, True, False, 0, 1)
        texts = [line["transcript"] for line in lines]
        want = [[texts[i] for i in b if i != 2] for b in plan.batches(0)]
        got = [(features.shape[0], list(transcripts), lengths.tolist()) for features, transcripts, lengths in loader]
        assert [g[1] for g in got] == want
        assert all(n == len(t) == len(lengths) for n, t, lengths in got)
