"""Record files and tar shards read straight from object stores and HTTP
servers (store_servers.py: a real `rclone serve s3` and a real nginx). Every
record and every batch equals the same file read locally, offloaded or not;
403 and 404 name the object; a server killed mid-epoch and restarted costs
nothing; a server that stays down fails within DLOP_STORE_RETRY_MS, naming
the object; `dlop pack` uploads to a store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")
media = pytest.importorskip("dlop._C").media

from dlop.data import OffloadLoader  # noqa: E402
from dlop.data.pack import pack  # noqa: E402
from store_servers import (  # noqa: E402,F401 (fixtures)
    ACCESS, BATCH, BUCKET, SECRET, SEED, SPEC, TOKEN, assert_same_records, batches, daemon, data, first_batches,
    free_port, http, run_epoch, run_epoch_across_an_outage, s3, shards,
)


def test_a_record_file_in_s3_reads_as_the_local_file(data, s3):
    remote, local = media.open_source(s3["url"]), media.open_source(str(data["local"]))
    assert_same_records(remote, local)
    assert batches(remote, 1) == batches(local, 1)


def test_a_record_file_over_http_reads_as_the_local_file(data, http):
    assert_same_records(media.open_source(http["url"]), media.open_source(str(data["local"])))


def test_a_missing_object_names_it_with_404(s3, http):
    with pytest.raises(Exception, match=r"s3://train/images/nope\.dlop.*404.*NoSuchKey"):
        media.open_source(f"s3://{BUCKET}/images/nope.dlop")
    with pytest.raises(Exception, match=r"/shards/nope\.dlop.*HTTP 404"):
        media.open_source(http["base"] + "/shards/nope.dlop")


def test_a_bad_key_names_the_object_with_403(s3, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-0123456789")
    with pytest.raises(Exception, match=r"s3://train/images/train\.dlop.*HTTP 403"):
        media.open_source(s3["url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody-has-this-key")
    with pytest.raises(Exception, match=r"s3://train/images/train\.dlop.*HTTP 403.*InvalidAccessKeyId"):
        media.open_source(s3["url"])


def test_a_profile_gives_the_keys(s3, tmp_path, monkeypatch):
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[other]\naws_access_key_id = wrong\n\n[dlop]\naws_access_key_id = {ACCESS}\n"
                           f"aws_secret_access_key = {SECRET}\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "dlop")
    assert len(media.open_source(s3["url"])) == 27
    monkeypatch.setenv("AWS_PROFILE", "missing")
    with pytest.raises(Exception, match="no S3 credentials.*profile 'missing'"):
        media.open_source(s3["url"])


def test_pack_uploads_to_the_store(data, s3):
    stats = pack(str(data["folder"]), f"s3://{BUCKET}/packed/out.dlop")
    assert stats["records"] == 27
    body = s3["client"].get_object(Bucket=BUCKET, Key="packed/out.dlop")["Body"].read()
    assert body == data["local"].read_bytes()


def test_a_server_killed_and_restarted_mid_read_loses_nothing(data, s3):
    remote, local = media.open_source(s3["url"]), media.open_source(str(data["local"]))
    s3["server"].kill()
    restart = threading.Timer(1.0, s3["server"].start)  # an outage the reads below must wait out
    restart.start()
    try:
        assert_same_records(remote, local)
    finally:
        restart.join()


def test_a_server_that_stays_down_fails_within_the_retry_budget(data, s3):
    s3["server"].kill()
    try:
        code = ("import dlop._C as C\n"
                f"C.media.open_source({s3['url']!r})\n")
        env = dict(os.environ, DLOP_STORE_RETRY_MS="300")
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    finally:
        s3["server"].start()
    assert proc.returncode != 0
    assert "s3://train/images/train.dlop" in proc.stderr and "DLOP_STORE_RETRY_MS" in proc.stderr, proc.stderr


def test_offloaded_epoch_from_s3_survives_a_server_restart(data, s3, daemon, tmp_path):
    want = batches(media.open_source(str(data["local"])), 3)
    loader = OffloadLoader(s3["url"], SPEC, BATCH, shuffle=True, seed=SEED, offloaders=[daemon], token=TOKEN,
                           prefetch=2)
    assert loader.offloaded
    assert run_epoch_across_an_outage(loader, 3, s3["server"]) == want  # every batch once, in order, byte-identical
    log = (tmp_path / "daemon.log").read_text()
    assert "s3://train/images/train.dlop" in log and "retrying" in log, "the daemon never met the outage"


def test_local_fallback_reads_the_store(data, s3):
    want = batches(media.open_source(str(data["local"])), 2)
    with pytest.warns(RuntimeWarning, match="no dlop-offloader answered"):
        loader = OffloadLoader(s3["url"], SPEC, BATCH, shuffle=True, seed=SEED, offloaders=[f"127.0.0.1:{free_port()}"],
                               token=TOKEN, connect_timeout=1.0, fallback="warn")
    assert run_epoch(loader, 2) == want


# ---- WebDataset-style tar shards ---------------------------------------------------------------------------------


def test_local_tar_shards_hold_the_folder_samples_in_order(shards):
    tars = media.open_source(str(shards["local"]))
    folder = shards["folder"]
    assert len(tars) == len(folder) == 27 and tars.classes == ["0", "1", "2"]  # .cls holds integers
    for i in range(len(folder)):
        assert tars.read(i) == folder.read(i) and tars.label(i) == folder.label(i), i
    assert tars.name(0).endswith("train-000.tar:" + os.path.splitext(os.path.relpath(folder.name(0),
                                                                     shards["local"].parent / "images"))[0] + ".jpg")


@pytest.mark.parametrize("where", ["s3", "http"])
def test_remote_tar_shards_read_as_the_local_ones(shards, where):
    remote, local = media.open_source(shards[where]), media.open_source(str(shards["local"]))
    assert_same_records(remote, local)
    assert batches(remote, 1) == batches(local, 1)


def test_a_list_of_shards_joined_by_colons(shards):
    local = sorted(str(p) for p in shards["local"].glob("*.tar"))
    both = media.open_source(local[2] + "::" + local[0])
    first, last = media.open_source(local[2]), media.open_source(local[0])
    assert len(both) == len(first) + len(last)
    assert both.read(0) == first.read(0) and both.read(len(first)) == last.read(0)


def test_damaged_shards_name_the_shard_and_the_sample(tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"x" * 2048)
    with pytest.raises(Exception, match=r"bad\.tar: not a tar file: header checksum mismatch at byte 0"):
        media.open_source(str(bad))
    wds = pytest.importorskip("webdataset")
    with wds.TarWriter(str(tmp_path / "nolabel.tar")) as sink:
        sink.write({"__key__": "a/one", "jpg": b"\xff\xd8"})
    with pytest.raises(Exception, match=r"nolabel\.tar: sample a/one: no \.cls member"):
        media.open_source(str(tmp_path / "nolabel.tar"))
    with pytest.raises(Exception, match=r"\{1\.\.0\} counts down"):
        media.open_source(str(tmp_path / "empty-{1..0}.tar"))
    (tmp_path / "no-tars").mkdir()
    with pytest.raises(Exception, match="no .tar files"):
        media.open_source(str(tmp_path / "no-tars") + "::" + str(tmp_path / "no-tars"))


def test_offloaded_epoch_from_s3_shards_equals_the_local_shards(shards, daemon):
    want = batches(media.open_source(str(shards["local"])), 2)
    loader = OffloadLoader(shards["s3"], SPEC, BATCH, shuffle=True, seed=SEED, offloaders=[daemon], token=TOKEN)
    assert loader.offloaded
    assert run_epoch(loader, 2) == want


CACHED_READER = """
import os, sys
import dlop._C as C
source = C.media.open_source(sys.argv[1])
first = [source.read(i) for i in range(len(source))]
folder = os.path.join(os.environ["DLOP_STORE_CACHE_DIR"], os.listdir(os.environ["DLOP_STORE_CACHE_DIR"])[0])
print(sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)), flush=True)
sys.stdin.readline()  # the server is down now
print("same" if [source.read(i) for i in range(len(source))] == first else "differ", flush=True)
"""


def test_the_daemon_cache_serves_reads_while_the_store_is_down(data, s3, tmp_path):
    env = dict(os.environ, DLOP_STORE_CACHE_DIR=str(tmp_path), DLOP_STORE_RETRY_MS="200")
    proc = subprocess.Popen([sys.executable, "-c", CACHED_READER, s3["url"]], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        cached = int(proc.stdout.readline())
        s3["server"].kill()
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        s3["server"].start()
    assert out.strip() == "same", err
    assert cached == data["local"].stat().st_size + 80  # every record, the index, the header read first
    assert not any(tmp_path.iterdir()), "the cache folder outlived its process"


def test_the_cache_stays_under_its_limit(data, s3, tmp_path):
    limit = data["local"].stat().st_size // 4
    env = dict(os.environ, DLOP_STORE_CACHE_DIR=str(tmp_path), DLOP_STORE_CACHE_BYTES=str(limit))
    proc = subprocess.Popen([sys.executable, "-c", CACHED_READER, s3["url"]], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cached = int(proc.stdout.readline())
    out, err = proc.communicate("go\n", timeout=60)  # the server is up: misses read it again
    assert out.strip() == "same", err
    assert 0 < cached <= limit


def test_a_list_of_local_shards_in_the_local_fallback(shards):
    tars = sorted(str(p) for p in shards["local"].glob("*.tar"))
    want = batches(media.open_source(str(shards["local"])), 4)
    with pytest.warns(RuntimeWarning, match="no dlop-offloader answered"):
        loader = OffloadLoader(tars, SPEC, BATCH, shuffle=True, seed=SEED, offloaders=[f"127.0.0.1:{free_port()}"],
                               token=TOKEN, connect_timeout=1.0, fallback="warn")
    assert run_epoch(loader, 4) == want


def test_an_s3_shard_epoch_resumes_from_a_state_dict(shards, daemon):
    want = batches(media.open_source(str(shards["local"])), 5)

    def loader():
        return OffloadLoader(shards["s3"], SPEC, BATCH, shuffle=True, seed=SEED, offloaders=[daemon], token=TOKEN)

    first = loader()
    got = first_batches(first, 5, 3)
    state = first.state_dict()
    assert state["epoch"] == 5 and state["position"] == 3
    resumed = loader()
    resumed.load_state_dict(state)
    got += [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y in resumed]
    assert got == want
