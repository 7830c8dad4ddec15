"""python -m bench.train: a whole DDP training step, data pipeline and all-reduce together.

    python -m bench.train --json train.json --report DIR             # all ranks on this host
    python -m bench.train --hosts 3 --link 1gbit --report DIR        # 2 trainer hosts + 1 offloader host
    python -m bench.train --kind video --hosts 3 --link 1gbit --report DIR   # clips and a 3D CNN
    python -m bench.train --device cuda --trainer-cores 4 --report DIR   # one accelerator: bench.train.train_device

DDP trains a small CNN on the built-in ImageNet-like image folder (``dlop
make-dataset``; JPEG decode, RandomResizedCrop, horizontal flip, normalise).
With ``--kind video`` it trains a small 3D CNN (a Conv3d stem, pooling and
the same wide head) on a built-in folder of H.264 clips (160 x 120, 30 fps,
2 s, two B-frames; even clips a keyframe every 16 frames, odd clips one per
clip; made once with ffmpeg); per sample ``--frames`` frames at
``--frame-stride`` from a random start, the short side resized to a random
size in ``--short-side``, a random ``--size`` square crop and a flip drawn
once per clip, normalised with Kinetics' mean and std. The local rows read
clips with PyAV in a torch Dataset (offload_media's reader: seek to the
keyframe before the clip, decode forward, resize with
``F.interpolate(antialias=True)``), the offload rows get them from the
native pipeline (a ``"kind": "video"`` spec, one view).
Rows, same run, same seed, same model (the DataLoader rows take
DistributedSampler's order, the offloaded rows dlop's own: two permutations of
the same samples):

* ``stock``: DDP over Gloo, torch's DataLoader (k workers) on each trainer;
* ``dlop_local``: DDP over dlop, torch's DataLoader on each trainer;
* ``dlop_offload_unscheduled``: DDP over dlop, batches from dlop-offloader
  daemons through ``dlop.data.OffloadLoader``, ``DLOP_TRAFFIC_CLASSES=0``;
* ``dlop_offload``: the same with dlop's traffic scheduling on.

With ``--hosts H`` every process lives in a network-namespace host
(bench.netns): ``--ranks-per-host`` (1 or 2) trainer ranks on each of the
first H - ``--offloader-hosts`` hosts, one daemon on each remaining host, every
link shaped by ``--link RATE`` (tbf). Without it everything runs on this host.
A namespace does not separate CPUs, so by default (``--host-cpus split``) the
trainer hosts and the offloader hosts get disjoint cores of this machine
(``netns.split_cpus``: on 2 cores, both trainer hosts share core 0 and the
offloader host has core 1), as separate machines would; ``--host-cpus all``
lets every host use every core.

The built-in dataset is made large enough (``--images 0``, ``--clips 0``)
that every step of a run lies in one epoch: an epoch's first batches are leased only when it
starts, so a boundary inside the timed steps would be measured every run where
a real epoch has thousands of steps.

Offloaded batches travel as uint8 (``--wire uint8``, the default; 4x less than
float32) and are normalised on the trainer; ``--wire float32`` normalises in
the daemon. The local DataLoader rows always normalise in their workers.
Offloaded clips arrive as N x 1 x C x T x H x W (one view); the view axis
is dropped on the trainer.

Definitions, per rank and timed step (a step = ``next(loader)`` + forward +
backward + optimiser step; a DDP comm hook timestamps each bucket's all-reduce when DDP hands the
bucket over and when its future completes; each column is the mean over
timed steps and ranks, so that compute + exposed comm + data stall = step):

* ``data_stall_ms``: time blocked in ``next(loader)``; turning a uint8 batch
  into normalised floats counts as compute;
* ``exposed_comm_ms``: from the moment the last bucket was handed over (the
  backward pass has then computed every gradient) to the completion of the
  last bucket to finish; the communication backward could not hide;
* ``compute_ms``: step - data stall - exposed comm;
* ``samples_per_s``: the samples every rank trained on in its timed steps (as
  its batches held them) / the slowest rank's time; ``labels_sha1`` is a
  digest of their labels, rank by rank and in order, so that the samples a
  row counts can be checked against the sampler's order;
* ``allreduce_p50_ms``/``allreduce_p99_ms``: bucket all-reduce durations during
  training, every bucket of every timed step and rank, each from the moment
  the last rank handed that bucket over (no all-reduce can start before; all
  ranks run on this machine, so their clocks agree) to its completion on
  this rank; ``allreduce_p99_idle_ms``: the same all-reduce with no data
  traffic on any link: after the timed steps the loader is stopped (its
  workers, leases and prefetching) and the rank trains ``--idle-reps`` more
  steps on its last batch, kept in memory, so the step computes as in
  training (normalising included) and only the data's traffic is gone;
  ``allreduce_p99_replay_ms``: the bucket all-reduces alone (same sizes,
  same group, handed over at the training step's median offsets, rounds a
  step apart) with nothing computing either. Both are p99 over
  ``--idle-reps`` rounds and every rank. A bucket's duration includes
  waiting behind the buckets handed over before it, in every measurement
  alike; it leaves out waiting for a slower rank's backward
  (``allreduce_skew_ms``, the mean time from the first rank's hand-over to
  the last's in training).

``--runs R`` repeats the four configurations R times in turn, each run a fresh
set of processes and process group; each column is the median over runs, and
each ratio is taken within a run, then the median over runs.
The ranks run ``bench.train_rank`` (the model, the loaders, the comm
hook, the idle steps and the replay); the table, markdown and PNG come from
``bench.train.train_report``.

``--trace DIR`` sets ``DLOP_TRACE=DIR`` for the last configuration's processes
(each dlop rank writes a Chrome trace of its collectives; the daemons write none).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import _common
from bench.train import train_report

CONFIGS = ("stock", "dlop_local", "dlop_offload_unscheduled", "dlop_offload")
RUN_TIMEOUT_S = 900


# --- arguments ----------------------------------------------------------

def parse_link(text: str | None) -> tuple[str | None, str | None]:
    """'RATE[,DELAY]' -> (rate, delay); ValueError naming what is wrong."""
    if not text:
        return None, None
    from bench.common.netns import rate_bytes

    rate, _, delay = text.partition(",")
    rate_bytes(rate)  # ValueError: not a tc rate
    if delay and not delay.strip().rstrip("unms").replace(".", "", 1).isdigit():
        raise ValueError(f"not a tc delay: {delay!r} (e.g. 100us, 1ms)")
    return rate.strip(), delay.strip() or None


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated: " + ", ".join(CONFIGS))
    p.add_argument("--hosts", type=int, default=0, help="network-namespace hosts (needs root); 0: this host only")
    p.add_argument("--link", help="RATE[,DELAY] for every host's link, e.g. 1gbit (needs --hosts)")
    p.add_argument("--ranks", type=int, default=2, help="trainer ranks without --hosts")
    p.add_argument("--ranks-per-host", type=int, default=1, choices=(1, 2))
    p.add_argument("--offloader-hosts", type=int, default=1, help="hosts of their own for the daemons (--hosts)")
    p.add_argument("--host-cpus", choices=("split", "all"), default="split",
                   help="--hosts: trainer and offloader hosts on disjoint cores (split) or all on every core")
    p.add_argument("--kind", choices=("image", "video"), default="image",
                   help="images and a 2D CNN, or clips and a 3D CNN")
    p.add_argument("--data", help="an image or clip folder (root/class/file); default: the built-in one, made once")
    p.add_argument("--images", type=int, default=0,
                   help="images of the built-in dataset (10 classes); 0: enough that every step of a run lies in "
                        "one epoch (an epoch's first batches are leased only when it starts)")
    p.add_argument("--clips", type=int, default=0, help="--kind video: clips of the built-in dataset, as --images")
    p.add_argument("--size", type=int, help="RandomResizedCrop's output size (224), or the clips' crop (56)")
    p.add_argument("--frames", type=int, default=8, help="--kind video: frames per clip")
    p.add_argument("--frame-stride", type=int, default=2, help="--kind video: frames between a clip's frames")
    p.add_argument("--short-side", default="64,80",
                   help="--kind video: MIN,MAX of the random size the short side is resized to")
    p.add_argument("--batch", type=int, help="samples per rank and step (images 16, clips 8)")
    p.add_argument("--hidden", type=int, default=384,
                   help="the model's hidden width (its gradient grows with it; 384: 4 MiB, 33 ms at 1gbit)")
    p.add_argument("--stem-stride", type=int,
                   help="the conv stem's (spatial) stride: the model's compute per step, same gradient (images 4: "
                        "about 1.5x 8's; clips 1: about 4x 2's)")
    p.add_argument("-k", "--workers", type=int, default=1, help="DataLoader workers per rank = threads per daemon")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--idle-reps", type=int, default=20,
                   help="steps on a resident batch (the idle all-reduce), and rounds of the replay")
    p.add_argument("--runs", type=int, default=1, help="runs of every config (columns: medians over runs)")
    p.add_argument("--wire", choices=("uint8", "float32"), default="uint8", help="offloaded batches' dtype")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--data-share", type=float, default=0.1,
                   help="dlop_offload: share of --link's rate that batches may use while gradients move "
                        "(DLOP_DATA_RATE_MBPS); unset without a link")
    p.add_argument("--trace", help="DLOP_TRACE folder for the last config's processes")
    p.add_argument("--offloader", help="the dlop-offloader executable (default: next to this Python)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--report", help="write train.md and train.png here (created)")
    args = p.parse_args(argv)
    video = args.kind == "video"
    args.size = args.size or (56 if video else 224)
    args.batch = args.batch or (8 if video else 16)
    args.stem_stride = args.stem_stride or (1 if video else 4)
    args.clip = None
    if video:
        try:
            low, high = (int(v) for v in args.short_side.split(","))
        except ValueError:
            p.error(f"--short-side {args.short_side!r}: give MIN,MAX, e.g. 64,80")
        if not args.size <= low <= high:
            p.error(f"--short-side {args.short_side}: need --size {args.size} <= MIN <= MAX")
        args.clip = {"frames": args.frames, "stride": args.frame_stride, "short_side": [low, high],
                     "crop": args.size, "hflip": 0.5}
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not args.configs or (unknown := [c for c in args.configs if c not in CONFIGS]):
        p.error(f"unknown config(s) {', '.join(unknown) if args.configs else '(none)'}: choose from "
                f"{', '.join(CONFIGS)}")
    try:
        args.rate, args.delay = parse_link(args.link)
    except ValueError as e:
        p.error(f"--link {args.link!r}: {e}")
    if args.link and not args.hosts:
        p.error("--link shapes the links between --hosts hosts: give --hosts too")
    if args.hosts and args.hosts <= args.offloader_hosts:
        p.error(f"--hosts {args.hosts} leaves no trainer host beside {args.offloader_hosts} offloader host(s)")
    if not 0 < args.data_share <= 1:
        p.error(f"--data-share {args.data_share}: give a share of the link in (0, 1]")
    if min(args.ranks, args.batch, args.steps, args.hidden, args.stem_stride, args.workers, args.runs,
           args.idle_reps, args.offloader_hosts, args.frames, args.frame_stride) < 1:
        p.error("--ranks, --batch, --steps, --hidden, --stem-stride, --workers, --runs, --idle-reps, "
                "--offloader-hosts, --frames and --frame-stride must be at least 1")
    return args


# --- the driver ---------------------------------------------------------

def offloader_path(explicit: str | None) -> str:
    from bench.offload.offload_common import offloader_path as find

    return find(explicit)


class Cluster:
    """Where each process runs: namespace hosts (--hosts) or this host; starts daemons and ranks there."""

    def __init__(self, args) -> None:
        self.args, self.hosts = args, None
        if args.hosts:
            from bench.common import netns

            ok, why = netns.available()
            if not ok:
                raise SystemExit(f"--hosts {args.hosts}: network namespaces cannot be made here: {why}")
            if args.delay and not netns.netem_available():
                raise SystemExit(f"--link {args.link}: this kernel has no netem qdisc, so a delay cannot be "
                                 "shaped; give the rate alone")
            self.trainer_hosts = list(range(args.hosts - args.offloader_hosts))
            self.offloader_hosts = list(range(len(self.trainer_hosts), args.hosts))
            cpus = None
            if args.host_cpus == "split":
                try:
                    cpus = netns.split_cpus([len(self.trainer_hosts), len(self.offloader_hosts)])
                except ValueError as e:
                    raise SystemExit(f"--host-cpus split: {e}; give --host-cpus all") from e
            self.hosts = netns.Hosts(args.hosts, rate=args.rate, delay=args.delay, cpus=cpus)
            self.world = len(self.trainer_hosts) * args.ranks_per_host
        else:
            self.trainer_hosts, self.offloader_hosts, self.world = [0], [0], args.ranks

    def addr(self, host: int) -> str:
        return self.hosts.addrs[host] if self.hosts else "127.0.0.1"

    def rank_host(self, rank: int) -> int:
        return self.trainer_hosts[rank // self.args.ranks_per_host] if self.hosts else 0

    def popen(self, host: int, argv: list[str], env: dict, **kw) -> subprocess.Popen:
        if self.hosts:
            return self.hosts.popen(host, argv, env=env, **kw)
        return subprocess.Popen(argv, env=env, **kw)

    def describe(self) -> str:
        if not self.hosts:
            return f"{self.world} trainer ranks and 1 offloader on this host (loopback, unshaped)"
        from bench.common.netns import describe_cpus

        shaping = f"every link {self.args.rate} (tbf, both directions)" if self.args.rate else "links unshaped"
        cpus = self.hosts.cpus
        placed = ("every host on every core" if cpus is None else
                  "cores: trainer hosts " + " / ".join(describe_cpus(cpus[h]) for h in self.trainer_hosts) +
                  ", offloader hosts " + " / ".join(describe_cpus(cpus[h]) for h in self.offloader_hosts))
        return (f"{len(self.trainer_hosts)} trainer host(s) x {self.args.ranks_per_host} rank(s), "
                f"{len(self.offloader_hosts)} offloader host(s), network namespaces on one bridge, {shaping}, "
                f"{placed}")

    def close(self) -> None:
        if self.hosts:
            self.hosts.close()


def start_daemons(cluster: Cluster, exe: str, threads: int, token_file: str, env: dict, log) -> tuple[list, list[str]]:
    """One dlop-offloader per offloader host (its log lines go to `log`); the processes and their addresses."""
    procs, addresses = [], []
    for host in cluster.offloader_hosts:
        addr = cluster.addr(host)
        proc = cluster.popen(host, [exe, "--listen", f"{addr}:0", "--token-file", token_file, "--threads",
                                    str(threads)], env, stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append(proc)
        line = proc.stdout.readline()
        if "listening on" not in line:
            _common.stop_processes(procs)
            raise RuntimeError(f"dlop-offloader on {addr} did not start: {line!r}")
        addresses.append(f"{addr}:{line.strip().rsplit(':', 1)[1]}")
    return procs, addresses


def data_rate_mbps(args) -> int | None:
    """MB/s of batches while gradients move: --data-share of the link (None: no link, the engine's default)."""
    link = _rate_bytes(args.rate)
    return max(1, round(link * args.data_share / 1e6)) if link else None


def run_config(args, cluster: Cluster, config: str, data: str, workdir: Path, trace: str | None) -> list[dict]:
    """One fresh process group training under `config`; each rank's measurements."""
    from bench.ddp.ddp import free_port, rank_env

    out = workdir / config
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ, DLOP_TRAFFIC_CLASSES="0" if config == "dlop_offload_unscheduled" else "1")
    env.pop("DLOP_TRACE", None)
    if data_rate_mbps(args) and "DLOP_DATA_RATE_MBPS" not in os.environ:
        env["DLOP_DATA_RATE_MBPS"] = str(data_rate_mbps(args))
    if trace:
        env["DLOP_TRACE"] = trace
    if cluster.hosts:
        env["GLOO_SOCKET_IFNAME"] = cluster.hosts.device  # Gloo binds loopback unless told the host's device
    daemons, addresses, token = [], [], os.urandom(16).hex()
    log = open(out / "log.txt", "w")
    ranks = []
    try:
        if config.startswith("dlop_offload"):
            token_file = out / "token"
            token_file.write_text(token + "\n")
            token_file.chmod(0o600)
            daemons, addresses = start_daemons(cluster, args.offloader_exe, args.workers, str(token_file), env,
                                               log)
        spec = {"config": config, "kind": args.kind, "clip": args.clip, "data": data, "size": args.size,
                "batch": args.batch, "hidden": args.hidden,
                "stem_stride": args.stem_stride, "workers": args.workers, "steps": args.steps,
                "warmup": args.warmup, "idle_reps": args.idle_reps,
                "wire": args.wire, "bucket_cap_mb": args.bucket_cap_mb, "threads": args.threads,
                "offloaders": addresses, "token": token, "out": str(out / "rank.json")}
        port = free_port()
        argv = [sys.executable, "-m", "bench.train_rank", json.dumps(spec)]
        for r in range(cluster.world):
            host = cluster.rank_host(r)
            rank_vars = rank_env(r, cluster.world, r % args.ranks_per_host if cluster.hosts else r,
                                 cluster.addr(cluster.rank_host(0)), port)
            ranks.append(cluster.popen(host, argv, dict(env, **rank_vars), stdout=log, stderr=subprocess.STDOUT))
        wait_ranks(ranks, config, out / "log.txt")
    finally:
        _common.stop_processes(ranks)
        _common.stop_processes(daemons)
        log.close()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(cluster.world)]


def wait_ranks(ranks: list, config: str, log: Path) -> None:
    """Until every rank exits; the first failure stops the run (the others would wait on it)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while any(p.poll() is None for p in ranks) and not any(p.poll() for p in ranks):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    codes = [p.poll() for p in ranks]
    if any(c != 0 for c in codes):
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{config}: ranks exited {codes} (None: still running at the deadline)\n{tail}")


def since_last_handover(per_rank: list[list[list[tuple[float, float]]]]) -> tuple[list[float], list[float]]:
    """Per rank, per step, per bucket (handed over, finished) -> every bucket's duration on every rank
    from the last rank's hand-over, and per step and bucket the spread of the hand-overs."""
    durations, skew = [], []
    for step in zip(*per_rank, strict=True):
        for bucket in zip(*step, strict=True):
            handed = [t for t, _ in bucket]
            durations += [max(0.0, f - max(handed)) for _, f in bucket]
            skew.append(max(handed) - min(handed))
    return durations, skew


def labels_digest(ranks: list[dict]) -> str:
    """sha1 of the timed steps' labels, rank by rank, step by step: '0:3,1,...;1:...'."""
    import hashlib

    text = ";".join(f"{r['rank']}:" + ",".join(str(int(x)) for step in r["labels"] for x in step) for r in ranks)
    return hashlib.sha1(text.encode()).hexdigest()


def summarise(config: str, batch: int, ranks: list[dict]) -> dict:
    """One run's row from its ranks' measurements (definitions: the module docstring)."""
    def mean(key):
        return sum(sum(r[key]) / len(r[key]) for r in ranks) / len(ranks)

    step, data, exposed = (1e3 * mean(k) for k in ("step", "data", "exposed"))
    durations, skew = since_last_handover([r["buckets"] for r in ranks])
    idle, _ = since_last_handover([r["idle"] for r in ranks])
    replay, _ = since_last_handover([r["replay"] for r in ranks])
    samples = sum(len(labels) for r in ranks for labels in r["labels"])
    return {"config": config, "ranks": len(ranks), "samples": samples, "labels_sha1": labels_digest(ranks),
            "samples_per_s": samples / max(r["wall_s"] for r in ranks),
            "step_ms": step, "compute_ms": max(0.0, step - data - exposed), "exposed_comm_ms": exposed,
            "data_stall_ms": data, "allreduce_p50_ms": 1e3 * _common.percentile(durations, 0.5),
            "allreduce_p99_ms": 1e3 * _common.percentile(durations, 0.99),
            "allreduce_p99_idle_ms": 1e3 * _common.percentile(idle, 0.99),
            "allreduce_p99_replay_ms": 1e3 * _common.percentile(replay, 0.99),
            "allreduce_skew_ms": 1e3 * sum(skew) / max(1, len(skew)),
            "buckets": len(ranks[0]["bucket_elements"]), "gradient_mib": ranks[0]["gradient_bytes"] / 2**20}


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per config, each numeric column's median over runs."""
    rows = []
    for i, first in enumerate(runs[0]):
        row = dict(first)
        for key, value in first.items():
            if isinstance(value, float):
                row[key] = _common.median([run[i][key] for run in runs])
        row["runs"] = len(runs)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--device" or a.startswith("--device=") for a in argv):
        from bench.train import train_device  # one accelerator fed by offloaders: a benchmark of its own

        return train_device.main(argv)
    args = parse_args(argv)
    if any(c.startswith("dlop_offload") for c in args.configs):
        args.offloader_exe = offloader_path(args.offloader)
    from bench.offload.offload import builtin_dataset

    cluster = Cluster(args)  # refuses hosts or a link this machine cannot make, before anything runs
    video = args.kind == "video"
    if args.data:
        data = args.data
    elif video:
        data = builtin_clips(args.clips or images_for_one_epoch(args, cluster.world, least=40))
    else:
        data = builtin_dataset(args.images or images_for_one_epoch(args, cluster.world))
    kind = {"kind": "video", "clip": args.clip, "sample_values": 3 * args.frames * args.size ** 2} if video else {}
    header = _common.run_header(benchmark="train_video" if video else "train", **kind, hosts=args.hosts,
                                link=args.link, placement=cluster.describe(),
                                host_cpus=args.host_cpus if args.hosts else None,
                                ranks=cluster.world, batch_per_rank=args.batch, size=args.size, hidden=args.hidden,
                                stem_stride=args.stem_stride,
                                workers=args.workers, steps=args.steps, warmup=args.warmup, runs=args.runs,
                                wire=args.wire, data=data, bucket_cap_mb=args.bucket_cap_mb,
                                threads_per_rank=args.threads, idle_reps=args.idle_reps,
                                trainer_hosts=len(cluster.trainer_hosts), offloader_hosts=len(cluster.offloader_hosts),
                                link_bytes_per_s=_rate_bytes(args.rate),
                                data_rate_mbps=os.environ.get("DLOP_DATA_RATE_MBPS") or data_rate_mbps(args))
    print(f"# {header['command']}")
    print(_common.header_comment(header))
    sample = (f"clips of {args.frames} frames at stride {args.frame_stride}, short side {args.short_side}, crop "
              f"{args.size}, flip 0.5, 3D CNN" if video else f"{args.size}px")
    print(f"# {cluster.describe()}; {header['ranks']} ranks x batch {args.batch}, {sample}, model hidden "
          f"{args.hidden}, stem stride {args.stem_stride}; {args.warmup} untimed + {args.steps} timed steps; "
          f"k = {args.workers}")
    print(f"# offloaded batches travel as {args.wire}" +
          (" and are normalised on the trainer" if args.wire == "uint8" else ", normalised by the daemons"))
    if data_rate_mbps(args) or "DLOP_DATA_RATE_MBPS" in os.environ:
        print(f"# dlop_offload: batches paced to {header['data_rate_mbps']} MB/s while a gradient all-reduce "
              "is in flight (DLOP_DATA_RATE_MBPS)")
    if args.link and not args.delay:
        print("# links shaped by rate alone (tbf); a delay needs netem" +
              ("" if cluster.hosts is None or _netem() else ", which this kernel lacks"))
    workdir = Path(tempfile.mkdtemp(prefix="dlop-bench-train-"))
    runs = []
    try:
        bar = _common.progress(total=args.runs * len(args.configs), desc="train", unit="config")
        for run in range(args.runs):
            rows = []
            for config in args.configs:
                last = run == args.runs - 1 and config == args.configs[-1]
                trace = os.path.abspath(args.trace) if args.trace and last else None
                if trace:
                    os.makedirs(trace, exist_ok=True)
                bar.set_postfix_str(config)
                rows.append(summarise(config, args.batch, run_config(args, cluster, config, data, workdir, trace)))
                bar.update()
            runs.append(rows)
        bar.close()
    finally:
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
    rows = median_rows(runs)
    train_report.print_table(rows)
    for line in train_report.traffic_lines(header, rows) + train_report.ratio_lines(runs):
        print(f"# {line}")
    if args.trace:
        print(f"# traces: {os.path.abspath(args.trace)}/dlop-trace-*.json ({args.configs[-1]}, last run; "
              "Chrome trace, Perfetto loads it)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        _common.write_json(args.json, dict(header, ratios=train_report.ratio_lines(runs)), rows)
        print(f"# written to {args.json}")
    if args.report:
        written = train_report.write(header, rows, runs, args.report)
        print(f"# report: {', '.join(written)}")
    return 0


def images_for_one_epoch(args, world: int, least: int = 640) -> int:
    """Built-in samples so that a rank's warm-up and timed steps, and the loaders' look-ahead past them, stay in
    its first epoch (at least `least`, a multiple of the dataset's 10 classes)."""
    ahead = 6  # OffloadLoader leases 4 past the next batch; DataLoader prefetches 2 per worker
    needed = world * args.batch * (args.warmup + args.steps + ahead)
    return max(least, -(-needed // 10) * 10)


CLIP_SIZE, CLIP_FPS, CLIP_FRAMES = (160, 120), 30, 60


def builtin_clips(clips: int) -> str:
    """The video set of --kind video, made once in the cache: 10 classes of H.264 mp4 clips, each a moving test
    source (offload_media's four, by class) panned by a moving crop and tinted by class. Short and small
    clips, so that a run's worth (hundreds) is made in a minute or two; even clips have a keyframe every 16
    frames, odd ones one per clip (the decoder then starts at the clip's first frame)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    from bench.offload.offload_media import _VIDEO_SOURCES, _cache, _ffmpeg, _made_once

    per_class = max(1, -(-clips // 10))
    w, h = CLIP_SIZE

    def one(root: Path, cls: int, i: int) -> None:
        rng = random.Random(f"train-video/{cls}/{i}")
        kind = _VIDEO_SOURCES[cls % len(_VIDEO_SOURCES)]
        size = f"{2 * w}x{2 * h}"
        source = (f"mandelbrot=size={size}:rate={CLIP_FPS}:maxiter=32" if kind == "mandelbrot" else
                  f"life=size={size}:rate={CLIP_FPS}:seed={cls * 100000 + i}:ratio=0.4:mold=8" if kind == "life"
                  else f"{kind}=size={size}:rate={CLIP_FPS}")
        vx, vy = rng.uniform(10, 60), rng.uniform(10, 40)
        pan = f"crop={w}:{h}:x='mod(t*{vx:.1f}+{rng.randrange(w)},iw-ow)':y='mod(t*{vy:.1f},ih-oh)'"
        _ffmpeg(["-f", "lavfi", "-i", source, "-frames:v", str(CLIP_FRAMES),
                 "-vf", f"format=rgb24,{pan},hue=h={36 * cls + rng.uniform(0, 30):.0f}",
                 "-c:v", "libx264", "-preset", "veryfast", "-bf", "2", "-g", "16" if i % 2 == 0 else "250",
                 "-pix_fmt", "yuv420p", "-an", "-threads", "1", str(root / f"class{cls}" / f"clip{i}.mp4")])

    def make(root: Path) -> None:
        for cls in range(10):
            (root / f"class{cls}").mkdir(parents=True)
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for done in [pool.submit(one, root, cls, i) for cls in range(10) for i in range(per_class)]:
                done.result()

    return _made_once(_cache(f"bench-train-video-10x{per_class}"), make)


def _rate_bytes(rate: str | None) -> float | None:
    from bench.common.netns import rate_bytes

    return rate_bytes(rate) if rate else None


def _netem() -> bool:
    from bench.common.netns import netem_available

    return netem_available()


if __name__ == "__main__":
    sys.exit(main())
