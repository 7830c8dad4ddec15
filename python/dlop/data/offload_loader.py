"""OffloadLoader: batches made by dlop-offloader daemons, or locally when none answers.

The batch order is a pure function of (seed, epoch), sharded across the
trainer ranks (``dlop._C.offload.EpochPlan``: DistributedSampler's rules, one
``drop_last`` flag for both the sampler and the last incomplete batch), so the
offloaded path and the local fallback yield the same batches. With
``shuffle="shards"`` the order is by shard (the shard sizes join the inputs).
"""

from __future__ import annotations

import atexit
import collections
import functools
import gc
import json
import os
import threading
import time
import warnings
import weakref
from typing import Any, Iterator, Sequence

import torch

from dlop import _C
from dlop.data import _device, _loader_view, _python_job, _token, metrics
from dlop.errors import Error, NoOffloaderError

_native = _C.offload
_media = _C.media


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _engine_pacer(process_group: Any):
    """The pacer over ``process_group``'s dlop engine (default: the default
    group), or None when it is not dlop, not initialized, or
    DLOP_TRAFFIC_CLASSES=0 turned scheduling off."""
    import torch.distributed as dist

    if process_group is False or not (dist.is_available() and dist.is_initialized()):
        return None
    group = process_group if process_group is not None else dist.group.WORLD
    try:
        backend = group._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        return None
    if not isinstance(backend, _C.ProcessGroupDlop):
        return None
    return _native.engine_pacer(backend)


FALLBACKS = ("error", "warn", "local")


def _absolute(source: str) -> str:
    """`source` with each local path (of a "::" list) made absolute here: a daemon resolves a relative
    path in its own working directory, which is not the trainer's."""
    return "::".join(part if "://" in part else os.path.abspath(os.path.expanduser(part))
                     for part in source.split("::"))


def _not_served(address: str, error: Error) -> tuple[bool, str]:
    """(whether the daemon answered, what it said) for the error add_daemon raised."""
    from dlop.errors import InvalidArgumentError, ProtocolError

    if isinstance(error, (InvalidArgumentError, ProtocolError)):  # it answered, and said no
        return True, f"{address} refused: {error}"
    return False, f"{address}: {error}"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"offloader address {address!r} is not host:port")
    return host, int(port)


# The fallback's worker processes: each opens the source and the pipeline once.
_worker_state: dict[str, Any] = {}


def _worker_init(source: str, transform: str) -> None:
    maker = _media.BatchMaker(transform)
    _worker_state["source"] = _media.open_source(source, maker.kind)
    _worker_state["maker"] = maker


def _worker_batch(indices: list[int], seed: int, epoch: int):
    samples, labels, lengths, skipped = _worker_state["maker"].run_batch(
        _worker_state["source"], indices, seed=seed, epoch=epoch
    )
    return samples, labels, lengths, [index for index, _ in skipped]


def manifest_transcripts(path: str) -> list[str] | None:
    """The transcript of each line of a CSV or JSONL manifest, or None when it has none. They stay on the
    trainer: batches carry indices, and the loader pairs them with these."""
    import csv

    if path.endswith(".csv"):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows or "transcript" not in rows[0]:
            return None
        return [row["transcript"] for row in rows]
    if path.endswith(".jsonl"):
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if not any("transcript" in line for line in lines):
            return None
        return [line.get("transcript", "") for line in lines]
    return None


def _native_batch(samples, labels, lengths, transcripts=None) -> tuple:
    """(samples, labels), or with lengths (audio) (samples, labels, lengths),
    the samples' last axis cut to the batch's longest; with transcripts, they
    take the labels' place."""
    if transcripts is not None:
        labels = transcripts
    if lengths is None:
        return samples, labels
    longest = int(lengths.max()) if len(lengths) else 0
    return samples[..., :longest], labels, lengths


def _python_worker_init(dataset, collate_fn, skip: bool) -> None:
    if collate_fn is None:
        from torch.utils.data import default_collate
        collate_fn = default_collate
    torch.set_num_threads(1)
    _worker_state["dataset"] = dataset
    _worker_state["collate_fn"] = collate_fn
    _worker_state["skip"] = skip


def _python_worker_batch(indices: list[int], seed: int, epoch: int) -> bytes:
    made = _python_job.make_batch(_worker_state["dataset"], _worker_state["collate_fn"], seed, epoch, indices,
                                  _worker_state["skip"])
    return _python_job.encode_batch(made)  # (batch, skipped), as a daemon's worker sends it


# Loaders whose lease manager may still hold daemon connections.
_open_loaders: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    """Closes the daemon connections the interpreter would leave open at exit: each takes in the
    daemon's last answers and batches first, where the process ending over them would reset the
    connection and leave UCX messages unmatched (noise in every daemon's log)."""
    for loader in list(_open_loaders):
        # Batches the script still holds view the manager's buffers, so it is closed, not freed.
        manager, loader._manager = loader._manager, None
        if manager is not None:
            manager.close()


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel for the first frame outside this package: the user's line
    that made or iterated the loader, whichever of dlop's frames the warning comes from."""
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _load_truncated(transform: str) -> str:
    """An image spec with PIL.ImageFile.LOAD_TRUNCATED_IMAGES as it is now, unless the spec sets it.

    Read once, here: batches are made ahead of their steps, on daemons, so a
    value followed live would reach some of them and not others."""
    try:
        spec = json.loads(transform)
    except ValueError:
        return transform  # BatchMaker names the JSON error
    if (not isinstance(spec, dict) or spec.get("kind", "image") != "image" or "load_truncated_images" in spec
            or not _python_job._pil_truncated()):
        return transform
    return json.dumps({**spec, "load_truncated_images": True})


class OffloadLoader:
    """Yields ``(samples, labels)`` torch tensors for this rank, one epoch per iteration.

    Native: ``source`` (a folder by class, a CSV/JSONL manifest, a record
    file, WebDataset-style tar shards: a folder of them, a path, a brace
    pattern or a list; record files and shards may be ``s3://`` or
    ``http(s)://`` URLs, docs/offload.md) and ``transform`` (a transform spec whose "kind" is "image", the
    default, "video" or "audio") run in C++ on the daemons. Images are
    N x C x H x W, clips N x views x C x T x H x W (or T before C), audio
    N x mels x frames padded to the batch's longest, yielded as
    ``(features, labels, lengths)``. A multi-label source gives N x classes
    multi-hot labels; a manifest with a ``transcript`` column gives each
    batch's transcripts (a list of str, read here from the manifest) in the
    labels' place. Generic Python path:
    ``dataset`` (any picklable map-style Dataset) and ``collate_fn`` (None:
    torch's default_collate) run in the daemons' Python workers, and each
    iteration yields what collate_fn returns. Random transforms in the
    dataset draw from torch, random and numpy seeded per batch from (seed,
    epoch, its indices), so a batch is the same wherever it is made.

    With offloaders the tensors view a pooled (page-locked where allowed)
    buffer without a copy; it is reused once the next batch is asked for, so
    keep a batch past that only by cloning it. With ``device="cuda"`` (or
    "cuda:N", or any accelerator torch has a device module for, such as the
    test accelerator "dlop_test") every tensor arrives on that device
    instead, copied on a side stream one batch ahead, and the caller's
    current stream waits for the copy (dlop.data._device).

    Batches that come over UCX are paced against the gradient all-reduces of
    ``process_group`` (default: the default group, when its backend is dlop;
    ``False``: never): while one is in flight, a batch not due by the next
    step moves at DLOP_DATA_RATE_MBPS at most. DLOP_TRAFFIC_CLASSES=0 turns
    this off with the rest of the scheduling.

    A sample that cannot be read raises dlop.SampleError naming it, made
    offloaded or locally; ``on_error="skip"`` leaves it out of its batch
    instead (the spec's ``on_error``; on the Python path, whatever the
    dataset raises for a sample) and counts it in ``stats().samples_skipped``.
    PIL.ImageFile.LOAD_TRUNCATED_IMAGES, as it is when the loader is made,
    lets a native image spec decode a truncated JPEG as PIL does (the spec's
    ``load_truncated_images``).
    A local folder is listed here when the loader is made: one holding files
    torchvision's ImageFolder lists but the native decoders do not read
    (.bmp, .webp, ...) is refused, naming them.

    ``fallback`` says what happens when no daemon serves the loader (none
    answers, each refuses its token or configuration, the token is missing, or
    every daemon is lost mid-epoch): ``"error"`` raises ``NoOffloaderError``
    naming each daemon's cause, at construction or at the batch where the last
    daemon was lost; ``"warn"`` makes the batches in ``workers`` local worker
    processes after one RuntimeWarning; ``"local"`` does so without one. The
    default is ``"error"`` when ``offloaders`` are given (a job that meant to
    offload must not train on the trainer's cores unnoticed) and ``"warn"``
    when none are. ``dataset``, ``sampler`` (the plan: ``set_epoch``, ``len``),
    ``batch_size`` and ``drop_last`` read as a DataLoader's do.

    ``stats()`` returns this rank's data stall, step time, batches in flight
    and each offloader's rate (dlop.data.metrics.LoaderStats); with
    DLOP_METRICS_PORT set the process serves them as Prometheus text
    (``metrics_port``).

    ``shuffle``: True shuffles the samples over the whole dataset each epoch
    (DistributedSampler's order), False keeps their order, and ``"shards"``
    (tar shards only: webdataset's ``shardshuffle``) shuffles the order of
    the shards each epoch, keeps each shard's samples in order and deals
    contiguous batches of that sequence to the ranks in turn, so a batch is
    read from a remote shard with one streamed request instead of one per
    sample. A batch then holds neighbouring samples of one shard (or two),
    the same ones every epoch (no shuffle buffer mixes them): write samples
    into the shards in random order. The trainer reads the shards' headers
    once to learn their sizes.
    """

    def __init__(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
        transform: str | dict | None = None,
        batch_size: int = 1,
        shuffle: bool | str = True,
        seed: int = 0,
        offloaders: Sequence[str] = (),
        token: str | None = None,
        prefetch: int = 4,
        drop_last: bool = False,
        workers: int = 2,
        lease_timeout: float = 30.0,
        no_daemon_timeout: float = 0.0,
        connect_timeout: float = 5.0,
        dataset: Any = None,
        collate_fn: Any = None,
        device: Any = None,
        process_group: Any = None,
        fallback: str | None = None,
        on_error: str | None = None,
    ) -> None:
        if (dataset is None) == (source is None):
            raise ValueError("OffloadLoader: give either source and transform (native) or dataset (Python path)")
        self.dataset, self.collate_fn, self._job = dataset, collate_fn, b""
        self.device = _device.accelerator_device(device)  # ValueError when this torch lacks that device
        if on_error not in (None, "raise", "skip"):
            raise ValueError(f"OffloadLoader: on_error is \"raise\" or \"skip\", not {on_error!r}")
        self._skip = on_error == "skip"
        if dataset is not None:
            self.source, self.transform, self.kind = "", "", "python"
            # ValueError when it does not pickle.
            self._job = _python_job.encode_job(dataset, collate_fn, skip=self._skip)
            self._dataset_size = len(dataset)
        else:
            if transform is None:
                raise ValueError("OffloadLoader: a native source needs a transform spec")
            # A list of shards travels as one spec, joined by "::" (webdataset's separator).
            self.source = _absolute("::".join(map(os.fspath, source)) if isinstance(source, (list, tuple))
                                    else os.fspath(source))
            self.transform = transform if isinstance(transform, str) else json.dumps(transform)
            if on_error is not None:  # the loader's policy is the spec's
                self.transform = json.dumps({**json.loads(self.transform), "on_error": on_error})
            self.transform = _load_truncated(self.transform)
            self.kind = _media.BatchMaker(self.transform).kind  # a bad spec fails here, not in a daemon
            if self.kind == "image" and _media.ImagePipeline(self.transform).fixed_shape is None:
                raise ValueError("OffloadLoader: the transform spec's ops leave each image its own size, and a batch "
                                 "stacks them: end the ops with random_resized_crop, center_crop, or resize to "
                                 "[height, width]")
            self._dataset_size = None
            if os.path.isdir(self.source):
                # Listed here, so that files the native decoders cannot read (a .bmp or .webp
                # torchvision's ImageFolder would list) are refused by name now, not by a daemon.
                self._dataset_size = len(_media.open_source(self.source, self.kind))
        self._transcripts = manifest_transcripts(self.source) if self.source else None
        if self.dataset is None:  # what DataLoader code reads as loader.dataset (len() of it)
            self.dataset = _loader_view.SourceDataset(self)
        self.batch_size = int(batch_size)
        if isinstance(shuffle, str) and shuffle != "shards":
            raise ValueError(f"OffloadLoader: shuffle is True, False or \"shards\", not {shuffle!r}")
        self.shuffle = bool(shuffle)
        self._shard_sizes: list[int] = []
        if shuffle == "shards":
            if dataset is not None:
                raise ValueError("OffloadLoader: shuffle=\"shards\" needs a native source made of tar shards")
            self._shard_sizes = list(_media.open_source(self.source, self.kind).shard_sizes)
            if not self._shard_sizes:
                raise ValueError(f"OffloadLoader: shuffle=\"shards\" needs tar shards; {self.source} is not made "
                                 "of shards")
            self._dataset_size = sum(self._shard_sizes)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.workers = int(workers)
        self.rank, self.world = _rank_world()
        self.prefetch = int(prefetch)
        self._stats = metrics.Recorder(self.rank, self.prefetch)
        self._epoch = 0
        self._resume: dict | None = None
        self._position = 0
        self._manager = None
        self._joining_lock = threading.Lock()
        self._prepared: list = []  # (address, PreparedDaemon or the error, callback) from add_offloader(wait=False)
        if fallback is None:
            fallback = "error" if offloaders else "warn"
        if fallback not in FALLBACKS:
            raise ValueError(f"OffloadLoader: fallback is \"error\", \"warn\" or \"local\", not {fallback!r}")
        self.fallback = fallback
        token = _token.resolve(token)
        reasons, answered = ([] if token or not offloaders else [_token.MISSING]), False
        for address in offloaders if token else ():
            try:
                if self._manager is None:
                    self._manager = _native.LeaseManager(
                        self.source, self.transform, self.seed, self.batch_size, token,
                        shuffle=self.shuffle, drop_last=self.drop_last, rank=self.rank, world=self.world,
                        prefetch=prefetch, lease_timeout=lease_timeout, no_daemon_timeout=no_daemon_timeout,
                        connect_timeout=connect_timeout, python=self._job,
                        pacer=_engine_pacer(process_group), shard_sizes=self._shard_sizes,
                        pin_for=None if self.device is None else str(self.device),
                    )
                self._manager.add_daemon(*_split(address))
                self._stats.add_address(address)
            except Error as e:  # the daemon did not answer or refused: try the next one
                said, why = _not_served(address, e)
                answered, cause = answered or said, e
                reasons.append(why)
        if self._manager is not None and self._manager.live_daemons() == 0:
            self._manager = None
        if self._manager is None:
            if not offloaders:
                why = "no offloaders were given"
            elif not token:
                why = _token.MISSING
            else:
                why = (f"no dlop-offloader {'serves this loader' if answered else 'answered'} "
                       f"({'; '.join(reasons)})")
            self._fall_back(why, cause if reasons and token else None)
        elif self._manager.dataset_size != (self._dataset_size or self._manager.dataset_size):
            raise ValueError(f"the offloaders see {self._manager.dataset_size} samples, the dataset here has "
                             f"{self._dataset_size}")
        else:
            self._dataset_size = self._manager.dataset_size
            self._stats.read(self._manager)
        # With DLOP_METRICS_PORT: the endpoint, if not up yet (a taken port warns).
        self.metrics_labels = metrics.serve(self)
        _open_loaders.add(self)

    def _fall_back(self, why: str, cause: BaseException | None = None) -> None:
        """No daemon serves this loader: raise, or say so (fallback "warn"); the caller goes local."""
        if self.fallback == "error":
            raise NoOffloaderError(f"OffloadLoader: {why} (fallback=\"error\"; \"warn\" or \"local\" make the "
                                   "batches in local worker processes instead)") from cause
        if self.fallback == "warn":
            self._warn_fallback(why)

    def _warn_fallback(self, why: str) -> None:
        warnings.warn(
            f"dlop.data.OffloadLoader: {why}; "
            f"making batches locally in {self.workers} worker processes",
            RuntimeWarning,
            stacklevel=_user_stacklevel(),
        )

    @property
    def sampler(self) -> _loader_view.PlanSampler:
        """This rank's plan of the current epoch as a sampler (``set_epoch`` sets the loader's epoch)."""
        return _loader_view.PlanSampler(self)

    def _sample_count(self) -> int:
        if self._dataset_size is None:
            self._plan()
        return self._dataset_size

    @property
    def metrics_port(self) -> int | None:
        """The port of this process's /metrics endpoint (DLOP_METRICS_PORT), None when none is
        served. The loader's series there carry ``metrics_labels`` (rank, loader)."""
        return metrics.server_port()

    @property
    def offloaded(self) -> bool:
        return self._manager is not None

    def add_offloader(self, address: str, wait: bool = True, joined: Any = None) -> None:
        """Uses another daemon from the next batch on (offloaded mode only).

        ``wait=False`` connects and configures it on a thread of its own (seconds, when the
        daemon starts Python workers) while the training goes on; it gets work between two
        batches once ready, and ``joined(address, error)`` is then called on the iterating
        thread (``error`` None, or the exception that kept it out)."""
        if self._manager is None:
            raise RuntimeError("this OffloadLoader runs locally; offloaders can only join an offloaded one")
        if wait:
            self._manager.add_daemon(*_split(address))
            self._stats.add_address(address)
            return
        manager = self._manager

        def prepare() -> None:
            try:
                got = manager.prepare_daemon(*_split(address))
            except Exception as e:  # reported on the iterating thread
                got = e
            with self._joining_lock:
                self._prepared.append((address, got, joined))

        # Not a daemon thread: one the interpreter stopped at exit inside prepare_daemon (whose GIL
        # release unwinds through C++ then) aborts the process; an exit waits for the join instead,
        # at most the connect timeout.
        threading.Thread(target=prepare, name="dlop-offloader-join").start()

    def _adopt_prepared(self) -> None:
        """Daemons that add_offloader(wait=False) prepared: they get work from the next batch."""
        with self._joining_lock:
            ready, self._prepared = self._prepared, []
        for address, got, joined in ready:
            error = got if isinstance(got, Exception) else None
            if error is None and self._manager is not None:
                try:
                    self._manager.adopt_daemon(got)
                    self._stats.add_address(address)
                except Exception as e:
                    error = e
            if joined is not None:
                joined(address, error)

    def stats(self) -> metrics.LoaderStats:
        """This rank's figures so far: data stall, step, batches in flight, per-offloader
        rates (dlop.data.metrics.LoaderStats documents the fields). Any thread may call it."""
        return self._stats.stats()

    def _plan(self):
        if self._dataset_size is None:
            self._dataset_size = len(_media.open_source(self.source, self.kind))
        return _native.EpochPlan(
            self._dataset_size, self.batch_size, self.seed, self.shuffle, self.drop_last, self.rank, self.world,
            self._shard_sizes,
        )

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)
        self._resume = None

    def __len__(self) -> int:
        return self._plan().batch_count()

    def state_dict(self) -> dict:
        """A small cursor: the epoch, the next batch's position and the plan it belongs to."""
        plan = self._plan()  # learns the dataset size when no daemon told it
        return {
            "epoch": self._epoch, "position": self._position, "seed": self.seed,
            "dataset_size": self._dataset_size, "batch_size": self.batch_size,
            "rank": self.rank, "world": self.world, "shuffle": self.shuffle, "drop_last": self.drop_last,
            "shards": plan.shards_digest(),
        }

    def load_state_dict(self, state: dict) -> None:
        """The next iteration resumes the cursor's epoch at its position."""
        mine = self.state_dict()
        state = {"shards": 0, **state}  # a cursor saved before shard plans existed is a sample plan's
        for key in ("seed", "dataset_size", "batch_size", "rank", "world", "shuffle", "drop_last", "shards"):
            if state[key] != mine[key]:
                raise ValueError(f"state_dict belongs to another plan: {key} is {state[key]!r}, not {mine[key]!r}")
        self._epoch = int(state["epoch"])
        self._resume = dict(state)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        start = int(self._resume["position"]) if self._resume else 0
        self._resume = None
        self._position = start
        batches = self._iter_offloaded(start) if self._manager is not None else self._iter_local(start)
        if self.device is not None:
            batches = _device.to_device(batches, self.device)
        # The data stall: the time from the loop asking (this generator resumed) to the batch handed out.
        clock, record = time.perf_counter, self._stats.step
        self._stats.start_iteration()
        try:
            while True:
                asked = clock()
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                record(asked, clock())
                yield batch
        finally:
            batches.close()

    def _iter_offloaded(self, start: int):
        m = self._manager
        cursor = self.state_dict()
        cursor["position"] = start
        m.restore(cursor)
        self._stats.start_iteration(m)
        held = None
        try:
            while True:
                if held is not None:
                    m.release(held)
                    held = None
                if self._prepared:
                    self._adopt_prepared()
                try:
                    got = m.next()
                except NoOffloaderError as e:
                    # Every daemon is gone: finish the epoch locally, said once.
                    self._fall_back(str(e), e)  # with fallback="error", the error is the caller's
                    self._manager = None
                    yield from self._iter_local(self._position)
                    return
                if got is None:
                    return
                position, samples, labels, held, skipped, lengths = got
                self._stats.offloaded(m)
                self._position = position + 1
                if labels is None:  # the Python path: samples is the blob of (batch, skipped)
                    batch, skipped = _python_job.decode_batch(samples)
                    self._stats.skipped(len(skipped))
                    if batch is not None:
                        batch, held = self._hand_out(m, batch, held)
                        yield batch
                else:
                    self._stats.skipped(len(skipped))
                    batch = _native_batch(samples, labels, lengths, self._batch_transcripts(position, skipped))
                    batch, held = self._hand_out(m, batch, held)
                    yield batch
        finally:
            if held is not None and self._manager is not None:
                m.release(held)
            if self._prepared and self._manager is not None:
                # Joiners ready by the end belong to the manager now, not to whatever drops this list last.
                self._adopt_prepared()

    def _hand_out(self, m, batch, slot: int):
        """(what to yield, the slot still to release at the next step). With a device the batch is
        lent instead: its upload reads the slot after that step, and to_device releases it."""
        if self.device is None:
            return batch, slot
        return _device.Lent(batch, functools.partial(m.release, slot)), None

    def _batch_transcripts(self, position: int, skipped) -> list[str] | None:
        """The transcripts of the batch at `position` of this epoch's plan, less its skipped samples."""
        if self._transcripts is None:
            return None
        if getattr(self, "_planned", (None,))[0] != self._epoch:
            self._planned = (self._epoch, self._plan().batches(self._epoch))
        left_out = set(skipped)
        return [self._transcripts[i] for i in self._planned[1][position] if i not in left_out]

    def _iter_local(self, start: int):
        import concurrent.futures as cf
        import multiprocessing as mp

        batches = self._plan().batches(self._epoch)[start:]
        # Garbage the forked workers would otherwise inherit and collect (an
        # earlier loader's UCX state among it) is collected here, once.
        gc.collect()
        with cf.ProcessPoolExecutor(
            # fork, as torch's DataLoader does on Linux: spawn would re-run the
            # user's script, which need not guard its top level with __main__.
            max_workers=max(1, self.workers),
            mp_context=mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn"),
            initializer=_python_worker_init if self.kind == "python" else _worker_init,
            initargs=((self.dataset, self.collate_fn, self._skip) if self.kind == "python"
                      else (self.source, self.transform)),
        ) as pool:
            # A bounded window of batches in flight, as with offloaders: memory
            # stays bounded whatever the epoch's length.
            window: collections.deque = collections.deque()
            todo = iter(batches)
            for k in range(len(batches)):
                while len(window) < 2 * max(1, self.workers) and (b := next(todo, None)) is not None:
                    work = _python_worker_batch if self.kind == "python" else _worker_batch
                    window.append(pool.submit(work, b, self.seed, self._epoch))
                got = window.popleft().result()
                self._stats.local(len(window))
                self._position = start + k + 1
                if self.kind == "python":
                    batch, skipped = _python_job.decode_batch(bytearray(got))
                    self._stats.skipped(len(skipped))
                    if batch is not None:
                        yield batch
                else:
                    samples, labels, lengths, skipped = got
                    self._stats.skipped(len(skipped))
                    yield _native_batch(*(None if a is None else torch.from_numpy(a) for a in (samples, labels, lengths)),
                                        self._batch_transcripts(start + k, skipped))
