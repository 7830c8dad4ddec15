"""Tar shards read as streams (OffloadLoader shuffle="shards"): an epoch's
batches are runs of neighbouring samples of shuffled shards, and a daemon
reads each with one GET, as the web server's own access log counts. The
batches equal the same plan made from the local shards sample by sample,
offloaded or not, resumed from a state_dict, or across a store restart."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
media = pytest.importorskip("dlop._C").media

from dlop.data import OffloadLoader  # noqa: E402
from store_servers import (  # noqa: E402,F401 (fixtures)
    BATCH, SEED, SPEC, TOKEN, daemon, data, first_batches, free_port, http, run_epoch, run_epoch_across_an_outage, s3,
    shards,
)


def shard_batches(source, epoch: int, by_shard: bool = True) -> list[tuple[bytes, bytes]]:
    """The shard-ordered (or sample-order) epoch made here from `source` (tests/media/batch_reads_test.cpp checks
    that reading a batch's runs ahead gives each sample's own bytes)."""
    pipeline = media.ImagePipeline(json.dumps(SPEC))
    plan = offload.EpochPlan(len(source), BATCH, SEED, True, False, 0, 1, source.shard_sizes if by_shard else [])
    out = []
    for indices in plan.batches(epoch):
        images, labels, _ = pipeline.run_batch(source, indices, seed=SEED, epoch=epoch)
        out.append((images.tobytes(), np.asarray(labels).tobytes()))
    return out


def loader(url: str, offloaders, **kw) -> OffloadLoader:
    return OffloadLoader(url, SPEC, BATCH, shuffle="shards", seed=SEED, offloaders=offloaders, token=TOKEN, **kw)


def data_gets(log, since: int) -> list[str]:
    """The GETs of shard bytes logged after byte `since`: opening a shard reads from byte 0 (its size, its headers),
    a sample's bytes start after its header."""
    lines = log.read_text()[since:].splitlines()
    return [x for x in lines if x.startswith("GET /shards/train-") and '"bytes=0-' not in x]


def test_the_shard_sizes_come_from_the_headers(shards):
    assert media.open_source(str(shards["local"])).shard_sizes == [9, 9, 9]
    assert media.open_source(shards["s3"]).shard_sizes == [9, 9, 9]
    assert media.open_source(str(shards["local"] / "train-001.tar")).shard_sizes == [9]


def test_a_shard_ordered_epoch_from_s3_equals_the_local_shards(shards, daemon):
    local = media.open_source(str(shards["local"]))
    want = shard_batches(local, 2)
    got_loader = loader(shards["s3"], [daemon])
    assert got_loader.offloaded and len(got_loader) == len(want) == 7
    assert run_epoch(got_loader, 2) == want
    # Not the sample-order epoch under another name.
    assert [y for _, y in want] != [y for _, y in shard_batches(local, 2, by_shard=False)]


def test_a_shard_ordered_epoch_costs_one_get_per_batch_run(shards, http, daemon):
    log = http["access_log"]
    local = media.open_source(str(shards["local"]))
    want = shard_batches(local, 3)
    streamed = loader(shards["http"], [daemon])
    since = log.stat().st_size
    assert run_epoch(streamed, 3) == want
    gets = data_gets(log, since)
    # 7 batches of 4 over 3 shards of 9: at most two batches hold the end of one shard and the start of another.
    assert len(want) <= len(gets) <= len(want) + 2, gets
    # The sample order reads nearly every sample on its own: 27 samples, about as many GETs.
    scattered = OffloadLoader(shards["http"], SPEC, BATCH, shuffle=True, seed=SEED, offloaders=[daemon], token=TOKEN)
    since = log.stat().st_size
    run_epoch(scattered, 3)
    assert len(data_gets(log, since)) >= 2 * len(gets)


def test_the_local_fallback_streams_the_same_epoch(shards):
    want = shard_batches(media.open_source(str(shards["local"])), 4)
    with pytest.warns(RuntimeWarning, match="no dlop-offloader answered"):
        fallback = loader(shards["http"], [f"127.0.0.1:{free_port()}"], connect_timeout=1.0, fallback="warn")
    assert run_epoch(fallback, 4) == want


def test_a_shard_ordered_epoch_resumes_from_a_state_dict(shards, daemon):
    want = shard_batches(media.open_source(str(shards["local"])), 5)
    first = loader(shards["s3"], [daemon])
    got = first_batches(first, 5, 3)
    state = first.state_dict()
    assert state["position"] == 3 and state["shards"] != 0
    resumed = loader(shards["s3"], [daemon])
    resumed.load_state_dict(state)
    got += [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y in resumed]
    assert got == want
    # A sample-order cursor is another plan's.
    sample_order = OffloadLoader(shards["s3"], SPEC, BATCH, shuffle=True, seed=SEED, offloaders=[daemon], token=TOKEN)
    with pytest.raises(ValueError, match="another plan: shards"):
        resumed.load_state_dict(sample_order.state_dict())


def test_a_store_killed_mid_shard_epoch_loses_and_repeats_nothing(shards, s3, daemon, tmp_path):
    want = shard_batches(media.open_source(str(shards["local"])), 6)
    streamed = loader(shards["s3"], [daemon], prefetch=2)
    assert run_epoch_across_an_outage(streamed, 6, s3["server"]) == want  # every batch once, in order, byte-identical
    log = (tmp_path / "daemon.log").read_text()
    assert "s3://train/shards/train-" in log and "retrying" in log, "the daemon never met the outage"


def test_shard_order_needs_tar_shards(data):
    with pytest.raises(ValueError, match="needs tar shards"):
        OffloadLoader(str(data["local"]), SPEC, BATCH, shuffle="shards")
    with pytest.raises(ValueError, match="True, False or \"shards\""):
        OffloadLoader(str(data["local"]), SPEC, BATCH, shuffle="samples")
