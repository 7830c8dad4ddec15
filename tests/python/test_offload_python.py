"""The generic Python path: a picklable Dataset + collate_fn run by real
dlop-offloader daemons' Python workers. Every batch equals the one the local
fallback makes (same seeds, same structure, same bytes), a daemon SIGKILLed
mid-epoch costs nothing, batches of varying size grow the pool, a state_dict
resumes mid-epoch, and bad input fails with a message naming it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from processes import Daemon, wait_for

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
if not hasattr(offload, "LeaseManager"):
    pytest.skip("dlop._C was built without the lease manager; rebuild it", allow_module_level=True)

import dlop  # noqa: E402
from dlop.data import OffloadLoader  # noqa: E402

pytestmark = pytest.mark.long_file(seconds=100)  # handed out first (conftest.py)

TOKEN = "offload-python-test-token-0123456789"
SEED = 5


class Mixed(torch.utils.data.Dataset):
    """Tensors of several dtypes, a random augmentation, a string and a numpy array per sample."""

    def __init__(self, n: int = 37) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) + i
        return {
            "image": g + torch.rand(2, 3, 4),  # the per-batch seed makes this reproducible
            "half": (g * 0.5).to(torch.bfloat16),
            "mask": g.to(torch.int64) % 3 == 0,
            "label": i,
            "name": f"sample-{i}",
            "raw": np.full(3, i, dtype=np.int16),
        }


class Ragged(torch.utils.data.Dataset):
    """Samples whose size grows with the index: batches of different byte sizes."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int):
        return torch.full((i * 500 + 1,), i, dtype=torch.int32)


def keep_list(samples):
    return list(samples)


class Failing(Mixed):
    def __getitem__(self, i: int):
        if i == 13:
            raise ZeroDivisionError("sample 13 is broken on purpose")
        return super().__getitem__(i)


class LoadsSlowly(Mixed):
    """Unpickling waits for a gate file: the daemon's worker is still loading the job."""

    def __init__(self, gate: Path, loading: Path) -> None:
        super().__init__()
        self.gate, self.loading = str(gate), str(loading)

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        Path(self.loading).touch()
        deadline = time.monotonic() + 120
        while not Path(self.gate).exists() and time.monotonic() < deadline:
            time.sleep(0.02)


class Unpicklable(Mixed):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def python_daemon(token_file: Path, *extra: str, python: str = sys.executable) -> Daemon:
    """A dlop-offloader whose Python workers run `python` (this interpreter imports dlop)."""
    return Daemon(token_file, "--python", python, *extra)


@pytest.fixture()
def token_file(tmp_path) -> Path:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


@pytest.fixture()
def daemons(token_file):
    ds = [python_daemon(token_file), python_daemon(token_file)]
    yield ds
    for d in ds:
        d.kill()


def detach(batch):
    """A copy that outlives the pool slot the batch views."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, dict):
        return {k: detach(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(detach(v) for v in batch)
    return batch


def assert_same(got, want) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)
    else:
        assert got == want


def local(dataset, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        loader = OffloadLoader(dataset=dataset, seed=SEED, workers=2, **kw)
    assert not loader.offloaded
    return [detach(b) for b in loader]


def remote(dataset, daemons, **kw) -> OffloadLoader:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loader = OffloadLoader(dataset=dataset, seed=SEED, offloaders=[d.address for d in daemons], token=TOKEN,
                               connect_timeout=60.0, **kw)
    assert loader.offloaded, "\n".join([str(w.message) for w in said] + [d.output() for d in daemons])
    return loader


def test_epoch_equals_the_local_fallback_and_holds_every_sample_once(daemons):
    want = local(Mixed(), batch_size=8)
    got = [detach(b) for b in remote(Mixed(), daemons, batch_size=8)]
    assert len(got) == 5  # 37 samples: 4 of 8 and one of 5
    for g, w in zip(got, want):
        assert_same(g, w)
    labels = sorted(int(i) for b in got for i in b["label"])
    assert labels == list(range(37))
    # The augmentation drew something, and the same thing on both sides.
    assert not torch.equal(got[0]["image"], got[0]["image"].floor())


def test_the_daemon_serves_other_clients_while_a_python_dataset_loads(token_file, tmp_path):
    """Loading a job (torch imported, the dataset unpickled) takes seconds; the daemon's event loop goes on."""
    d = python_daemon(token_file)
    gate, loading = tmp_path / "gate", tmp_path / "loading"
    made: dict = {}

    def configure() -> None:
        try:
            made["loader"] = remote(LoadsSlowly(gate, loading), [d], batch_size=8)
        except BaseException as e:  # noqa: BLE001 - the test thread reports it
            made["error"] = e

    trainer = threading.Thread(target=configure)
    trainer.start()
    try:
        deadline = time.monotonic() + 120
        while not loading.exists():
            assert time.monotonic() < deadline and trainer.is_alive(), made.get("error", "the worker never loaded")
            time.sleep(0.02)
        host, port = d.address.rsplit(":", 1)
        stats = offload.daemon_stats(host, int(port), TOKEN, 20.0)  # answered while the job still loads
        assert stats["counters"]["open_connections"] == 2  # the trainer's and this one
        gate.touch()
        trainer.join(120)
        assert "error" not in made, made.get("error")
        got = [detach(b) for b in made["loader"]]
        for g, w in zip(got, local(Mixed(), batch_size=8), strict=True):
            assert_same(g, w)
    finally:
        gate.touch()
        trainer.join(120)
        d.kill()


def test_a_daemon_killed_mid_epoch_still_gives_every_batch_once(daemons):
    want = local(Mixed(), batch_size=4)
    loader = remote(Mixed(), daemons, batch_size=4)
    got = []
    for k, b in enumerate(loader):
        got.append(detach(b))
        if k == 2:
            daemons[0].kill()
    assert len(got) == len(want) == 10
    for g, w in zip(got, want):
        assert_same(g, w)


def test_batches_of_varying_size_grow_the_pool(daemons):
    want = local(Ragged(), batch_size=5, collate_fn=keep_list, shuffle=False)
    got = [detach(b) for b in remote(Ragged(), daemons, batch_size=5, collate_fn=keep_list, shuffle=False)]
    assert [len(b) for b in got] == [5, 5, 5, 5, 3]
    assert got[-1][-1].numel() == 22 * 500 + 1
    for g, w in zip(got, want):
        assert_same(g, w)


def test_resume_from_a_state_dict(daemons):
    want = local(Mixed(), batch_size=4, drop_last=True)
    loader = remote(Mixed(), daemons, batch_size=4, drop_last=True)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    it.close()
    again = remote(Mixed(), daemons[1:], batch_size=4, drop_last=True)
    again.load_state_dict(state)
    rest = [detach(b) for b in again]
    assert len(rest) == len(want) - 3
    for g, w in zip(rest, want[3:]):
        assert_same(g, w)


def test_an_exception_in_the_dataset_is_raised_in_the_trainer_naming_it(daemons):
    loader = remote(Failing(), daemons, batch_size=4, shuffle=False)
    with pytest.raises(Exception, match="ZeroDivisionError: sample 13 is broken on purpose"):
        for _ in loader:
            pass


def test_an_unpicklable_dataset_is_refused_before_any_work():
    with pytest.raises(ValueError, match="cannot be pickled"):
        OffloadLoader(dataset=Unpicklable(), batch_size=4)


def test_a_daemon_without_python_is_refused_with_the_reason(token_file):
    d = python_daemon(token_file, "--no-python")
    try:
        with pytest.raises(dlop.NoOffloaderError, match=f"{d.address} refused: .*runs no Python"):
            OffloadLoader(dataset=Mixed(), batch_size=8, offloaders=[d.address], token=TOKEN)
        with pytest.warns(RuntimeWarning, match="runs no Python"):
            loader = OffloadLoader(dataset=Mixed(), batch_size=8, offloaders=[d.address], token=TOKEN, fallback="warn")
        assert not loader.offloaded
    finally:
        d.kill()


def test_a_daemon_whose_python_cannot_start_workers_says_so(token_file):
    d = python_daemon(token_file, python="/bin/false")
    try:
        with pytest.raises(dlop.NoOffloaderError, match="did not start.*is dlop importable by that Python"):
            OffloadLoader(dataset=Mixed(), batch_size=8, offloaders=[d.address], token=TOKEN)
        assert d.proc.poll() is None  # the daemon itself goes on
        children = [c for t in Path(f"/proc/{d.proc.pid}/task").iterdir() for c in (t / "children").read_text().split()]
        assert children == []  # the refused workers were reaped, no zombies
    finally:
        d.kill()


class KillsItsWorker(torch.utils.data.Dataset):
    """Ends any process but the one that made it: every Python worker of a daemon dies at its first sample."""

    def __init__(self) -> None:
        self.parent = os.getpid()

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i):
        if os.getpid() != self.parent:
            os._exit(3)
        return torch.tensor([i])


def test_a_daemon_that_fails_every_batch_is_dropped_not_asked_forever(token_file):
    # Its workers gone, the daemon fails each batch as its own failure: asked
    # again and again, the epoch would never end.
    d = python_daemon(token_file)
    try:
        loader = remote(KillsItsWorker(), [d], batch_size=4, shuffle=False)
        with pytest.raises(dlop.NoOffloaderError):
            for _ in loader:
                pass
        assert loader.stats().leases_reissued <= 3
        assert d.proc.poll() is None  # the daemon itself goes on
    finally:
        d.kill()


SCRIPT = """
import sys, torch
from dlop.data import OffloadLoader

class InMain(torch.utils.data.Dataset):  # pickled by value: the daemon cannot import __main__
    def __len__(self): return 10
    def __getitem__(self, i): return torch.tensor([i, i * i])

loader = OffloadLoader(dataset=InMain(), batch_size=4, shuffle=False, offloaders=[sys.argv[1]],
                       token=sys.argv[2], connect_timeout=60.0)
assert loader.offloaded
print([b[:, 1].tolist() for b in loader])
"""


def test_a_dataset_defined_in_a_scripts_main_travels_by_value(daemons, tmp_path):
    pytest.importorskip("cloudpickle")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), daemons[0].address, TOKEN], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]"


def test_a_gpu_device_without_cuda_is_refused_by_name():
    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU: test_batches_arrive_on_the_gpu covers it")
    with pytest.raises(ValueError, match="device cuda asked for, but this torch has no usable cuda device"):
        OffloadLoader(dataset=Mixed(), batch_size=4, device="cuda")
    with pytest.raises(ValueError, match="device meta asked for, but this torch has no usable meta device"):
        OffloadLoader(dataset=Mixed(), batch_size=4, device="meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the GPU machine)")
def test_batches_arrive_on_the_gpu_equal_to_the_cpu_ones(daemons):
    want = local(Mixed(), batch_size=8)
    loader = remote(Mixed(), daemons, batch_size=8, device="cuda")
    got = []
    for b in loader:
        assert b["image"].is_cuda and b["half"].is_cuda
        got.append(detach(b))
        torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert torch.equal(g["image"].cpu(), w["image"]) and torch.equal(g["half"].cpu(), w["half"])
        assert torch.equal(g["label"].cpu(), w["label"]) and g["name"] == w["name"]


def test_a_daemon_joins_without_stopping_the_training_loop(token_file, tmp_path):
    """add_offloader(wait=False): the joiner loads the job (here until a gate opens) while batches keep
    coming from the first daemon; it gets work once ready, and the epoch holds every sample once."""
    gate, loading = tmp_path / "gate", tmp_path / "loading"
    first, second = python_daemon(token_file), python_daemon(token_file)
    try:
        gate.touch()
        loader = remote(LoadsSlowly(gate, loading), [first], batch_size=1, prefetch=2)
        gate.unlink()
        loading.unlink()
        said = []
        started = time.monotonic()
        loader.add_offloader(second.address, wait=False, joined=lambda a, e: said.append((a, e)))
        loader.add_offloader("127.0.0.1:1", wait=False, joined=lambda a, e: said.append((a, e)))
        assert time.monotonic() - started < 10  # a wait would last until the gate opens below: never
        labels, it = [], iter(loader)
        labels += [int(i) for i in next(it)["label"]]
        wait_for(loading.exists, 60, "the joiner to load the job")
        for _ in range(4):  # the joiner is stuck loading: these come from the first daemon, unhindered
            labels += [int(i) for i in next(it)["label"]]
        assert [a for a, _ in said] == ["127.0.0.1:1"]
        assert "127.0.0.1:1" in str(said[0][1])
        gate.touch()
        for batch in it:
            labels += [int(i) for i in batch["label"]]
            if len(said) < 2:
                time.sleep(0.2)  # a slow step, so that the joiner is ready before the epoch ends
        assert sorted(labels) == list(range(37))
        assert said[1] == (second.address, None)
        assert [o.address for o in loader.stats().offloaders] == [first.address, second.address]
    finally:
        first.kill()
        second.kill()


EXITS_WHILE_JOINING = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from test_offload_python import LoadsSlowly, SEED, TOKEN
from dlop.data import OffloadLoader
gate, loading = Path(sys.argv[2]), Path(sys.argv[3])
loader = OffloadLoader(dataset=LoadsSlowly(gate, loading), seed=SEED, offloaders=[sys.argv[4]], token=TOKEN,
                       batch_size=1, connect_timeout=60.0)
assert loader.offloaded
gate.unlink()
loading.unlink()
it = iter(loader)
next(it)
loader.add_offloader(sys.argv[5], wait=False)
while not loading.exists():
    time.sleep(0.02)
print("exiting", flush=True)
"""


def test_a_script_that_ends_while_a_daemon_joins_exits_cleanly(token_file, tmp_path):
    """The script is done while the joiner still loads the job: its exit waits for the join (then
    drops it) rather than abort the process with the join stopped inside the native call."""
    gate, loading = tmp_path / "gate", tmp_path / "loading"
    first, second = python_daemon(token_file), python_daemon(token_file)
    try:
        gate.touch()
        proc = subprocess.Popen([sys.executable, "-c", EXITS_WHILE_JOINING, str(Path(__file__).parent), str(gate),
                                 str(loading), first.address, second.address],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.stdout.readline().strip() != "exiting":
            proc.kill()
            pytest.fail(f"the script did not get to its end: {proc.communicate()[1][-3000:]}")
        time.sleep(0.5)  # the interpreter is finalizing, the join still in flight
        assert proc.poll() is None
        gate.touch()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "terminate" not in err, err[-3000:]
    finally:
        first.kill()
        second.kill()


class Flipped(torch.utils.data.Dataset):
    """Uses torchvision in the worker only when a sample is made: the worker imports it on demand,
    through dlop's shim where this torchvision was built for another torch."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        import torchvision.transforms.functional as TF

        return TF.hflip(torch.arange(6.0).reshape(1, 2, 3) + i), i


def test_a_dataset_that_imports_torchvision_in_the_workers(daemons):
    got = [detach(b) for b in remote(Flipped(), daemons[:1], batch_size=3, shuffle=False)]
    images = torch.cat([g[0] for g in got])
    labels = torch.cat([g[1] for g in got])
    assert labels.tolist() == list(range(6))
    want = torch.stack([(torch.arange(6.0).reshape(1, 2, 3) + i).flip(-1) for i in range(6)])
    assert torch.equal(images, want)


class _Interrupted(Exception):
    pass


def _interrupt(*_) -> None:
    raise _Interrupted


def test_a_signal_reaches_python_while_the_loader_waits_for_a_batch(token_file):
    """The wait for a batch runs in C++ without the GIL: a signal's Python handler (Ctrl-C, a test's
    timeout) still runs within a moment, and what it raises leaves the loop, long before any lease
    times out."""
    d = python_daemon(token_file)
    before = signal.signal(signal.SIGUSR1, _interrupt)
    try:
        loader = remote(Mixed(), [d], batch_size=1, prefetch=2, lease_timeout=120.0)
        it = iter(loader)
        next(it)
        d.proc.send_signal(signal.SIGSTOP)  # alive, socket open, answers nothing
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        started = time.monotonic()
        with pytest.raises(_Interrupted):
            for _ in it:
                pass
        assert time.monotonic() - started < 60
    finally:
        signal.signal(signal.SIGUSR1, before)
        d.proc.send_signal(signal.SIGCONT)
        d.kill()
