"""What the benchmarks share: sizes, medians, the run's description, JSON output."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

# The reports' own functions, shared with the benchmarks that write what they read.
from dlop.report.common import UNITS, format_size, median, percentile, read_rows  # noqa: F401


def parse_size(text: str) -> int:
    """'8', '4K', '256M', '1G' -> bytes (binary units, as dlop-bench reads them)."""
    text = text.strip()
    digits = len(text) - len(text.lstrip("0123456789"))
    unit = text[digits:].upper()
    if digits == 0 or unit not in UNITS:
        raise ValueError(f"'{text}' is not a size like 8, 4K, 256M or 1G")
    return int(text[:digits]) * UNITS[unit]


def size_range(minimum: int, maximum: int, factor: int) -> list[int]:
    if factor < 2:
        raise ValueError("the size factor must be at least 2")
    sizes, size = [], max(minimum, 1)
    while size <= maximum:
        sizes.append(size)
        size *= factor
    return sizes


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def git_revision() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def command_line() -> str:
    """The command as a user would retype it (module form, not the file path)."""
    module = sys.modules["__main__"].__spec__
    program = f"python -m {module.name.removesuffix('.__main__')}" if module is not None else sys.argv[0]
    return " ".join([program] + [shlex.quote(a) for a in sys.argv[1:]])


def run_header(**extra) -> dict:
    import torch

    header = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cores": cpu_count(),
        "revision": git_revision(),
        "torch": torch.__version__,
        "command": command_line(),
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("DLOP_", "UCX_"))},
    }
    header.update(extra)
    return header


def header_comment(header: dict) -> str:
    return (f"# {header['date']} on {header['host']} ({header.get('cpu', 'unknown CPU')}), {header['cores']} cores, "
            f"{header['revision']}, torch {header['torch']}")


def progress(iterable=None, *, show: bool = True, **kwargs):
    """A tqdm bar on stderr for a long loop; off when stderr is not a terminal (logs, CI) or `show` is false
    (ranks other than 0, or a parent process that draws its own bar)."""
    from tqdm import tqdm

    return tqdm(iterable, disable=None if show else True, file=sys.stderr, dynamic_ncols=True, leave=False, **kwargs)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_json(path: str, header: dict, rows: list[dict]) -> None:
    with open(path, "w") as out:
        json.dump({"header": header, "rows": rows}, out, indent=2, sort_keys=True)
        out.write("\n")


def stop_processes(procs: list) -> None:
    """SIGTERM each process still running, then wait; one that outlives 10 s is killed."""
    import signal
    import subprocess

    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def end_run(control) -> int:
    """Every rank waits for the others on `control` (a CPU group), then leaves: the benchmark's exit status."""
    import torch.distributed as dist

    dist.barrier(group=control)
    dist.destroy_process_group()
    return 0


def launched_by_torchrun(name: str) -> bool:
    """False, having said how to launch `name` (bench.NAME), when it was not started by torchrun."""
    if "RANK" in os.environ:
        return True
    print(f"{name}: launch with torchrun, e.g. torchrun --nproc-per-node 2 -m {name}", file=sys.stderr)
    return False
