"""CPU time of every thread of the bench.train trainer ranks, summed per
config and thread name: python bench/train/thread_cpu.py SECONDS [STOPFILE]

Samples /proc/*/task/*/stat every 0.5 s (a thread's last reading counts) for
SECONDS or until STOPFILE exists, then prints one line per (config, thread).
Run it beside ``python -m bench.train``; see bench/results/progress_thread_cpu/.
"""

import collections
import json
import os
import sys
import time


def sample(last: dict) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if b"bench.train_rank" not in cmd:
                continue
            config = json.loads(cmd[cmd.index(b"bench.train_rank") + 1])["config"]
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                last[(config, pid, tid, name)] = int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue  # the process or thread ended meanwhile


def main() -> None:
    end = time.time() + float(sys.argv[1])
    stop = sys.argv[2] if len(sys.argv) > 2 else None
    last: dict = {}
    while time.time() < end and not (stop and os.path.exists(stop)):
        sample(last)
        time.sleep(0.5)
    total = collections.defaultdict(int)
    for (config, _pid, _tid, name), ticks in last.items():
        total[(config, name)] += ticks
    for (config, name), ticks in sorted(total.items()):
        print(f"{config:>26} {name:<16} {ticks / os.sysconf('SC_CLK_TCK'):8.2f} s")


if __name__ == "__main__":
    main()
