"""Runs a function on N real rank processes, with backend "dlop" and Gloo side by side.

Each rank initialises the default process group with backend "dlop" and one
Gloo group over the same ranks (``dist.new_group(backend="gloo")``), so a test
can run the same operation on both and compare. Two ways to run:

* :class:`Cluster`: N ranks that stay up across tests (the process group is
  set up once) and run one function after another. A failure, a rank that
  dies or a hang tears the ranks down; the next call starts fresh ones.
* :func:`run_ranks`: fresh ranks for one function, then gone (faults, set-up
  options, exit behaviour).

Ranks are forked from a server that imported torch once (processes.py), so a
fresh set of ranks costs its process group's set-up, not N imports of torch.

Functions run as ``fn(ctx, *args)`` with a :class:`RankContext`; they must be
module-level (they are pickled by name) and their results picklable. A rank
that raises, dies or is still running at the deadline makes the call raise
:class:`RankFailure` with each failing rank's traceback (or, for a hang, every
thread's Python stack).
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import pickle
import random
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_connections
from pathlib import Path
from typing import Any, Callable

from processes import adopt_environment, python_env, rank_process_context, wait_for

# The default deadline of one call (and of bringing the ranks up), seconds.
DEFAULT_TIMEOUT = float(os.environ.get("DLOP_TEST_TIMEOUT", "240"))
# Once a rank has failed, how long the others get to finish before they count as hung.
FAILURE_GRACE = 20.0


class RankFailure(AssertionError):
    """One or more ranks failed, died or hung; the message has each one's story."""

    def __init__(self, message: str, errors: dict[int, str], hung: list[int]):
        super().__init__(message)
        self.errors = errors
        self.hung = hung


@dataclass(frozen=True)
class Dead:
    """The result of a rank that died (allowed by run(..., may_die=...))."""

    exitcode: int | None


@dataclass
class Setup:
    """How each rank starts (defaults: what most tests want)."""

    backend: str = "dlop"
    # "tcp" (a fresh port), "file" (a file in the work folder), "env" (MASTER_ADDR/PORT set).
    init: str = "tcp"
    pg_timeout_s: float | None = 120.0
    gloo: bool = True  # also make the Gloo reference group
    import_dlop: bool = True  # False: only backend="dlop" names it (entry points)
    env: dict[str, str] = field(default_factory=dict)
    # Modules each rank imports before init_process_group (e.g. a device's).
    imports: tuple[str, ...] = ()
    # Per rank, on top of env: e.g. {r: {"DLOP_HOST_ID": f"host{r}"}} (ranks as separate hosts).
    rank_env: dict[int, dict[str, str]] = field(default_factory=dict)
    # "destroy" (destroy_process_group, then exit), "exit" (interpreter exit
    # with the group still up), "hard" (os._exit(0) at once).
    teardown: str = "destroy"


class RankContext:
    """What a function gets on its rank."""

    def __init__(self, rank: int, world_size: int, workdir: Path, gloo):
        self.rank = rank
        self.world_size = world_size
        self.workdir = workdir
        self.gloo = gloo  # the Gloo group over all ranks, or None
        self.state: dict[str, Any] = {}  # survives between calls on a Cluster

    @property
    def dlop(self):
        import torch.distributed as dist

        return dist.group.WORLD


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port the kernel
    hands out (bind to 0) may be taken by any process's next outgoing
    connection before a rank listens on it (seen as EADDRINUSE)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    candidates = random.Random().sample(range(10000, low), k=min(64, max(0, low - 10000)))
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# The rank side.


def _init_rank(rank: int, world_size: int, setup: Setup, workdir: Path, port: int, env: dict[str, str]) -> RankContext:
    adopt_environment(env)
    import torch
    import torch.distributed as dist

    if setup.import_dlop:
        import dlop  # noqa: F401  (registers "dlop"; without it torch's entry points must)

    for module in setup.imports:
        __import__(module)
    torch.set_num_threads(1)
    kwargs: dict[str, Any] = {"backend": setup.backend}
    if setup.pg_timeout_s is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=setup.pg_timeout_s)
    if setup.init == "tcp":
        kwargs.update(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    elif setup.init == "file":
        kwargs.update(init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world_size)
    elif setup.init == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
        kwargs["init_method"] = "env://"
    else:
        raise ValueError(f"unknown init {setup.init!r}")
    dist.init_process_group(**kwargs)
    gloo = dist.new_group(backend="gloo") if setup.gloo else None
    return RankContext(rank, world_size, workdir, gloo)


def _rank_main(rank: int, world_size: int, setup: Setup, workdir: str, port: int, env: dict[str, str], conn) -> None:
    work = Path(workdir)
    # SIGUSR1 (sent by the parent when a call hangs) writes every thread's stack.
    stacks = open(work / f"rank{rank}.stacks", "w")  # noqa: SIM115  (open until exit)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    try:
        ctx = _init_rank(rank, world_size, setup, work, port, env)
    except BaseException:  # noqa: BLE001  (the parent reports it)
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(3)  # the parent is gone
        if message is None:
            break
        fn, args, kwargs = message
        try:
            reply = ("ok", fn(ctx, *args, **kwargs))
            pickle.dumps(reply)
        except BaseException:  # noqa: BLE001
            reply = ("error", traceback.format_exc())
        conn.send(reply)
    import torch.distributed as dist

    if setup.teardown == "hard":
        conn.send(("ok", None))
        os._exit(0)
    if setup.teardown == "destroy" and dist.is_initialized():
        dist.destroy_process_group()
    conn.send(("ok", None))
    conn.close()
    # "exit": the interpreter's own shutdown with the group (and any pending
    # operation) still up.


# ---------------------------------------------------------------------------
# The parent side.


class Cluster:
    """world_size ranks kept up between calls (see the module's docstring)."""

    def __init__(self, world_size: int, setup: Setup | None = None, timeout: float = DEFAULT_TIMEOUT):
        self.world_size = world_size
        self.setup = setup or Setup()
        self.timeout = timeout
        self._procs: list = []
        self._conns: list = []
        self._workdir: tempfile.TemporaryDirectory | None = None
        self.starts = 0  # how many times ranks were started (tests of the harness)

    # -- lifecycle --

    @property
    def up(self) -> bool:
        return bool(self._procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def workdir(self) -> Path:
        assert self._workdir is not None
        return Path(self._workdir.name)

    def start(self) -> None:
        if self.up:
            return
        self.starts += 1
        self._workdir = tempfile.TemporaryDirectory(prefix=f"dlop-c10d-{self.world_size}-")
        ctx = rank_process_context()
        port = free_port()
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe()
            env = python_env({**self.setup.env, **self.setup.rank_env.get(rank, {})})
            proc = ctx.Process(
                target=_rank_main,
                args=(rank, self.world_size, self.setup, self._workdir.name, port, env, child_end),
                name=f"dlop-rank{rank}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
        try:
            self._collect("set-up", self.timeout, may_die=())
        except BaseException:
            self.kill()
            raise

    def close(self, timeout: float = 60.0) -> list[int | None]:
        """Stops the ranks the way Setup.teardown says; their exit codes (None: killed after timeout)."""
        if not self.up:
            return []
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            codes.append(proc.exitcode)
        self.kill()
        return codes

    def kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(10)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- calls --

    def run(self, fn: Callable, *args, timeout: float | None = None, may_die: tuple[int, ...] = (), **kwargs) -> list:
        """fn(ctx, *args, **kwargs) on every rank; the results by rank.

        Ranks in may_die may die (their result is Dead(exitcode)); any other
        failure raises RankFailure and takes the ranks down.
        """
        self.start()
        message = (fn, args, kwargs)
        for conn in self._conns:
            conn.send(message)
        try:
            return self._collect(getattr(fn, "__name__", str(fn)), timeout or self.timeout, may_die)
        except BaseException:
            self.kill()
            raise

    def _collect(self, what: str, timeout: float, may_die) -> list:
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        pending = {conn: rank for rank, conn in enumerate(self._conns)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for conn in wait_connections(list(pending), timeout=min(left, 1.0)):
                rank = pending.pop(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    proc = self._procs[rank]
                    proc.join(5)
                    if rank in may_die:
                        results[rank] = Dead(proc.exitcode)
                    else:
                        errors[rank] = f"rank {rank} died (exit code {proc.exitcode})"
                    continue
                if status == "ok":
                    results[rank] = value
                else:
                    errors[rank] = value
            if errors:
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
        hung = sorted(pending.values())
        if not errors and not hung:
            return [results[r] for r in range(self.world_size)]
        stacks = {}
        for rank in hung:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
        if hung:
            time.sleep(1.0)
            for rank in hung:
                path = self.workdir / f"rank{rank}.stacks"
                stacks[rank] = path.read_text()[-6000:] if path.exists() else "(no stacks)"
        parts = [f"{what} on {self.world_size} rank(s):"]
        for rank in sorted(errors):
            parts.append(f"--- rank {rank} failed:\n{errors[rank]}")
        for rank in hung:
            parts.append(f"--- rank {rank} still running after {timeout:.0f} s; its threads:\n{stacks[rank]}")
        raise RankFailure("\n".join(parts), errors, hung)


def check(cluster: Cluster, fn: Callable, *args, **kwargs) -> None:
    """Runs fn (which returns a list of problems on each rank) and fails listing them.

    A rank that found a problem may have left the others in a different state
    (an operation it did not join, a group that failed): the ranks are then
    taken down so the next test starts on fresh ones.
    """
    by_rank = cluster.run(fn, *args, **kwargs)
    problems = [f"rank {r}: {p}" for r, ps in enumerate(by_rank) for p in ps]
    if problems:
        cluster.kill()
        shown = "\n".join(problems[:40])
        more = f"\n... {len(problems) - 40} more" if len(problems) > 40 else ""
        raise AssertionError(shown + more)


def run_ranks(
    fn: Callable,
    world_size: int,
    *args,
    setup: Setup | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    may_die: tuple[int, ...] = (),
    **kwargs,
) -> list:
    """fn(ctx, *args, **kwargs) on world_size fresh ranks; the results by rank."""
    cluster = Cluster(world_size, setup, timeout)
    results = cluster.run(fn, *args, may_die=may_die, **kwargs)  # kills the ranks if it raises
    codes = cluster.close()
    bad = [(r, c) for r, c in enumerate(codes) if r not in may_die and c not in (0, None)]
    if bad:
        raise RankFailure(f"{fn.__name__}: ranks exited with codes {bad}", {}, [])
    return results


# ---------------------------------------------------------------------------
# Helpers for the functions that run on the ranks.


def venv_bin(name: str) -> str:
    """An executable next to this interpreter (torchrun in the venv)."""
    return str(Path(sys.executable).with_name(name))


# ---------------------------------------------------------------------------
# Tensors for the comparisons. Every rank's input is a function of (rank,
# seed) only, so any rank can also compute what every other rank sent and
# from that the expected result (the reference where Gloo refuses an op).

DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int64", "uint8", "bool")
# Sizes in elements: empty, one, odd (not a multiple of any vector width or of the world size).
SIZES = (0, 1, 7, 4099)
BIG_BYTES = 16 << 20


def dtype_of(name: str):
    import torch

    return getattr(torch, name)


def make_input(dtype, numel: int, rank: int, seed: int = 0, kind: str = "any"):
    """A 1-D tensor of numel elements for rank. kind "prod": values near 1 (products stay in range)."""
    import torch

    g = torch.Generator().manual_seed(seed * 7919 + rank * 104729 + numel)
    if dtype.is_complex:
        real = torch.randn(numel, 2, generator=g, dtype=torch.float64)
        if kind == "prod":
            real = real * 0.1 + torch.tensor([1.0, 0.0], dtype=torch.float64)
        return torch.view_as_complex(real.to(torch.float64 if dtype == torch.complex128 else torch.float32).contiguous())
    if dtype.is_floating_point:
        x = torch.randn(numel, generator=g, dtype=torch.float64)
        if kind == "prod":
            x = 1.0 + 0.1 * x
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 4 if kind == "prod" else 256, (numel,), generator=g).to(dtype)
    lo, hi = (-3, 4) if kind == "prod" else (-(10**6), 10**6)
    return torch.randint(lo, hi, (numel,), generator=g, dtype=torch.int64).to(dtype)


def tolerances(dtype) -> dict:
    import torch

    return {
        torch.float32: dict(rtol=1e-5, atol=1e-5),
        torch.float64: dict(rtol=1e-12, atol=1e-12),
        torch.float16: dict(rtol=2e-3, atol=1e-2),
        torch.bfloat16: dict(rtol=2e-2, atol=5e-2),
        torch.complex64: dict(rtol=1e-5, atol=1e-5),
        torch.complex128: dict(rtol=1e-12, atol=1e-12),
    }.get(dtype, dict(rtol=0, atol=0))


def mismatch(what: str, got, expected, exact: bool = True) -> str | None:
    """None when got equals expected (exactly, or within the dtype's float tolerance); else why not."""
    import torch

    if got.dtype != expected.dtype or got.shape != expected.shape:
        return f"{what}: got {got.dtype}{tuple(got.shape)}, expected {expected.dtype}{tuple(expected.shape)}"
    if exact or not (got.is_floating_point() or got.is_complex()):
        if torch.equal(got, expected):
            return None
        # Bitwise for floats: equal() says NaN != NaN.
        if got.is_floating_point() or got.is_complex():
            if torch.equal(got.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)):
                return None
    else:
        try:
            torch.testing.assert_close(got, expected, **tolerances(got.dtype), equal_nan=True)
            return None
        except AssertionError:
            pass
    diff = (got != expected).nonzero()
    first = diff[0].tolist() if len(diff) else "?"
    return (
        f"{what}: {len(diff)} of {got.numel()} elements differ, first at {first}: "
        f"got {got.reshape(-1)[:6].tolist()}..., expected {expected.reshape(-1)[:6].tolist()}..."
    )


def attempt(fn):
    """(result, None) or (None, the exception) for fn()."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001
        return None, e


def mark_done(ctx: RankContext, step: str) -> None:
    """Tells the other ranks (wait_until_done) that this rank is past step."""
    (ctx.workdir / f"{step}.rank{ctx.rank}").touch()


def wait_until_done(ctx: RankContext, step: str, ranks, timeout: float = 60.0) -> None:
    """Returns once every rank in ranks is past step (mark_done): a rank that must stay out of an
    operation until the others have seen it fail waits this long, not a fixed sleep."""
    wait_for(lambda: all((ctx.workdir / f"{step}.rank{r}").exists() for r in ranks), timeout,
             f"ranks {list(ranks)} past {step}")


def non_contiguous_like(t):
    """A non-contiguous view with t's shape and values (every other element of a bigger buffer,
    filled elsewhere with a sentinel), and the buffer (to check nothing outside the view changed)."""
    import torch

    base = torch.empty((*t.shape, 2), dtype=t.dtype)
    base.view(torch.uint8).fill_(0xA5) if t.dtype != torch.bool else base.fill_(True)
    view = base[..., 0]
    view.copy_(t)
    if t.numel() > 1:
        assert not view.is_contiguous()
    return view, base


# ---------------------------------------------------------------------------
# One shared Cluster per world size, at most one up at a time (the machine may
# have few cores): test modules take theirs through a module-scoped fixture
# parametrised by world size, which pytest orders so that each size runs once.

_shared: dict[int, Cluster] = {}


def shared_cluster(world_size: int) -> Cluster:
    for size in [s for s in _shared if s != world_size]:
        _shared.pop(size).close()
    cluster = _shared.setdefault(world_size, Cluster(world_size))
    cluster.start()
    return cluster


def close_shared() -> None:
    while _shared:
        _shared.popitem()[1].close()


import atexit  # noqa: E402

atexit.register(close_shared)
