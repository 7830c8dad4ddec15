"""The linearity report's figures: predicted against measured, and the predictions with their bands."""

from __future__ import annotations

import os

from dlop.report.linearity_text import PLOTS

PLOT_INCHES = (11.0, 4.5)
PLOT_DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_checks(plt, report: dict, path: str) -> None:
    """Left: DDP linearity, predicted against measured, with the target's corridor. Right: all-reduce times."""
    checks, target = report["checks"], report["targets"]["linearity_within"]
    fig, (left, right) = plt.subplots(1, 2, figsize=PLOT_INCHES)
    left.plot([0, 1], [0, 1], "k-", lw=0.8)
    left.fill_between([0, 1], [-target, 1 - target], [target, 1 + target], color="green", alpha=0.12,
                      label=f"within {target}")
    for backend, marker in (("dlop", "o"), ("gloo", "s")):
        points = [c for c in checks["ddp"] if c["backend"] == backend]
        left.errorbar([c["measured"] for c in points], [c["predicted"] for c in points],
                      yerr=[[c["predicted"] - c["band"][0] for c in points],
                            [c["band"][1] - c["predicted"] for c in points]], fmt=marker, label=backend, capsize=2)
        for c in points:
            left.annotate(f"{c['hosts']}x{c['per_host']} {c['rate'] or 'local'}", (c["measured"], c["predicted"]),
                          textcoords="offset points", xytext=(4, -8), fontsize=6)
    left.set(xlabel="measured linearity", ylabel="predicted linearity", xlim=(0, 1.05), ylim=(0, 1.05),
             title="DDP linearity across namespace hosts")
    left.legend(fontsize=8)
    for column, marker in (("ring", "o"), ("hierarchical", "^"), ("gloo", "s")):
        points = [a for a in checks["allreduce"] if a["column"] == column]
        right.scatter([a["measured_ms"] for a in points], [a["predicted_ms"] for a in points], marker=marker,
                      label=column)
    times = [a[k] for a in checks["allreduce"] for k in ("measured_ms", "predicted_ms")] or [1.0]
    low, high = min(times) / 1.5, max(times) * 1.5
    right.plot([low, high], [low, high], "k-", lw=0.8)
    right.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)",
              title="all-reduce time across namespace hosts")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def plot_predicted(plt, report: dict, path: str) -> None:
    predicted = report["predicted"]
    computes = sorted({p["compute"] for p in predicted}) or ["cpu"]
    fig, axes = plt.subplots(1, len(computes), figsize=PLOT_INCHES, squeeze=False)
    for axis, compute in zip(axes[0], computes):
        for p in (p for p in predicted if p["compute"] == compute):
            ns = [int(n) for n in p["linearity"]]
            line, = axis.plot(ns, list(p["linearity"].values()), marker=".",
                              ls="-" if p["algorithm"] == "hierarchical" else "--",
                              label=f"{p['model']}, {p['algorithm']}, {p['link_gbps']:g} Gbit/s")
            axis.fill_between(ns, [b[0] for b in p["band"].values()], [b[1] for b in p["band"].values()],
                              color=line.get_color(), alpha=0.15)
        axis.set_xscale("log", base=2)
        if predicted:
            ticks = [int(n) for n in predicted[0]["linearity"]]
            axis.set_xticks(ticks, [str(n) for n in ticks])
        axis.set(xlabel="ranks N", ylabel="linearity", ylim=(0, 1.05), title=f"predicted, {compute} compute")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def write(report: dict, folder: str) -> list[str]:
    plt = _pyplot()
    paths = []
    for name, plot in zip(PLOTS, (plot_checks, plot_predicted)):
        paths.append(os.path.join(folder, name))
        plot(plt, report, paths[-1])
    return paths
