"""dlop's exceptions: one class per error code, raised for real.

Every C++ error code has its class in dlop.errors, a subclass of dlop.Error
and of the builtin a caller catches (ValueError, TimeoutError, RuntimeError,
OSError). Through torch.distributed (dist.all_reduce, Work.wait, the Work's
future) the class survives: a dead peer is a dlop.PeerDeadError, a timeout a
dlop.TimeoutError, both also torch.distributed.DistBackendError. In the offload
client: a malformed frame is a dlop.ProtocolError, the last daemon gone a
dlop.NoOffloaderError, on which OffloadLoader finishes the epoch locally.
"""

from __future__ import annotations

import builtins
import datetime
import json
import os
import signal
import socket
import subprocess
import threading
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import dlop  # noqa: E402
from dlop import _C  # noqa: E402
from c10d_harness import Dead, Setup, attempt, run_ranks  # noqa: E402

BUILTIN = {
    "invalid argument": ValueError,
    "timeout": builtins.TimeoutError,
    "system error": OSError,
}


def test_every_error_code_has_its_class():
    names = _C._errc_names()
    assert "peer dead" in names and "invalid argument" in names, names
    assert sorted(names) == sorted(dlop.errors._BY_CODE), "a code without a class, or a class without a code"
    for name in names:
        cls = dlop.errors._BY_CODE[name]
        assert cls.code == name and getattr(dlop, cls.__name__) is cls
        with pytest.raises(cls, match="boom") as caught:
            _C._raise_error(name, "boom")
        err = caught.value
        assert type(err) is cls and isinstance(err, dlop.Error)
        assert isinstance(err, BUILTIN.get(name, RuntimeError)), (name, type(err).__mro__)
    assert issubclass(dlop.SampleError, dlop.InvalidArgumentError) and _C.media.SampleError is dlop.SampleError
    assert issubclass(dlop.NoOffloaderError, dlop.PeerDeadError)
    for cls in (dlop.PeerDeadError, dlop.TimeoutError, dlop.CanceledError, dlop.TransportError, dlop.ProtocolError):
        assert issubclass(cls, dist.DistBackendError), cls


def test_invalid_argument_from_the_offload_pipeline():
    with pytest.raises(dlop.InvalidArgumentError, match="unknown op") as caught:
        _C.media.ImagePipeline(json.dumps({"ops": [{"op": "blur"}]}))
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, dlop.Error)


# ---------------------------------------------------------------------------
# Through torch.distributed.


def _kinds(err) -> dict:
    return dict(
        type=type(err).__name__,
        message=str(err),
        dlop=isinstance(err, dlop.Error),
        runtime=isinstance(err, RuntimeError),
        value=isinstance(err, ValueError),
        timeout=isinstance(err, builtins.TimeoutError),
        dist=isinstance(err, dist.DistBackendError),
    )


def rank_bad_arguments_then_timeouts(ctx) -> dict | None:
    out = {}
    # Refused before anything is sent, on both ranks.
    out["bad_op"] = _kinds(attempt(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND))[1])
    sparse = torch.sparse_coo_tensor([[0]], [1.0], (3,))
    out["sparse_max"] = _kinds(attempt(lambda: dist.all_reduce(sparse, op=dist.ReduceOp.MAX))[1])
    dist.barrier()
    if ctx.rank == 1:
        time.sleep(4)  # joins nothing more
        return None
    work = dist.all_reduce(torch.ones(8), async_op=True)
    out["wait_timeout"] = _kinds(attempt(lambda: work.wait(datetime.timedelta(milliseconds=300)))[1])
    out["op_timeout"] = _kinds(attempt(work.wait)[1])  # the group's 2 s timeout
    return out


def test_bad_arguments_and_timeouts_through_torch_distributed():
    results = run_ranks(rank_bad_arguments_then_timeouts, 2, setup=Setup(pg_timeout_s=2, gloo=False), timeout=120)
    r = results[0]
    for what in ("bad_op", "sparse_max"):
        assert r[what]["type"] == "InvalidArgumentError" and r[what]["dlop"] and r[what]["value"], (what, r[what])
    assert "sparse tensors can only be summed" in r["sparse_max"]["message"], r["sparse_max"]
    for what in ("wait_timeout", "op_timeout"):
        got = r[what]
        assert got["type"] == "TimeoutError" and got["dlop"] and got["timeout"] and got["dist"] and got["runtime"], got
    assert "Work.wait timed out after 300 ms" in r["wait_timeout"]["message"], r
    assert "Timed out" in r["op_timeout"]["message"], r


def rank_peer_dies(ctx) -> dict | None:
    x = torch.ones(1024)
    dist.barrier()
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    out = {}
    out["all_reduce"] = _kinds(attempt(lambda: [dist.all_reduce(x) for _ in range(10_000)])[1])
    out["work_wait"] = _kinds(attempt(lambda: dist.all_reduce(x, async_op=True).wait())[1])
    out["future"] = _kinds(attempt(lambda: dist.all_reduce(x, async_op=True).get_future().wait())[1])
    return out


def test_a_dead_peer_through_torch_distributed():
    results = run_ranks(rank_peer_dies, 2, setup=Setup(pg_timeout_s=20, gloo=False), may_die=(1,), timeout=120)
    assert isinstance(results[1], Dead), results
    r = results[0]
    first = r["all_reduce"]
    assert first["type"] == "PeerDeadError" and first["dlop"] and first["dist"] and first["runtime"], first
    assert "rank 1" in first["message"], first
    # Later operations on the failed group are refused, naming the first failure.
    for what in ("work_wait", "future"):
        got = r[what]
        assert got["type"] in ("CanceledError", "PeerDeadError") and got["dlop"] and got["dist"], (what, got)


# ---------------------------------------------------------------------------
# The offload client.


class _Garbler:
    """A listener that answers every connection with a malformed frame."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.sendall(b"NOT-A-DLOP-FRAME" * 4)
            time.sleep(1)

    def close(self):
        self.sock.close()


def test_a_malformed_frame_is_a_protocol_error():
    g = _Garbler()
    try:
        with pytest.raises(dlop.ProtocolError) as caught:
            _C.offload.daemon_stats("127.0.0.1", g.port, "token-0123456789abcdef", 5.0)
    finally:
        g.close()
    err = caught.value
    assert isinstance(err, dlop.Error) and isinstance(err, RuntimeError), type(err).__mro__


def test_nobody_listening_is_a_dead_peer():
    port = socket.create_server(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    with pytest.raises(dlop.PeerDeadError, match=f"127.0.0.1:{free}"):
        _C.offload.daemon_stats("127.0.0.1", free, "token-0123456789abcdef", 2.0)


TOKEN = "errors-test-token-0123456789abcdef"
SPEC = {"ops": [{"op": "random_resized_crop", "size": 16}]}


@pytest.fixture()
def offloader(tmp_path):
    import processes

    exe = processes.offloader()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    proc = subprocess.Popen([exe, "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--threads", "1"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "listening on" in line, line
    yield proc, int(line.strip().rsplit(":", 1)[1])
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    from dlop.data.make_dataset import main as make_dataset

    out = tmp_path_factory.mktemp("data") / "train"
    assert make_dataset([str(out), "--classes", "2", "--per-class", "6", "--seed", "5"]) == 0
    return str(out)


def test_the_last_offloader_gone_is_no_offloader_error(images, offloader):
    proc, port = offloader
    m = _C.offload.LeaseManager(images, json.dumps(SPEC), 1, 2, TOKEN, shuffle=False, no_daemon_timeout=0.3)
    m.add_daemon("127.0.0.1", port)
    m.set_epoch(0)
    proc.kill()
    proc.wait()
    with pytest.raises(dlop.NoOffloaderError, match="no dlop-offloader left") as caught:
        while (got := m.next()) is not None:
            m.release(got[3])
    assert isinstance(caught.value, dlop.PeerDeadError) and isinstance(caught.value, RuntimeError)


def test_offload_loader_finishes_the_epoch_locally_when_its_daemon_dies(images, offloader):
    from dlop.data import OffloadLoader

    proc, port = offloader
    loader = OffloadLoader(images, SPEC, 2, shuffle=True, seed=3, offloaders=[f"127.0.0.1:{port}"], token=TOKEN,
                           prefetch=1, no_daemon_timeout=0.3, workers=1, fallback="warn")
    assert loader.offloaded
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, (x, y) in enumerate(loader):
            got.append((x.clone(), y.clone()))
            if k == 0:
                proc.kill()
                proc.wait()
    assert not loader.offloaded
    fallback = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(fallback) == 1 and "no dlop-offloader left" in str(fallback[0].message), [str(w.message) for w in caught]
    with pytest.warns(RuntimeWarning, match="no offloaders were given"):
        local = OffloadLoader(images, SPEC, 2, shuffle=True, seed=3, workers=1)
    want = [(x.clone(), y.clone()) for x, y in local]
    assert len(got) == len(want) == 6
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)
