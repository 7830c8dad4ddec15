"""The linearity report: measured rows, the scaling model's checks and predictions, as markdown, JSON and PNGs.

``build`` turns the rows of ``dlop.bench.ddp`` runs (one per rank count) into
the report's numbers; ``write`` renders them. Every figure in the markdown is
in the JSON too (the tests parse both).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass

from dlop.bench import scaling_model as sm

PLOT_INCHES = (11.0, 4.5)
PLOT_DPI = 110
PLOTS = ("throughput.png", "linearity.png", "speedup_scatter.png", "predicted.png")
BASELINE = "none"  # ddp's backend name for the model alone (no DDP)


@dataclass
class ModelSettings:
    link_gbps: list[float]
    link_latency_us: float
    intra_latency_us: float
    ranks_per_host: int
    predict: list[int]
    bucket_bytes: float
    intra_gbps: float | None = None  # the predictions' intra-host link; None: dlop's fitted one


def read_measured(path: str) -> tuple[dict, list[dict]]:
    """A linearity.json's header and measured rows (to report again without running)."""
    with open(path) as f:
        data = json.load(f)
    if "measured" not in data:
        raise SystemExit(f"{path} is not a linearity report's JSON (no 'measured' rows)")
    return data["header"], data["measured"]


def _rate_gbps(rate: str | None) -> float | None:
    """tc's rate ('10gbit', '500mbit') in Gbit/s; None when unset or not in that form."""
    match = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", (rate or "").strip().lower())
    if not match:
        return None
    return float(match.group(1)) * {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0}[match.group(2)]


def measured_rows(header: dict, rows: list[dict]) -> list[dict]:
    """The rows with linearity, the ideal throughput, dlop's speed-ups and oversubscription filled in."""
    cores = header["cores"]
    base = {r["model"]: r for r in rows if r["backend"] == BASELINE and r["ranks"] == 1}
    if missing := sorted({r["model"] for r in rows} - set(base)):
        raise SystemExit(f"no 1-rank baseline (model alone) for {', '.join(missing)}: measure N = 1 too")
    by_key = {(r["model"], r["ranks"], r["backend"]): r for r in rows}
    out = []
    for r in sorted(rows, key=lambda r: (r["model"], r["ranks"], r["backend"] != BASELINE, r["backend"] != "dlop",
                                          r["backend"])):
        one = base[r["model"]]["samples_per_s"]
        per_host = math.ceil(r["ranks"] / r["hosts"])
        row = dict(r, ideal_samples_per_s=r["ranks"] * one, linearity=r["samples_per_s"] / one / r["ranks"],
                   ranks_per_host=per_host, oversubscribed=per_host * r["threads_per_rank"] > cores, speedup={})
        if r["backend"] == "dlop":
            for (model, ranks, peer), other in by_key.items():
                if model == r["model"] and ranks == r["ranks"] and peer not in ("dlop", BASELINE):
                    row["speedup"][peer] = r["samples_per_s"] / other["samples_per_s"]
        out.append(row)
    return out


def _workloads(rows: list[dict], backend: str) -> dict[str, sm.Workload]:
    """Per model: the 1-rank compute time, the gradient, and `backend`'s DDP overhead at 1 rank (0 if unmeasured)."""
    ddp_one = {r["model"]: r["step_ms"] / 1e3 for r in rows if r["backend"] == backend and r["ranks"] == 1}
    work = {}
    for r in rows:
        if r["backend"] == BASELINE and r["ranks"] == 1:
            compute = r["step_ms"] / 1e3
            overhead = max(0.0, ddp_one.get(r["model"], compute) - compute)
            work[r["model"]] = sm.Workload(r["model"], compute, r["gradient_mib"] * 2**20, overhead)
    return work


def calibrate(header: dict, rows: list[dict], settings: ModelSettings) -> dict:
    """{backend: {"intra_gbps", "calibration_ranks"}}: each backend's intra-host link, fitted at its smallest N > 1."""
    fits = {}
    for backend in sorted({r["backend"] for r in rows} - {BASELINE}):
        work = _workloads(rows, backend)
        mine = [r for r in rows if r["backend"] == backend and r["ranks"] > 1]
        if not mine:
            continue
        n = min(r["ranks"] for r in mine)
        points = [(work[r["model"]], n, sm.oversubscription(r["ranks_per_host"], r["threads_per_rank"], header["cores"]),
                   r["step_ms"] / 1e3) for r in mine if r["ranks"] == n]
        fits[backend] = {"intra_gbps": sm.fit_intra_gbps(points, settings.bucket_bytes, settings.intra_latency_us),
                         "calibration_ranks": n}
    return fits


def checks(header: dict, rows: list[dict], fits: dict, settings: ModelSettings) -> list[dict]:
    """The model's linearity at every measured N > 1 against the measured one."""
    net_gbps = _rate_gbps(header.get("host_rate"))
    out = []
    for r in rows:
        if r["backend"] == BASELINE or r["ranks"] == 1 or r["backend"] not in fits:
            continue
        fit = fits[r["backend"]]
        intra = sm.Link(fit["intra_gbps"], settings.intra_latency_us)
        net = sm.Link(net_gbps, settings.intra_latency_us) if net_gbps else intra  # namespace hosts share the machine
        w = _workloads(rows, r["backend"])[r["model"]]
        over = sm.oversubscription(r["ranks_per_host"], r["threads_per_rank"], header["cores"])
        step = sm.step_seconds(w.compute_s, w.gradient_bytes, settings.bucket_bytes, "flat ring", r["ranks"],
                               r["ranks_per_host"], intra, net, over, w.overhead_s)
        predicted = sm.linearity(w.compute_s, step)
        out.append({"model": r["model"], "backend": r["backend"], "ranks": r["ranks"], "hosts": r["hosts"],
                    "measured_linearity": r["linearity"], "predicted_linearity": predicted,
                    "error": predicted - r["linearity"], "oversubscription": over,
                    "in_sample": r["ranks"] == fit["calibration_ranks"]})
    return out


def predictions(rows: list[dict], fits: dict, settings: ModelSettings) -> list[dict]:
    """Linearity at settings.predict ranks, per model, algorithm and network link, with dlop's intra-host link."""
    if "dlop" not in fits:
        return []
    intra = sm.Link(settings.intra_gbps or fits["dlop"]["intra_gbps"], settings.intra_latency_us)
    out = []
    for model, w in _workloads(rows, "dlop").items():
        for algorithm in sm.ALGORITHMS:
            for gbps in settings.link_gbps:
                net = sm.Link(gbps, settings.link_latency_us)
                values = {}
                for n in settings.predict:
                    step = sm.step_seconds(w.compute_s, w.gradient_bytes, settings.bucket_bytes, algorithm, n,
                                           settings.ranks_per_host, intra, net, overhead_s=w.overhead_s)
                    values[str(n)] = sm.linearity(w.compute_s, step)
                out.append({"model": model, "algorithm": algorithm, "link_gbps": gbps, "linearity": values})
    return out


def build(header: dict, raw_rows: list[dict], settings: ModelSettings) -> dict:
    rows = measured_rows(header, raw_rows)
    fits = calibrate(header, rows, settings)
    return {"header": header, "measured": rows, "model": {"settings": asdict(settings), "fits": fits,
                                                          "backward_share": sm.BACKWARD_SHARE},
            "checks": checks(header, rows, fits, settings), "predicted": predictions(rows, fits, settings)}


# --- markdown -------------------------------------------------------------


def peers_of(report: dict) -> list[str]:
    return sorted({p for r in report["measured"] for p in r["speedup"]})


def markdown(report: dict) -> str:
    h, rows, peers = report["header"], report["measured"], peers_of(report)
    settings, fits = report["model"]["settings"], report["model"]["fits"]
    over = sorted({r["ranks"] for r in rows if r["oversubscribed"]})
    out = ["# DDP linearity: dlop against " + (", ".join(peers) or "no peer"), "",
           f"Measured {h['date']} on {h['host']}: {h.get('cpu', 'unknown CPU')}, {h['cores']} cores; "
           f"commit {h['revision']}, torch {h['torch']}.  ",
           f"`{h['command']}`  ",
           f"{h['threads_per_rank']} torch thread(s) per rank at every N; {h['repetitions']} repetitions of "
           f"{h['warmup']} untimed + {h['steps']} timed steps, backends alternating; {h['hosts']} host(s); "
           f"DDP bucket_cap_mb {h['bucket_cap_mb']}.", ""]
    if over:
        out += [f"> **Oversubscribed: N = {', '.join(map(str, over))}.** Those runs have more rank threads per host "
                f"than the host's {h['cores']} cores, so ranks time-share cores: their linearity measures the "
                "machine being too small, not communication. Rows marked **yes** below.", ""]
    out += ["linearity = N-rank samples/s / 1-rank samples/s / N, where the 1-rank figure is the model alone "
            "(no DDP, same threads); ideal = N x 1-rank samples/s; "
            + "; ".join(f"dlop/{p} = dlop's samples/s / {p}'s at the same N" for p in peers) + ".", "",
            "## Measured", ""]
    head = ["model", "N", "hosts", "ranks/host", "backend", "samples/s", "ideal samples/s", "linearity"]
    head += [f"dlop/{p}" for p in peers] + ["oversubscribed"]
    out += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * 3 + "---|" + "---:|" * (3 + len(peers)) + "---|"]
    for r in rows:
        line = [r["model"], str(r["ranks"]), str(r["hosts"]), str(r["ranks_per_host"]),
                "model alone" if r["backend"] == BASELINE else r["backend"], f"{r['samples_per_s']:.1f}",
                f"{r['ideal_samples_per_s']:.1f}", f"{r['linearity']:.3f}"]
        line += [f"{r['speedup'][p]:.2f}" if p in r["speedup"] else "-" for p in peers]
        line.append("**yes**" if r["oversubscribed"] else "no")
        out.append("| " + " | ".join(line) + " |")
    out += ["", "## Scaling model: checked against the measured runs", "",
            "The model (dlop/bench/scaling_model.py) predicts these runs as a flat ring on one host. Its intra-host "
            "link bandwidth is fitted per backend at the smallest measured N > 1 (in-sample: that N says *fit*); "
            "every other N is out of sample. Compute is the 1-rank step time, slowed by the oversubscription "
            "factor (rank threads per host / cores, at least 1); DDP's overhead is the backend's 1-rank DDP step "
            "less the model alone's. The fitted bandwidth is an effective one: on a CPU machine it also absorbs "
            "the cores the transport's threads take from compute.", ""]
    for backend, fit in sorted(fits.items()):
        out.append(f"- {backend}: intra-host link fitted at {fit['intra_gbps']:.3g} Gbit/s "
                   f"(N = {fit['calibration_ranks']}), latency {settings['intra_latency_us']} us")
    out += ["", "| model | backend | N | measured linearity | predicted linearity | error | sample |",
            "|---|---|---:|---:|---:|---:|---|"]
    for c in report["checks"]:
        out.append(f"| {c['model']} | {c['backend']} | {c['ranks']} | {c['measured_linearity']:.3f} | "
                   f"{c['predicted_linearity']:.3f} | {c['error']:+.3f} | {'fit' if c['in_sample'] else 'check'} |")
    out += ["", "## Scaling model: predictions beyond this machine (not measured)", "",
            f"{settings['ranks_per_host']} ranks per host, each with cores of its own (no oversubscription); "
            f"network link latency {settings['link_latency_us']} us; intra-host link "
            + (f"{settings['intra_gbps']:g} Gbit/s (--intra-gbps). " if settings.get("intra_gbps")
               else "as fitted for dlop (hierarchical gains only where it is faster than the network). ") +
            "Overlap assumption (DDP's): buckets of the gradient are all-reduced during backward, which is "
            f"{report['model']['backward_share']:.2f} of the 1-rank step; only what exceeds that window, and at "
            "least the last bucket's all-reduce, adds to the step. Flat ring: 2(N-1) latencies and 2(N-1)/N of "
            "the bytes over the slowest link (the network). Hierarchical: intra-host reduce, ring among host "
            "leaders, intra-host broadcast.", ""]
    predicted = report["predicted"]
    if predicted:
        ns = list(predicted[0]["linearity"])
        out += ["| model | algorithm | link (Gbit/s) | " + " | ".join(f"N = {n}" for n in ns) + " |",
                "|---|---|---:|" + "---:|" * len(ns)]
        for p in predicted:
            out.append(f"| {p['model']} | {p['algorithm']} | {p['link_gbps']:g} | "
                       + " | ".join(f"{p['linearity'][n]:.3f}" for n in ns) + " |")
    else:
        out.append("No prediction: dlop was not measured at N > 1.")
    out += ["", "## Plots", ""] + [f"![{name[:-4]}]({name})" for name in PLOTS] + [""]
    return "\n".join(out)


# --- plots ----------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_model(rows: list[dict]) -> dict[str, list[dict]]:
    models: dict[str, list[dict]] = {}
    for r in rows:
        models.setdefault(r["model"], []).append(r)
    return models


def _mark_oversubscribed(axis, rows: list[dict]) -> None:
    over = sorted({r["ranks"] for r in rows if r["oversubscribed"]})
    if over:
        axis.axvspan(over[0] / 1.25, over[-1] * 1.25, color="red", alpha=0.08, label="oversubscribed")


def plot_throughput(plt, report: dict, path: str) -> None:
    models = _by_model(report["measured"])
    fig, axes = plt.subplots(1, len(models), figsize=PLOT_INCHES, squeeze=False)
    for axis, (model, rows) in zip(axes[0], models.items()):
        ranks = sorted({r["ranks"] for r in rows})
        one = next(r["samples_per_s"] for r in rows if r["backend"] == BASELINE)
        axis.plot(ranks, [n * one for n in ranks], "k--", lw=1, label="ideal (N x 1-rank)")
        for backend in sorted({r["backend"] for r in rows} - {BASELINE}, key=lambda b: b != "dlop"):
            mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["ranks"])
            axis.plot([r["ranks"] for r in mine], [r["samples_per_s"] for r in mine], marker="o", label=backend)
        _mark_oversubscribed(axis, rows)
        axis.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="samples/s", title=f"{model}: throughput")
        axis.set_xticks(ranks, [str(n) for n in ranks])
        axis.set_xticks([], minor=True)  # no "3 x 10^0" labels between the rank counts
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def plot_linearity(plt, report: dict, path: str) -> None:
    models = _by_model([r for r in report["measured"] if r["backend"] != BASELINE])
    fig, axes = plt.subplots(1, max(len(models), 1), figsize=PLOT_INCHES, squeeze=False)
    for axis, (model, rows) in zip(axes[0], models.items()):
        ranks = sorted({r["ranks"] for r in rows})
        backends = sorted({r["backend"] for r in rows}, key=lambda b: b != "dlop")
        width = 0.8 / len(backends)
        for k, backend in enumerate(backends):
            cells = {r["ranks"]: r for r in rows if r["backend"] == backend}
            xs = [i + k * width for i, n in enumerate(ranks) if n in cells]
            bars = axis.bar(xs, [cells[n]["linearity"] for n in ranks if n in cells], width, label=backend)
            for bar, n in zip(bars, [n for n in ranks if n in cells]):
                if cells[n]["oversubscribed"]:
                    bar.set_hatch("//")
        axis.axhline(1.0, color="gray", lw=0.8)
        labels = [f"{n}\n(oversubscribed)" if any(r["oversubscribed"] for r in rows if r["ranks"] == n) else str(n)
                  for n in ranks]
        axis.set_xticks([i + width * (len(backends) - 1) / 2 for i in range(len(ranks))], labels)
        axis.set(xlabel="ranks N", ylabel="linearity", title=f"{model}: linearity (N-rank / 1-rank / N)", ylim=(0, 1.15))
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def plot_speedup_scatter(plt, report: dict, path: str) -> None:
    """ACSpeed's figure: x = the peer's linearity, y = dlop's speed-up over it, one colour per N."""
    rows = report["measured"]
    peer_rows = {(r["model"], r["ranks"], r["backend"]): r for r in rows}
    ranks = sorted({r["ranks"] for r in rows if r["speedup"]})
    colours = plt.get_cmap("tab10")
    markers = "os^Dv"
    fig, axis = plt.subplots(figsize=PLOT_INCHES)
    for j, peer in enumerate(peers_of(report)):
        for i, n in enumerate(ranks):
            points = [(peer_rows[(r["model"], n, peer)]["linearity"], r["speedup"][peer], r["model"])
                      for r in rows if r["ranks"] == n and peer in r["speedup"]]
            colour = colours(i % 10)
            over = " (oversubscribed)" if any(r["oversubscribed"] for r in rows if r["ranks"] == n) else ""
            axis.scatter([p[0] for p in points], [p[1] for p in points], color=colour, marker=markers[j % 5], s=60,
                         label=f"N = {n}{over}, vs {peer}")
            for x, y, model in points:
                axis.annotate(model, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    axis.axhline(1.0, color="gray", lw=0.8)
    axis.set(xlabel="peer's linearity", ylabel="dlop speed-up over the peer (samples/s ratio)",
             title="dlop's speed-up against the peer's linearity")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def plot_predicted(plt, report: dict, path: str) -> None:
    predicted = _by_model(report["predicted"])
    fig, axes = plt.subplots(1, max(len(predicted), 1), figsize=PLOT_INCHES, squeeze=False)
    for axis, (model, rows) in zip(axes[0], predicted.items()):
        for p in rows:
            ns = [int(n) for n in p["linearity"]]
            axis.plot(ns, list(p["linearity"].values()), marker=".",
                      ls="-" if p["algorithm"] == "hierarchical" else "--",
                      label=f"{p['algorithm']}, {p['link_gbps']:g} Gbit/s")
        checks = [c for c in report["checks"] if c["model"] == model and c["backend"] == "dlop"]
        axis.scatter([c["ranks"] for c in checks], [c["measured_linearity"] for c in checks], color="k", zorder=3,
                     label="measured (dlop, this machine)")
        axis.set_xscale("log", base=2)
        ticks = sorted({c["ranks"] for c in checks} | {int(n) for p in rows for n in p["linearity"]})
        axis.set_xticks(ticks, [str(n) for n in ticks])
        axis.set(xlabel="ranks N", ylabel="linearity", ylim=(0, 1.05), title=f"{model}: predicted (model)")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def write(report: dict, folder: str) -> list[str]:
    """linearity.md, linearity.json and the PNGs into `folder`; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, "linearity.md"), os.path.join(folder, "linearity.json")]
    with open(paths[0], "w") as f:
        f.write(markdown(report))
    with open(paths[1], "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
        f.write("\n")
    plt = _pyplot()
    for name, plot in zip(PLOTS, (plot_throughput, plot_linearity, plot_speedup_scatter, plot_predicted)):
        paths.append(os.path.join(folder, name))
        plot(plt, report, paths[-1])
    return paths
