"""Replica groups under torchft on one host: a lighthouse, one torchrun per group, and what their steps record.

Each replica group is one process of examples/torchft_ddp.py under its own
torchrun (which restarts it when it dies); they find each other through one
torchft lighthouse. The example appends a JSON line per step and per fault to
one record file, from which :func:`recovery` reads the figures.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torchft_ddp.py"


def _bin(name: str) -> str:
    """An executable of this Python's environment (torchrun, torchft_lighthouse)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found beside {sys.executable} or on PATH (pip install 'dlop[ft]')")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lighthouse:
    """torchft's lighthouse on a free port, for a `with` block."""

    def __init__(self, log: Path, heartbeat_timeout_ms: int = 5000, join_timeout_ms: int = 10000) -> None:
        self.port = free_port()
        self.address = f"http://127.0.0.1:{self.port}"
        self._args = [_bin("torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms", "100",
                      "--join_timeout_ms", str(join_timeout_ms), "--heartbeat_timeout_ms", str(heartbeat_timeout_ms),
                      "--bind", f"[::]:{self.port}"]
        self._log = log

    def __enter__(self) -> "Lighthouse":
        self._proc = subprocess.Popen(self._args, stdout=open(self._log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120  # a loaded machine starts it slowly
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        self._proc.kill()
        raise RuntimeError(f"the lighthouse did not listen on port {self.port}: {self._log.read_text()[-2000:]}")

    def __exit__(self, *exc) -> None:
        self._proc.kill()
        self._proc.wait()


@dataclass
class Run:
    out: Path
    returncodes: list[int | None]
    records: list[dict] = field(default_factory=list)

    def steps(self, replica: int) -> list[dict]:
        return [r for r in self.records if r["replica"] == replica and r["event"] == "step"]

    def weights(self, replica: int) -> dict:
        import torch

        return torch.load(self.out / f"replica_{replica}.pt")


def run_replicas(backend: str, out: Path, *, steps: int, kill_at_step: int = -1, replicas: int = 2,
                 useless_params: int = 2_000_000, heartbeat_timeout_ms: int = 5000, timeout: float = 600,
                 extra_env: dict[str, str] | None = None) -> Run:
    """Trains `steps` committed steps with `replicas` groups of one process each; replica 1 dies at kill_at_step."""
    out.mkdir(parents=True, exist_ok=True)
    record = out / "steps.jsonl"
    record.unlink(missing_ok=True)
    procs = []
    with Lighthouse(out / "lighthouse.log", heartbeat_timeout_ms=heartbeat_timeout_ms) as lighthouse:
        for r in range(replicas):
            env = dict(os.environ, REPLICA_GROUP_ID=str(r), NUM_REPLICA_GROUPS=str(replicas),
                       TORCHFT_LIGHTHOUSE=lighthouse.address, OMP_NUM_THREADS="1", **(extra_env or {}))
            args = [_bin("torchrun"), "--standalone", "--nproc-per-node=1", "--max-restarts=3",
                    "--monitor-interval=0.1", str(EXAMPLE), "--backend", backend, "--steps", str(steps),
                    "--record", str(record), "--out", str(out), "--kill-at-step", str(kill_at_step),
                    "--useless-params", str(useless_params)]
            procs.append(subprocess.Popen(args, env=env, stdout=open(out / f"replica{r}.log", "w"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                    p.wait()
    records = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return Run(out, [p.returncode for p in procs], records)


def steady_step_s(run: Run, replica: int = 0, skip: int = 3) -> float:
    """Median seconds of the committed steps every replica took part in, past the first `skip`."""
    full = max(r["participants"] for r in run.steps(replica))
    times = [r["t"] - r["started"] for r in run.steps(replica)
             if r["committed"] and r["participants"] == full and r["step"] >= skip]
    return statistics.median(times)


def recovery(run: Run, survivor: int = 0, killed: int = 1) -> dict:
    """What the kill cost: from the record of the killed replica's death to the survivor's next
    committed step, the replacement's healing and rejoining, and the steps the survivor lost."""
    kill = next(r for r in run.records if r["event"] == "kill")
    after = [r for r in run.steps(survivor) if r["t"] > kill["t"]]
    failed = [r for r in after if not r["committed"]]
    detected = failed[0]["t"] if failed else None
    next_commit = next(r for r in after if r["committed"])
    start = next(r for r in run.records if r["replica"] == killed and r["event"] == "start" and r["attempt"] > 0)
    replacement = [r for r in run.steps(killed) if r["attempt"] > 0 and r["committed"]]
    rejoined = next(r for r in replacement if r["participants"] > 1)
    survivor_rejoined = next(r for r in after if r["committed"] and r["participants"] > 1)
    return {
        "kill_to_next_commit_s": next_commit["t"] - kill["t"],
        "detected_to_next_commit_s": None if detected is None else next_commit["t"] - detected,
        "kill_to_detected_s": None if detected is None else detected - kill["t"],
        "restart_to_rejoin_s": rejoined["t"] - start["t"],
        "kill_to_rejoin_s": survivor_rejoined["t"] - kill["t"],
        "steps_lost": len(failed),
        "solo_steps": sum(1 for r in after if r["committed"] and r["participants"] == 1),
        "healed_at_step": rejoined["step"],
    }
