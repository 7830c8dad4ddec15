"""dlop run: an unmodified training script, its DataLoaders' work offloaded.

    dlop run [--local-offloaders N] -- python train.py ARGS...
    dlop run --offloaders HOST:PORT[,...] [--token-file F] -- python train.py ARGS...
    dlop run --discover [--token-file F] -- torchrun --nproc-per-node 2 train.py ARGS...

With neither --offloaders nor --discover, `dlop run` starts dlop-offloader
daemons on this host (one per core the command's ranks leave spare, at least
one; --local-offloaders N to choose) with a fresh token, runs the command as
its child (forwarding SIGINT, SIGTERM and SIGHUP to it), stops the daemons
when it exits and exits with its status; see dlop.local_offloaders for how
they also go when `dlop run` is killed. Otherwise the command replaces this
process (exec: signals and the exit status are the command's).

dlop's ``sitecustomize`` (python/dlop/_run_site) goes first on
PYTHONPATH, so every Python the command starts, torchrun's ranks included,
loads it; it patches ``torch.utils.data.DataLoader.__iter__`` once torch's
data module is imported, and costs nothing elsewhere. Iterating a DataLoader
then runs ``dlop.data.offload(loader)`` once for that loader (:func:`iterate`)
and yields its batches: the same dataset, transforms and batch size, made by
the offloaders in dlop's seeded order (sharded across the job's ranks like a
DistributedSampler, whose ``set_epoch`` keeps working). A loader that cannot
be offloaded, or finds no offloader answering, runs as usual after one
warning naming why. Each process that offloaded something prints one line at
exit counting the batches the offloaders made.

``--discover`` takes the offloaders announced in the job's c10d store (see
``dlop.data.discovery`` and ``dlop offloader --store``), also those that join
later: the default process group's store, so the script must have called
``init_process_group`` before iterating; ``--store HOST:PORT`` names a store
instead. Settings travel by environment: DLOP_RUN_OFFLOADERS,
DLOP_RUN_DISCOVER, DLOP_RUN_STORE, DLOP_OFFLOAD_TOKEN_FILE (or the token in
DLOP_OFFLOAD_TOKEN). ``python -S`` / ``-I`` skip sitecustomize, and with it dlop.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "_run_site"


# ---------------------------------------------------------------- the launcher


def _check_address(text: str, what: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"dlop run: {what} {text!r} is not HOST:PORT")
    return text


def environment(argv: list[str], base: dict[str, str]) -> tuple[list[str], dict[str, str], int | None]:
    """(command, its environment, how many local offloaders to start or None) for `dlop run ARGV`.

    With local offloaders the environment lacks DLOP_RUN_OFFLOADERS and the
    token, which :func:`main` adds once the daemons listen."""
    own, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="dlop run", usage="dlop run [--local-offloaders N | --offloaders HOST:PORT[,...] "
                                "| --discover] [--token-file F] [--store HOST:PORT] -- COMMAND [ARGS...]",
                                description="Run a training command with its DataLoaders offloaded to dlop-offloader "
                                            "daemons (started on this host unless --offloaders or --discover).")
    p.add_argument("--offloaders", default="", help="comma-separated HOST:PORT of dlop-offloader daemons")
    p.add_argument("--discover", action="store_true", help="also use the offloaders announced in the job's c10d store")
    p.add_argument("--store", help="with --discover: this TCPStore instead of the default process group's")
    p.add_argument("--token-file", help="the offloaders' shared token (default: DLOP_OFFLOAD_TOKEN)")
    p.add_argument("--local-offloaders", type=int, metavar="N",
                   help="start N dlop-offloader daemons on this host for the command's lifetime (the default "
                        "without --offloaders or --discover: one per core the command's ranks leave spare)")
    args = p.parse_args(own)
    if not command:
        p.error("no command: put it after --, e.g. dlop run -- python train.py")
    addresses = [_check_address(a.strip(), "offloader address") for a in args.offloaders.split(",") if a.strip()]
    if args.store and not args.discover:
        p.error("--store only means something with --discover")
    env = dict(base)
    env.pop("DLOP_RUN_DISCOVER", None)
    env.pop("DLOP_RUN_STORE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR)] + [q for q in env.get("PYTHONPATH", "").split(os.pathsep) if q])
    if not addresses and not args.discover:
        from dlop.local_offloaders import default_count

        if args.token_file:
            p.error("--token-file is for daemons started elsewhere: the local ones get a fresh token")
        count = default_count(command) if args.local_offloaders is None else args.local_offloaders
        if count < 1:
            p.error(f"--local-offloaders {count}: at least 1")
        return command, env, count
    if args.local_offloaders is not None:
        p.error("--local-offloaders starts daemons here: it does not go with --offloaders or --discover")
    env["DLOP_RUN_OFFLOADERS"] = ",".join(addresses)
    if args.discover:
        env["DLOP_RUN_DISCOVER"] = "1"
    if args.store:
        env["DLOP_RUN_STORE"] = _check_address(args.store, "--store")
    if args.token_file:
        path = Path(args.token_file).resolve()
        try:
            path.read_bytes()
        except OSError as e:
            raise SystemExit(f"dlop run: token file {args.token_file}: {e.strerror}") from None
        env["DLOP_OFFLOAD_TOKEN_FILE"] = str(path)  # the path, not the secret, goes in the environment
    elif not env.get("DLOP_OFFLOAD_TOKEN") and not env.get("DLOP_OFFLOAD_TOKEN_FILE"):
        raise SystemExit("dlop run: no token: pass --token-file or set DLOP_OFFLOAD_TOKEN")
    return command, env, None


def _run_with_local_offloaders(command: list[str], env: dict[str, str], count: int) -> int:
    from dlop.local_offloaders import LocalOffloaders, die_with_parent

    with LocalOffloaders(count) as daemons:
        print(daemons.describe(), file=sys.stderr, flush=True)
        env = {k: v for k, v in env.items() if k != "DLOP_OFFLOAD_TOKEN"}
        env["DLOP_RUN_OFFLOADERS"] = ",".join(daemons.addresses)
        env["DLOP_OFFLOAD_TOKEN_FILE"] = str(daemons.token_file)
        parent = os.getpid()
        # The command goes with `dlop run` too, should that be SIGKILLed: its offloaders are gone then.
        child = subprocess.Popen(command, env=env, preexec_fn=lambda: die_with_parent(parent))

        def forward(signum, _frame):
            if child.poll() is None:
                child.send_signal(signum)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, forward)
        code = child.wait()
    return code if code >= 0 else 128 - code  # killed by signal N: status 128+N, as a shell reports it


def main(argv: list[str] | None = None) -> int:
    command, env, local = environment(sys.argv[1:] if argv is None else argv, dict(os.environ))
    if shutil.which(command[0], path=env.get("PATH")) is None:
        raise SystemExit(f"dlop run: command not found: {command[0]}")
    if local is not None:
        return _run_with_local_offloaders(command, env, local)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], command, env)
    return 127  # not reached


# ------------------------------------------- in the training processes (patched DataLoader)

_busy = threading.local()  # set while dlop sets a loader up: DataLoaders it iterates then stay torch's
_lock = threading.Lock()
_joined: list[str] = []  # addresses the discovery watcher reported, in order
_store = None
_watcher = None
_counts = {"offloaded": 0, "local": 0}  # batches yielded, by who made them
_summary_registered = False


def _token() -> str | None:
    path = os.environ.get("DLOP_OFFLOAD_TOKEN_FILE")
    if path:
        return Path(path).read_text().rstrip(" \t\n\r\v\f")  # as dlop-offloader reads it
    return os.environ.get("DLOP_OFFLOAD_TOKEN")


def _discovery_store():
    """(store, None), or (None, why not). One connection per process, plus one for the watcher."""
    global _store, _watcher
    if _store is not None:
        return _store, None
    from dlop.data import discovery

    where = os.environ.get("DLOP_RUN_STORE")
    if where:
        import datetime

        from torch.distributed import TCPStore

        host, _, port = where.rpartition(":")
        try:
            store = TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=30))
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

    def joined(address: str) -> None:
        with _lock:
            _joined.append(address)

    _watcher = discovery.Watcher(watched, joined, interval=float(os.environ.get("DLOP_RUN_DISCOVER_INTERVAL", "1")))
    _store = store
    return store, None


class _Local:
    """A loader that runs as torch's, and why."""

    def __init__(self, reason: str, tried: list[str]) -> None:
        self.reason, self.tried = reason, tried

    def worth_retrying(self) -> bool:
        # With discovery, offloaders that joined since are worth a new try (at
        # the next epoch's iteration; the current epoch has started locally).
        if not os.environ.get("DLOP_RUN_DISCOVER"):
            return False
        if _store is None:  # the process group may exist by now
            import torch.distributed as dist

            return not os.environ.get("DLOP_RUN_STORE") and dist.is_available() and dist.is_initialized()
        with _lock:
            return any(a not in self.tried for a in _joined)


class _Offloaded:
    def __init__(self, off, used: list[str]) -> None:
        self.off = off
        self.used = set(used)
        self.seen = 0  # how much of _joined this loader has looked at
        self.iterations = 0

    def _add_joined(self) -> None:
        # On the consumer's thread, between batches: the lease manager is driven by one thread.
        with _lock:
            new = _joined[self.seen:]
            self.seen = len(_joined)
        for address in new:
            if address in self.used or not self.off.offloaded:
                continue
            self.used.add(address)
            try:
                self.off.add_offloader(address)
                print(f"dlop run: offloader {address} joined", file=sys.stderr, flush=True)
            except Exception as e:  # an unreachable joiner costs nothing but this line
                print(f"dlop run: offloader {address} announced but not usable: {e}", file=sys.stderr, flush=True)

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
        import torch

        pin = pin and torch.cuda.is_available()
        native = self.off.dataset is None
        for got in self.off:
            by_daemon = self.off.offloaded
            # The OffloadLoader's tensors view buffers reused at the next step;
            # a script may keep a batch (torch's loaders give fresh tensors), so copy.
            batch = _own(list(got) if native else got, pin)
            _counts["offloaded" if by_daemon else "local"] += 1
            if _watcher is not None:
                self._add_joined()
            yield batch


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


def _prepare(loader):
    from dlop.data import discovery
    from dlop.data.wrap import offload

    addresses = [a for a in os.environ.get("DLOP_RUN_OFFLOADERS", "").split(",") if a]
    reason = _why_not(loader)
    if reason is None and os.environ.get("DLOP_RUN_DISCOVER"):
        store, reason = _discovery_store()
        if store is not None:
            try:
                addresses += [a for a in discovery.discover(store) if a not in addresses]
            except Exception as e:
                reason = f"reading the offloaders from the store failed ({e})"
            if reason is None and not addresses:
                reason = "no offloader is announced in the job's store yet (dlop offloader --store ...)"
    if reason is None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                off = offload(loader, offloaders=addresses, token=_token())
            except (ValueError, TypeError, RuntimeError, OSError) as e:
                reason = str(e)
        if reason is None:
            if off.offloaded:
                # The watcher reports the initial addresses too: _Offloaded skips them as used.
                return _Offloaded(off, addresses)
            reason = next((str(w.message) for w in caught if "OffloadLoader" in str(w.message)), "no offloader answered")
        for w in caught:  # anything else said while setting up is the user's to see
            if "OffloadLoader" not in str(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    warnings.warn(f"dlop run: this DataLoader is not offloaded and runs as usual: {reason}", RuntimeWarning, stacklevel=4)
    return _Local(reason, addresses)


def _summary() -> None:
    if _counts["offloaded"] or _counts["local"]:
        print(f"dlop run: {_counts['offloaded']} batches made by dlop-offloader, {_counts['local']} made locally "
              f"(pid {os.getpid()})", file=sys.stderr, flush=True)
    if _watcher is not None:
        _watcher.stop()


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
        return original(loader)
    return state.batches(loader)


if __name__ == "__main__":
    sys.exit(main())
