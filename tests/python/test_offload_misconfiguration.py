"""A misconfigured offload is loud: against real dlop-offloader daemons, a wrong
or missing token, a relative source path, a configuration a daemon refuses and
a bad spec each raise (or, with fallback="warn", warn once) naming the cause;
a token file's trailing newline is no cause; `dlop run --strict` fails the job
where plain `dlop run` says what really runs; and the loader reads as a
DataLoader where trainers read one (Lightning's fit loop: dataset, sampler,
batch_size, drop_last)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from processes import Daemon, python_env, small_image_dataset, token_file_with

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
if not hasattr(offload, "LeaseManager"):
    pytest.skip("dlop._C was built without the lease manager; rebuild it", allow_module_level=True)

import dlop  # noqa: E402
from dlop.data import OffloadLoader  # noqa: E402

TOKEN = "misconfiguration-test-token-0123456789"
SPEC = {"ops": [{"op": "random_resized_crop", "size": 32}]}
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.long_file(seconds=90)  # three `dlop run` jobs: handed out first (conftest.py)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    return small_image_dataset(tmp_path_factory.mktemp("data") / "images")


@pytest.fixture()
def daemon(tmp_path):
    d = Daemon(token_file_with(tmp_path / "token", TOKEN))
    yield d
    d.kill()


@pytest.fixture()
def no_token_in_env(monkeypatch):
    monkeypatch.delenv("DLOP_OFFLOAD_TOKEN", raising=False)
    monkeypatch.delenv("DLOP_OFFLOAD_TOKEN_FILE", raising=False)


def loader(source, daemon, **kw) -> OffloadLoader:
    kw.setdefault("token", TOKEN)
    return OffloadLoader(source, SPEC, 4, offloaders=[daemon.address], connect_timeout=10.0, **kw)


def test_a_wrong_token_raises_by_default_naming_the_refusal(images, daemon):
    with pytest.raises(dlop.NoOffloaderError, match=f"{daemon.address} refused: .*token"):
        loader(images, daemon, token="not-the-daemons-token-0123456789")


def test_fallback_warn_warns_once_and_local_says_nothing(images, daemon):
    with pytest.warns(RuntimeWarning, match="refused") as said:
        warned = loader(images, daemon, token="not-the-daemons-token-0123456789", fallback="warn")
    assert len(said) == 1 and not warned.offloaded
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = loader(images, daemon, token="not-the-daemons-token-0123456789", fallback="local")
    assert not quiet.offloaded and len(list(quiet)) == len(quiet)
    with pytest.raises(ValueError, match="fallback"):
        loader(images, daemon, fallback="maybe")


def test_a_missing_token_says_it_is_missing(images, daemon, no_token_in_env):
    with pytest.raises(dlop.NoOffloaderError, match="no token was given") as raised:
        loader(images, daemon, token=None)
    assert "refused" not in str(raised.value)


def test_a_token_file_ending_in_a_newline_is_the_daemons_token(images, daemon, tmp_path, no_token_in_env,
                                                                monkeypatch):
    path = tmp_path / "token"  # the daemon's own file, written as `echo TOKEN > token` would
    assert path.read_text() == TOKEN + "\n"
    assert loader(images, daemon, token=path.read_text()).offloaded
    monkeypatch.setenv("DLOP_OFFLOAD_TOKEN_FILE", str(path))
    assert loader(images, daemon, token=None).offloaded


def test_a_relative_source_is_the_trainers_path(images, tmp_path, monkeypatch):
    """The daemon runs elsewhere (its own working directory): the client sends the absolute path."""
    monkeypatch.chdir(tmp_path)
    d = Daemon(token_file_with(tmp_path / "token", TOKEN))  # started here, where no "images" folder is
    try:
        monkeypatch.chdir(Path(images).parent)
        got = loader("images", d)
        assert got.offloaded and got.source == images
        assert sum(len(y) for _, y in got) == 18
    finally:
        d.kill()


def test_a_configuration_the_daemon_refuses_is_reported_as_refused(daemon, tmp_path):
    missing = tmp_path / "not-there" / "images"
    with pytest.raises(dlop.NoOffloaderError) as raised:
        loader(str(missing), daemon)
    message = str(raised.value)
    assert f"{daemon.address} refused: " in message and str(missing) in message, message
    assert "no dlop-offloader answered" not in message, message
    # A path that is not there is said to be missing, not taken for a record file that cannot be opened.
    assert "no such folder or file" in message and f"record file {missing}" not in message, message


def test_an_unreachable_daemon_is_one_that_did_not_answer(images):
    with pytest.raises(dlop.NoOffloaderError, match="no dlop-offloader answered .*127.0.0.1:1"):
        OffloadLoader(images, SPEC, 4, offloaders=["127.0.0.1:1"], token=TOKEN, connect_timeout=1.0)


@pytest.mark.parametrize("spec, what", [
    ({"ops": []}, "size"),
    ({"ops": [{"op": "hflip", "p": 0.5}]}, "size"),
    ({"ops": [{"op": "random_resized_crop"}]}, "size"),
    ({"ops": [{"op": "no_such_op"}]}, "no_such_op"),
])
def test_a_spec_error_is_caught_at_construction(images, spec, what):
    """docs/offload.md: a bad spec fails when the loader is made, not at the first batch."""
    with pytest.raises(ValueError, match=what):
        OffloadLoader(images, spec, 4, fallback="local")


def test_the_loader_reads_as_a_dataloader(images, daemon):
    """What Lightning's fit loop reads: len(loader.dataset) (has_len), loader.sampler.set_epoch each epoch
    (_set_sampler_epoch), batch_size and drop_last; OffloadLoader and offload are in dir(dlop.data)."""
    import dlop.data

    assert {"OffloadLoader", "offload"} <= set(dir(dlop.data))
    got = loader(images, daemon, drop_last=True)
    assert got.dataset is not None and len(got.dataset) == 18
    assert got.batch_size == 4 and got.drop_last is True and len(got) == 4
    for name in ("sampler", "batch_sampler"):  # as lightning.pytorch.loops.utilities._set_sampler_epoch
        sampler = getattr(got, name, None)
        if sampler is not None and callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(3)
    assert got.state_dict()["epoch"] == 3
    epoch3 = [i for batch in got._plan().batches(3) for i in batch]
    assert list(got.sampler) == epoch3 and len(got.sampler) == 16
    python = OffloadLoader(dataset=list(range(10)), batch_size=5, fallback="local")
    assert python.dataset == list(range(10)) and len(python.dataset) == 10


# ------------------------------------------------------------------- dlop run

SCRIPT = """
import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=1)
print("batches", sum(1 for _ in loader), flush=True)
"""


def dlop_run(tmp_path, *flags, token=TOKEN):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    tok = token_file_with(tmp_path / "client-token", token)
    return subprocess.run([str(BIN / "dlop"), "run", *flags, "--token-file", str(tok), "--", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=240, env=python_env())


def test_dlop_run_says_what_runs_and_strict_fails_the_job(tmp_path, daemon):
    plain = dlop_run(tmp_path, "--offloaders", daemon.address, token="not-the-daemons-token-0123456789")
    assert plain.returncode == 0 and "batches 2" in plain.stdout, plain.stderr
    warned = [line for line in plain.stderr.splitlines() if "not offloaded" in line]
    assert warned and "refused" in warned[0] and "torch's DataLoader, in 1 worker process" in warned[0], warned
    assert "2 worker processes" not in plain.stderr
    # Every process that iterated a DataLoader accounts for it at exit, offloaded or not.
    assert "0 batches made by dlop-offloader, 0 made locally, 1 DataLoader iteration(s) left to torch" in plain.stderr
    strict = dlop_run(tmp_path, "--strict", "--offloaders", daemon.address, token="not-the-daemons-token-0123456789")
    assert strict.returncode != 0 and "batches" not in strict.stdout, strict.stdout
    assert "dlop run --strict" in strict.stderr and "refused" in strict.stderr, strict.stderr[-2000:]


def test_dlop_run_offloads_with_the_right_token_and_counts_it(tmp_path, daemon):
    done = dlop_run(tmp_path, "--strict", "--offloaders", daemon.address)
    assert done.returncode == 0 and "batches 2" in done.stdout, done.stderr[-2000:]
    assert "2 batches made by dlop-offloader, 0 made locally" in done.stderr, done.stderr[-2000:]


def test_dlop_run_auto_on_a_small_machine_names_the_flag_that_sizes_it():
    """One core: the fleet is sized 1 to 1, and dlop run says so with the flag that changes it."""
    done = subprocess.run([str(BIN / "dlop"), "run", "--offloaders", "auto", "--", "true"], capture_output=True,
                          text=True, timeout=240, env=python_env(), preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 to 1" in done.stderr and "--cores N" in done.stderr, done.stderr[-2000:]
