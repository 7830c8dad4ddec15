"""Jobs that restart.

torchrun restarts every rank of a job when one dies (``--max-restarts``), and
its rendezvous store lives on across attempts: with static rendezvous and with
the c10d rendezvous's shared store, a restarted rank finds every key the
attempts before it wrote. dlop keys all its wire-up under a namespace rank 0
of each attempt draws afresh (transport/session.hpp), so a restart never
reaches a dead process's worker address, and an earlier attempt's report of
a dead peer never aborts the next one.

- Restarts: kills at points spread at random (before and right after init, or
  k steps after the attempt resumed), one per attempt for ROUNDS attempts; each
  restart must come up, and the job must end with the weights of a run that
  was never interrupted (torch.equal). With 2 ranks and static rendezvous,
  with 3 ranks and the c10d rendezvous, and with a node (a network
  namespace) leaving and joining under ``--nnodes 1:2``.
- Gloo on the same restart test, for comparison: its figures are reported,
  and its failures never fail the suite (xfail).

Jobs killed whole, jobs sharing a machine and killed trainers of offloaders
are in test_killed_jobs.py.

DLOP_TEST_RESTART_ROUNDS sets ROUNDS (default 6: both init kills, four distinct\nstep offsets, every rank at least twice).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from c10d_harness import free_port
from torchrun_jobs import Job, torchrun

pytestmark = pytest.mark.long_file(seconds=180)  # handed out first (conftest.py)

ROUNDS = int(os.environ.get("DLOP_TEST_RESTART_ROUNDS", "6"))
# Gloo's failed restarts each cost its timeout: the suite runs the plan's first kills only.
GLOO_ROUNDS = int(os.environ.get("DLOP_TEST_GLOO_ROUNDS", str(min(ROUNDS, 4))))
STEPS = 60  # more than ROUNDS attempts can finish: each kill comes at most 7 steps after a checkpoint
SEED = int(os.environ.get("DLOP_TEST_SEED", str(random.randrange(1 << 30))))


def kill_plan(rounds: int, nproc: int, rng: random.Random) -> list:
    """One kill per attempt, spread over what can differ, in a random order: every rank dies (rank 0,
    which draws each attempt's namespace, too), before and right after init, and k steps after the
    attempt resumed for distinct k in 0-7."""
    points = ["before_init", "after_init"] + rng.sample(range(8), 8)
    where = [points[i % len(points)] for i in range(rounds)]
    ranks = [i % nproc for i in range(rounds)]
    rng.shuffle(where)
    rng.shuffle(ranks)
    return [[rank, w] for rank, w in zip(ranks, where)]


def final_weights(folder: Path) -> dict:
    import torch

    return torch.load(folder / "final.pt")


def same_weights(a: dict, b: dict) -> list[str]:
    """Names of the tensors that differ (empty: bitwise equal)."""
    import torch

    return [k for k in a if k not in b or not torch.equal(a[k], b[k])] + [k for k in b if k not in a]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final weights of uninterrupted runs, by (ranks, replicated data)."""
    made: dict[tuple[int, bool], dict] = {}

    def get(nproc: int, replicated: bool = False) -> dict:
        if (nproc, replicated) not in made:
            folder = tmp_path_factory.mktemp(f"reference{nproc}{'r' if replicated else ''}")
            job = Job(folder, torchrun(nproc, free_port()), {"RESTART_STEPS": str(STEPS),
                                                               "RESTART_REPLICATED": "1" if replicated else "0"})
            assert job.wait() == 0, job.tail()
            made[(nproc, replicated)] = final_weights(folder)
        return made[(nproc, replicated)]

    return get


def restart_outcome(job: Job, plan: list, nproc: int) -> dict:
    """What a restart job did: attempts that came up, kills, whether all ranks finished."""
    events = job.events()
    up = {(int(e[1]), int(e[2])) for e in events if e[0] == "up"}
    kills = [(int(e[1]), int(e[2])) for e in events if e[0] == "kill"]
    done = {int(e[2]) for e in events if e[0] == "done"}
    # Attempts after the first whose ranks all had to come up: the one before was killed at a
    # step (or not at all), and this one is not killed before its process group is up.
    attempts = {int(e[1]) for e in events if e[0] in ("init", "up", "kill")}
    restarts = [a for a in sorted(attempts) if a > 0 and not (a < len(plan) and isinstance(plan[a][1], str))]
    came_up = [a for a in restarts if all((a, r) in up for r in range(nproc))]
    return {"attempts": sorted(attempts), "restarts": restarts, "came_up": came_up, "kills": kills,
            "finished": done == set(range(nproc))}


def run_restarts(folder: Path, nproc: int, rdzv: str, backend: str, plan: list) -> tuple[Job, int]:
    env = {"RESTART_BACKEND": backend, "RESTART_PLAN": json.dumps(plan), "RESTART_STEPS": str(STEPS)}
    if backend == "gloo":
        env["RESTART_TIMEOUT"] = "8"  # how long Gloo waits for a stale peer
    job = Job(folder, torchrun(nproc, free_port(), rdzv, max_restarts=len(plan)), env)
    return job, job.wait()


# ---------------------------------------------------------------------------
# Restarts.


@pytest.mark.parametrize("rdzv,nproc", [("static", 2), ("c10d", 3)], ids=["static-2ranks", "c10d-3ranks"])
def test_every_restart_comes_up_and_ends_at_the_uninterrupted_weights(tmp_path, reference, rdzv, nproc):
    plan = kill_plan(ROUNDS, nproc, random.Random(SEED + nproc))
    job, code = run_restarts(tmp_path, nproc, rdzv, "dlop", plan)
    out = restart_outcome(job, plan, nproc)
    why = f"seed {SEED}, plan {plan}, outcome {out}:\n{job.tail()}"
    assert code == 0, why
    assert out["attempts"] == list(range(ROUNDS + 1)), why  # no attempt failed to come up (each costs a restart)
    assert out["kills"] == [(a, plan[a][0]) for a in range(ROUNDS)], why
    assert out["came_up"] == out["restarts"] and out["finished"], why
    # Each attempt resumed every rank from the same checkpoint, never from an older one.
    resumed = {}
    for e in job.events():
        if e[0] == "up":
            resumed.setdefault(int(e[1]), set()).add(int(e[5]))
    assert all(len(s) == 1 for s in resumed.values()), resumed
    steps = [next(iter(resumed[a])) for a in sorted(resumed)]
    assert steps == sorted(steps), steps
    assert same_weights(final_weights(tmp_path), reference(nproc)) == [], why


def test_a_node_leaves_and_joins_under_elastic_membership(tmp_path, reference):
    """Two hosts (network namespaces), one rank each, under torchrun --nnodes 1:2 with the c10d
    rendezvous on host 0. Host 1 (its launcher and rank) is killed mid-training: host 0 goes on
    alone from the checkpoint; then host 1 comes back and both go on to the end. Every sample is
    on every rank, so the weights are those of an uninterrupted single-rank run."""
    from bench.common import netns

    ok, why = netns.available()
    if not ok:
        pytest.skip(f"cannot make network namespaces here: {why}")
    # torch's launcher shares one store between its rounds by default, but a node that joins in a
    # later round then waits for a key the rank 0 of earlier rounds never writes again (torch 2.13):
    # each round gets its own store here.
    env = {"RESTART_REPLICATED": "1", "RESTART_STEPS": str(STEPS), "RESTART_STEP_SLEEP": "0.05",
           "RESTART_FINISH_WORLD": "2", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    with netns.Hosts(2) as hosts:
        env["GLOO_SOCKET_IFNAME"] = hosts.device
        # A namespace's address is not among the machine's names: host 0 is told that it serves the
        # rendezvous's store, and each host the address the other reaches it at.
        argv = [torchrun(1, 29400, "c10d", max_restarts=3, nnodes="1:2", endpoint=hosts.addrs[0], store_host=h == 0,
                         local_addr=hosts.addrs[h]) for h in (0, 1)]

        def on(host: int):
            return lambda args, **kw: hosts.popen(host, args, **kw)

        first = Job(tmp_path, argv[0], env, popen=on(0), log="host0.log")
        second = Job(tmp_path, argv[1], env, popen=on(1), log="host1.log")
        try:
            first.wait_for("up", world=2)
            while not (tmp_path / "checkpoint.pt").exists():
                time.sleep(0.05)
            second.kill()  # the node leaves
            first.wait_for("up", world=1)
            second = Job(tmp_path, argv[1], env, popen=on(1), log="host1-again.log")  # and joins again
            codes = (first.wait(), second.wait())
        finally:
            for job in (first, second):
                if job.proc.poll() is None:
                    job.kill()
        why = f"events {first.events()}\n--- host 0:\n{first.tail()}\n--- host 1:\n{second.tail()}"
        assert codes == (0, 0), why
        worlds = [int(e[3]) for e in first.events() if e[0] == "up" and e[2] == "0"]
        assert worlds[0] == 2 and 1 in worlds and worlds[-1] == 2, why
        assert sorted(e[2] for e in first.events() if e[0] == "done") == ["0", "1"], why
        assert same_weights(final_weights(tmp_path), reference(1, replicated=True)) == [], why


@pytest.mark.skipif(os.environ.get("DLOP_TEST_GLOO_RESTARTS") != "1",
                    reason="a comparison, not a check: DLOP_TEST_GLOO_RESTARTS=1 runs it")
def test_gloo_on_the_same_restart_test(tmp_path, reference):
    """For comparison only, so not part of `make test`: Gloo on the static-2ranks plan (its first
    GLOO_ROUNDS kills). Gloo reads the earlier attempt's addresses from the store, so some restarts
    fail in connectFullMesh, each costing a restart; it passes only where every kill was made and
    the job still ended at the uninterrupted weights. Its figures are printed, and a failure is an
    xfail."""
    nproc = 2
    plan = kill_plan(ROUNDS, nproc, random.Random(SEED + nproc))[:GLOO_ROUNDS]
    job, code = run_restarts(tmp_path, nproc, "static", "gloo", plan)
    out = restart_outcome(job, plan, nproc)
    equal = out["finished"] and code == 0 and same_weights(final_weights(tmp_path), reference(nproc)) == []
    passed = equal and len(out["kills"]) == len(plan)
    summary = (f"Gloo: {len(out['came_up'])} of {len(out['restarts'])} restarts came up; "
               f"{len(out['kills'])} of {len(plan)} kills made; "
               f"{'ended at the uninterrupted weights' if equal else 'did not finish'} (seed {SEED})")
    print(summary)
    if not passed:
        pytest.xfail(summary)
