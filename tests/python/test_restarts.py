"""Jobs that restart, and jobs that share a machine.

torchrun restarts every rank of a job when one dies (``--max-restarts``), and
its rendezvous store lives on across attempts: with static rendezvous and with
the c10d rendezvous's shared store, a restarted rank finds every key the
attempts before it wrote. dlop keys all its wire-up under a namespace rank 0
of each attempt draws afresh (transport/session.hpp), so a restart never
reaches a dead process's worker address, and an earlier attempt's report of
a dead peer never aborts the next one.

- Restarts: kills at random points (before and right after init, or k steps
  after the attempt resumed), one per attempt for ROUNDS attempts; each
  restart must come up, and the job must end with the weights of a run that
  was never interrupted (torch.equal). With 2 ranks and static rendezvous,
  with 3 ranks and the c10d rendezvous, and with a node (a network
  namespace) leaving and joining under ``--nnodes 1:2``.
- Gloo on the same restart test, for comparison: its figures are reported,
  and its failures never fail the suite (xfail).
- Two jobs at once on one machine (2 and 3 ranks, ranks 0 and 1 in both),
  each checking the exact result of every collective.
- Jobs SIGKILLed whole (launcher and ranks) during init, during training and
  at a random time, then a job on the same port; then nothing of dlop's may be
  left in /dev/shm or System V shared memory, and a planted segment of a dead
  creator is gone while a live creator's stays.

- Offloaders: a trainer SIGKILLed while a daemon makes its batches has its
  leases freed there (the daemon then serves the next trainer), and one
  SIGKILLed under ``dlop run --local-offloaders`` leaves no daemon behind;
  nor does a SIGKILLed ``dlop run``, whose token folder the next one removes.

DLOP_TEST_RESTART_ROUNDS sets ROUNDS (default 10).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from c10d_harness import free_port, python_env, venv_bin
from processes import offloader, wait_for

pytestmark = pytest.mark.long_file  # minutes in all: handed out first (conftest.py)

SCRIPT = str(Path(__file__).with_name("restart_training.py"))
ROUNDS = int(os.environ.get("DLOP_TEST_RESTART_ROUNDS", "10"))
# Gloo's failed restarts each cost its timeout: the suite runs the plan's first kills only.
GLOO_ROUNDS = int(os.environ.get("DLOP_TEST_GLOO_ROUNDS", str(min(ROUNDS, 4))))
STEPS = 60  # more than ROUNDS attempts can finish: each kill comes at most 7 steps after a checkpoint
JOB_DEADLINE = 240.0
SEED = int(os.environ.get("DLOP_TEST_SEED", str(random.randrange(1 << 30))))


# ---------------------------------------------------------------------------
# Jobs: torchrun over restart_training.py, its events and its processes.


def descendants(pid: int) -> list[int]:
    """pid's children, theirs, and so on (torchrun starts its ranks in sessions of their own)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = [int(c) for c in (task / "children").read_text().split()]
                found += kids
                todo += kids
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Job:
    """One torchrun (or, with `popen`, another launcher) of restart_training.py in its own folder."""

    def __init__(self, folder: Path, argv: list[str], env: dict[str, str], popen=subprocess.Popen,
                 log: str = "log"):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.log_path = folder / log
        self.log = open(self.log_path, "w")  # noqa: SIM115  (closed in wait/kill)
        self.pids: set[int] = set()
        self.proc = popen(argv, env=python_env({"RESTART_DIR": str(folder), **env}), stdout=self.log,
                          stderr=subprocess.STDOUT, start_new_session=True)

    def events(self) -> list[list[str]]:
        try:
            return [line.split() for line in (self.folder / "events").read_text().splitlines()]
        except FileNotFoundError:
            return []

    def wait_for(self, kind: str, timeout: float = 60.0, world: int | None = None) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pids.update(descendants(self.proc.pid))
            for e in self.events():
                if e[0] == kind and (world is None or int(e[3]) == world):
                    return e
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        pytest.fail(f"no '{kind}' event within {timeout:.0f} s (launcher exit {self.proc.poll()}):\n{self.tail()}")

    def wait(self, timeout: float = JOB_DEADLINE) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"job in {self.folder} still running after {timeout:.0f} s:\n{self.tail()}")
        self.log.close()
        return code

    def kill(self) -> None:
        """SIGKILL to the launcher and every process under it, all at once (a job killed whole)."""
        everyone = [self.proc.pid, *descendants(self.proc.pid)]
        self.pids.update(everyone)
        for pid in everyone:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in everyone) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.log.close()

    def tail(self, n: int = 6000) -> str:
        if not self.log.closed:
            self.log.flush()
        text = self.log_path.read_text(errors="replace")
        return text[-n:]


def torchrun(nproc: int, port: int, rdzv: str = "static", max_restarts: int = 0, nnodes: str = "1",
             endpoint: str = "127.0.0.1", script_args: tuple[str, ...] = (), store_host: bool | None = None,
             local_addr: str | None = None) -> list[str]:
    """torchrun's command line. store_host: whether this launcher serves the c10d rendezvous's store
    (None: torchrun decides, from whether the endpoint is one of this host's names); local_addr:
    the address the other hosts reach this one at (None: its host name)."""
    argv = [venv_bin("torchrun"), f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.1"]
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    if rdzv == "static":
        argv += ["--rdzv-backend=static", f"--master-addr={endpoint}", f"--master-port={port}"]
    else:
        # A round closes a second after its minimum of nodes joined; a node is dead after 3 missed beats.
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}:{port}", f"--rdzv-id=restarts-{port}",
                 "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
                 + ("" if store_host is None else f",is_host={str(store_host).lower()}")]
    return [*argv, SCRIPT, *script_args]


def kill_plan(rounds: int, nproc: int, rng: random.Random) -> list:
    """One kill per attempt: a random rank, before or right after init, or k steps after it resumed."""
    plan = []
    for _ in range(rounds):
        u = rng.random()
        where = "before_init" if u < 0.1 else "after_init" if u < 0.2 else rng.randrange(8)
        plan.append([rng.randrange(nproc), where])
    return plan


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
    from dlop.bench import netns

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


# ---------------------------------------------------------------------------
# Jobs sharing a machine.


def exact_job(folder: Path, nproc: int, port: int, job_id: int, iters: int = 10) -> Job:
    return Job(folder, torchrun(nproc, port, script_args=("exact",)),
               {"RESTART_JOB": str(job_id), "RESTART_ITERS": str(iters)})


def check_exact(job: Job, nproc: int) -> None:
    code = job.wait()
    results = [e for e in job.events() if e[0] == "exact"]
    assert code == 0 and len(results) == nproc, job.tail()
    assert all(e[3] == "ok" for e in results), [" ".join(e) for e in results]


def test_two_jobs_at_once_each_get_exact_results(tmp_path):
    """A job of 2 ranks and one of 3 on one machine at the same time (ranks 0 and 1 in both)."""
    jobs = [(exact_job(tmp_path / "a", 2, free_port(), 1), 2), (exact_job(tmp_path / "b", 3, free_port(), 2), 3)]
    for job, nproc in jobs:
        check_exact(job, nproc)


def shm_files() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir()}


def sysv_segments() -> dict[int, tuple[int, int]]:
    """shmid -> (creator pid, attached processes)."""
    def table(*flags):
        out = subprocess.run(["ipcs", "-m", *flags], capture_output=True, text=True).stdout
        return [line.split() for line in out.splitlines() if line[:1].isdigit() or line.startswith("0x")]

    pids = {int(r[0]): int(r[2]) for r in table("-p") if r[0].isdigit()}
    attached = {int(r[1]): int(r[5]) for r in table() if r[0].startswith("0x")}
    return {shmid: (pids.get(shmid, 0), n) for shmid, n in attached.items()}


def held_open(name: str) -> bool:
    """Whether a live process maps or holds /dev/shm/<name> open."""
    path = f"/dev/shm/{name}"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if path in (proc / "maps").read_text():
                return True
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd).startswith(path):
                    return True
        except OSError:
            continue
    return False


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def plant_segment(name: str, pid: int, started: int) -> Path:
    """A dlop segment file as ShmSegment writes it (transport/src/shm_segment.cpp's Header), made by `pid`."""
    import struct

    ns = int(re.search(r"\[(\d+)\]", os.readlink("/proc/self/ns/pid"))[1])
    header = struct.pack("<QIiQQQQQQ", 0x314D48535F504F4C, 1, pid, started, ns, 64, 64, 1, 0)
    path = Path("/dev/shm") / f"dlop-{name}"
    path.write_bytes(header + bytes(64))
    return path


def test_killed_jobs_leave_nothing_and_their_port_serves_the_next_job(tmp_path):
    """Three jobs SIGKILLed whole (during init, during training, at a random time) on one port, then
    a job on that port. A planted segment of a dead creator is removed by the next dlop process, one
    of a live creator stays, and the killed jobs left nothing in /dev/shm or System V memory."""
    rng = random.Random(SEED)
    files_before, sysv_before = shm_files(), set(sysv_segments())
    dead = subprocess.Popen(["sleep", "60"])
    dead_started = start_time(dead.pid)
    dead.kill()
    dead.wait()
    stale = plant_segment(f"restarts-test-{os.getpid()}-dead", dead.pid, dead_started)
    live = plant_segment(f"restarts-test-{os.getpid()}-live", os.getpid(), start_time(os.getpid()))
    port, pids = free_port(), set()
    try:
        for k, trigger in enumerate(("init", "up", "time")):
            job = Job(tmp_path / f"killed{k}", torchrun(2, port),
                      {"RESTART_STEPS": "100000", "RESTART_STEP_SLEEP": "0.01"})
            if trigger == "time":
                time.sleep(rng.uniform(0.5, 4.0))
            else:
                job.wait_for(trigger)
                time.sleep(rng.uniform(0.0, 0.3))
            job.kill()
            pids |= job.pids
        check_exact(exact_job(tmp_path / "after", 2, port, 3, iters=3), 2)
        assert not stale.exists(), "the next dlop process left a dead creator's segment"
        assert live.exists(), "a live creator's segment was removed"
    finally:
        stale.unlink(missing_ok=True)
        live.unlink(missing_ok=True)
    left = [f for f in shm_files() - files_before
            if (f.startswith("dlop-") or f.startswith("ucx")) and not held_open(f)]
    assert left == [], f"left in /dev/shm: {left}"
    leaked = {shmid: owner for shmid, owner in sysv_segments().items()
              if shmid not in sysv_before and owner[1] == 0 and owner[0] in pids}
    assert leaked == {}, f"System V segments of killed processes, attached by none: {leaked}"


# ---------------------------------------------------------------------------
# Offloaders of a killed trainer.

TOKEN = "restarts-test-token-0123456789abcdef"
TRAINER = f"""
import sys
import torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from restart_training import SlowSquares
if sys.argv[1] == "dataloader":  # an unmodified script: `dlop run` offloads it
    loader = torch.utils.data.DataLoader(SlowSquares(), batch_size=2)
else:
    from dlop.data import OffloadLoader
    loader = OffloadLoader(dataset=SlowSquares(), seed=1, offloaders=[sys.argv[2]], token=sys.argv[3],
                           batch_size=2, shuffle=False, connect_timeout=60)
got = []
for batch in loader:
    print("BATCH", flush=True)
    got += [int(v) for v in batch[:, 0]]
print("GOT", sorted(got), flush=True)
"""
SQUARES = sorted(i * i for i in range(8))


def daemon_counters(address: str) -> dict:
    from dlop._C import offload

    host, port = address.rsplit(":", 1)
    return offload.daemon_stats(host, int(port), TOKEN, 20.0)["counters"]


def test_a_killed_trainer_has_its_leases_freed_in_the_daemon(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    daemon = subprocess.Popen([offloader(), "--listen", "127.0.0.1:0", "--token-file", str(token_file),
                               "--threads", "1", "--python", venv_bin("python")], stdout=subprocess.PIPE, text=True)
    try:
        line = daemon.stdout.readline()
        assert "listening on" in line, line
        address = "127.0.0.1:" + line.strip().rsplit(":", 1)[1]
        script = tmp_path / "trainer.py"
        script.write_text(TRAINER)
        argv = [venv_bin("python"), str(script), "offload", address, TOKEN]
        trainer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=python_env())
        wait_for(lambda: daemon_counters(address)["open_leases"] > 0, 60, "the daemon holds a lease of the trainer")
        trainer.kill()
        trainer.wait()
        # Only this test's own STATS connection is left, and no lease.
        wait_for(lambda: (c := daemon_counters(address))["open_leases"] == 0 and c["open_connections"] == 1, 60,
                 "the daemon freed the dead trainer's leases and connection")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=python_env())
        assert f"GOT {SQUARES}" in done.stdout, done.stdout + done.stderr
        assert daemon.poll() is None, "the daemon died"
    finally:
        daemon.kill()
        daemon.wait()


def test_a_trainer_killed_under_dlop_run_leaves_no_daemon(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    run = subprocess.Popen([venv_bin("dlop"), "run", "--local-offloaders", "2", "--", venv_bin("python"),
                            str(script), "dataloader"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=python_env())
    everyone: list[int] = []
    try:
        assert run.stdout.readline().strip() == "BATCH", "the trainer made no batch"
        everyone = descendants(run.pid)
        trainer = [p for p in everyone if str(script) in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(trainer) == 1 and len(everyone) >= 3, everyone  # the trainer and two daemons (and their workers)
        os.kill(trainer[0], signal.SIGKILL)
        assert run.wait(timeout=60) != 0
        wait_for(lambda: not any(alive(p) for p in everyone), 30, "every daemon of dlop run has exited")
    finally:
        for pid in everyone:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()


def test_a_killed_dlop_run_leaves_no_daemon_and_the_next_removes_its_token():
    sleeper = [venv_bin("python"), "-c", "import time; print('UP', flush=True); time.sleep(600)"]
    run = subprocess.Popen([venv_bin("dlop"), "run", "--local-offloaders", "1", "--", *sleeper],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env())
    everyone: list[int] = []
    try:
        assert run.stdout.readline().strip() == "UP"
        everyone = descendants(run.pid)
        folders = list(Path(tempfile.gettempdir()).glob(f"dlop-run-{run.pid}-*"))
        assert len(folders) == 1 and (folders[0] / "token").exists(), folders
        run.kill()
        run.wait()
        wait_for(lambda: not any(alive(p) for p in everyone), 30,
                 "the daemon and the command of a SIGKILLed dlop run have exited")
        assert folders[0].exists()  # nothing of ours ran at the SIGKILL
        subprocess.run([venv_bin("dlop"), "run", "--local-offloaders", "1", "--", venv_bin("python"), "-c", "pass"],
                       check=True, capture_output=True, timeout=120, env=python_env())
        assert not folders[0].exists(), "the next dlop run left the dead one's token folder"
    finally:
        for pid in everyone:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()
