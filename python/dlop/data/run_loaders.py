"""`dlop run`, in the training processes: each DataLoader iteration offloaded.

dlop run's ``sitecustomize`` (python/dlop/fleet/_run_site) hands every iteration of
a ``torch.utils.data.DataLoader`` to :func:`iterate`, which runs
``dlop.data.offload(loader)`` once for that loader and yields its batches,
or the loader's own when it cannot be offloaded (one warning naming why).
The offloaders come from the settings the launcher (dlop.fleet.run) left in the
environment: DLOP_RUN_OFFLOADERS, the names in DLOP_RUN_DNS (dlop.fleet),
DLOP_RUN_WAIT, and the job's c10d store with DLOP_RUN_DISCOVER
(dlop.fleet.discovery; DLOP_RUN_DISCOVER_WAIT: seconds to wait for the first
announcement). Offloaders that answer or are announced later join the
running loaders between batches. With DLOP_RUN_AUTOSCALE (the fleet's store,
``dlop run --offloaders auto``) each process publishes the figures of its
busiest offloaded loader there (dlop.fleet.scaling.figures). With DLOP_RUN_STRICT
(``dlop run --strict``) a DataLoader that would run as torch's raises instead,
and so does a loader whose offloaders are all lost mid-epoch.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings

_busy = threading.local()  # set while dlop sets a loader up: DataLoaders it iterates then stay torch's
_lock = threading.Lock()
_joined: list[str] = []  # addresses the discovery watcher reported, in order
_store = None
_watchers: list = []  # the discovery and fleet watchers of this process, stopped at exit
_fleet_watched = False  # a fleet watcher has started (one per process: every loader shares its joins)
_counts = {"offloaded": 0, "local": 0, "torch": 0}  # batches yielded by who made them; torch: DataLoaders left to it
_summary_registered = False
_offloaded: list = []  # this process's offloaded loaders (_Offloaded), for the autoscaling figures
_publishing = False  # the figures' publisher has started (one per process)


def _strict() -> bool:
    return bool(os.environ.get("DLOP_RUN_STRICT"))


def _tcp_store(where: str):
    """A client of the TCPStore at "HOST:PORT" (a connection of its own)."""
    import datetime

    from torch.distributed import TCPStore

    host, _, port = where.rpartition(":")
    return TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))


def _discovery_store():
    """(store, None), or (None, why not). One connection per process, plus one for the watcher."""
    global _store
    if _store is not None:
        return _store, None
    from dlop.fleet import discovery

    where = os.environ.get("DLOP_RUN_STORE")
    if where:
        try:
            store = _tcp_store(where)
        except Exception as e:  # the training goes on, locally
            return None, f"the store at {where} did not answer ({e})"
    else:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None, ("--discover reads the default process group's store, and torch.distributed is not "
                          "initialized when this DataLoader is iterated (or pass dlop run --store HOST:PORT)")
        store = discovery.raw_store(dist.distributed_c10d._get_default_store())
    try:
        watched = store.clone()  # the watcher's thread gets a connection of its own
    except Exception:
        watched = store

    _watchers.append(discovery.Watcher(watched, _report_join, interval=_interval()))
    _store = store
    return store, None


def _interval() -> float:
    return float(os.environ.get("DLOP_RUN_DISCOVER_INTERVAL", "1"))


def _report_join(address: str) -> None:
    with _lock:
        _joined.append(address)


def _fleet(addresses: list[str]) -> tuple[list[str], str]:
    """Of the given addresses and those behind DLOP_RUN_DNS's names, the ones that answer (waiting up
    to DLOP_RUN_WAIT seconds for the first), and why none does; the others join when they answer."""
    global _fleet_watched
    from dlop.fleet import dns

    names = [n for n in os.environ.get("DLOP_RUN_DNS", "").split(",") if n]
    candidates = dns.Candidates(addresses, names)
    ready, why = dns.wait_for_any(candidates, float(os.environ.get("DLOP_RUN_WAIT") or 0))
    if not _fleet_watched:
        _fleet_watched = True
        _watchers.append(dns.Watcher(candidates, _report_join, seen=ready, interval=_interval()))
    return ready, why


class _Local:
    """A loader that runs as torch's, and why."""

    def __init__(self, reason: str, tried: list[str]) -> None:
        self.reason, self.tried = reason, tried

    def worth_retrying(self) -> bool:
        # Offloaders that joined since (discovered, or answering at last) are
        # worth a new try at the next epoch's iteration; the current epoch has started locally.
        with _lock:
            if any(a not in self.tried for a in _joined):
                return True
        if os.environ.get("DLOP_RUN_DISCOVER") and _store is None:  # the process group may exist by now
            import torch.distributed as dist

            return not os.environ.get("DLOP_RUN_STORE") and dist.is_available() and dist.is_initialized()
        return False


class _Offloaded:
    def __init__(self, off, used: list[str]) -> None:
        self.off = off
        self.used = set(used)
        self.seen = 0  # how much of _joined this loader has looked at
        self.iterations = 0
        _offloaded.append(self)
        if os.environ.get("DLOP_RUN_AUTOSCALE"):
            _start_publishing(off.rank, off.world)

    def _add_joined(self) -> None:
        # On the consumer's thread, between batches: the lease manager is driven by one thread.
        with _lock:
            new = _joined[self.seen:]
            self.seen = len(_joined)
        for address in new:
            if address in self.used or not self.off.offloaded:
                continue
            self.used.add(address)
            # Connecting and configuring take seconds (a daemon starts its Python workers): not on the
            # training loop's time. It gets work between two batches once ready.
            self.off.add_offloader(address, wait=False, joined=_say_joined)

    def batches(self, loader):
        from torch.utils.data.distributed import DistributedSampler

        if type(loader.sampler) is DistributedSampler:
            epoch = loader.sampler.epoch  # the script's set_epoch
        else:
            epoch = self.iterations  # torch reshuffles every iteration: so does dlop, by epoch
        self.iterations += 1
        self.off.set_epoch(epoch)
        pin = bool(loader.pin_memory)
        return self._generate(pin)

    def _generate(self, pin: bool):
        pin = pin and _accelerator_to_pin_for() is not None
        native = self.off.kind != "python"
        for got in self.off:
            by_daemon = self.off.offloaded
            # The OffloadLoader's tensors view buffers reused at the next step;
            # a script may keep a batch (torch's loaders give fresh tensors), so copy.
            batch = _own(list(got) if native else got, pin)
            _counts["offloaded" if by_daemon else "local"] += 1
            if _watchers:
                self._add_joined()
            yield batch


def _say_joined(address: str, error) -> None:
    if error is None:
        print(f"dlop run: offloader {address} joined", file=sys.stderr, flush=True)
    else:
        print(f"dlop run: offloader {address} announced but not usable: {error}", file=sys.stderr, flush=True)


def _busiest_stats():
    """The figures of this process's offloaded loader that handed out the most batches (the
    training loader, whatever else the script iterates now and then)."""
    stats = [o.off.stats() for o in list(_offloaded)]
    stats = [s for s in stats if s.steps > 0]
    return max(stats, key=lambda s: s.steps) if stats else None


def _start_publishing(rank: int, world: int) -> None:
    """One publisher per process, on a connection of its own to the fleet's store."""
    global _publishing
    if _publishing:
        return
    _publishing = True
    from dlop.fleet.scaling.figures import Publisher

    where = os.environ["DLOP_RUN_AUTOSCALE"]
    try:
        store = _tcp_store(where)
    except Exception as e:  # the training goes on; the fleet keeps its size
        print(f"dlop run: the fleet's store at {where} did not answer ({e}); this rank's figures are not published",
              file=sys.stderr, flush=True)
        return
    _watchers.append(Publisher(store, rank, world, _busiest_stats))


def _accelerator_to_pin_for():
    """The accelerator a pinned batch would be copied to, as torch's DataLoader picks it: the current
    one (torch.accelerator; CUDA on a torch without it), when its device module says it is usable
    (as dlop.data._device checks a device). None: pinning would buy nothing, or fail (MPS)."""
    import torch

    current = getattr(getattr(torch, "accelerator", None), "current_accelerator", None)
    device = current() if current is not None else torch.device("cuda")
    if device is None or device.type == "mps":
        return None
    module = getattr(torch, device.type, None)
    is_available = getattr(module, "is_available", None)
    return device if is_available is not None and is_available() else None


def _own(batch, pin: bool):
    """A copy of a batch whose tensors and arrays do not view the loader's buffers."""
    import numpy as np
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if pin else batch.clone()
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, dict):
        return type(batch)((k, _own(v, pin)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_own(v, pin) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_own(v, pin) for v in batch)
    return batch


def _why_not(loader) -> str | None:
    """What dlop.data.offload would get wrong about this loader, beyond what it checks itself."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    if type(loader) is not DataLoader:
        return f"it is a {type(loader).__name__}, a DataLoader subclass whose behaviour dlop cannot know"
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    rank = dist.get_rank() if world > 1 else 0
    sampler = loader.sampler
    if type(sampler) is DistributedSampler:
        if (sampler.num_replicas, sampler.rank) != (world, rank):
            return (f"its DistributedSampler is rank {sampler.rank} of {sampler.num_replicas}, and this process "
                    f"is rank {rank} of {world}: dlop shards by the process group")
    elif world > 1:
        return (f"it has no DistributedSampler in a job of {world} ranks, so every rank reads the whole "
                "dataset, and dlop would shard it across the ranks")
    return None


def _announced(store) -> list[str]:
    """The offloaders announced in the store, waiting up to DLOP_RUN_DISCOVER_WAIT seconds for the first."""
    import time

    from dlop.fleet import discovery

    deadline = time.monotonic() + float(os.environ.get("DLOP_RUN_DISCOVER_WAIT") or 0)
    while not (found := discovery.discover(store)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _prepare(loader):
    from dlop.fleet import discovery
    from dlop.data.wrap import offload

    addresses = [a for a in os.environ.get("DLOP_RUN_OFFLOADERS", "").split(",") if a]
    reason = _why_not(loader)
    unanswered = ""
    if reason is None and (os.environ.get("DLOP_RUN_DNS") or os.environ.get("DLOP_RUN_WAIT")):
        tried = addresses
        addresses, unanswered = _fleet(addresses)
        if unanswered and not os.environ.get("DLOP_RUN_DISCOVER"):
            reason, addresses = unanswered, tried
    if reason is None and os.environ.get("DLOP_RUN_DISCOVER"):
        store, reason = _discovery_store()
        if store is not None:
            try:
                addresses += [a for a in _announced(store) if a not in addresses]
            except Exception as e:
                reason = f"reading the offloaders from the store failed ({e})"
            if reason is None and not addresses:
                reason = unanswered or "no offloader is announced in the job's store yet (dlop offloader --store ...)"
    if reason is None:
        try:
            # "error": a loader no offloader serves is torch's here, not the OffloadLoader's local workers.
            off = offload(loader, offloaders=addresses, fallback="error")
        except (ValueError, TypeError, RuntimeError, OSError) as e:
            reason = str(e)
        else:
            # Offloaders all lost later: the epoch ends on local workers, or with --strict an error.
            off.fallback = "error" if _strict() else "warn"
            # The watcher reports the initial addresses too: _Offloaded skips them as used.
            return _Offloaded(off, addresses)
    if _strict():
        raise RuntimeError(f"dlop run --strict: this DataLoader is not offloaded: {reason}")
    workers = loader.num_workers
    runs = f"{workers} worker process{'es' if workers != 1 else ''}" if workers else "the main process"
    warnings.warn(f"dlop run: this DataLoader is not offloaded ({reason}); it runs as torch's DataLoader, in {runs} "
                  "(dlop run --strict makes this an error)", RuntimeWarning, stacklevel=4)
    return _Local(reason, addresses)


def _summary() -> None:
    torch_made = f", {_counts['torch']} DataLoader iteration(s) left to torch" if _counts["torch"] else ""
    print(f"dlop run: {_counts['offloaded']} batches made by dlop-offloader, {_counts['local']} made locally"
          f"{torch_made} (pid {os.getpid()})", file=sys.stderr, flush=True)
    for watcher in _watchers:
        watcher.stop()


def iterate(loader, original):
    """DataLoader.__iter__ under dlop run: the offloaded batches, or `original(loader)`'s."""
    if getattr(_busy, "active", False):
        return original(loader)
    state = loader.__dict__.get("_dlop_run")
    if state is None or (isinstance(state, _Local) and state.worth_retrying()):
        _busy.active = True
        try:
            state = _prepare(loader)
        finally:
            _busy.active = False
        global _summary_registered
        if not _summary_registered:
            _summary_registered = True
            atexit.register(_summary)
        loader.__dict__["_dlop_run"] = state  # DataLoader.__setattr__ guards only its own fields
    if isinstance(state, _Local):
        _counts["torch"] += 1
        return original(loader)
    return state.batches(loader)
