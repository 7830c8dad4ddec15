"""The linearity report as markdown: every figure here is in linearity.json too (linearity_report.build)."""

from __future__ import annotations

from dlop.report.common import format_size
from dlop.report.linearity_terms import SOURCES

PLOTS = ("checks.png", "predicted.png")


def _layout(c: dict) -> str:
    return f"{c['hosts']}x{c['per_host']}"


def _table(head: list[str], rows: list[list[str]], right_from: int) -> list[str]:
    align = ["---"] * right_from + ["---:"] * (len(head) - right_from)
    return ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def _header(report: dict) -> list[str]:
    h = report["header"]
    return ["# DDP linearity: the scaling model calibrated from its parts, checked across hosts", "",
            f"Measured {h['date']} on {h['host']}: {h.get('cpu', 'unknown CPU')}, {h['cores']} cores; "
            f"commit {h['revision']}, torch {h['torch']}.  ",
            f"`{h['command']}`  ",
            f"Models {', '.join(h['models'])}; {h['threads_per_rank']} torch thread(s) per rank; DDP "
            f"{h['repetitions']} repetitions of {h['warmup']} untimed + {h['steps']} timed steps, bucket_cap_mb "
            f"{h['bucket_cap_mb']}; {h['runs']} run(s) of everything, interleaved. Checked on namespace hosts "
            f"(layouts hosts x ranks per host: {', '.join(h['layouts'])}; tbf links {', '.join(h['rates'])}). "
            f"Every namespace host shares this machine's {h['cores']} cores: a check's cores per rank are "
            f"({h['cores']} - the cores other processes kept busy during it) / ranks.", ""]


def _calibration(report: dict) -> list[str]:
    rows = [[SOURCES[t["term"]][0], t["scope"], f"{t['median']:.4g}", f"{t['min']:.4g} - {t['max']:.4g}",
             SOURCES[t["term"]][1]] for t in report["calibration"]]
    return ["## Calibration: each term from the benchmark that measures it", "",
            "Medians over the runs, and the spread (smallest - largest run) that the bands below move each term "
            "through. The intra-host link is the backend's own 2-rank all-reduce on this host (dlop: `dlop-bench "
            "allreduce --local 2`, shm/cma; Gloo: through torch). CPU contention is a term of its own: a rank is "
            "busy for max(compute + DDP overhead, (compute CPU + crowding x (backend CPU + network CPU)) / cores per "
            "rank), and the last bucket's time on the links follows. Crowding is 1 with a core per rank and grows "
            "linearly in ranks per core through the measured point (a measured ratio below 1 counts as 1).", ""] + \
        _table(["term", "of", "median", "spread", "measured by"], rows, 2) + [""]


def _checks(report: dict) -> list[str]:
    c, t = report["checks"], report["targets"]
    out = ["## Predicted against measured (out of sample)", "",
           f"Target: |predicted - measured| linearity within {t['linearity_within']}, and the same winner between "
           "ring and hierarchical as measured (a winner is measured where every run names it; where the runs "
           "disagree it is a tie, and the model agrees when its ratio lies within the runs'). "
           f"Met at **{t['ddp_within']} of {t['ddp_points']}** DDP points and "
           f"**{t['winners_agree']} of {t['winner_points']}** ring/hierarchical points. Taken run by run, "
           f"**{t['quiet_runs_within']} of {t['quiet_runs']}** runs beside less than {t['quiet_below_cores']:g} core "
           "of other work are within the target (the last column). Bands: the prediction with each calibrated term "
           "moved through its measured spread.", "", "### DDP linearity", ""]
    rows = [[d["model"], d["backend"], d["algorithm"], d["rate"] or "this host", _layout(d),
             f"{d['cores_per_rank']:.2f}", f"{d['measured']:.3f}", f"{d['predicted']:.3f}",
             f"{d['band'][0]:.3f} - {d['band'][1]:.3f}", f"{d['error']:+.3f}",
             "in sample" if d["in_sample"] else ("yes" if d["within_target"] else "**no**"),
             "; ".join(f"{b:.2f}: {m:.3f} / {p:.3f}" for b, m, p in
                       zip(d["background_cores"], d["measured_runs"], d["predicted_runs"]))] for d in c["ddp"]]
    out += _table(["model", "backend", "algorithm", "link", "layout", "cores/rank", "measured", "predicted", "band",
                   "error", "within 0.05", "each run: other work (cores): measured / predicted"], rows, 5)
    out += ["", "### All-reduce time", ""]
    rows = [[a["rate"], _layout(a), a["column"], format_size(a["bytes"]), f"{a['measured_ms']:.2f}",
             f"{a['predicted_ms']:.2f}", f"{a['band_ms'][0]:.2f} - {a['band_ms'][1]:.2f}", f"{100 * a['error']:+.1f}"]
            for a in c["allreduce"]]
    out += _table(["link", "layout", "column", "size", "measured (ms)", "predicted (ms)", "band (ms)", "error (%)"],
                  rows, 3)
    out += ["", "### Ring or hierarchical", ""]
    rows = [[w["rate"], _layout(w), format_size(w["bytes"]), w["measured"], f"{w['measured_ratio']:.2f}",
             ", ".join(f"{r:.2f}" for r in w["measured_runs_ratio"]), w["predicted"], f"{w['predicted_ratio']:.2f}",
             "yes" if w["agree"] else "**no**"] for w in c["winners"]]
    out += _table(["link", "layout", "size", "measured winner", "measured ring / hier", "each run", "predicted winner",
                   "predicted ring / hier", "agree"], rows, 3)
    return out + [""]


def _predictions(report: dict) -> list[str]:
    s, predicted = report["settings"], report["predicted"]
    out = ["## Predictions beyond this machine (assumed, not measured)", "",
           f"Assumed: {s['ranks_per_host']} ranks per host, {s['cores_per_rank']:g} cores per rank, network links of "
           f"{', '.join(f'{g:g}' for g in s['link_gbps'])} Gbit/s with {s['latency_us']:g} us latency "
           "(`--ranks-per-host`, `--cores-per-rank`, `--link-gbps`, `--latency-us`); intra-host link "
           + (f"{s['intra_gbps']:g} Gbit/s (`--intra-gbps`)" if s.get("intra_gbps") else
              "as calibrated for dlop on this host (`--intra-gbps` to set a host's own)")
           + "; network CPU per byte sent "
           + (f"{s['net_cpu_ns']:g} ns (`--net-cpu-ns`)" if s.get("net_cpu_ns") is not None else
              "as calibrated for dlop across namespace hosts on the fastest link (TCP; `--net-cpu-ns` to set a "
              "cluster's own, 0 where the NIC does the work)")
           + "; everything else as calibrated for dlop on this host. cpu: this host's compute per step. "
           + (f"gpu: a {s['step_ms']:g} ms GPU step (`--step-ms`), no compute on the host's CPU and no DDP overhead, "
              "the backend's CPU per step as measured here, staging copies hidden behind the network. "
              if s.get("step_ms") else "No GPU column: give a GPU's step time with `--step-ms`. ")
           + "Each cell: the prediction, then its band.", ""]
    if not predicted:
        return out + ["No prediction.", ""]
    ns = list(predicted[0]["linearity"])
    rows = [[p["model"], p["compute"], p["algorithm"], f"{p['link_gbps']:g}"]
            + [f"{p['linearity'][n]:.3f} ({p['band'][n][0]:.3f}-{p['band'][n][1]:.3f})" for n in ns]
            for p in predicted]
    return out + _table(["model", "compute", "algorithm", "link (Gbit/s)"] + [f"N = {n}" for n in ns], rows, 3) + [""]


def markdown(report: dict) -> str:
    lines = _header(report) + _calibration(report) + _checks(report) + _predictions(report)
    return "\n".join(lines + ["## Plots", ""] + [f"![{name[:-4]}]({name})" for name in PLOTS] + [""])
