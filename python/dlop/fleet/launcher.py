"""`dlop offloader --store HOST:PORT [--advertise HOST] [daemon args...]`, or
`dlop offloader [daemon args...]` in het group 1 of a SLURM job.

Starts ``dlop-offloader`` (``$DLOP_OFFLOADER``, else the one next to this
Python, else on PATH) with the remaining arguments, waits until it listens,
and announces the address trainers can reach it at in the training job's
c10d store (``dlop.fleet.discovery``), where ``dlop run --discover`` finds
it, also mid-epoch. SIGINT/SIGTERM/SIGHUP go to the daemon; when it exits its
announcement is withdrawn and this command exits with its status.

The store is the job's TCPStore: under torchrun, MASTER_ADDR:MASTER_PORT.

In a SLURM job, without --store, the daemon listens where that job's
`dlop run` looks (dlop.fleet.slurm.het_offloaders: every interface, on the port
derived from the job id, plus SLURM_LOCALID), with the job's token
(DLOP_OFFLOAD_TOKEN_FILE) and a compute thread per CPU of its task, and
prints the node it runs on.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from dlop.fleet import discovery


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """preexec_fn: SIGTERM to this child when process `parent` dies (also by SIGKILL)."""
    # Runs in the child between fork and exec; the mark survives exec.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        os._exit(126)
    if os.getppid() != parent:  # the parent died before prctl: nobody would send the signal
        os._exit(0)


def daemon_path() -> str:
    for candidate in (os.environ.get("DLOP_OFFLOADER", ""), str(Path(sys.executable).parent / "dlop-offloader"),
                      shutil.which("dlop-offloader") or ""):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("dlop offloader: dlop-offloader not found (set DLOP_OFFLOADER, or build it: make build)")


def _host_port(text: str, what: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"dlop offloader: {what} {text!r} is not HOST:PORT")
    return host, int(port)


def _reachable_host(listen_host: str, store: tuple[str, int], advertise: str | None) -> str:
    """The host to announce: --advertise, the listen host, or (for a wildcard)
    this machine's address on the route to the store, which trainers share."""
    if advertise:
        return advertise
    if listen_host not in ("0.0.0.0", "::", ""):
        return listen_host
    with socket.create_connection(store, timeout=10) as s:
        return s.getsockname()[0]


def _connect_store(host: str, port: int, timeout: float, stopping: threading.Event):
    """A TCPStore client, tried in short attempts so that a signal is handled meanwhile."""
    from torch.distributed import TCPStore

    deadline = time.monotonic() + timeout
    while True:
        try:
            attempt = min(2.0, max(0.5, deadline - time.monotonic()))
            return TCPStore(host, port, is_master=False, wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=attempt))
        except Exception as e:  # RuntimeError/DistNetworkError while the store is not up yet
            if stopping.is_set() or time.monotonic() > deadline:
                raise SystemExit(f"dlop offloader: cannot reach the store at {host}:{port} ({e})") from None
            time.sleep(0.5)


def _given(rest: list[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in rest)


def _slurm_daemon_args(listen_host: str, rest: list[str], env) -> tuple[str, list[str], str]:
    """(--listen, the other daemon arguments, a line saying where it runs) for het group 1 of a SLURM job."""
    from dlop.fleet import slurm

    try:
        port = slurm.offloader_port(env) + int(env.get("SLURM_LOCALID") or 0)
        tasks_here = slurm.tasks_on_this_node(env)
    except ValueError as e:
        raise SystemExit(f"dlop offloader: {e}") from None
    extra = []
    if not _given(rest, "--token-file"):
        if not env.get("DLOP_OFFLOAD_TOKEN_FILE"):
            raise SystemExit("dlop offloader: no token: DLOP_OFFLOAD_TOKEN_FILE is unset (the batch script makes "
                             "the job's: see dlop slurm-template), and no --token-file was given")
        extra += ["--token-file", env["DLOP_OFFLOAD_TOKEN_FILE"]]
    cpus = env.get("SLURM_CPUS_PER_TASK") or str(max(1, int(env.get("SLURM_CPUS_ON_NODE") or 0) // tasks_here))
    if not _given(rest, "--threads") and cpus.isdigit() and int(cpus) > 0:
        extra += ["--threads", cpus]
    where = (f"dlop offloader: on {socket.gethostname()} for SLURM job {env.get('SLURM_JOB_ID')}, "
             f"port {port} (het group 1's nodes, the port from the job id: dlop run finds it)")
    return f"{listen_host}:{port}", extra + rest, where


def _start(argv: list[str], start_timeout: float, hint: str = "") -> tuple[subprocess.Popen, int]:
    """dlop-offloader started with argv and listening: (the process, its port). Its stdout is relayed."""
    # A process group of its own: a signal to ours (scancel, a terminal's Ctrl-C) reaches the daemon once,
    # forwarded by main(); a second SIGTERM would cut its drain short. It still goes if we are SIGKILLed.
    parent = os.getpid()
    proc = subprocess.Popen([daemon_path(), *argv], stdout=subprocess.PIPE, text=True, process_group=0,
                            preexec_fn=lambda: die_with_parent(parent))
    # The daemon's stdout is relayed line by line; the first line says where it listens.
    lines: queue.Queue = queue.Queue()

    def relay() -> None:
        for line in proc.stdout:
            lines.put(line)
            sys.stdout.write(line)
            sys.stdout.flush()
        lines.put(None)

    threading.Thread(target=relay, daemon=True).start()
    deadline = time.monotonic() + start_timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            raise SystemExit(f"dlop offloader: dlop-offloader did not listen within {start_timeout:g} s") from None
        if line is None:
            code = proc.wait()
            raise SystemExit(f"dlop offloader: dlop-offloader exited with status {code} before listening{hint}")
        if "listening on" in line:
            return proc, int(line.strip().rsplit(":", 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dlop offloader",
        description="Run dlop-offloader and announce it in a training job's c10d store, or, in a SLURM job "
                    "without --store, where that job's `dlop run` looks for it. Arguments not listed here go to "
                    "dlop-offloader (--token-file is required there, except in a SLURM job).")
    parser.add_argument("--store", help="HOST:PORT of the job's TCPStore (torchrun: MASTER_ADDR:MASTER_PORT); "
                                        "in a SLURM job's het group 1 leave it out")
    parser.add_argument("--listen", default="0.0.0.0:0", help="passed to dlop-offloader (default: every interface, "
                                                              "any port; in a SLURM job the port is the job's)")
    parser.add_argument("--advertise", help="host to announce (default: the listen host, or for 0.0.0.0 the "
                                            "address this machine reaches the store from)")
    parser.add_argument("--store-timeout", type=float, default=300.0, help="seconds to wait for the store (default 300)")
    parser.add_argument("--start-timeout", type=float, default=30.0,
                        help="seconds to wait for the daemon to listen (default 30)")
    args, rest = parser.parse_known_args(argv)
    listen_host, _ = _host_port(args.listen, "--listen")
    store_addr = _host_port(args.store, "--store") if args.store else None
    hint = ""
    if store_addr is None:
        if not os.environ.get("SLURM_JOB_ID"):
            parser.error("--store is required outside a SLURM job (there, het group 1 runs `dlop offloader` "
                         "without it: see dlop slurm-template)")
        listen, rest, where = _slurm_daemon_args(listen_host, rest, os.environ)
        print(where, flush=True)
        hint = (f" (is port {listen.rsplit(':', 1)[1]} taken? DLOP_SLURM_OFFLOADER_PORT in the batch script "
                "chooses another)")
    else:
        listen = args.listen

    stopping = threading.Event()
    proc = None

    def forward(signum, _frame):
        stopping.set()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    proc, port = _start(["--listen", listen, *rest], args.start_timeout, hint)
    if stopping.is_set():  # a signal came while it started
        proc.terminate()
    if store_addr is None:
        code = proc.wait()
        return code if code >= 0 else 128 - code

    store = index = None
    try:
        store = _connect_store(*store_addr, args.store_timeout, stopping)
        address = f"{_reachable_host(listen_host, store_addr, args.advertise)}:{port}"
        index = discovery.announce(store, address)
        print(f"dlop offloader: announced {address} in the store at {args.store}", flush=True)
    except BaseException:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        raise
    code = proc.wait()
    try:
        discovery.withdraw(store, index)
    except Exception:  # the job (and its store) may be gone already: nothing to withdraw from
        pass
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
