"""CPU time of this process's threads, grouped by who they work for.

Linux only: /proc/self/task/*/schedstat gives each thread's time on a CPU in
nanoseconds (/proc/self/task/*/stat in clock ticks where schedstat is
missing). Threads are grouped by name:

| group | threads |
| --- | --- |
| dlop | the backend's own threads (``dlop-progress``, ``dlop-complete``, ...) |
| gloo | Gloo's (``pt_gloo_runloop``, ``gloo_*``) and torch's c10d watchdog threads serving them |
| training | every other thread: the caller (forward, backward, optimizer), torch's intra-op threads |

The caller's thread also runs whatever a backend does inline (submitting,
a blocking wait that drives progress): that shows under "training", and the
bench's single-process mode (no DDP) is the reference that separates it.
"""

from __future__ import annotations

import os

GROUPS = ("training", "dlop", "gloo")
_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def group_of(name: str) -> str:
    if name.startswith("dlop-"):
        return "dlop"
    if "gloo" in name.lower():
        return "gloo"
    return "training"


def _thread_ns(task: str) -> float | None:
    try:
        with open(f"/proc/self/task/{task}/schedstat") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/self/task/{task}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_NS
    except (OSError, ValueError, IndexError):
        return None  # the thread ended meanwhile


def snapshot() -> dict[str, tuple[str, float]]:
    """{thread id: (name, CPU nanoseconds so far)} for every live thread of this process."""
    threads = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        ns = _thread_ns(task)
        if ns is not None:
            threads[task] = (name, ns)
    return threads


def by_group(before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, per group. A thread born in between counts from zero; one that
    ended in between is lost (the backends' threads live as long as their groups)."""
    spent = dict.fromkeys(GROUPS, 0.0)
    for task, (name, ns) in after.items():
        spent[group_of(name)] += (ns - before.get(task, (name, 0.0))[1]) / 1e9
    return spent


def by_name(before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, per thread name (threads of one name summed)."""
    spent: dict[str, float] = {}
    for task, (name, ns) in after.items():
        spent[name] = spent.get(name, 0.0) + (ns - before.get(task, (name, 0.0))[1]) / 1e9
    return spent
