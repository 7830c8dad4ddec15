"""python -m bench.autoscale: dlop's autoscaled offloader fleet against fleets sized by hand.

One trainer host and offloader hosts (network namespaces, bench.netns). The
trainer's step is fixed (a sleep of --step-ms after each batch); its
OffloadLoader runs a Python-path dataset (bench.fleet.autoscale_data) whose
per-sample cost follows --phases, e.g. cheap, then costly, then cheap. In the
same run, over the same schedule, three fleets:

* ``peak``: enough offloaders for the costliest phase, all run long;
* ``average``: enough for the schedule's mean cost;
* ``auto``: from --min, sized by dlop.fleet.scaling's Controller (in a thread of the
  trainer, every --window seconds) through an actuator that starts and stops
  ``dlop offloader`` processes on the offloader hosts.

Every offloader is ``dlop offloader --store TRAINER:PORT --threads 1`` on an
offloader host, announced in the store the trainer hosts; the trainer takes
those that join while it runs. For each fleet: the data stall (in all, per
phase), samples/s, offloader-core-seconds (threads x seconds alive within the
run) and, per change of cost, the steps until the stall over the last
--rolling steps is back under --stall-target and stays there. The ratios
against the peak-sized fleet of the same run, medians over --runs, are
checked against the targets: samples/s within 5%, at most 70% of the
core-seconds, the stall back under target within 20 steps of each change.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from dlop.fleet.scaling.actuator import Actuator

FLEETS = ("peak", "average", "auto")
TINY = {"step_ms": 250.0, "batch": 2, "phases": "cheap:10,costly:30,cheap:10", "sample_ms": "cheap:25,costly:200",
        "peak": 2, "average": 1, "max": 3, "window": 0.5, "cooldown_steps": 8}
TARGETS = {"samples_per_s": 0.95, "core_seconds": 0.70, "recover_steps": 20}


# --- the actuator of namespace hosts ----------------------------------------------------------

class _Daemon:
    def __init__(self, proc: subprocess.Popen, host: str, started: float) -> None:
        self.proc, self.host, self.started = proc, host, started
        self.address: str | None = None  # once announced
        self.stopped: float | None = None  # when it was asked to drain
        self.ended: float | None = None
        self.announced = threading.Event()


class NetnsActuator(Actuator):
    """``dlop offloader`` processes on namespace hosts, started round robin, the newest stopped first
    (SIGTERM: the launcher forwards it, the daemon drains, the launcher withdraws its announcement). It does
    not wait for a daemon to start: the controller holds its target until the trainers see it live."""

    name = "netns"

    def __init__(self, hosts: list[tuple[str, str]], store: str, token_file: str, log, threads: int = 1) -> None:
        self.hosts, self.store, self.token_file, self.log = hosts, store, token_file, log
        self.threads = int(threads)
        self.daemons: list[_Daemon] = []  # asked for and not stopped, oldest first
        self.every: list[_Daemon] = []  # every daemon started, for the core-seconds
        self._turn = 0
        self._lock = threading.Lock()
        self._readers: list[threading.Thread] = []

    @property
    def floor(self) -> int:
        return 0

    def size(self) -> int:
        return len(self.daemons)

    def _start_one(self) -> _Daemon:
        namespace, address = self.hosts[self._turn % len(self.hosts)]
        self._turn += 1
        argv = ["ip", "netns", "exec", namespace, sys.executable, "-m", "dlop.fleet.launcher",
                "--store", self.store, "--token-file", self.token_file, "--listen", "0.0.0.0:0",
                "--advertise", address, "--threads", str(self.threads)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        d = _Daemon(proc, namespace, time.monotonic())
        reader = threading.Thread(target=self._read, args=(d,), name="autoscale-daemon-log")
        reader.start()
        self._readers.append(reader)
        return d

    def _read(self, d: _Daemon) -> None:
        """The launcher's output into the log, its announced address, and when it ended."""
        for line in d.proc.stdout:
            if "announced " in line:
                d.address = line.split("announced ", 1)[1].split()[0]
                d.announced.set()
            with self._lock:
                self.log.write(f"[{d.host} pid {d.proc.pid}] {line}")
        d.proc.wait()
        d.ended = time.monotonic()
        d.announced.set()

    def scale(self, target: int) -> str:
        have = len(self.daemons)
        if target > have:
            started = [self._start_one() for _ in range(target - have)]
            self.daemons += started
            self.every += started
            return f"started {len(started)} offloader(s) on {', '.join(d.host for d in started)}"
        if target < have:
            gone = self.daemons[target:]
            del self.daemons[target:]
            for d in reversed(gone):  # the newest first
                d.stopped = time.monotonic()
                if d.proc.poll() is None:
                    d.proc.send_signal(signal.SIGTERM)
            return f"draining {len(gone)} offloader(s): {', '.join(str(d.address) for d in gone)}"
        return "no change"

    def wait_announced(self, timeout: float) -> list[str]:
        """The addresses of every daemon asked for, once each has announced itself."""
        deadline = time.monotonic() + timeout
        for d in self.daemons:
            if not d.announced.wait(max(0.0, deadline - time.monotonic())) or d.address is None:
                raise RuntimeError(f"offloader on {d.host} (pid {d.proc.pid}) did not announce itself within "
                                   f"{timeout:g} s (exit status {d.proc.poll()}): see the daemons' log")
        return [d.address for d in self.daemons]

    def check(self) -> list[str]:
        problems = []
        for d in [d for d in self.daemons if d.proc.poll() is not None]:
            self.daemons.remove(d)
            problems.append(f"offloader on {d.host} (pid {d.proc.pid}) exited with status {d.proc.returncode}")
        return problems

    def close(self) -> None:
        self.scale(0)
        for d in self.every:
            try:
                d.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                d.proc.kill()
        for reader in self._readers:
            reader.join()

    def core_seconds(self, begin: float, end: float) -> float:
        """Threads x seconds alive of every daemon, within [begin, end]."""
        alive = sum(max(0.0, min(end, d.ended or end) - max(begin, d.started)) for d in self.every)
        return self.threads * alive


# --- the trainer (a process on the trainer host) ----------------------------------------------

def _client(address: str):
    import datetime

    from torch.distributed import TCPStore

    host, _, port = address.rpartition(":")
    return TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))


def trainer(spec: dict) -> dict:
    """One fleet through the schedule; its step trace, daemons and decisions."""
    import datetime
    import warnings

    from torch.distributed import TCPStore

    from bench.fleet.autoscale_data import PhasedSamples
    from dlop.data import OffloadLoader
    from dlop.fleet import discovery
    from dlop.fleet.scaling import policy
    from dlop.fleet.scaling.controller import Controller
    from dlop.fleet.scaling.figures import Publisher

    store = TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    address = f"{spec['trainer']}:{store.port}"
    log = open(spec["log"], "a", buffering=1)
    actuator = NetnsActuator([tuple(h) for h in spec["hosts"]], address, spec["token_file"], log)
    auto = spec["fleet"] == "auto"
    settings = policy.Settings(**spec["settings"]) if auto else None
    actuator.scale(settings.min if auto else spec["size"])
    batch, step = spec["batch"], spec["step_ms"] / 1000.0
    # One warm-up step first, at the first phase's cost: it waits for the offloaders' Python workers to start,
    # which no step of the schedule should count.
    phases = [tuple(p) for p in spec["phases"]]
    dataset = PhasedSamples(batch, [(1, phases[0][1])] + phases)
    joined: list[str] = []
    watcher = publisher = controller = None
    said: list[str] = []
    try:
        first = actuator.wait_announced(120.0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a local fallback would measure the wrong thing
            loader = OffloadLoader(dataset=dataset, batch_size=batch, shuffle=False, offloaders=first,
                                   token=Path(spec["token_file"]).read_text().strip(), prefetch=spec["prefetch"])
        watcher = discovery.Watcher(_client(address), joined.append, interval=0.2)
        used, added = set(first), []
        if auto:
            publisher = Publisher(_client(address), 0, 1, loader.stats, interval=0.25)
            controller = Controller(_client(address), actuator, settings, spec["window"],
                                    say=lambda line: (said.append(line), print(line, file=sys.stderr, flush=True)))
        trace = []

        def adopted(a, error):
            if error is not None:  # drained before it joined: as dlop run, a line and no more
                print(f"offloader {a} announced but not usable: {error}", file=sys.stderr, flush=True)
            else:  # it was prepared off the loop (as in dlop run) and works from the next batch on
                added.append((round(time.monotonic() - begin, 3), len(trace), a))

        it = iter(loader)
        next(it)
        begin = time.monotonic()
        if controller is not None:
            controller.start()
        for k in range(1, len(dataset) // batch):
            time.sleep(step)
            asked = time.monotonic()
            for a in [a for a in list(joined) if a not in used]:  # joins happen between batches, as in dlop run
                used.add(a)
                loader.add_offloader(a, wait=False, joined=adopted)
            samples, labels = next(it)
            got = time.monotonic()
            if labels.tolist() != list(range(k * batch, (k + 1) * batch)):
                raise RuntimeError(f"step {k}: got samples {labels.tolist()}, not the step's own")
            trace.append((round(got - begin, 4), round(got - asked, 5), actuator.size(),
                          loader.stats().offloaders_live))
        end = trace[-1][0] + begin
        if next(it, None) is not None:
            raise RuntimeError("the loader has batches beyond the schedule")
    finally:
        for part in (controller, publisher, watcher):
            if part is not None:
                part.stop()
        actuator.close()
        log.close()
    decisions = [{"t": round(d.time - begin, 3), "step": d.step, "stall_ratio": round(d.stall_ratio, 4),
                  "live": d.live, "target": d.target, "size": d.size} for d in (controller.decisions if auto else [])]
    return {"fleet": spec["fleet"], "batch": batch, "trace": trace, "core_seconds": actuator.core_seconds(begin, end),
            "daemons": [{"host": d.host, "address": d.address, "started": round(d.started - begin, 3),
                         "stopped": None if d.stopped is None else round(d.stopped - begin, 3),
                         "ended": None if d.ended is None else round(d.ended - begin, 3)} for d in actuator.every],
            "joined": added, "decisions": decisions, "said": said}


# --- the figures ------------------------------------------------------------------------------

def summarize(result: dict, phases: list[tuple[str, int, float]], target: float, rolling: int) -> dict:
    """A fleet's figures from its trace: stall and samples/s, per phase too, and the steps to recover."""
    trace = result["trace"]
    times = [t for t, _, _, _ in trace]
    stalls = [s for _, s, _, _ in trace]
    steps = [times[0]] + [b - a for a, b in zip(times, times[1:])]  # step k: from batch k-1 to batch k
    wall = times[-1]  # from the warm-up batch (time 0) to the last batch
    out = {"fleet": result["fleet"], "samples_per_s": result["batch"] * len(trace) / wall,
           "stall_s": sum(stalls), "stall_ratio": sum(stalls) / wall,
           "join_stall_s": sum(stalls[k] for k in {k for _, k, _ in result["joined"]}),
           "core_seconds": result["core_seconds"],
           "sizes": sorted({size for _, _, size, _ in trace}), "phases": [], "recover_steps": []}
    ratio = []
    for k in range(len(trace)):
        lo = max(0, k - rolling + 1)
        ratio.append(sum(stalls[lo:k + 1]) / sum(steps[lo:k + 1]))
    start = 0
    for i, (name, count, _) in enumerate(phases):
        span = range(start, start + count)
        out["phases"].append({"phase": name, "steps": count, "stall_s": sum(stalls[k] for k in span),
                              "stall_ratio": sum(stalls[k] for k in span) / sum(steps[k] for k in span)})
        if i > 0:  # a change of cost: the steps until the rolling stall is under target for the rest of the phase
            above = [k for k in span if ratio[k] > target]
            out["recover_steps"].append(0 if not above else None if above[-1] == span[-1] else above[-1] + 1 - start)
        start += count
    out["rolling_stall_ratio"] = [round(r, 4) for r in ratio]
    return out


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def compare(runs: list[dict]) -> dict:
    """Per run, the auto and average fleets against that run's peak fleet; medians over the runs."""
    out = {}
    for fleet in ("average", "auto"):
        speed = [r[fleet]["samples_per_s"] / r["peak"]["samples_per_s"] for r in runs]
        cores = [r[fleet]["core_seconds"] / r["peak"]["core_seconds"] for r in runs]
        changes = len(runs[0][fleet]["recover_steps"])
        recover = []
        for c in range(changes):
            got = [r[fleet]["recover_steps"][c] for r in runs]
            recover.append(None if any(g is None for g in got) else median(got))
        out[fleet] = {"samples_per_s": median(speed), "core_seconds": median(cores), "recover_steps": recover,
                      "samples_per_s_runs": speed, "core_seconds_runs": cores}
    a = out["auto"]
    a["met"] = {"samples_per_s": a["samples_per_s"] >= TARGETS["samples_per_s"],
                "core_seconds": a["core_seconds"] <= TARGETS["core_seconds"],
                "recover_steps": all(s is not None and s <= TARGETS["recover_steps"] for s in a["recover_steps"])}
    return out


# --- the run ----------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=("full", "tiny"), default="full", help="tiny: a smoke test of a minute or so")
    p.add_argument("--phases", default="cheap:80,costly:120,cheap:80", help="NAME:STEPS,... in order")
    p.add_argument("--sample-ms", default="cheap:40,costly:260", help="NAME:MS per sample of each phase name")
    p.add_argument("--steps", type=int, help="scale the phases to this many steps in all")
    p.add_argument("--step-ms", type=float, default=400.0, help="the trainer's fixed step after each batch")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=4, help="the loader's leases ahead")
    p.add_argument("--peak", type=int,
                   help="the peak fleet (default: the costliest phase's need x --headroom, rounded up)")
    p.add_argument("--average", type=int, help="the average fleet (default: the mean need x --headroom, rounded up)")
    p.add_argument("--min", type=int, default=1, help="the autoscaled fleet's least (and first) size")
    p.add_argument("--max", type=int, default=6, help="the autoscaled fleet's most")
    p.add_argument("--window", type=float, default=1.0, help="the controller's decision window, seconds")
    p.add_argument("--stall-target", type=float, default=0.02, help="the policy's stall target (fraction of the step)")
    p.add_argument("--hysteresis", type=int, default=2, help="the policy's windows in a row before a change")
    p.add_argument("--headroom", type=float, default=1.2, help="the policy's margin, and the hand-sized fleets'")
    p.add_argument("--cooldown-steps", type=int, default=30, help="the policy's steps after a change")
    p.add_argument("--rolling", type=int, default=10, help="steps of the rolling stall the recovery is read from")
    p.add_argument("--offloader-hosts", type=int, default=2)
    p.add_argument("--runs", type=int, default=1, help="runs of the three fleets (the order turns each run)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--plot", help="write the plot (PNG) here")
    p.add_argument("--from-json", help="report an earlier run's JSON again (table, ratios, --plot) instead of running")
    p.add_argument("--trainer", help=argparse.SUPPRESS)  # a fleet's spec file: run as its trainer
    args = p.parse_args(argv)
    if args.size == "tiny":
        defaults = {a.dest: a.default for a in p._actions}
        for key, value in TINY.items():
            if getattr(args, key) == defaults[key]:
                setattr(args, key, value)
    return args


def _pairs(text: str, what: str) -> list[tuple[str, float]]:
    out = []
    for item in text.split(","):
        name, _, value = item.strip().rpartition(":")
        try:
            out.append((name, float(value)))
        except ValueError:
            raise SystemExit(f"{what} {text!r}: each item is NAME:NUMBER") from None
        if not name:
            raise SystemExit(f"{what} {text!r}: each item is NAME:NUMBER")
    return out


def plan(args) -> list[tuple[str, int, float]]:
    """(name, steps, ms per sample) of each phase; bad options exit naming themselves."""
    costs = dict(_pairs(args.sample_ms, "--sample-ms"))
    phases = [(n, int(s)) for n, s in _pairs(args.phases, "--phases")]
    if missing := sorted({n for n, _ in phases} - set(costs)):
        raise SystemExit(f"--sample-ms gives no cost for phase(s) {', '.join(missing)}")
    if args.steps:
        total = sum(s for _, s in phases)
        phases = [(n, max(1, round(s * args.steps / total))) for n, s in phases]
    if any(s < 1 for _, s in phases) or len(phases) < 2:
        raise SystemExit(f"--phases {args.phases!r}: two phases or more, of a step or more each")
    for name, value in (("--step-ms", args.step_ms), ("--batch", args.batch), ("--window", args.window),
                        ("--rolling", args.rolling), ("--runs", args.runs),
                        ("--offloader-hosts", args.offloader_hosts)):
        if value <= 0:
            raise SystemExit(f"{name} {value}: above 0")
    return [(n, s, costs[n]) for n, s in phases]


def needs(args, phases) -> list[float]:
    """Offloaders (of 1 thread) each phase keeps busy: a batch's cost over the step."""
    return [args.batch * ms / args.step_ms for _, _, ms in phases]


def run_fleet(hosts, folder: Path, fleet: str, size: int, args, phases, env) -> dict:
    spec = {"fleet": fleet, "size": size, "trainer": hosts.addrs[0],
            "hosts": list(zip(hosts.names[1:], hosts.addrs[1:])), "token_file": str(folder / "token"),
            "batch": args.batch, "step_ms": args.step_ms, "phases": [(s, ms) for _, s, ms in phases],
            "prefetch": args.prefetch, "window": args.window, "log": str(folder / "daemons.log"),
            "out": str(folder / f"{fleet}.json"),
            "settings": {"min": args.min, "max": args.max, "stall_target": args.stall_target,
                         "headroom": args.headroom, "hysteresis": args.hysteresis,
                         "cooldown_steps": args.cooldown_steps}}
    (folder / "spec.json").write_text(json.dumps(spec))
    proc = hosts.popen(0, [sys.executable, "-m", "bench.autoscale", "--trainer", str(folder / "spec.json")], env=env)
    if proc.wait() != 0:
        log = (folder / "daemons.log").read_text() if (folder / "daemons.log").exists() else ""
        tail = "\n".join(log.splitlines()[-20:])
        raise SystemExit(f"the {fleet} fleet's trainer failed (status {proc.returncode}); the offloaders said:\n{tail}")
    return json.loads(Path(spec["out"]).read_text())


def print_report(runs: list[dict], ratios: dict, phases) -> None:
    line = "{:>8} {:>10} {:>10} {:>12} {:>8} {:>13} " + " ".join("{:>13}" for _ in phases)
    print(line.format("fleet", "offloaders", "samples/s", "stall ratio", "core-s", "join stall s",
                      *(f"stall {n}" for n, _, _ in phases)))
    for fleet in FLEETS:
        got = [r[fleet] for r in runs]
        sizes = sorted({s for g in got for s in g["sizes"]})
        print(line.format(fleet, f"{sizes[0]}-{sizes[-1]}" if len(sizes) > 1 else sizes[0],
                          f"{median([g['samples_per_s'] for g in got]):.3f}",
                          f"{median([g['stall_ratio'] for g in got]):.3f}",
                          f"{median([g['core_seconds'] for g in got]):.0f}",
                          f"{median([g['join_stall_s'] for g in got]):.1f}",
                          *(f"{median([g['phases'][i]['stall_ratio'] for g in got]):.3f}" for i in range(len(phases)))))
    changes = [f"{a}->{b}" for (a, _, _), (b, _, _) in zip(phases, phases[1:])]
    for fleet in ("average", "auto"):
        r = ratios[fleet]
        recover = ", ".join(f"{c} {'not recovered' if s is None else f'{s:g}'}"
                            for c, s in zip(changes, r["recover_steps"]))
        print(f"# {fleet} vs peak: samples/s {r['samples_per_s']:.3f}x, core-seconds {r['core_seconds']:.3f}x; "
              f"steps to recover: {recover}")
    met = ratios["auto"]["met"]
    print(f"# targets (auto): samples/s >= {TARGETS['samples_per_s']} of peak's: "
          f"{'met' if met['samples_per_s'] else 'MISSED'}; core-seconds <= {TARGETS['core_seconds']} of peak's: "
          f"{'met' if met['core_seconds'] else 'MISSED'}; stall under target within {TARGETS['recover_steps']} "
          f"steps of each change: {'met' if met['recover_steps'] else 'MISSED'}")


def plot(path: str, runs: list[dict], phases, target: float, rolling: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(FLEETS), 1, figsize=(9, 7), sharex=True)
    most = max(t[2] for r in runs for got in r.values() for t in got["trace"])
    for ax, fleet in zip(axes, FLEETS):
        size_ax = ax.twinx()
        for i, r in enumerate(runs):
            got = r[fleet]
            ax.plot(got["rolling_stall_ratio"], color="tab:red", alpha=0.8, lw=1,
                    label="stall ratio" if i == 0 else None)
            size_ax.step(range(len(got["trace"])), [t[2] for t in got["trace"]], where="post", color="tab:blue",
                         alpha=0.8, lw=1, label="offloaders" if i == 0 else None)
        ax.axhline(target, color="tab:red", ls=":", lw=1)
        start = 0
        for _, count, _ in phases[:-1]:
            start += count
            ax.axvline(start, color="grey", ls="--", lw=1)
        ax.set_ylim(0, 1)
        size_ax.set_ylim(0, most + 1)
        ax.set_ylabel(f"{fleet}\nstall ratio\n(last {rolling} steps)")
        size_ax.set_ylabel("offloaders")
        if fleet == FLEETS[0]:
            lines = ax.get_legend_handles_labels()
            sizes = size_ax.get_legend_handles_labels()
            ax.legend(lines[0] + sizes[0], lines[1] + sizes[1], loc="upper left")
    axes[-1].set_xlabel("step (dashed: a change of cost)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.trainer:
        spec = json.loads(Path(args.trainer).read_text())
        Path(spec["out"]).write_text(json.dumps(trainer(spec)))
        return 0
    from bench.common import _common, netns

    if args.from_json:
        got = json.loads(Path(args.from_json).read_text())
        h, rows = got["header"], {r["fleet"]: r["runs"] for r in got["rows"]}
        runs = [{f: rows[f][i] for f in FLEETS} for i in range(len(rows["peak"]))]
        print_report(runs, h["ratios"], [tuple(p) for p in h["phases"]])
        if args.plot:
            plot(args.plot, runs, [tuple(p) for p in h["phases"]], h["settings"]["stall_target"],
                 h["settings"]["rolling"])
        return 0
    phases = plan(args)
    need = needs(args, phases)
    steps = sum(s for _, s, _ in phases)
    mean = sum(n * s for n, (_, s, _) in zip(need, phases)) / steps
    sizes = {"peak": args.peak or math.ceil(max(need) * args.headroom - 1e-9),
             "average": args.average or max(1, math.ceil(mean * args.headroom - 1e-9))}
    ok, why = netns.available()
    if not ok:
        raise SystemExit(f"python -m bench.autoscale needs namespace hosts: {why}")
    header = _common.run_header(benchmark="autoscale", phases=[list(p) for p in phases], step_ms=args.step_ms,
                                batch=args.batch, prefetch=args.prefetch, fleets=sizes, runs=args.runs,
                                settings={"min": args.min, "max": args.max, "window": args.window,
                                          "stall_target": args.stall_target, "headroom": args.headroom,
                                          "hysteresis": args.hysteresis, "cooldown_steps": args.cooldown_steps,
                                          "rolling": args.rolling})
    print(_common.header_comment(header))
    print(f"# {header['command']}")
    print("# phases: " + ", ".join(f"{n} {s} steps at {ms:g} ms/sample (needs {x:.2f} offloaders)"
                                   for (n, s, ms), x in zip(phases, need)))
    print(f"# step {args.step_ms:g} ms, batch {args.batch}, prefetch {args.prefetch}; fleets: peak {sizes['peak']}, "
          f"average {sizes['average']}, auto {args.min}-{args.max} (window {args.window:g} s, stall target "
          f"{args.stall_target:g}, headroom {args.headroom:g}, hysteresis {args.hysteresis}, "
          f"cool-down {args.cooldown_steps} steps)")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    runs = []
    with tempfile.TemporaryDirectory(prefix="dlop-autoscale-") as tmp, \
            netns.Hosts(1 + args.offloader_hosts) as hosts:
        folder = Path(tmp)
        (folder / "token").write_text(os.urandom(16).hex())
        (folder / "token").chmod(0o600)  # dlop-offloader refuses a token others may read
        for r in range(args.runs):
            order = FLEETS[r % 3:] + FLEETS[:r % 3]
            got = {}
            for fleet in _common.progress(order, desc=f"run {r + 1}/{args.runs}"):
                result = run_fleet(hosts, folder, fleet, sizes.get(fleet, args.min), args, phases, env)
                got[fleet] = {**summarize(result, phases, args.stall_target, args.rolling), **result}
                print(f"# run {r + 1} {fleet}: {got[fleet]['samples_per_s']:.3f} samples/s, stall ratio "
                      f"{got[fleet]['stall_ratio']:.3f}, {got[fleet]['core_seconds']:.0f} core-s", flush=True)
            runs.append(got)
    ratios = compare(runs)
    print_report(runs, ratios, phases)
    if args.plot:
        plot(args.plot, runs, phases, args.stall_target, args.rolling)
    if args.json:
        rows = [{"fleet": f, "runs": [r[f] for r in runs]} for f in FLEETS]
        _common.write_json(args.json, {**header, "ratios": ratios, "targets": TARGETS}, rows)
        print(f"# written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
