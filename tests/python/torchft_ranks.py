"""A torchft group's survivor and its peers, for tests/python/test_torchft.py (run as a script).

    python torchft_ranks.py {dlop,baby,gloo} {kill,stop} ROUNDS

The survivor (this process) hosts the store; each round it configures a group
of 2 with a new peer (forked from a server that imported torch, dlop and
torchft once), all-reduces with it, starts an all-reduce the peer never joins,
then SIGKILLs the peer (kill) or SIGSTOPs it (stop: a live peer that says
nothing, as behind a cut link), waits for the error (kill) or aborts the
group (stop), and checks that a group made at once works. One JSON line per
round: times, and the process's file descriptors, threads, /dev/shm entries
and RSS after it.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from datetime import timedelta

import torch
from torch.distributed import ReduceOp, TCPStore

COUNT = 1 << 18  # 1 MiB of floats: the in-flight all-reduce is a message algorithm, not the inline one


def group_class(kind: str):
    if kind == "gloo":
        from torchft.process_group import ProcessGroupGloo

        return ProcessGroupGloo
    from dlop.c10d.torchft import ProcessGroupBabyDlop, ProcessGroupDlop

    return ProcessGroupBabyDlop if kind == "baby" else ProcessGroupDlop


def peer_main(kind: str, store_addr: str, ready) -> None:
    pg = group_class(kind)(timeout=timedelta(seconds=60))
    pg.configure(store_addr, "peer", 1, 2)
    x = torch.ones(COUNT)
    pg.allreduce([x], ReduceOp.SUM).wait()
    ready.send(x[0].item())
    time.sleep(3600)


def figures() -> dict:
    statm = open("/proc/self/statm").read().split()
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "shm": len(os.listdir("/dev/shm")), "rss_mb": int(statm[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20}


def main() -> None:
    kind, how, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchft.process_group", "dlop", "dlop.c10d.torchft"])
    store = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    pg = group_class(kind)(timeout=timedelta(seconds=60))
    for i in range(rounds):
        addr = f"127.0.0.1:{store.port}/round/{i}"
        mine, theirs = ctx.Pipe()
        peer = ctx.Process(target=peer_main, args=(kind, addr, theirs))  # not a daemon: a baby peer has a child
        peer.start()
        t = time.monotonic()
        pg.configure(addr, "survivor", 0, 2)
        configured = time.monotonic() - t
        x = torch.ones(COUNT)
        pg.allreduce([x], ReduceOp.SUM).wait()
        assert x[0].item() == 2.0 and mine.recv() == 2.0
        work = pg.allreduce([torch.ones(COUNT)], ReduceOp.SUM)  # the peer never joins it
        t = time.monotonic()
        os.kill(peer.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        error, failed_s, abort_s = None, None, None
        if how == "kill":
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001  (the failure is what is measured)
                error, failed_s = str(e).splitlines()[0], time.monotonic() - t
        t = time.monotonic()
        pg.abort()
        abort_s = time.monotonic() - t
        if how == "stop":
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001
                error = str(e).splitlines()[0]
            os.kill(peer.pid, signal.SIGKILL)
        peer.join()
        t = time.monotonic()
        pg.configure(f"127.0.0.1:{store.port}/alone/{i}", "survivor", 0, 1)
        y = torch.ones(8)
        pg.allreduce([y], ReduceOp.SUM).wait()
        alone_s = time.monotonic() - t
        print(json.dumps({"round": i, "configure_s": configured, "failed_s": failed_s, "abort_s": abort_s,
                          "alone_s": alone_s, "error": error, **figures()}), flush=True)
    pg.shutdown()


if __name__ == "__main__":
    main()
