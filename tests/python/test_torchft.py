"""dlop under torchft: training that survives a replica group's death without restarting the others.

Real processes, real torchft, a real lighthouse (bench/ft/replicas.py starts
them): examples/torchft_ddp.py, torchft's DDP example with the backend to
pick, as 2 replica groups of one process, each under its own torchrun.

- A replica SIGKILLed mid-step: the survivor keeps committing, the killed one
  (restarted by its torchrun) heals from the survivor and rejoins, and both
  end with the same weights. Without a fault, dlop's run ends with Gloo's
  weights, bit for bit.
- Abort: an all-reduce in flight toward a peer that died, or that stopped
  answering, fails; abort returns at once; a new group works at once; 25
  rounds of that (50 quorum changes) leave file descriptors, threads,
  /dev/shm and RSS flat. The same through torchft's child-process wrapper.
- Bad input: no lighthouse, a store address that does not parse, a world
  size of 0: each an error naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torchft", reason="torchft is not installed (pip install 'dlop[ft]')")

from bench.ft.replicas import recovery, run_replicas  # noqa: E402

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.long_file(seconds=400)  # handed out first (conftest.py)


def _rounds(kind: str, how: str, rounds: int) -> list[dict]:
    done = subprocess.run([sys.executable, str(HERE / "torchft_ranks.py"), kind, how, str(rounds)],
                          capture_output=True, text=True, timeout=240 + 30 * rounds)
    assert done.returncode == 0, f"torchft_ranks.py {kind} {how} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == rounds, done.stdout
    return lines


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_ddp_survivor_keeps_committing_and_the_killed_replica_heals_and_rejoins(tmp_path):
    run = run_replicas("dlop", tmp_path, steps=16, kill_at_step=4, useless_params=200_000, timeout=400)
    assert run.returncodes == [0, 0], (run.out / "replica0.log").read_text()[-3000:]
    figures = recovery(run)
    survivor = run.steps(0)
    assert any(not r["committed"] for r in survivor), "the survivor's step with the dead peer was not discarded"
    assert figures["solo_steps"] >= 1, f"the survivor committed no step alone: {figures}"
    healed = [r for r in run.steps(1) if r["attempt"] > 0 and r["committed"] and r["participants"] == 2]
    assert healed and healed[0]["step"] >= 5, f"the restarted replica did not heal from the survivor: {figures}"
    assert _same(run.weights(0), run.weights(1))


def test_ddp_without_faults_ends_with_gloos_weights(tmp_path):
    runs = {b: run_replicas(b, tmp_path / b, steps=8, useless_params=200_000, timeout=300) for b in ("dlop", "gloo")}
    for backend, run in runs.items():
        assert run.returncodes == [0, 0], (backend, (run.out / "replica0.log").read_text()[-3000:])
        assert _same(run.weights(0), run.weights(1)), backend
    assert _same(runs["dlop"].weights(0), runs["gloo"].weights(0))


@pytest.mark.alone("times an abort")
def test_abort_toward_a_silent_peer_returns_at_once_and_the_next_group_works():
    rounds = _rounds("dlop", "stop", 2)
    for r in rounds:
        assert "aborted" in r["error"], r
        # An abort owes a silent peer nothing: before, it waited 2 s for it.
        assert r["abort_s"] < 1.0, rounds
        assert r["alone_s"] < 10, rounds


@pytest.mark.alone("counts what the machine holds in /dev/shm")
def test_fifty_quorum_changes_after_deaths_leave_nothing_behind():
    rounds = _rounds("dlop", "kill", 25)
    for r in rounds:
        print(f"round {r['round']:2}: failed after {r['failed_s']:.3f} s, abort {r['abort_s']:.3f} s, "
              f"fds {r['fds']}, threads {r['threads']}, /dev/shm {r['shm']}, RSS {r['rss_mb']:.0f} MB")
        assert "dead" in r["error"], r
    warm, last = rounds[4], rounds[-1]
    assert last["fds"] <= warm["fds"] + 2, rounds
    assert last["threads"] <= warm["threads"] + 1, rounds
    assert last["shm"] <= warm["shm"], rounds
    assert last["rss_mb"] <= warm["rss_mb"] + 40, rounds


def test_the_child_process_wrapper_survives_a_dead_peer():
    for r in _rounds("baby", "kill", 2):
        assert r["error"] is not None and r["alone_s"] < 60, r


def test_bad_input_is_an_error_naming_it():
    from torch.distributed import TCPStore
    from torchft import Manager

    from dlop.c10d.torchft import ProcessGroupDlop

    pg = ProcessGroupDlop(timeout=timedelta(seconds=5))
    with pytest.raises(ValueError, match="store address 'localhost/prefix' is not host:port/prefix"):
        pg.configure("localhost/prefix", "r", 0, 1)
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        pg.configure("localhost:1234/prefix", "r", 0, 0)
    store = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    with pytest.raises(RuntimeError, match=r"failed to connect to http://127\.0\.0\.1:9 "):
        Manager(pg=pg, load_state_dict=lambda s: None, state_dict=lambda: {}, min_replica_size=1, rank=0,
                world_size=1, store_addr="127.0.0.1", store_port=store.port, lighthouse_addr="http://127.0.0.1:9",
                replica_id="r", connect_timeout=timedelta(seconds=2))
