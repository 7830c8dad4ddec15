"""Offloaders known by name, or that may not listen yet: what `dlop run`'s
trainers do with ``--offloaders-dns NAME:PORT`` (every address behind a
name, e.g. a Kubernetes headless Service) and with a SLURM job's offloaders,
which start beside the trainers.

:func:`resolve` gives every A and AAAA record of a name. :func:`wait_for_any`
polls the candidates until one accepts a TCP connection or the time is up.
:class:`Watcher` then reports, once each, the candidates that start
answering later (a daemon still starting, a pod that joins the Service): a
thread re-resolves the names every ``resolve_every`` seconds and tries the
addresses not seen yet every ``interval``. Nothing here raises into the
training loop; failures are kept for the warning that names them.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable, Iterable

_log = logging.getLogger("dlop.fleet.dns")


def split_host_port(text: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"; ValueError naming the text otherwise."""
    host, _, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: an IPv6 address goes in brackets, [ADDR]:PORT")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not NAME:PORT")
    return host, int(port)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve(name_port: str) -> list[str]:
    """Every address behind NAME (A and AAAA records, as getaddrinfo gives them), as HOST:PORT in the
    resolver's order, each once. OSError naming the name when it does not resolve."""
    host, port = split_host_port(name_port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise OSError(f"{host} does not resolve ({e.strerror})") from None
    out: list[str] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            address = join_host_port(sockaddr[0], port)
            if address not in out:
                out.append(address)
    return out


def answers(address: str, timeout: float = 1.0) -> str | None:
    """None when something accepts a TCP connection at address, else why not."""
    host, port = split_host_port(address)
    try:
        s = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
    # Leave as a client that is done: say so, then read to the daemon's close. Closing
    # with what it sent unread would reset the connection, which reads as a network fault.
    with s:
        try:
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):
                pass
        except OSError:
            pass
    return None


class Candidates:
    """Fixed addresses plus those behind names, re-resolved on each call; failures kept in `errors`."""

    def __init__(self, addresses: Iterable[str], names: Iterable[str]) -> None:
        self.addresses = list(addresses)
        self.names = list(names)
        self.errors: dict[str, str] = {}

    def __call__(self) -> list[str]:
        out = list(self.addresses)
        for name in self.names:
            try:
                found = resolve(name)
                self.errors.pop(name, None)
            except (OSError, ValueError) as e:
                self.errors[name] = str(e)
                continue
            out += [a for a in found if a not in out]
        return out


def wait_for_any(candidates: Candidates, timeout: float, poll: float = 0.2) -> tuple[list[str], str]:
    """(the candidates that answer, why none did: "" when some do), trying until `timeout` has passed
    (one round when it is 0)."""
    if not (candidates.addresses or candidates.names):
        return [], "no offloader address or name was given"
    deadline = time.monotonic() + timeout
    while True:
        addresses = candidates()
        why = {a: answers(a) for a in addresses}
        ready = [a for a, w in why.items() if w is None]
        if ready or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    if ready:
        return ready, ""
    failures = [f"{a} ({w})" for a, w in why.items()] + [f"{n}: {e}" for n, e in candidates.errors.items()]
    waited = f" within {timeout:g} s" if timeout > 0 else ""
    return [], f"no offloader answered{waited}: " + ("; ".join(failures) or "the names resolve to no address")


class Watcher:
    """Calls ``callback(address)`` from a thread once per candidate that starts answering, skipping `seen`."""

    def __init__(self, candidates: Candidates, callback: Callable[[str], None], seen: Iterable[str] = (),
                 interval: float = 1.0, resolve_every: float = 10.0) -> None:
        self._candidates = candidates
        self._callback = callback
        self._seen = set(seen)
        self._interval = float(interval)
        self._resolve_every = float(resolve_every)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlop-fleet", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending: list[str] = []
        resolved_at = float("-inf")
        while not self._stop.is_set():
            if time.monotonic() - resolved_at >= self._resolve_every:
                resolved_at = time.monotonic()
                pending = [a for a in self._candidates() if a not in self._seen]
            for address in [a for a in pending if answers(a) is None]:
                self._seen.add(address)
                pending.remove(address)
                try:
                    self._callback(address)
                except Exception:  # the callback's failure is not the watcher's to propagate
                    _log.exception("dlop fleet: the callback for offloader %s failed", address)
            if not pending and not self._candidates.names:
                return  # fixed addresses only, every one seen: nothing can join any more
            self._stop.wait(self._interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
