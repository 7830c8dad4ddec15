"""`dlop run -- python train.py`: an unmodified script's DataLoader, offloaded.

The script below knows nothing of dlop (only torchvision's import needs this
environment's workaround, and two optional pauses let the test act at a known
point). Each sample is identified by a digest of its image tensor and its
label. Under `dlop run` the epochs must hold exactly the samples of the plain
run, in dlop's plan order (computed here by dlop._C.offload.EpochPlan), and
the work must be the daemon's: its log shows the dataset configured, and the
trainer's exit line counts every batch as made by dlop-offloader. With an
unreachable offloader the script warns once and its output is the plain
run's, byte for byte (torch's own order)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processes import Daemon, wait_for
from torchrun_jobs import alive, kill_leftovers

pytestmark = pytest.mark.long_file(seconds=150)  # handed out first (conftest.py)

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
media = pytest.importorskip("dlop._C").media

from dlop.cli import main as dlop_main  # noqa: E402

TOKEN = "dlop-run-test-token-0123456789abcdef"
BIN = Path(sys.executable).parent

SCRIPT = r'''
import hashlib, json, os, sys, time
import torch

try:
    import torchvision
except RuntimeError:  # this CPU torch cannot load torchvision's C++ ops: declare the two it registers
    for m in [m for m in sys.modules if m.startswith("torchvision")]:
        del sys.modules[m]
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def pause(name):  # the test's sync points, nothing to do with data loading
    gate = os.environ.get(name)
    if gate:
        print("PAUSED " + name, flush=True)
        while not os.path.exists(gate):
            time.sleep(0.05)


distributed = "RANK" in os.environ
if distributed:
    torch.distributed.init_process_group("gloo")
torch.manual_seed(0)
tf = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
dataset = torchvision.datasets.ImageFolder(sys.argv[1], transform=tf)
sampler = DistributedSampler(dataset) if distributed else None
loader = DataLoader(dataset, batch_size=4, shuffle=sampler is None, sampler=sampler,
                    num_workers=int(os.environ.get("TEST_WORKERS", "0")))
pause("TEST_GATE_START")
epochs = []
for epoch in range(2):
    if sampler is not None:
        sampler.set_epoch(epoch)
    batches = []
    for k, (x, y) in enumerate(loader):
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        batches.append([[int(y[i]), hashlib.sha1(x[i].numpy().tobytes()).hexdigest()[:16]] for i in range(len(y))])
        if epoch == int(os.environ.get("TEST_GATE_MID_EPOCH", "0")) and k == 0:
            pause("TEST_GATE_MID")
    epochs.append(batches)
rank = torch.distributed.get_rank() if distributed else 0
print("RESULT " + json.dumps({"rank": rank, "len": len(loader), "epochs": epochs}), flush=True)
'''

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
SPEC = {"ops": [{"op": "resize", "size": 20}, {"op": "center_crop", "size": 16},
                {"op": "normalize", "mean": MEAN, "std": STD}], "output": "float32"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The dataset (by `dlop make-dataset`), the script, and the keys of its samples by index."""
    d = tmp_path_factory.mktemp("run")
    data = d / "images"
    assert dlop_main(["make-dataset", str(data), "--classes", "3", "--per-class", "4", "--seed", "2"]) == 0
    script = d / "train.py"
    script.write_text(SCRIPT)
    # Every sample's key, made by dlop's native pipeline (bit-identical to torchvision for these ops).
    source = media.open_source(str(data))
    images, labels, _ = media.ImagePipeline(json.dumps(SPEC)).run_batch(source, list(range(len(source))), seed=0, epoch=0)
    keys = [[int(labels[i]), hashlib.sha1(images[i].tobytes()).hexdigest()[:16]] for i in range(len(source))]
    return data, script, keys


@pytest.fixture()
def token_file(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


def logged_daemon(token_file: Path, log: Path) -> Daemon:
    """A real dlop-offloader whose log (stderr, at info) goes to a file the test reads."""
    daemon = Daemon(token_file, stderr=log.open("w"), env={**os.environ, "DLOP_LOG_LEVEL": "info"})
    daemon.log = log
    return daemon


@pytest.fixture()
def daemon(token_file, tmp_path):
    d = logged_daemon(token_file, tmp_path / "daemon.log")
    yield d
    d.kill()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLOP_RUN_", "DLOP_OFFLOAD_TOKEN"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run(command: list[str], timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_env(**extra))
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def results(out: str) -> list[dict]:
    return sorted((json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")),
                  key=lambda r: r["rank"])


def samples(epoch: list) -> list:
    return sorted(s for batch in epoch for s in batch)


@pytest.fixture(scope="module")
def plain(setup):
    data, script, keys = setup
    (r,) = results(run([sys.executable, str(script), str(data)]).stdout)
    return r


def dlop_run(*args: str) -> list[str]:
    return [str(BIN / "dlop"), "run", *args]


def test_plain_run_holds_every_sample_once_per_epoch(setup, plain):
    keys = setup[2]
    assert plain["len"] == 3
    assert all(samples(e) == sorted(keys) for e in plain["epochs"])


def test_an_unmodified_script_is_offloaded(setup, plain, daemon, token_file):
    data, script, keys = setup
    done = run(dlop_run("--offloaders", daemon.address, "--token-file", str(token_file), "--",
                        "python", str(script), str(data)))
    (r,) = results(done.stdout)
    assert "not offloaded" not in done.stderr and "Warning" not in done.stderr, done.stderr
    # The daemon did the work: it was configured with this dataset, and every batch came from it.
    assert f"configured: {data}" in daemon.log.read_text()
    assert "dlop run: 6 batches made by dlop-offloader, 0 made locally" in done.stderr
    assert r["len"] == plain["len"]
    for epoch, got in enumerate(r["epochs"]):
        assert samples(got) == samples(plain["epochs"][epoch])  # the same samples, each once
        plan = offload.EpochPlan(len(keys), 4, 0, True, False, 0, 1).batches(epoch)  # in dlop's order
        assert got == [[keys[i] for i in batch] for batch in plan]
    assert r["epochs"][0] != r["epochs"][1]  # reshuffled per epoch, as torch does


def test_an_unreachable_offloader_warns_once_and_changes_nothing(setup, plain, token_file):
    data, script, _ = setup
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    done = run(dlop_run("--offloaders", dead, "--token-file", str(token_file), "--", "python", str(script), str(data)),
               TEST_WORKERS="2")  # torch's own worker processes, which must not be patched into recursion
    assert done.stderr.count("dlop run: this DataLoader is not offloaded (") == 1, done.stderr
    assert "it runs as torch's DataLoader, in 2 worker processes" in done.stderr, done.stderr  # what really runs
    assert dead in done.stderr
    assert results(done.stdout) == [plain]  # torch's batches, in torch's order


def test_discovered_offloaders_including_one_joining_mid_epoch(setup, plain, token_file, tmp_path):
    data, script, keys = setup
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    offloader_argv = [sys.executable, "-m", "dlop.cli", "offloader", "--store", f"127.0.0.1:{store.port}",
                 "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--threads", "1"]
    logged = _env(DLOP_LOG_LEVEL="info")  # the daemons' log names each job they serve
    first = subprocess.Popen(offloader_argv, stdout=subprocess.PIPE, stderr=(tmp_path / "first.log").open("w"), text=True,
                             env=logged)
    second = trainer = None
    try:
        from dlop.fleet import discovery

        wait_for(lambda: discovery.discover(store), 30, "the first offloader's announcement")
        gate = tmp_path / "go"
        trainer = subprocess.Popen(
            dlop_run("--discover", "--store", f"127.0.0.1:{store.port}", "--token-file", str(token_file), "--",
                     "python", str(script), str(data)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_env(TEST_GATE_MID=str(gate), DLOP_RUN_DISCOVER_INTERVAL="0.1"))
        assert trainer.stdout.readline().strip() == "PAUSED TEST_GATE_MID"  # one batch in, from the first
        second = subprocess.Popen(offloader_argv, stdout=subprocess.PIPE, stderr=(tmp_path / "second.log").open("w"),
                                  text=True, env=logged)
        joined = wait_for(lambda: discovery.discover(store)[1:], 30, "the second offloader's announcement")[0]
        time.sleep(0.5)  # a few watcher polls
        gate.touch()
        out, err = trainer.communicate(timeout=120)
        assert trainer.returncode == 0, err
        assert f"dlop run: offloader {joined} joined" in err
        assert "dlop run: 6 batches made by dlop-offloader, 0 made locally" in err
        (r,) = results(out)
        for epoch, got in enumerate(r["epochs"]):
            plan = offload.EpochPlan(len(keys), 4, 0, True, False, 0, 1).batches(epoch)
            assert got == [[keys[i] for i in batch] for batch in plan]
        for p in (first, second):
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=20) == 0
        assert f"configured: {data}" in (tmp_path / "second.log").read_text()  # the joiner served this job
    finally:
        for p in (first, second, trainer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_torchrun_two_ranks_discovering_through_the_process_group_store(setup, plain, token_file, tmp_path):
    """torchrun's ranks find an offloader announced in torchrun's own store (MASTER_ADDR:MASTER_PORT)."""
    data, script, keys = setup
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gate = tmp_path / "go"
    trainer = subprocess.Popen(
        dlop_run("--discover", "--token-file", str(token_file), "--", "torchrun", "--nproc-per-node", "2",
                 "--master-addr", "127.0.0.1", "--master-port", str(port), str(script), str(data)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(TEST_GATE_START=str(gate)))
    announcer = subprocess.Popen([sys.executable, "-m", "dlop.cli", "offloader", "--store", f"127.0.0.1:{port}",
                                  "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--threads", "1"],
                                 stdout=subprocess.PIPE, stderr=(tmp_path / "daemon.log").open("w"), text=True,
                                 env=_env(DLOP_LOG_LEVEL="info"))
    try:
        for line in announcer.stdout:  # the daemon's line, then the announcement
            if "announced" in line:
                break
        gate.touch()
        out, err = trainer.communicate(timeout=120)
        assert trainer.returncode == 0, err
        ranks = results(out)
        assert [r["rank"] for r in ranks] == [0, 1]
        assert err.count("batches made by dlop-offloader, 0 made locally") == 2, err
        assert "not offloaded" not in err
        for epoch in range(2):
            # DistributedSampler's contract: the ranks together hold every sample exactly once.
            assert samples(ranks[0]["epochs"][epoch] + ranks[1]["epochs"][epoch]) == samples(plain["epochs"][epoch])
            for r in ranks:
                plan = offload.EpochPlan(len(keys), 4, 0, True, False, r["rank"], 2).batches(epoch)
                assert r["epochs"][epoch] == [[keys[i] for i in batch] for batch in plan]
        announcer.send_signal(signal.SIGTERM)
        assert announcer.wait(timeout=20) == 0
    finally:
        for p in (announcer, trainer):
            if p.poll() is None:
                p.kill()
                p.wait()


# ------------------------------------------------------------ the launcher itself


def test_processes_without_a_dataloader_pay_nothing_and_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("print('the user sitecustomize ran')\n")
    done = run(dlop_run("--offloaders", "127.0.0.1:1", "--", "python", "-c",
                        "import sys; print('torch' in sys.modules, 'dlop' in sys.modules)"),
               PYTHONPATH=str(other), DLOP_OFFLOAD_TOKEN=TOKEN)
    # Once in dlop run's own Python (PYTHONPATH as given), once in the command,
    # where dlop's sitecustomize shadows it and must chain-load it.
    assert done.stdout.splitlines() == ["the user sitecustomize ran"] * 2 + ["False False"]


def test_the_command_replaces_dlop_run_exit_status_and_pid():
    proc = subprocess.Popen(dlop_run("--offloaders", "127.0.0.1:1", "--", "python", "-c",
                                     "import os, sys; print(os.getpid()); sys.exit(7)"),
                            stdout=subprocess.PIPE, text=True, env=_env(DLOP_OFFLOAD_TOKEN=TOKEN))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7 and int(out) == proc.pid  # exec'd: signals reach the command itself


@pytest.mark.parametrize("args, message", [
    (["--local-offloaders", "0", "--", "true"], "--local-offloaders 0: at least 1"),
    (["--local-offloaders", "1", "--offloaders", "h:1", "--", "true"], "--local-offloaders starts daemons here"),
    (["--token-file", "t", "--", "true"], "the local ones get a fresh token"),
    (["--offloaders", "nohost"], "no command: put it after --"),
    (["--offloaders", "nohost", "--", "true"], "offloader address 'nohost' is not HOST:PORT"),
    (["--offloaders", "h:1", "--token-file", "/nonexistent/token", "--", "true"], "token file /nonexistent/token"),
    (["--offloaders", "h:1", "--", "true"], "no token: pass --token-file or set DLOP_OFFLOAD_TOKEN"),
    (["--offloaders", "h:1", "--store", "h:2", "--", "true"], "--store only means something with --discover"),
])
def test_bad_arguments_are_named(args, message, monkeypatch, capsys):
    # In this process: what `dlop run` prints and exits with, without starting Python and torch again for each.
    from dlop.fleet import run as dlop_run_module

    for name in [k for k in os.environ if k.startswith(("DLOP_RUN_", "DLOP_OFFLOAD_TOKEN"))]:
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit) as stop:
        dlop_run_module.main(list(args))
    code = stop.value.code
    said = capsys.readouterr().err + (code if isinstance(code, str) else "")
    assert code not in (0, None) and message in said, said


def test_loaders_dlop_cannot_reproduce_warn_once_each_and_run_as_torch_does(tmp_path, token_file):
    script = tmp_path / "other.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "ds = TensorDataset(torch.arange(10))\n"
        "class Mine(DataLoader):\n    pass\n"
        "loaders = [DataLoader(ds, batch_size=3, collate_fn=lambda b: [x for (x,) in b]), Mine(ds, batch_size=4),\n"
        "           DataLoader(ds, batch_size=5)]\n"
        "size = lambda b: len(b[0]) if b[0].dim() else len(b)\n"
        "for epoch in range(2):\n"
        "    print([[size(b) for b in loader] for loader in loaders])\n")
    done = run(dlop_run("--discover", "--token-file", str(token_file), "--", "python", str(script)))
    assert done.stdout.splitlines() == ["[[3, 3, 3, 1], [4, 4, 2], [5, 5]]"] * 2
    reasons = [line for line in done.stderr.splitlines() if "dlop run: this DataLoader is not offloaded" in line]
    # One per loader, not per epoch; the first and third loaders' reasons are
    # the same text from the same line, which Python's warnings show once. A
    # custom collate_fn is no reason any more (the generic Python path runs it).
    assert len(reasons) == 2, done.stderr
    assert "torch.distributed is not initialized" in reasons[0] and "a Mine, a DataLoader subclass" in reasons[1]
    assert "collate_fn" not in done.stderr


GENERIC = r'''
import torch
from torch.utils.data import DataLoader, Dataset

class Words(Dataset):  # defined in __main__: it reaches the offloader's workers by value
    def __len__(self):
        return 11
    def __getitem__(self, i):
        return {"id": i, "text": "w" * (i + 1), "vec": torch.arange(3) * i}

def collate(items):
    return {"ids": torch.tensor([x["id"] for x in items]), "texts": [x["text"] for x in items],
            "vecs": torch.stack([x["vec"] for x in items])}

loader = DataLoader(Words(), batch_size=4, shuffle=False, collate_fn=collate)
kept = []
for epoch in range(2):
    for b in loader:
        kept.append(b)  # kept past the next step: must not change under dlop run
print([[b["ids"].tolist(), b["texts"], b["vecs"].sum().item()] for b in kept])
'''


def test_a_generic_dataset_and_collate_fn_are_offloaded_unmodified(daemon, token_file, tmp_path):
    script = tmp_path / "generic.py"
    script.write_text(GENERIC)
    want = run([sys.executable, str(script)]).stdout
    done = run(dlop_run("--offloaders", daemon.address, "--token-file", str(token_file), "--",
                        sys.executable, str(script)))
    assert done.stdout == want
    assert "dlop run: 6 batches made by dlop-offloader, 0 made locally" in done.stderr, done.stderr


# ------------------------------------------- local offloaders (neither --offloaders nor --discover)

STARTED = re.compile(r"dlop run: started (\d+) local dlop-offloader daemon\(s\): (.*); "
                     r"they stop when the command exits")


def _started(stderr: str) -> list[tuple[str, int]]:
    """(address, pid) of each daemon `dlop run` says it started."""
    m = STARTED.search(stderr)
    assert m, stderr
    daemons = [(a, int(pid)) for a, pid in re.findall(r"(127\.0\.0\.1:\d+) \(pid (\d+)\)", m.group(2))]
    assert len(daemons) == int(m.group(1))
    return daemons


def test_local_offloaders_make_every_batch_and_are_gone_after(setup, plain):
    """`dlop run -- python train.py`: no daemon given, so dlop run starts them here, with a fresh token."""
    data, script, keys = setup
    done = run(dlop_run("--local-offloaders", "2", "--", "python", str(script), str(data)), timeout=400,
               DLOP_LOG_LEVEL="info")
    daemons = _started(done.stderr)
    assert len(daemons) == 2
    # The local daemons did the work: configured with this dataset (their log is dlop run's stderr),
    # every batch made by dlop-offloader, in dlop's plan order.
    assert f"configured: {data}" in done.stderr
    assert "dlop run: 6 batches made by dlop-offloader, 0 made locally" in done.stderr, done.stderr
    (r,) = results(done.stdout)
    for epoch, got in enumerate(r["epochs"]):
        plan = offload.EpochPlan(len(keys), 4, 0, True, False, 0, 1).batches(epoch)
        assert got == [[keys[i] for i in batch] for batch in plan]
        assert samples(got) == samples(plain["epochs"][epoch])
    assert not any(alive(pid) for _, pid in daemons)


def test_the_default_is_one_daemon_per_spare_core():
    from dlop.fleet.local import default_count, trainer_ranks

    cores = len(os.sched_getaffinity(0))
    assert trainer_ranks(["python", "train.py"]) == 1
    assert trainer_ranks(["torchrun", "--nproc-per-node", "3", "t.py"]) == 3
    assert trainer_ranks(["torchrun", "--nproc_per_node=4", "t.py"]) == 4
    assert trainer_ranks(["mpirun", "-np", "2", "python", "t.py"]) == 2
    assert trainer_ranks(["python", "-m", "torch.distributed.run", "--nproc-per-node", "5", "t.py"]) == 5
    assert default_count(["python", "train.py"]) == max(1, cores - 1)
    assert default_count(["torchrun", "--nproc-per-node", str(cores + 4), "t.py"]) == 1
    done = run(dlop_run("--", "python", "-c", "pass"), timeout=300)
    assert len(_started(done.stderr)) == max(1, cores - 1)


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_local_offloaders_go_when_dlop_run_is_killed(setup, tmp_path, sig):
    """Mid-epoch, `dlop run` gets SIGTERM or SIGINT (forwarded to the command, then the daemons are
    stopped) or SIGKILL (the kernel's parent-death signal stops the daemons and the command)."""
    data, script, _ = setup
    gate = tmp_path / "never"
    # SIGINT as a terminal gives it: a test run started in the background (a shell's `&`) ignores SIGINT,
    # and the command would inherit that and outlive the forwarded signal.
    proc = subprocess.Popen(dlop_run("--local-offloaders", "2", "--", "python", str(script), str(data)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(TEST_GATE_MID=str(gate)),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    everyone: list[int] = []
    try:
        line = ""
        while not STARTED.search(line):
            line = proc.stderr.readline()
            assert line, "dlop run said nothing about its daemons"
        daemons = _started(line)
        assert proc.stdout.readline().strip() == "PAUSED TEST_GATE_MID"  # a batch made, the trainer waits
        everyone = _children(proc.pid)
        assert {pid for _, pid in daemons} < set(everyone) and len(everyone) == 3  # two daemons and the command
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            left = {pid: Path(f"/proc/{pid}/wchan").read_text() for pid in everyone if alive(pid)}
            proc.kill()
            try:
                err = proc.communicate(timeout=10)[1]
            except subprocess.TimeoutExpired:
                err = "(its stderr stayed open)"
            pytest.fail(f"dlop run did not exit within 60 s of {sig.name}; alive (pid: wchan): {left}; "
                        f"its stderr:\n{err[-4000:]}")
        if sig == signal.SIGTERM:
            assert code == 128 + signal.SIGTERM  # the command's status: killed by the forwarded SIGTERM
        elif sig == signal.SIGKILL:
            assert code == -signal.SIGKILL
        else:
            assert code != 0
        wait_for(lambda: not any(alive(pid) for pid in everyone), 30, "every process of dlop run to exit")
    finally:
        gate.touch()
        kill_leftovers(everyone, proc)
