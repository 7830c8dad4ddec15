"""What an OffloadLoader measures each step, and its Prometheus endpoint.

Each loader keeps a :class:`Recorder`. Per batch it costs two
``time.perf_counter`` calls, a few reads of the lease manager's counters and
one append to a bounded deque:

* the data stall: how long the training loop waited inside the loader's
  ``__next__`` for the batch (the whole wait: lease, landing, the Python
  path's decoding, the upload to a device);
* the step: the time from one batch handed out to the next (the training
  step, stall included); an iteration's first batch counts its stall alone;
* the batches in flight: leases the daemons are making for this rank,
  estimated from the lease manager's counters (issued, less reissued, less
  completed, since the epoch began); locally, batches given to the worker
  processes and not yet yielded;
* per offloader (by its ``host:port``): the batches it completed for this
  rank, and their rate over the last :data:`WINDOW_SECONDS`;
* per offloader, its busy fraction: the share of its last
  ``dlop._C.offload.BUSY_WINDOW_SECONDS`` the daemon's compute pool spent
  making batches, as its latest batch for this rank reported it (``None``
  before that batch, or once the daemon died): the daemon's own
  ``dlop_offloader_busy_ratio``, over the same window.

``OffloadLoader.stats()`` returns a :class:`LoaderStats`. With
``DLOP_METRICS_PORT`` set, the process serves the stats of all its loaders as
Prometheus text on ``http://0.0.0.0:PORT/metrics`` from a daemon thread
(:func:`serve`): PORT plus ``LOCAL_RANK`` when several ranks share a host,
any free port for 0. A port that cannot be bound is a warning naming it;
training goes on without the endpoint.

The names follow Prometheus's conventions and the daemon's (``dlop-offloader
--metrics-port``): base units, ``_total`` for counters, ``_ratio`` for a
share in [0, 1]. A trainer's series are ``dlop_data_*``, a daemon's
``dlop_offloader_*``; what a trainer says of an offloader is
``dlop_data_offloader_*``, named as the daemon names the same figure
(``dlop_data_offloader_batches_sent_total`` summed over the ranks is the
daemon's ``dlop_offloader_batches_sent_total``).
"""

from __future__ import annotations

import collections
import http.server
import math
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Iterable

#: The span (seconds) of the windowed figures: rates, mean stall and step.
WINDOW_SECONDS = 10.0
# Steps kept for the window at most, whatever the step rate.
_WINDOW_STEPS = 4096


@dataclass(frozen=True)
class OffloaderStats:
    """One offloader as one rank sees it."""

    address: str  #: ``host:port`` as given to the loader
    batches: int  #: batches it completed for this rank, since the loader was made
    batches_per_second: float  #: completed for this rank, over the window
    #: the share of its last few seconds the daemon spent making batches, as its latest batch
    #: reported it; None before its first batch for this rank, or once it died
    busy_fraction: float | None = None


@dataclass(frozen=True)
class LoaderStats:
    """One rank's data-loading figures (``OffloadLoader.stats()``).

    Totals run from the loader's construction over all epochs; ``stall_seconds``,
    ``step_seconds``, ``stall_ratio`` and the offloaders' rates cover the last
    ``window_seconds`` (at most :data:`WINDOW_SECONDS`); ``last_*`` is the last step.
    """

    rank: int
    offloaded: bool  #: False: the batches are made locally (no offloader answered, or all died)
    time: float  #: ``time.perf_counter()`` when the last batch was handed out (0.0 before any)
    steps: int  #: batches handed out
    stall_seconds_total: float  #: time the training loop waited inside ``__next__``
    step_seconds_total: float  #: time from batch to batch (stall included)
    last_stall_seconds: float
    last_step_seconds: float
    window_seconds: float  #: the span the windowed figures cover
    window_steps: int
    stall_seconds: float  #: mean stall per step over the window
    step_seconds: float  #: mean step over the window
    stall_ratio: float  #: stall / step over the window
    batches_in_flight: int | None  #: None before the first batch
    prefetch: int  #: the loader's lease window (batches leased ahead of the consumer)
    offloaders_live: int  #: daemons the lease manager still uses
    leases_issued: int
    leases_reissued: int  #: leases lost (a daemon died, failed a batch or timed out) and leased again
    offloaders: tuple[OffloaderStats, ...] = ()
    #: samples left out of their batches as unreadable (``on_error="skip"``), since the loader was made
    samples_skipped: int = 0


class Recorder:
    """A loader's figures. The loader's iteration calls :meth:`start_iteration`,
    :meth:`offloaded` or :meth:`local` as each batch is made, and :meth:`step` as
    it is handed out; :meth:`stats` may be called from any thread."""

    def __init__(self, rank: int = 0, prefetch: int = 0, window: float = WINDOW_SECONDS) -> None:
        self.rank, self.prefetch, self.window = int(rank), int(prefetch), float(window)
        self._lock = threading.Lock()
        self._addresses: list[str] = []  # by the lease manager's add_daemon order
        self._completed: tuple[int, ...] = ()
        self._busy: tuple[float, ...] = ()  # NaN: unknown
        self._issued = self._reissued = self._live = 0
        self._base = 0  # issued - reissued - completed when the epoch began
        self._in_flight: int | None = None
        self._offloaded = False
        self._last_got: float | None = None
        self._steps = 0
        self._stall_total = self._step_total = 0.0
        self._last = (0.0, 0.0, 0.0)  # (time, stall, step)
        # Per step: (time handed out, stall, step, completed per daemon).
        self._recent: collections.deque = collections.deque(maxlen=_WINDOW_STEPS)
        self._skipped = 0

    def add_address(self, address: str) -> None:
        """A daemon the lease manager took (in its add_daemon order)."""
        with self._lock:
            self._addresses.append(address)
            self._completed = self._completed + (0,)
            self._busy = self._busy + (math.nan,)

    def start_iteration(self, manager: Any = None) -> None:
        """An iteration begins: its first step counts from here; with offloaders,
        the in-flight estimate starts over (restore canceled the older leases)."""
        self._last_got = None
        if manager is not None:
            self.read(manager)
            self._base = self._issued - self._reissued - sum(self._completed)

    def read(self, m: Any) -> None:
        """The lease manager's counters now (the offloaders live, the batches each completed, how
        busy each said it was)."""
        completed, busy = tuple(m.completed_per_daemon()), tuple(m.busy_per_daemon())
        issued, reissued, live = m.leases_issued(), m.leases_reissued(), m.live_daemons()
        with self._lock:
            self._completed, self._busy = completed, busy
            self._issued, self._reissued, self._live = issued, reissued, live
            self._offloaded = True

    def offloaded(self, manager: Any) -> None:
        """A batch came from the lease manager: its counters now."""
        self.read(manager)
        out = self._issued - self._reissued - sum(self._completed) - self._base
        self._in_flight = min(max(out, 0), self.prefetch) if self.prefetch else max(out, 0)

    def local(self, in_flight: int) -> None:
        """A batch came from the local worker processes."""
        self._offloaded = False
        self._live = 0
        self._in_flight = int(in_flight)

    def skipped(self, count: int) -> None:
        """Samples a batch left out as unreadable (the skip policy)."""
        with self._lock:
            self._skipped += int(count)

    def step(self, asked: float, got: float) -> None:
        """The training loop asked for a batch at ``asked`` and got it at ``got`` (perf_counter)."""
        stall = got - asked
        step = got - self._last_got if self._last_got is not None else stall
        self._last_got = got
        with self._lock:
            self._steps += 1
            self._stall_total += stall
            self._step_total += step
            self._last = (got, stall, step)
            self._recent.append((got, stall, step, self._completed))
            while len(self._recent) > 1 and got - self._recent[0][0] > self.window:
                self._recent.popleft()

    def stats(self) -> LoaderStats:
        with self._lock:
            recent = list(self._recent)
            addresses, completed, busy = list(self._addresses), self._completed, self._busy
            steps, stall_total, step_total, last = self._steps, self._stall_total, self._step_total, self._last
            issued, reissued, live, in_flight = self._issued, self._reissued, self._live, self._in_flight
            skipped = self._skipped
        span = recent[-1][0] - recent[0][0] if len(recent) > 1 else 0.0
        # The window's steps: those after its first sample (whose rates start there).
        counted = recent[1:] if len(recent) > 1 else recent
        stall_sum = sum(r[1] for r in counted)
        step_sum = sum(r[2] for r in counted)
        # Per address (one given twice is one daemon): batches and rates add up, the busy
        # fraction is the larger known.
        by_address: dict[str, list] = {}
        for k, address in enumerate(addresses):
            done = completed[k] if k < len(completed) else 0
            before = recent[0][3][k] if recent and k < len(recent[0][3]) else 0
            rate = (done - before) / span if span > 0 else 0.0
            known = busy[k] if k < len(busy) and not math.isnan(busy[k]) else None
            entry = by_address.setdefault(address, [0, 0.0, None])
            entry[0] += done
            entry[1] += rate
            if known is not None and (entry[2] is None or known > entry[2]):
                entry[2] = known
        return LoaderStats(
            rank=self.rank, offloaded=self._offloaded, time=last[0], steps=steps,
            stall_seconds_total=stall_total, step_seconds_total=step_total,
            last_stall_seconds=last[1], last_step_seconds=last[2],
            window_seconds=span, window_steps=len(counted),
            stall_seconds=stall_sum / len(counted) if counted else 0.0,
            step_seconds=step_sum / len(counted) if counted else 0.0,
            stall_ratio=stall_sum / step_sum if step_sum > 0 else 0.0,
            batches_in_flight=in_flight, prefetch=self.prefetch, offloaders_live=live,
            leases_issued=issued, leases_reissued=reissued,
            offloaders=tuple(OffloaderStats(a, int(n), r, b) for a, (n, r, b) in by_address.items()),
            samples_skipped=skipped,
        )


# --- Prometheus text exposition -------------------------------------------------------------------

# (name, type, help, how to read it from a LoaderStats). Per-offloader ones follow.
_LOADER_METRICS = (
    ("dlop_data_batches_total", "counter", "Batches the loader handed to the training loop.",
     lambda s: s.steps),
    ("dlop_data_stall_seconds_total", "counter",
     "Time the training loop waited inside the loader's __next__ for a batch.", lambda s: s.stall_seconds_total),
    ("dlop_data_step_seconds_total", "counter", "Time from batch to batch (the training step, stall included).",
     lambda s: s.step_seconds_total),
    ("dlop_data_stall_seconds", "gauge", "Mean data stall per step over the window.", lambda s: s.stall_seconds),
    ("dlop_data_step_seconds", "gauge", "Mean step over the window.", lambda s: s.step_seconds),
    ("dlop_data_stall_ratio", "gauge", "Data stall over step time, over the window.", lambda s: s.stall_ratio),
    ("dlop_data_window_seconds", "gauge", "The span the windowed figures cover.", lambda s: s.window_seconds),
    ("dlop_data_batches_in_flight", "gauge", "Leases the offloaders are making for this rank (estimated).",
     lambda s: s.batches_in_flight),
    ("dlop_data_offloaded", "gauge", "1 while batches come from offloaders, 0 when made locally.",
     lambda s: int(s.offloaded)),
    ("dlop_data_offloaders_live", "gauge", "Offloaders the rank's lease manager still uses.",
     lambda s: s.offloaders_live),
    ("dlop_data_leases_issued_total", "counter", "Leases given to offloaders.", lambda s: s.leases_issued),
    ("dlop_data_leases_reissued_total", "counter",
     "Leases lost (offloader died, failed or timed out) and leased again.", lambda s: s.leases_reissued),
    ("dlop_data_samples_skipped_total", "counter", "Samples left out of their batches as unreadable "
     "(on_error=\"skip\").", lambda s: s.samples_skipped),
)
_OFFLOADER_METRICS = (
    ("dlop_data_offloader_batches_sent_total", "counter", "Batches the offloader sent to this rank.",
     lambda o: o.batches),
    ("dlop_data_offloader_batches_per_second", "gauge", "Batches per second the offloader sent to this rank, "
     "over the window.", lambda o: o.batches_per_second),
    ("dlop_data_offloader_busy_ratio", "gauge", "The offloader's dlop_offloader_busy_ratio as its latest batch for "
     "this rank reported it (absent before that batch, or once it died).", lambda o: o.busy_fraction),
)


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def exposition(loaders: Iterable[tuple[dict[str, str], LoaderStats]]) -> str:
    """Prometheus text exposition (format 0.0.4) of the stats, each under its labels."""
    loaders = list(loaders)
    lines = []
    for name, kind, text, read in _LOADER_METRICS:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, s in loaders:
            value = read(s)
            if value is not None:
                tags = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
                lines.append(f"{name}{{{tags}}} {_number(value)}")
    for name, kind, text, read in _OFFLOADER_METRICS:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, s in loaders:
            for o in s.offloaders:
                value = read(o)
                if value is not None:
                    tags = ",".join(f'{k}="{_label(v)}"' for k, v in {**labels, "offloader": o.address}.items())
                    lines.append(f"{name}{{{tags}}} {_number(value)}")
    return "\n".join(lines) + "\n"


# --- The endpoint -----------------------------------------------------------------------------------

_lock = threading.Lock()
# Every live loader of this process, held weakly, with its labels (`loader`: its number in order of making).
_loaders: list[tuple[dict[str, str], weakref.ref]] = []
_made = 0
_server: http.server.ThreadingHTTPServer | None = None
_refused: set[str] = set()  # DLOP_METRICS_PORT values already warned about


def _live_stats() -> list[tuple[dict[str, str], LoaderStats]]:
    with _lock:
        refs = list(_loaders)
    out = []
    for labels, ref in refs:
        loader = ref()
        if loader is not None:
            out.append((labels, loader.stats()))
    return out


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        try:
            body = exposition(_live_stats()).encode()
        except Exception as e:  # a scrape must never reach the training loop
            self.send_error(500, f"{type(e).__name__}: {e}")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a line on stderr
        pass


def start_server(port: int, host: str = "0.0.0.0") -> int:
    """Serves /metrics on host:port (0: a free port) from a daemon thread; the port.
    OSError when it cannot be bound. One server per process: a second call returns its port."""
    global _server
    with _lock:
        if _server is not None:
            return _server.server_address[1]
        server = http.server.ThreadingHTTPServer((host, int(port)), _Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="dlop-metrics", daemon=True).start()
        _server = server
        return server.server_address[1]


def stop_server() -> None:
    """Stops the endpoint (a later loader with DLOP_METRICS_PORT starts it again)."""
    global _server
    with _lock:
        server, _server = _server, None
        _refused.clear()
    if server is not None:
        server.shutdown()
        server.server_close()


def server_port() -> int | None:
    """The endpoint's port, or None when none is served."""
    server = _server
    return None if server is None else server.server_address[1]


def serve(loader: Any) -> dict[str, str]:
    """Registers the loader (an object with ``rank`` and ``stats()``: its stats join every
    scrape) and, with ``DLOP_METRICS_PORT`` set, starts the endpoint if it is not up.
    Returns the labels of the loader's series. Never raises: a bad or taken port is one
    warning, once per value."""
    global _made
    with _lock:
        labels = {"rank": str(loader.rank), "loader": str(_made)}
        _made += 1
        _loaders[:] = [(n, r) for n, r in _loaders if r() is not None]
        _loaders.append((labels, weakref.ref(loader)))
    value = os.environ.get("DLOP_METRICS_PORT", "").strip()
    if value and _server is None and value not in _refused:
        _serve_env(value)
    return labels


def _serve_env(value: str) -> None:
    local = os.environ.get("LOCAL_RANK", "").strip()
    where = f"DLOP_METRICS_PORT={value}"
    try:
        base = int(value)
    except ValueError:
        base = -1
    port = base + int(local) if base > 0 and local.isdigit() else base
    if base > 0 and local.isdigit():
        where += f" + LOCAL_RANK {local}"
    if not 0 <= port <= 65535:
        why = f"{where} is not a port (0-65535)"
    else:
        try:
            start_server(port)
            return
        except OSError as e:
            why = f"port {port} ({where}) cannot be served: {e.strerror or e}"
    _refused.add(value)
    warnings.warn(f"dlop.data: {why}; training goes on without the metrics endpoint", RuntimeWarning, stacklevel=4)


__all__ = ["WINDOW_SECONDS", "LoaderStats", "OffloaderStats", "Recorder", "exposition", "serve", "start_server",
           "stop_server", "server_port"]
