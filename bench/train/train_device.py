"""python -m bench.train --device DEV: offloaded preprocessing feeding one accelerator, against what users run.

    python -m bench.train --device cuda --kind image --trainer-cores 4 --json image.json --report DIR
    python -m bench.train --device dlop_test --kind video --trainer-cores 1 --test-op-us 20 --test-tflops 0.05

One machine models a GPU host and spare CPU machines: the trainer process and
every process it starts (its DataLoader workers) are confined to
``--trainer-cores`` K cores (``os.sched_setaffinity``, which children inherit);
the offloaders get the machine's other cores (``--offloader-cores`` narrows
them: a count or a list). Rows, same seed and model, each a fresh set of
processes; the DataLoader rows draw their order from a seeded
DistributedSampler, dlop's rows from dlop's own (``EpochPlan``): two
permutations of the same samples:

* ``synthetic``: one batch already on the device, every step: the device's ceiling;
* ``stock``: torch's DataLoader in the K cores, pinned float32 batches copied
  with ``non_blocking=True``, the worker count that trains fastest there;
* ``stock_uint8``: the same DataLoader, its workers shipping uint8 (4x fewer
  bytes to collate, pin and copy) and the device normalising, as timm's
  PrefetchLoader and NVIDIA's examples do;
* ``stock_all_cores``: ``stock`` with every core (as many CPUs as dlop gets);
* ``gpu_decode``: images decoded by ``torchvision.io.decode_jpeg(device=DEV)``
  (CUDA; elsewhere the workers decode) and transformed on the device; video
  only where the device has a decoder, else absent with the reason;
* ``native_local``: dlop's native pipeline in the trainer process, one thread
  per trainer core, no offloaders; batches uploaded as ``dlop_offload``'s are;
* ``dlop_offload``: ``OffloadLoader(..., device=DEV)`` fed by one
  dlop-offloader per offloader core;
* ``dlop_run``: the ``stock`` process unchanged, under ``dlop run
  --local-offloaders N`` on the offloader cores.

The gain of ``dlop_offload`` over ``stock`` is then the product of three:
the format (``stock_uint8``/``stock``), the decoder (dlop's pipeline, which
decodes only a crop's region: ``native_local``/``stock_uint8``) and the
offloading (the other cores: ``dlop_offload``/``native_local``).

Worker counts (``--workers``, ``--uint8-workers``, ``--all-cores-workers``):
a number, or ``auto``: each of K - 1, K and 2K (the cores' count) trains for
``--probe-seconds`` in a process of its own, and the fastest is kept.

Timing: every row trains its warm-up steps (at least one per producer, so
that every worker, thread or daemon has delivered its first batch), then its
loader's queue is drained (batches taken without training until one must be
waited for), then ``--seconds`` (or ``--steps``) are timed; the same for
every row. With ``--deadline S`` a row (or probe) starts only while the time
since the start leaves at least the longest row so far before S; the rest
are listed as skipped, with the reason, and a row still running at S is cut
and listed so.

Per row: samples/s (samples trained on in the timed window over its wall
time); ``device_busy`` (device events around forward + backward + optimiser
step, summed, over the wall time of the timed steps); ``data_stall_ms`` (per
step, blocked on the loader); trainer-host CPU per sample (the trainer
process and its workers); offloader CPU per sample; peak pinned memory
(VmLck of the trainer and its workers, sampled every 20 ms by the driver on
cores other than the trainer's where there are any, plus the device's
pinned allocator where torch reports it). The header holds each row's ratio
to ``stock``, ``stock_uint8``, ``stock_all_cores``, ``synthetic`` and
``gpu_decode``, the three factors above, and the offloader cores that would
feed the device at ``synthetic``'s rate (from the measured offloader CPU per
sample).

On ``dlop_test`` the device's cost model (``--test-op-us``, ``--test-tflops``:
``DLOP_TEST_DEVICE_OP_US``, ``DLOP_TEST_DEVICE_TFLOPS`` in the trainer's
environment) makes compute take modelled time, so that a row is bound by the
device or by its data as on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import _common
from bench.train import train_device_report
from bench.train.train_device_models import MODELS

ROWS = ("synthetic", "stock", "stock_uint8", "stock_all_cores", "gpu_decode", "native_local", "dlop_offload",
        "dlop_run")
# The DataLoader rows and the option giving their worker count.
WORKERS = {"stock": "workers", "gpu_decode": "workers", "dlop_run": "workers", "stock_uint8": "uint8_workers",
           "stock_all_cores": "all_cores_workers"}
DEFAULTS = {"image": {"batch": 64, "classes": 0}, "video": {"batch": 8, "classes": 157},
            "audio": {"batch": 32, "classes": 0}}


def parse_cpus(text: str) -> list[int]:
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.train --device DEV", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", required=True, help="cpu, cuda[:N], dlop_test[:N] or any accelerator torch knows")
    p.add_argument("--kind", choices=("image", "video", "audio"), default="image")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated: " + ", ".join(ROWS))
    p.add_argument("--trainer-cores", type=int, default=4, help="K: cores of the trainer process and its workers")
    p.add_argument("--offloader-cores", help="a count or a list (4-9) of the cores left: default all of them")
    p.add_argument("--data", help="image folder, video folder or audio folder by class; default: built-in, made once")
    p.add_argument("--samples", type=int, default=0, help="samples of the built-in set (default: 5000 images, "
                   "96 clips, 64 audio files)")
    p.add_argument("--image-size", default="500x375", help="built-in images: WxH (JPEG quality 90)")
    p.add_argument("--clip-size", default="480x270", help="built-in clips: WxH (H.264, B-frames)")
    p.add_argument("--clip-seconds", type=float, default=10.0, help="built-in clips: length (keyframes every 2-10 s)")
    p.add_argument("--model", help="image: %s; video: %s; audio: %s (the first is the default)" %
                   tuple(", ".join(m) for m in MODELS.values()))
    p.add_argument("--classes", type=int, help="video: classes of the Charades-like manifest (157); else the data's")
    p.add_argument("--batch", type=int, help="samples per step (images 64, clips 8, audio 32)")
    p.add_argument("--size", type=int, default=224, help="images: RandomResizedCrop's size")
    p.add_argument("--frames", type=int, default=16, help="video: frames per clip")
    p.add_argument("--frame-stride", type=int, default=2, help="video: frames between a clip's frames")
    p.add_argument("--short-side", default="128,160", help="video: MIN,MAX of the random short side")
    p.add_argument("--crop", type=int, default=112, help="video: the square crop")
    p.add_argument("--audio-seconds", type=float, default=4.0, help="audio: the random crop's length")
    p.add_argument("--seconds", type=float, default=20.0, help="timed seconds per row (at least 3 steps)")
    p.add_argument("--steps", type=int, default=0, help="timed steps per row instead of --seconds")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--workers", default="auto", help="stock's DataLoader workers: a number, or auto (probe)")
    p.add_argument("--uint8-workers", help="stock_uint8's workers: a number, or auto (default: as --workers)")
    p.add_argument("--all-cores-workers", default="auto", help="stock_all_cores's workers: a number, or auto")
    p.add_argument("--probe-seconds", type=float, default=3.0, help="auto: seconds of training per worker count")
    p.add_argument("--deadline", type=float, help="seconds from the start: rows that would end past it are "
                   "skipped, and listed so")
    p.add_argument("--autocast", choices=("auto", "bf16", "off"), default="auto", help="auto: bf16 on cuda")
    p.add_argument("--channels-last", choices=("auto", "on", "off"), default="auto", help="auto: on for cuda")
    p.add_argument("--test-op-us", type=float, help="dlop_test: every device operator takes at least this long")
    p.add_argument("--test-tflops", type=float, help="dlop_test: the rate of matmul and convolution FLOPs")
    p.add_argument("--offloader", help="the dlop-offloader executable (default: next to this Python)")
    p.add_argument("--json", help="write the header and rows here")
    p.add_argument("--report", help="write train_device.md and train_device.png here (created)")
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not args.rows or (unknown := [r for r in args.rows if r not in ROWS]):
        p.error(f"--rows: unknown {', '.join(unknown) if args.rows else '(none)'}; choose from {', '.join(ROWS)}")
    args.model = args.model or MODELS[args.kind][0]
    if args.model not in MODELS[args.kind]:
        p.error(f"--model {args.model} is not a {args.kind} model: choose from {', '.join(MODELS[args.kind])}")
    args.batch = args.batch or DEFAULTS[args.kind]["batch"]
    try:
        low, high = (int(v) for v in args.short_side.split(","))
    except ValueError:
        p.error(f"--short-side {args.short_side!r}: give MIN,MAX, e.g. 128,160")
    if not args.crop <= low <= high:
        p.error(f"--short-side {args.short_side}: need --crop {args.crop} <= MIN <= MAX")
    args.clip = {"frames": args.frames, "stride": args.frame_stride, "short_side": [low, high], "crop": args.crop,
                 "hflip": 0.5}
    args.uint8_workers = args.uint8_workers or args.workers
    if args.deadline is not None and args.deadline <= 0:
        p.error(f"--deadline {args.deadline:g}: give the seconds this command may run")
    for name in ("workers", "uint8_workers", "all_cores_workers"):
        value = getattr(args, name)
        if value != "auto" and not (value.isdigit()):
            p.error(f"--{name.replace('_', '-')} {value!r}: a number of workers, or auto")
    if min(args.batch, args.frames, args.frame_stride, args.warmup + 1, args.trainer_cores) < 1 or args.seconds <= 0:
        p.error("--batch, --frames, --frame-stride, --trainer-cores and --seconds must be positive")
    if args.device.split(":")[0] != "dlop_test" and (args.test_op_us or args.test_tflops):
        p.error("--test-op-us and --test-tflops model the test accelerator's compute: give --device dlop_test")
    return args


def place(args) -> tuple[list[int], list[int], list[int]]:
    """(trainer cores, offloader cores, all cores) from this process's affinity; SystemExit when they do not fit."""
    every = sorted(os.sched_getaffinity(0))
    if args.trainer_cores >= len(every):
        raise SystemExit(f"--trainer-cores {args.trainer_cores}: this process may use {len(every)} core(s), and the "
                         "offloaders need at least one of them")
    trainer, rest = every[:args.trainer_cores], every[args.trainer_cores:]
    offloader = rest
    if args.offloader_cores:
        text = args.offloader_cores.strip()
        try:
            offloader = rest[:int(text)] if text.isdigit() else parse_cpus(text)
        except ValueError:
            raise SystemExit(f"--offloader-cores {text!r}: a count or a list such as 4-9,12") from None
        if not offloader or not set(offloader) <= set(rest):
            raise SystemExit(f"--offloader-cores {text}: give 1 to {len(rest)} of the cores the trainer leaves "
                             f"({_common_cpus(rest)})")
    return trainer, offloader, every


def _common_cpus(cpus: list[int]) -> str:
    from bench.common.netns import describe_cpus

    return describe_cpus(cpus)


def offload_path(args, spec_probe: dict) -> str:
    """"native" where this build's pipeline makes the kind, else "python" (the stock dataset on the offloaders'
    Python workers)."""
    from dlop import _C
    from bench.train import train_device_data as data

    spec = {"image": data.image_spec(args.size), "video": data.video_spec(args.clip),
            "audio": data.audio_spec(args.audio_seconds)}[args.kind]
    try:
        _C.media.BatchMaker(json.dumps(spec))
        return "native"
    except Exception as e:  # a build without FFmpeg or the audio libraries refuses the kind
        spec_probe["offload_native_missing"] = str(e).splitlines()[0]
        return "python"


def absent_rows(args, device_type: str) -> dict:
    """Rows that cannot run here, and why."""
    why = {}
    if args.kind == "video":
        try:
            import torchcodec  # noqa: F401
            have = device_type == "cuda"
        except Exception:
            have = False
        why["gpu_decode"] = ("this benchmark decodes clips on the device through torchcodec's CUDA decoder, which is "
                             "not wired in yet" if have else
                             f"no video decoder on {device_type}: torchcodec with CUDA is not installed here"
                             if device_type == "cuda" else f"{device_type} has no video decoder")
    elif args.kind == "audio":
        why["gpu_decode"] = "audio is decoded on the CPU in every pipeline users run; no device decoder row"
        why["stock_uint8"] = "log-mel features are computed in float32 on the CPU; there is no uint8 form to ship"
    return why


def start_daemons(exe: str, cores: list[int], workdir: Path, log) -> tuple[list, list[str], str]:
    """One single-threaded dlop-offloader per core, each confined to its core from its start."""
    token = os.urandom(16).hex()
    token_file = workdir / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    procs, addresses = [], []
    for core in cores:
        proc = subprocess.Popen([exe, "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--threads", "1"],
                                stdout=subprocess.PIPE, stderr=log, text=True,
                                preexec_fn=lambda c=core: os.sched_setaffinity(0, {c}))
        procs.append(proc)
    for proc in procs:
        line = proc.stdout.readline()
        if "listening on" not in line:
            _common.stop_processes(procs)
            raise RuntimeError(f"dlop-offloader did not start: {line!r}")
        addresses.append("127.0.0.1:" + line.strip().rsplit(":", 1)[1])
    return procs, addresses, token


def run_process(argv: list[str], env: dict, cores: list[int], log_path: Path, what: str, timeout: float,
                grace: float = 30) -> None:
    with open(log_path, "a") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: os.sched_setaffinity(0, cores))
        try:
            code = proc.wait(timeout=timeout + grace)  # the process dumps its stacks and exits at `timeout`
        except subprocess.TimeoutExpired:
            _common.stop_processes([proc])
            code = "timeout"
    if code != 0:
        raise RuntimeError(f"{what}: exited {code}\n{log_path.read_text()[-3000:]}")


def row_timeout(args) -> float:
    """Seconds a row may take, start-up and warm-up included, before its process reports where it hangs."""
    return 120 + 5 * (args.seconds if not args.steps else 2 * args.steps)


def rank_env(args) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.test_op_us is not None:
        env["DLOP_TEST_DEVICE_OP_US"] = f"{args.test_op_us:g}"
    if args.test_tflops is not None:
        env["DLOP_TEST_DEVICE_TFLOPS"] = f"{args.test_tflops:g}"
    return env


class Clock:
    """--deadline: the seconds left, and whether a run as long as the longest so far still fits in them."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline, self.start, self.longest = deadline, time.monotonic(), {}

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - self.elapsed()

    def fits(self, what: str) -> bool:
        return self.left() > self.longest.get(what, 0.0)

    def ran(self, what: str, seconds: float) -> None:
        self.longest[what] = max(self.longest.get(what, 0.0), seconds)

    def timeout(self, usual: float) -> float:
        return max(1.0, min(usual, self.left()))

    def why_not(self, what: str) -> str:
        return (f"not started: {self.elapsed():.0f} s of --deadline {self.deadline:g} s gone, and the longest "
                f"{what} so far took {self.longest.get(what, 0.0):.0f} s")


class PinnedSampler:
    """Peak page-locked memory (VmLck, what mlock holds: dlop's pools) of a trainer process and its workers,
    sampled every 20 ms from a thread of this process confined to `cores` (those the trainer does not use),
    so that sampling costs the trainer's cores nothing. The trainer writes its pid to `pid_file` as it starts
    (under `dlop run` it is not the process this driver starts)."""

    def __init__(self, pid_file: Path, cores: list[int]) -> None:
        import threading

        self.pid_file, self.cores, self.peak, self.stop = pid_file, cores, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, name="pinned-sampler", daemon=True)
        self.thread.start()

    @staticmethod
    def locked_mib(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/status") as f:
                return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmLck:")), 0.0)
        except OSError:
            return 0.0

    def _run(self) -> None:
        from bench.offload.offload_common import descendants

        if self.cores:
            os.sched_setaffinity(0, self.cores)  # pid 0: this thread alone
        pid = None
        while not self.stop.wait(0.02):
            if pid is None:
                try:
                    pid = int(self.pid_file.read_text())
                except (OSError, ValueError):
                    continue
            self.peak = max(self.peak, sum(self.locked_mib(p) for p in [pid] + descendants(pid)))

    def close(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.peak


def producers(row: str, workers: int, cores: dict) -> int:
    """What makes the row's batches, counted: workers, threads or daemons (each delivers a first batch before
    the timed window)."""
    if row == "synthetic":
        return 0
    if row in ("dlop_offload", "dlop_run"):
        return len(cores["offloader"])
    return workers


def run_row(args, row: str, base: dict, cores: dict, workdir: Path, clock: Clock) -> dict:
    """One row in fresh processes; its raw measurements."""
    out = workdir / f"{row}.json"
    log_path = workdir / f"{row}.log"
    workers = len(cores["trainer"]) if row == "native_local" else base["workers"].get(row, 0)
    spec = dict(base, row=row, out=str(out), cores=cores["all" if row == "stock_all_cores" else "trainer"],
                workers=workers, producers=producers(row, workers, cores),
                timeout_s=clock.timeout(base["timeout_s"]))
    rank = [sys.executable, "-m", "bench.train_device_rank"]
    env = rank_env(args)
    daemons = []
    pinned = PinnedSampler(Path(str(out) + ".pid"), [c for c in cores["all"] if c not in cores["trainer"]])
    try:
        if row == "dlop_offload":
            with open(log_path, "a") as log:
                daemons, spec["offloaders"], spec["token"] = start_daemons(args.offloader_exe, cores["offloader"],
                                                                           workdir, log)
            spec["offloader_pids"] = [d.pid for d in daemons]
        grace = 30 if args.deadline is None else 5
        if row == "dlop_run":
            argv = [sys.executable, "-m", "dlop.fleet.run", "--local-offloaders", str(len(cores["offloader"])), "--",
                    *rank, json.dumps(spec)]
            run_process(argv, env, cores["offloader"], log_path, row, spec["timeout_s"], grace)  # the rank pins itself
        else:
            run_process(rank + [json.dumps(spec)], env, spec["cores"], log_path, row, spec["timeout_s"], grace)
    finally:
        _common.stop_processes(daemons)
        peak = pinned.close()
    raw = json.loads(out.read_text())
    raw["peak_pinned_mib"] = peak + raw.pop("cuda_host_peak_mib", 0.0)
    raw["workers"] = workers
    return raw


def probe_workers(args, base: dict, cores: list[int], workdir: Path, setting: str, row: str,
                  clock: Clock) -> tuple[int, dict]:
    """The worker count for `row` on `cores`: the given one, or the count that trains fastest, each count
    training --probe-seconds in a process of its own (its workers forked before the device starts, as in the
    row)."""
    if setting != "auto":
        return int(setting), {}
    n = len(cores)
    rates = {}
    for count in sorted({max(1, n - 1), n, 2 * n}):
        if not clock.fits("probe"):
            rates["skipped"] = clock.why_not("probe")
            break
        out = workdir / f"probe_{row}_{count}.json"
        spec = dict(base, row=row, out=str(out), cores=cores, workers=count, producers=count,
                    seconds=args.probe_seconds, steps=0, timeout_s=clock.timeout(base["timeout_s"]))
        started = time.monotonic()
        try:
            run_process([sys.executable, "-m", "bench.train_device_rank", json.dumps(spec)], rank_env(args), cores,
                        workdir / f"probe_{row}.log", f"worker probe ({row}, {count} workers)", spec["timeout_s"],
                        30 if args.deadline is None else 5)
        except RuntimeError:
            if clock.left() > 0:
                raise
            rates["skipped"] = f"{count} workers: cut at --deadline {args.deadline:g} s"
            break
        clock.ran("probe", time.monotonic() - started)
        got = json.loads(out.read_text())
        rates[count] = got["samples"] / got["wall_s"]
    counted = {k: v for k, v in rates.items() if isinstance(k, int)}
    return (max(counted, key=counted.get) if counted else n), rates


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.train import train_device_data as data
    from bench.train.train_device_datasets import builtin

    trainer, offloader, every = place(args)
    device_type = args.device.split(":")[0]
    absent = {r: why for r, why in absent_rows(args, device_type).items() if r in args.rows}
    rows_to_run = [r for r in args.rows if r not in absent]
    if any(r in ("dlop_offload", "dlop_run") for r in rows_to_run):
        from bench.offload.offload_common import offloader_path

        args.offloader_exe = offloader_path(args.offloader)
    workdir = Path(tempfile.mkdtemp(prefix="dlop-bench-train-device-"))
    source = os.path.abspath(args.data) if args.data else builtin(args)
    classes = args.classes or DEFAULTS[args.kind]["classes"]
    if args.kind == "video":
        source = data.write_charades_manifest(source, str(workdir / "manifest.csv"), classes or 157)
        classes = data.read_manifest(source)[1]
    else:
        classes = classes or len({label for _, label in data.class_folder(source)})
    notes: dict = {}
    cuda = device_type == "cuda"
    base = {"kind": args.kind, "device": args.device, "data": source, "batch": args.batch, "size": args.size,
            "clip": args.clip, "seconds_per_sample": args.audio_seconds, "model": args.model, "classes": classes,
            "warmup": args.warmup, "seconds": args.seconds, "steps": args.steps,
            "autocast": "bf16" if args.autocast == "bf16" or (args.autocast == "auto" and cuda) else "off",
            "channels_last": args.channels_last == "on" or (args.channels_last == "auto" and cuda),
            "video_reader": data.video_reader(), "offload_path": offload_path(args, notes), "offloaders": [],
            "token": "", "timeout_s": row_timeout(args)}
    if args.kind == "video" and base["video_reader"] is None:
        raise SystemExit("--kind video: the stock rows read clips with PyAV or OpenCV, and neither imports here")
    clock = Clock(args.deadline)
    base["workers"], probes = {}, {}
    for probed in ("stock", "stock_uint8", "stock_all_cores"):
        users = [r for r, option in WORKERS.items() if option == WORKERS[probed] and r in rows_to_run]
        if users:  # dlop_run and gpu_decode take stock's count, probed as stock
            base["workers"][probed], probes[probed] = probe_workers(
                args, base, every if probed == "stock_all_cores" else trainer, workdir,
                getattr(args, WORKERS[probed]), probed, clock)
    for row, option in WORKERS.items():
        base["workers"].setdefault(row, base["workers"].get("stock", 0) if option == "workers" else 0)
    header = _common.run_header(
        benchmark="train_device", device=args.device, kind=args.kind, model=args.model, classes=classes,
        batch=args.batch, data=source, trainer_cores=trainer, offloader_cores=offloader, all_cores=every,
        workers={r: base["workers"][r] for r in WORKERS if r in rows_to_run},
        native_local_threads=len(trainer), worker_probe=probes, deadline_s=args.deadline, autocast=base["autocast"],
        channels_last=base["channels_last"], offload_path=base["offload_path"], video_reader=base["video_reader"],
        sample=train_device_report.describe_sample(args), seconds_per_row=args.seconds, steps_per_row=args.steps,
        warmup=args.warmup, absent=absent, test_device_model={"op_us": args.test_op_us, "tflops": args.test_tflops},
        **notes)
    print(_common.header_comment(header))
    print(f"# {args.kind}, {args.model} on {args.device}, batch {args.batch}; trainer cores "
          f"{_common_cpus(trainer)} (DataLoader workers: {header['workers']}; native_local: {len(trainer)} "
          f"threads), offloader cores {_common_cpus(offloader)} ({len(offloader)} daemons), stock_all_cores: "
          f"{len(every)} cores")
    raw, skipped = {}, {}
    bar = _common.progress(total=len(rows_to_run), desc="train --device", unit="row")
    try:
        for row in rows_to_run:
            bar.set_postfix_str(row)
            if not clock.fits("row"):
                skipped[row] = clock.why_not("row")
            else:
                started = time.perf_counter()
                try:
                    raw[row] = run_row(args, row, base, {"trainer": trainer, "offloader": offloader, "all": every},
                                       workdir, clock)
                except RuntimeError:
                    if clock.left() > 0:
                        raise
                    skipped[row] = f"cut at --deadline {args.deadline:g} s"
                else:
                    raw[row]["row_wall_s"] = time.perf_counter() - started
                    clock.ran("row", raw[row]["row_wall_s"])
            bar.update()
    finally:
        bar.close()
    header["skipped"] = skipped
    rows = [train_device_report.summarise(r, raw[r], args.batch, base) for r in rows_to_run if r in raw]
    header["ratios"] = train_device_report.ratios(rows)
    header["attribution"] = train_device_report.attribution(rows)
    header["targets"] = train_device_report.targets(args.kind, rows)
    header["offloader_cores_to_feed_device"] = train_device_report.cores_to_feed(rows)
    train_device_report.print_table(rows, header)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        _common.write_json(args.json, header, rows)
        print(f"# written to {args.json}")
    if args.report:
        print(f"# report: {', '.join(train_device_report.write(header, rows, args.report))}")
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
