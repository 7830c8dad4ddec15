"""The linearity report: calibrated terms, predicted against measured, and predictions, as markdown and JSON.

``build`` turns the measurements of ``python -m bench.linearity`` into the
report's numbers; ``linearity_text`` and ``linearity_plots`` render them. Every
figure in the markdown is in the JSON too (the tests parse both).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace

from dlop.report import linearity_plots, linearity_text
from dlop.report import scaling_model as sm
from dlop.report.common import median
from dlop.report.linearity_terms import SOURCES

TARGET_LINEARITY = 0.05  # the largest |predicted - measured| linearity the model is meant to reach
QUIET_BELOW = 1.0  # a run beside fewer cores of other work than this counts as quiet
BACKENDS = ("dlop", "gloo")


@dataclass
class Settings:
    """The predictions' assumptions (the checks use what was measured)."""

    link_gbps: list[float]
    latency_us: float
    ranks_per_host: int
    cores_per_rank: float
    predict: list[int]
    bucket_bytes: float
    step_ms: float | None = None
    intra_gbps: float | None = None  # None: dlop's intra-host link as calibrated
    net_cpu_ns: float | None = None  # None: dlop's network CPU per byte as calibrated on the fastest link here


def read_measured(path: str) -> tuple[dict, dict]:
    """A linearity.json's header and measurements (to report again without running)."""
    with open(path) as f:
        data = json.load(f)
    if "measurements" not in data:
        raise SystemExit(f"{path} is not a linearity report's JSON (no 'measurements')")
    return data["header"], data["measurements"]


# --- terms ----------------------------------------------------------------



def term_runs(calibration: list[dict], model: str, backend: str, rate: str | None) -> dict[str, list[float]]:
    """Each term's value in every calibration run, for one model, backend and network rate (None: no network)."""
    runs = {key: [] for key in SOURCES}
    for c in calibration:
        ddp = c["ddp"][model]
        runs["intra_gbps"].append(c["intra"][backend]["gbps"])
        runs["intra_latency_us"].append(c["intra"][backend]["latency_us"])
        if "cpu_ns_per_byte" in c["intra"][backend]:  # reports before the CPU terms lack them (0: not modelled)
            runs["intra_cpu_ns"].append(c["intra"][backend]["cpu_ns_per_byte"])
        if rate is not None:
            runs["net_gbps"].append(c["net"][rate]["gbps"])
            runs["net_latency_us"].append(c["net"][rate]["latency_us"])
            if "cpu_ns_per_byte" in c["net"][rate]:
                runs["net_cpu_ns"].append(c["net"][rate]["cpu_ns_per_byte"][backend])
        runs["compute_s"].append(ddp["compute_s"])
        runs["compute_cpu_s"].append(ddp["compute_cpu_s"])
        runs["backward_share"].append(c["split"][model]["backward_share"])
        runs["overhead_s"].append(ddp["overhead_s"][backend])
        runs["backend_cpu_s"].append(ddp["backend_cpu_s"][backend])
        if "crowded" in c:  # reports before the crowding term lack it (1: not modelled)
            runs["crowding"].append(crowding_of(c, backend))
            runs.setdefault("crowded_ranks_per_core", []).append(c["crowded"]["ranks"] / c["crowded"]["cores"])
    return {k: v for k, v in runs.items() if v}


def crowding_of(calibration_run: dict, backend: str) -> float:
    """The backend's CPU per byte sent with more ranks than cores, over its CPU per byte with 2 ranks."""
    return (calibration_run["crowded"]["cpu_ns_per_byte"][backend]
            / calibration_run["intra"][backend]["cpu_ns_per_byte"])


def crowding(values: dict[str, float]) -> sm.Crowding:
    if "crowding" not in values:
        return sm.NO_CROWDING
    return sm.Crowding(values["crowding"], values["crowded_ranks_per_core"])


def links(values: dict[str, float], net: sm.Link | None = None) -> tuple[sm.Link, sm.Link]:
    """The intra-host and network links of these term values; `net` (an assumed link) replaces the measured one,
    keeping the measured CPU per byte."""
    intra = sm.Link(values["intra_gbps"], values["intra_latency_us"], values.get("intra_cpu_ns", 0.0))
    if net is None:
        net = sm.Link(values["net_gbps"], values["net_latency_us"])
    return intra, replace(net, cpu_ns_per_byte=values.get("net_cpu_ns", 0.0))


def make_terms(values: dict[str, float], gradient_bytes: float, net: sm.Link | None = None) -> sm.Terms:
    intra, net = links(values, net)
    return sm.Terms(values["compute_s"], values["compute_cpu_s"], values["backward_share"], values["overhead_s"],
                    values["backend_cpu_s"], gradient_bytes, intra, net, crowding(values))


def with_band(runs: dict[str, list[float]], evaluate) -> tuple[float, float, float]:
    """evaluate(values) at every term's median, and the lowest and highest it gives when each term in turn moves
    to the smallest and the largest of its runs."""
    medians = {k: median(v) for k, v in runs.items()}
    centre = evaluate(medians)
    moved = [evaluate(dict(medians, **{k: bound(v)})) for k, v in runs.items() for bound in (min, max)]
    return centre, min(moved + [centre]), max(moved + [centre])


def dlop_algorithm(hosts: int, per_host: int) -> str:
    """What dlop's tuning table picks for a DDP bucket: hierarchical when some host has several ranks."""
    return "hierarchical" if hosts > 1 and per_host > 1 else "ring"


# --- the report's numbers -------------------------------------------------


def calibration_table(m: dict) -> list[dict]:
    cal = m["calibration"]
    models = sorted(cal[0]["ddp"])
    out = []

    def add(key, scope, values):
        out.append({"term": key, "scope": scope, "runs": values, "median": median(values),
                    "min": min(values), "max": max(values)})

    for backend in BACKENDS:
        add("intra_gbps", backend, [c["intra"][backend]["gbps"] for c in cal])
        add("intra_latency_us", backend, [c["intra"][backend]["latency_us"] for c in cal])
        if "cpu_ns_per_byte" in cal[0]["intra"][backend]:
            add("intra_cpu_ns", backend, [c["intra"][backend]["cpu_ns_per_byte"] for c in cal])
    for rate in cal[0]["net"]:
        add("net_gbps", rate, [c["net"][rate]["gbps"] for c in cal])
        add("net_latency_us", rate, [c["net"][rate]["latency_us"] for c in cal])
        for backend in BACKENDS if "cpu_ns_per_byte" in cal[0]["net"][rate] else ():
            add("net_cpu_ns", f"{rate}, {backend}", [c["net"][rate]["cpu_ns_per_byte"][backend] for c in cal])
    if "crowded" in cal[0]:
        crowded = cal[0]["crowded"]
        for backend in BACKENDS:
            add("crowding", f"{backend}, {crowded['ranks']} ranks on {crowded['cores']} cores",
                [crowding_of(c, backend) for c in cal])
    for model in models:
        add("compute_s", model, [c["ddp"][model]["compute_s"] for c in cal])
        add("compute_cpu_s", model, [c["ddp"][model]["compute_cpu_s"] for c in cal])
        add("backward_share", model, [c["split"][model]["backward_share"] for c in cal])
        for backend in BACKENDS:
            add("overhead_s", f"{model}, {backend}", [c["ddp"][model]["overhead_s"][backend] for c in cal])
            add("backend_cpu_s", f"{model}, {backend}", [c["ddp"][model]["backend_cpu_s"][backend] for c in cal])
    return out


def allreduce_checks(m: dict, cores: int) -> list[dict]:
    """Per rate, layout, column (dlop's ring or hierarchical, Gloo) and size: the median measured time against the
    model's, with the links measured here."""
    groups: dict[tuple, dict[int, float]] = {}
    for r in m["allreduce"]:
        groups.setdefault((r["rate"], r["hosts"], r["per_host"], r["column"], r["bytes"]), {})[r["run"]] = r["time_us"]
    out = []
    for (rate, hosts, per_host, column, nbytes), by_run in sorted(groups.items()):
        times = list(by_run.values())
        backend = "gloo" if column == "gloo" else "dlop"
        runs = {k: v for k, v in term_runs(m["calibration"], _any_model(m), backend, rate).items()
                if k.startswith(("intra", "net", "crowd"))}
        layout = sm.Layout(hosts, per_host, cores / (hosts * per_host))
        algorithm = "ring" if column == "gloo" else column

        def seconds(v, nbytes=nbytes, layout=layout, algorithm=algorithm):
            return sm.allreduce_seconds(algorithm, nbytes, layout, *links(v), crowding(v))

        predicted, low, high = with_band(runs, seconds)
        measured = median(times) * 1e-6
        out.append({"rate": rate, "hosts": hosts, "per_host": per_host, "column": column, "bytes": nbytes,
                    "measured_ms": measured * 1e3, "runs": list(by_run), "measured_runs_ms": [t * 1e-3 for t in times],
                    "predicted_ms": predicted * 1e3, "band_ms": [low * 1e3, high * 1e3],
                    "error": predicted / measured - 1})
    return out


def _any_model(m: dict) -> str:
    return sorted(m["calibration"][0]["ddp"])[0]


TIE = "tie"


def winner_of(ratios: list[float]) -> str:
    """ring / hierarchical time ratios -> the algorithm faster in every one, or TIE."""
    if all(r < 1 for r in ratios):
        return "ring"
    if all(r > 1 for r in ratios):
        return "hierarchical"
    return TIE


def winners(allreduce: list[dict]) -> list[dict]:
    """Ring against hierarchical wherever both ran: the faster, measured and predicted.

    Ring and hierarchical of one run ran one after the other, so each run gives a ratio. A winner is measured where
    every run names the same one; where the runs disagree the measurement is a tie, and the model agrees with it
    when its ratio lies within the runs' ratios (the measurement cannot tell them apart)."""
    cells = {(c["rate"], c["hosts"], c["per_host"], c["bytes"], c["column"]): c for c in allreduce}
    out = []
    for (rate, hosts, per_host, nbytes, column), ring in sorted(cells.items()):
        hier = cells.get((rate, hosts, per_host, nbytes, "hierarchical"))
        if column != "ring" or hier is None:
            continue
        ring_ms, hier_ms = (dict(zip(c["runs"], c["measured_runs_ms"])) for c in (ring, hier))
        ratios = [ring_ms[r] / hier_ms[r] for r in ring_ms if r in hier_ms]
        if not ratios:
            continue
        measured = winner_of(ratios)
        predicted_ratio = ring["predicted_ms"] / hier["predicted_ms"]
        predicted = winner_of([predicted_ratio])
        agree = measured == predicted or (measured == TIE and min(ratios) <= predicted_ratio <= max(ratios))
        out.append({"rate": rate, "hosts": hosts, "per_host": per_host, "bytes": nbytes, "measured": measured,
                    "predicted": predicted, "agree": agree, "measured_ratio": median(ratios),
                    "measured_runs_ratio": ratios, "predicted_ratio": predicted_ratio})
    return out


def ddp_checks(m: dict, cores: int, bucket_bytes: float) -> list[dict]:
    """DDP's linearity per model, backend, rate and layout (and the 2-rank run on this host, which calibrated the
    backend's CPU: in sample) against the model's. Each run is predicted with the background load it met."""
    cal = m["calibration"]
    cells: dict[tuple, list[tuple[float, float]]] = {}  # (linearity, background cores) per run
    for r in m["ddp"]:
        cells.setdefault((r["model"], r["backend"], r["rate"], r["hosts"], r["per_host"]), []).append(
            (r["linearity"], r["background_cores"]))
    for model in cal[0]["ddp"]:
        for backend in BACKENDS:
            cells[(model, backend, None, 1, 2)] = [(c["ddp"][model]["linearity_2"][backend],
                                                    c["ddp"][model]["background_cores"]["2"]) for c in cal]
    out = []
    for (model, backend, rate, hosts, per_host), runs_of in sorted(cells.items(), key=lambda kv: str(kv[0])):
        algorithm = dlop_algorithm(hosts, per_host) if backend == "dlop" else "ring"
        gradient = cal[0]["ddp"][model]["gradient_bytes"]
        runs = term_runs(cal, model, backend, rate)
        local = sm.Link(1.0, 0.0) if rate is None else None  # one host: no network edge (never read)
        per_run = []
        for _, background in runs_of:
            layout = shared_machine(cores, hosts, per_host, background)

            def lin(v, layout=layout):
                return sm.linearity(make_terms(v, gradient, local), algorithm, layout, bucket_bytes)

            per_run.append(with_band(runs, lin))
        measured = median([v for v, _ in runs_of])
        predicted = median([p for p, _, _ in per_run])
        out.append({"model": model, "backend": backend, "rate": rate, "hosts": hosts, "per_host": per_host,
                    "algorithm": algorithm, "measured": measured, "measured_runs": [v for v, _ in runs_of],
                    "predicted": predicted, "predicted_runs": [p for p, _, _ in per_run],
                    "band": [median([low for _, low, _ in per_run]),
                             median([high for _, _, high in per_run])],
                    "error": predicted - measured, "within_target": abs(predicted - measured) <= TARGET_LINEARITY,
                    "in_sample": rate is None, "background_cores": [b for _, b in runs_of],
                    "cores_per_rank": median([shared_machine(cores, hosts, per_host, b).cores_per_rank
                                                      for _, b in runs_of])})
    return out


def shared_machine(cores: int, hosts: int, per_host: int, background: float) -> sm.Layout:
    """Namespace hosts on this machine: every rank, and the other processes that kept `background` cores busy
    (counted as that many runnable threads), share its cores fairly; the 1-rank baseline shared them too."""
    return sm.Layout(hosts, per_host, sm.fair_share(cores, hosts * per_host, background),
                     sm.fair_share(cores, 1, background))


def predictions(m: dict, s: Settings) -> list[dict]:
    """Linearity at s.predict ranks for each model, compute (this host's CPU, or a GPU's --step-ms), algorithm
    and assumed network link; dlop's calibrated terms with their band."""
    cal = m["calibration"]
    out = []
    for model in sorted(cal[0]["ddp"]):
        gradient = cal[0]["ddp"][model]["gradient_bytes"]
        runs = term_runs(cal, model, "dlop", None)
        if s.intra_gbps:
            runs["intra_gbps"] = [s.intra_gbps]
        if s.net_cpu_ns is not None:
            runs["net_cpu_ns"] = [s.net_cpu_ns]
        elif (rate := fastest_rate(cal)) is not None:
            runs["net_cpu_ns"] = term_runs(cal, model, "dlop", rate).get("net_cpu_ns", [])
            runs = {k: v for k, v in runs.items() if v}
        computes = [("cpu", {})]
        if s.step_ms:
            # A GPU computes; the host's CPU only runs the backend (its measured CPU per step).
            computes.append(("gpu", {"compute_s": [s.step_ms / 1e3], "compute_cpu_s": [0.0], "overhead_s": [0.0]}))
        for compute, replaced in computes:
            for algorithm in sm.ALGORITHMS:
                for gbps in s.link_gbps:
                    net = sm.Link(gbps, s.latency_us)
                    values, bands = {}, {}
                    for n in s.predict:
                        per_host = min(s.ranks_per_host, n)
                        layout = sm.Layout(math.ceil(n / per_host), per_host, s.cores_per_rank)

                        def lin(v, layout=layout, algorithm=algorithm, net=net):
                            return sm.linearity(make_terms(v, gradient, net), algorithm, layout, s.bucket_bytes)

                        centre, low, high = with_band(dict(runs, **replaced), lin)
                        values[str(n)], bands[str(n)] = centre, [low, high]
                    out.append({"model": model, "compute": compute, "algorithm": algorithm, "link_gbps": gbps,
                                "linearity": values, "band": bands})
    return out


def fastest_rate(calibration: list[dict]) -> str | None:
    """The calibrated network link with the highest bandwidth (its CPU per byte is the least inflated by waiting
    on the link), or None when none was."""
    rates = list(calibration[0]["net"])
    return max(rates, key=lambda r: median([c["net"][r]["gbps"] for c in calibration]), default=None)


def build(header: dict, measurements: dict, s: Settings) -> dict:
    cores = header["cores"]
    allreduce = allreduce_checks(measurements, cores)
    ddp = ddp_checks(measurements, cores, s.bucket_bytes)
    out_of_sample = [c for c in ddp if not c["in_sample"]]
    won = winners(allreduce)
    quiet = [(p, m) for c in out_of_sample
             for p, m, b in zip(c["predicted_runs"], c["measured_runs"], c["background_cores"]) if b < QUIET_BELOW]
    return {"header": header, "measurements": measurements, "settings": asdict(s),
            "calibration": calibration_table(measurements),
            "checks": {"allreduce": allreduce, "winners": won, "ddp": ddp},
            "targets": {"linearity_within": TARGET_LINEARITY,
                        "ddp_points": len(out_of_sample), "ddp_within": sum(c["within_target"] for c in out_of_sample),
                        "quiet_below_cores": QUIET_BELOW, "quiet_runs": len(quiet),
                        "quiet_runs_within": sum(abs(p - m) <= TARGET_LINEARITY for p, m in quiet),
                        "winner_points": len(won), "winners_agree": sum(w["agree"] for w in won)},
            "predicted": predictions(measurements, s)}


def write(report: dict, folder: str) -> list[str]:
    """linearity.md, linearity.json and the PNGs into `folder`; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, "linearity.md"), os.path.join(folder, "linearity.json")]
    with open(paths[0], "w") as f:
        f.write(linearity_text.markdown(report))
    with open(paths[1], "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
        f.write("\n")
    return paths + linearity_plots.write(report, folder)
