"""What the offload benchmarks share (offload.py, offload_media.py and those that start offloaders): local
dlop-offloader daemons, timed passes over a loader, what the processes cost, and the rows' table.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import _common

_TICK = os.sysconf("SC_CLK_TCK")


def parse_cpus(text: str | None) -> set[int] | None:
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def offloader_path(explicit: str | None) -> str:
    here = Path(sys.executable).parent / "dlop-offloader"
    for c in (explicit, os.environ.get("DLOP_OFFLOADER"), str(here), shutil.which("dlop-offloader")):
        if c and os.access(c, os.X_OK):
            return c
    raise SystemExit("dlop-offloader not found: make build, or pass --offloader / set DLOP_OFFLOADER")


# --- what processes cost -------------------------------------------------

def proc_cpu(pid: int) -> float:
    """CPU-seconds of a live process so far, its reaped children included."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / _TICK  # utime stime cutime cstime


def proc_peak_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    out.append(int(child))
                    todo.append(int(child))
    return out


def memcpy_gb_s(mib: int = 256, reps: int = 5) -> float:
    """The best of `reps` one-thread copies of `mib` MiB, in GB/s: what a core's memory path moves, to set a
    rate in images per CPU-second against."""
    import numpy as np

    src = np.ones(mib << 20, np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return src.nbytes / best / 1e9


def trainer_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Daemons:
    """Local dlop-offloader processes on free ports, killed on exit."""

    def __init__(self, exe: str, count: int, threads: int, cpus: set[int] | None, token: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="dlop-bench-offload-")
        token_file = Path(self.dir) / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        self.procs, self.addresses = [], []
        for _ in range(count):
            proc = subprocess.Popen([exe, "--listen", "127.0.0.1:0", "--token-file", str(token_file),
                                     "--threads", str(threads)], stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)
            line = proc.stdout.readline()
            if "listening on" not in line:
                self.close()
                raise RuntimeError(f"dlop-offloader did not start: {line!r}")
            self.addresses.append("127.0.0.1:" + line.strip().rsplit(":", 1)[1])
            if cpus:
                os.sched_setaffinity(proc.pid, cpus)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs] + [c for p in self.procs for c in descendants(p.pid)]

    def close(self) -> None:
        _common.stop_processes(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)


def timed_passes(make_iter, batch: int, batches: int, reps: int, helper_pids, desc: str = "",
                 unit: str = "image") -> dict:
    """Median over passes of samples/s and CPU per sample. A batch is a tuple whose first item holds the samples
    (audio's has lengths after the labels).

    samples/s is timed over `batches` batches after a warm-up one. CPU per sample is the CPU of the trainer and
    its helpers over the whole pass, from before its iterator is made to its end, divided by every sample of it:
    workers and offloaders prefetch, so a window after the warm-up batch would miss the work done before it and
    count work done for batches after it, and the two need not cancel. The pass therefore always runs to the end
    of its epoch, where no work is in flight."""
    rates, cpu_all, cpu_trainer = [], [], []
    bar = _common.progress(total=reps * batches * batch, desc=desc or "offload", unit=unit)
    for _ in range(reps):
        before = {p: proc_cpu(p) for p in helper_pids()}  # helpers started by make_iter count from zero
        own0 = trainer_cpu()
        it = make_iter()
        total = next(it)[0].shape[0]  # warm-up: workers started, first batch in flight
        wall0, n, wall = time.perf_counter(), 0, None
        for got in it:
            total += got[0].shape[0]
            if wall is None:
                n += got[0].shape[0]
                bar.update(got[0].shape[0])
                if n >= batches * batch:
                    wall = time.perf_counter() - wall0
        if wall is None:
            if n == 0:
                raise RuntimeError("no batch after the warm-up one: use more --images or fewer --batches")
            wall = time.perf_counter() - wall0
        own = trainer_cpu() - own0
        helpers = sum(proc_cpu(p) - before.get(p, 0.0) for p in helper_pids() if os.path.exists(f"/proc/{p}"))
        rates.append(n / wall)
        cpu_all.append((own + helpers) / total)
        cpu_trainer.append(own / total)
    bar.close()
    return {"samples_per_s": _common.median(rates), "cpu_s_per_sample": _common.median(cpu_all),
            "trainer_cpu_s_per_sample": _common.median(cpu_trainer)}


# --- the report ---------------------------------------------------------

_LINE = "{:>11} {:>8} {:>10} {:>12} {:>14} {:>16} {:>14} {:>11}"


def print_rows(rows: list[dict]) -> None:
    print(_LINE.format("pipeline", "workers", "offloaders", "samples/s", "cpu s/sample", "trainer s/sample",
                       "peak RSS MiB", "per core"))
    for r in rows:
        if "unavailable" in r:
            print(f"{r['pipeline']:>11} {r['workers']:>8}   not available: {r['unavailable']}")
            continue
        per_core = 1.0 / r["cpu_s_per_sample"] if r["cpu_s_per_sample"] > 0 else float("inf")
        print(_LINE.format(r["pipeline"], r["workers"], r.get("offloaders", "-"), f"{r['samples_per_s']:.1f}",
                           f"{r['cpu_s_per_sample'] * 1e3:.2f} ms", f"{r['trainer_cpu_s_per_sample'] * 1e3:.3f} ms",
                           f"{r['peak_rss_mib']:.0f}", f"{per_core:.0f}/s"))


def finish(json_path: str | None, header: dict, rows: list[dict], print_ratios) -> int:
    """Prints the table and the benchmark's ratios, writes the JSON if asked: the exit status."""
    print_rows(rows)
    print_ratios(rows)
    if json_path:
        _common.write_json(json_path, header, rows)
        print(f"# written to {json_path}")
    return 0
