"""`dlop offloader --store HOST:PORT [--advertise HOST] [daemon args...]`.

Starts ``dlop-offloader`` (``$DLOP_OFFLOADER``, else the one next to this
Python, else on PATH) with the remaining arguments, waits until it listens,
and announces the address trainers can reach it at in the training job's
c10d store (``dlop.data.discovery``), where ``dlop run --discover`` finds
it, also mid-epoch. SIGINT/SIGTERM/SIGHUP go to the daemon; when it exits its
announcement is withdrawn and this command exits with its status.

The store is the job's TCPStore: under torchrun, MASTER_ADDR:MASTER_PORT.
"""

from __future__ import annotations

import argparse
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

from dlop.data import discovery


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dlop offloader",
        description="Run dlop-offloader and announce it in a training job's c10d store. "
                    "Arguments not listed here go to dlop-offloader (--token-file is required there).")
    parser.add_argument("--store", required=True, help="HOST:PORT of the job's TCPStore (torchrun: MASTER_ADDR:MASTER_PORT)")
    parser.add_argument("--listen", default="0.0.0.0:0", help="passed to dlop-offloader (default: every interface, any port)")
    parser.add_argument("--advertise", help="host to announce (default: the listen host, or for 0.0.0.0 the "
                                            "address this machine reaches the store from)")
    parser.add_argument("--store-timeout", type=float, default=300.0, help="seconds to wait for the store (default 300)")
    parser.add_argument("--start-timeout", type=float, default=30.0, help="seconds to wait for the daemon to listen")
    args, rest = parser.parse_known_args(argv)
    store_addr = _host_port(args.store, "--store")
    listen_host, _ = _host_port(args.listen, "--listen")

    proc = subprocess.Popen([daemon_path(), "--listen", args.listen, *rest], stdout=subprocess.PIPE, text=True)
    stopping = threading.Event()

    def forward(signum, _frame):
        stopping.set()
        if proc.poll() is None:
            proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)

    # The daemon's stdout is relayed line by line; the first line says where it listens.
    lines: queue.Queue = queue.Queue()

    def relay() -> None:
        for line in proc.stdout:
            lines.put(line)
            sys.stdout.write(line)
            sys.stdout.flush()
        lines.put(None)

    threading.Thread(target=relay, daemon=True).start()
    port = None
    deadline = time.monotonic() + args.start_timeout
    while port is None:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            raise SystemExit(f"dlop offloader: dlop-offloader did not listen within {args.start_timeout:g} s") from None
        if line is None:
            code = proc.wait()
            print(f"dlop offloader: dlop-offloader exited with status {code} before listening", file=sys.stderr)
            return code if code > 0 else 1
        if "listening on" in line:
            port = int(line.strip().rsplit(":", 1)[1])

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
