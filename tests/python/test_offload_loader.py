"""dlop.data.OffloadLoader against two real dlop-offloader daemons: every batch
of an epoch bit-identical to the native pipeline run here on the same plan,
a daemon SIGKILLed mid-epoch costs nothing, a state_dict resumes mid-epoch,
and with no daemon the local fallback warns once and yields the same batches."""

from __future__ import annotations

import os
import subprocess
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
media = pytest.importorskip("dlop._C").media
if not hasattr(offload, "LeaseManager"):
    pytest.skip("dlop._C was built without the lease manager; rebuild it", allow_module_level=True)

from dlop.data import OffloadLoader  # noqa: E402

TOKEN = "offload-loader-test-token-0123456789"
SPEC = {
    "ops": [
        {"op": "random_resized_crop", "size": 32},
        {"op": "hflip", "p": 0.5},
        {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    ]
}
SEED, BATCH = 11, 4


def reference(dataset: str, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The plan's batches run by the native pipeline in this process."""
    source = media.open_source(dataset)
    pipeline = media.ImagePipeline(__import__("json").dumps(SPEC))
    plan = offload.EpochPlan(len(source), BATCH, SEED, True, False, 0, 1)
    out = []
    for indices in plan.batches(epoch):
        images, labels, _ = pipeline.run_batch(source, indices, seed=SEED, epoch=epoch)
        out.append((images, labels))
    return out


def collect(loader) -> list[tuple[np.ndarray, np.ndarray]]:
    # The tensors view pool buffers reused on the next step: copy them out.
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for k, ((gx, gy), (wx, wy)) in enumerate(zip(got, want)):
        assert gx.tobytes() == wx.tobytes(), f"batch {k}: images differ"
        assert np.array_equal(gy, wy), f"batch {k}: labels differ"


def make_loader(dataset, daemons, **kw) -> OffloadLoader:
    return OffloadLoader(dataset, SPEC, BATCH, shuffle=True, seed=SEED,
                         offloaders=[d.address for d in daemons], token=TOKEN, prefetch=3, **kw)


def test_epoch_is_bit_identical_to_the_local_pipeline(dataset, daemons):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # offloaded: no fallback warning
        loader = make_loader(dataset, daemons)
    assert loader.offloaded
    assert len(loader) == 5  # 18 samples, batches of 4, the last one of 2
    loader.set_epoch(2)
    got = collect(loader)
    assert got[0][0].shape == (4, 3, 32, 32) and got[0][0].dtype == np.float32
    assert_same(got, reference(dataset, 2))


def test_offloader_stats_reports_every_stage(dataset, daemons, tmp_path):
    loader = make_loader(dataset, daemons[:1])
    assert len(collect(loader)) == 5
    token_file = tmp_path / "stats-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    from dlop.cli import main as dlop_main
    import contextlib, io, json
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert dlop_main(["offloader-stats", daemons[0].address, "--token-file", str(token_file), "--json"]) == 0
    stats = json.loads(out.getvalue())
    by = {s["name"]: s for s in stats["stages"]}
    assert list(by) == ["read", "decode", "augment", "collate", "batch", "send"]
    for name in ("read", "decode", "augment", "collate"):
        assert by[name]["items"] == 18 and by[name]["seconds"] > 0, name
    assert by["batch"]["items"] == by["send"]["items"] == 5
    assert by["collate"]["bytes"] == 18 * 3 * 32 * 32 * 4
    assert stats["counters"]["batches_ready"] == 5
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert dlop_main(["offloader-stats", daemons[0].address, "--token-file", str(token_file)]) == 0
    assert "decode" in out.getvalue() and "items/s" in out.getvalue()


def test_a_daemon_killed_mid_epoch_still_gives_every_batch_once(dataset, daemons):
    loader = make_loader(dataset, daemons, lease_timeout=10.0)
    loader.set_epoch(1)
    got = []
    for k, (x, y) in enumerate(loader):
        got.append((x.numpy().copy(), y.numpy().copy()))
        if k == 1:
            daemons[0].kill()
    assert_same(got, reference(dataset, 1))


def test_resume_from_a_state_dict(dataset, daemons):
    loader = make_loader(dataset, daemons)
    loader.set_epoch(4)
    first = []
    for x, y in loader:
        first.append((x.numpy().copy(), y.numpy().copy()))
        if len(first) == 2:
            break
    state = loader.state_dict()
    assert state["epoch"] == 4 and state["position"] == 2
    fresh = make_loader(dataset, daemons[1:])
    fresh.load_state_dict(state)
    assert_same(first + collect(fresh), reference(dataset, 4))


def test_no_daemon_falls_back_locally_with_one_warning(dataset, tmp_path):
    with pytest.warns(RuntimeWarning, match="no dlop-offloader answered") as caught:
        loader = OffloadLoader(dataset, SPEC, BATCH, seed=SEED, offloaders=["127.0.0.1:1"], token=TOKEN,
                               fallback="warn", workers=2, connect_timeout=1.0)
        loader.set_epoch(3)
        got = collect(loader)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert not loader.offloaded
    assert_same(got, reference(dataset, 3))


def _torchvision():
    from dlop._torchvision_compat import import_torchvision

    try:
        return import_torchvision()
    except ImportError as e:
        pytest.skip(f"torchvision is not installed: {e}")


def test_offload_wraps_an_imagefolder_dataloader(dataset, daemons):
    tv = _torchvision()
    from dlop.data import offload as offload_loader

    T = tv.transforms
    transform = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    dl = torch.utils.data.DataLoader(tv.datasets.ImageFolder(dataset, transform=transform), batch_size=BATCH,
                                     shuffle=True)
    loader = offload_loader(dl, offloaders=[d.address for d in daemons], token=TOKEN, seed=SEED)
    loader.set_epoch(0)
    assert_same(collect(loader), reference(dataset, 0))

    odd = T.Compose([T.Lambda(lambda x: x), T.ToTensor()])
    dl = torch.utils.data.DataLoader(tv.datasets.ImageFolder(dataset, transform=odd), batch_size=BATCH)
    with pytest.raises(ValueError, match="Lambda has no native op"):
        offload_loader(dl, offloaders=[d.address for d in daemons], token=TOKEN, native_only=True)


TRACED = """
import json, sys
from dlop.data import OffloadLoader
spec, dataset, token = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
loader = OffloadLoader(dataset, spec, 4, shuffle=True, seed=11, offloaders=sys.argv[4:], token=token, prefetch=3)
assert loader.offloaded
print(sum(len(y) for _, y in loader))
"""


def test_trace_shows_every_lease_and_every_wait(dataset, daemons, tmp_path):
    """DLOP_TRACE: each batch's lease (PRODUCE to its answer), the time it waited ready, and the consumer's wait."""
    import json
    import sys

    trace_dir = tmp_path / "trace"
    out = subprocess.run([sys.executable, "-c", TRACED, json.dumps(SPEC), dataset, TOKEN,
                          *[d.address for d in daemons]],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "DLOP_TRACE": str(trace_dir)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "18"
    (trace_file,) = trace_dir.glob("dlop-trace-*.json")
    events = json.loads(trace_file.read_text())["traceEvents"]
    leases = [e for e in events if e["name"].startswith("lease ") and e["args"]["outcome"] == "landed"]
    ready = {e["args"]["batch"]: e for e in events if e["name"].startswith("ready ")}
    waits = [e for e in events if e["name"] == "data wait"]
    assert sorted(e["args"]["batch"] for e in leases) == list(range(5))  # one landed lease per batch
    assert sorted(ready) == list(range(5)) and len(waits) == 5
    addresses = {d.address for d in daemons}
    for lease in leases:
        assert lease["cat"] == "data" and lease["args"]["daemon"] in addresses
        assert lease["args"]["bytes"] > 0 and lease["dur"] >= 0
        # Ready from when it landed (a lease ends there) until consumed.
        r = ready[lease["args"]["batch"]]
        assert r["ts"] >= lease["ts"] + lease["dur"] - 1 and r["dur"] >= 0
    assert sorted(w["args"]["batch"] for w in waits) == list(range(5))


PACER = r"""
import sys
import torch
import torch.distributed as dist
import dlop  # noqa: F401  (registers the backend)
from dlop.data.offload_loader import _engine_pacer

print("before init:", _engine_pacer(None))
dist.init_process_group("dlop", init_method="file://" + sys.argv[1], rank=0, world_size=1)
pacer = _engine_pacer(None)
print("dlop:", type(pacer).__name__ if pacer is not None else None)
if pacer is not None:
    # No gradient all-reduce in flight: every byte asked for is granted.
    print("granted:", pacer.acquire(12345, 1000))
print("gloo:", _engine_pacer(dist.new_group(backend="gloo")))
print("off:", _engine_pacer(False))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("classes", ["1", "0"])
def test_the_loader_paces_against_the_default_dlop_group(tmp_path, classes):
    """OffloadLoader's pacer comes from the default group's dlop engine; none
    for a Gloo group, before init, when asked not to, or with DLOP_TRAFFIC_CLASSES=0."""
    import sys

    out = subprocess.run([sys.executable, "-c", PACER, str(tmp_path / "store")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "DLOP_TRAFFIC_CLASSES": classes})
    assert out.returncode == 0, out.stderr
    want = ["before init: None", "dlop: DataPacer" if classes == "1" else "dlop: None"]
    if classes == "1":
        want.append("granted: 12345")
    want += ["gloo: None", "off: None"]
    assert out.stdout.split("\n")[:-1] == want


def test_batches_on_an_accelerator_are_read_only_after_their_copy(dataset, daemons):
    """device="dlop_test:1": each batch lands in pinned memory, is copied on a side stream one batch
    ahead, and the current stream waits for that copy. The test accelerator's copies take 20 ms, so a
    consumer that read on its stream without that wait would read memory not yet written."""
    import dlop.testing.accelerator as accelerator

    device = torch.device("dlop_test", 1)
    previous = accelerator.configure(delay_us=20_000)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader = make_loader(dataset, daemons, device=str(device))
            got = []
            for x, y in loader:
                assert x.device == device and y.device == device
                got.append((x.cpu().numpy(), y.cpu().numpy()))  # read on the current stream
        assert_same(got, reference(dataset, 0))
    finally:
        accelerator.configure(**previous)
