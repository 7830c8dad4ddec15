"""Jobs killed whole, jobs sharing a machine, and trainers killed under offloaders.

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
"""

from __future__ import annotations

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
from torchrun_jobs import Job, alive, descendants, kill_leftovers, torchrun

pytestmark = pytest.mark.long_file(seconds=120)  # handed out first (conftest.py)

SEED = int(os.environ.get("DLOP_TEST_SEED", str(random.randrange(1 << 30))))


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


# Alone: it counts what is new in /dev/shm, and a process another test SIGKILLs while UCX makes its
# segment (between creating the file and unlinking it) leaves one there too.
@pytest.mark.alone(reason="it counts what is new in /dev/shm, machine-wide")
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
        kill_leftovers(everyone, run)


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
        kill_leftovers(everyone, run)
