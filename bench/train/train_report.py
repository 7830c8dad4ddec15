"""bench.train's output: the table, the ratios against the targets, train.md and train.png."""

from __future__ import annotations

import os

from bench.common import _common

COLUMNS = ("samples_per_s", "step_ms", "compute_ms", "exposed_comm_ms", "data_stall_ms", "allreduce_p50_ms",
           "allreduce_p99_ms", "allreduce_p99_idle_ms", "allreduce_p99_replay_ms")
PARTS = (("compute_ms", "compute", "#4c72b0"), ("exposed_comm_ms", "exposed comm", "#dd8452"),
         ("data_stall_ms", "data stall", "#c44e52"))
PNG_SIZE = (800, 450)  # pixels: figsize (8, 4.5) at 100 dpi
_LINE = "{:>25} " + " ".join(["{:>12}"] * len(COLUMNS))


def cell(key: str, value: float) -> str:
    return f"{value:.1f}" if key == "samples_per_s" else f"{value:.2f}"


def print_table(rows: list[dict]) -> None:
    print(_LINE.format("# config", *COLUMNS))
    for r in rows:
        print(_LINE.format(r["config"], *(cell(k, r[k]) for k in COLUMNS)), flush=True)


def ratios(rows: list[dict]) -> list[tuple[str, float, str]]:
    """(what, ratio, target or "") within one run: dlop_offload against its targets, every config against stock
    and against its own idle all-reduce."""
    by = {r["config"]: r for r in rows}
    out = []
    off, stock = by.get("dlop_offload"), by.get("stock")
    if off is not None:
        out.append(("dlop_offload data stall / step", off["data_stall_ms"] / off["step_ms"], "<= 0.05"))
        if stock is not None:
            out.append(("dlop_offload / stock samples/s", off["samples_per_s"] / stock["samples_per_s"], ">= 1.5"))
    for r in rows:
        out.append((f"{r['config']} allreduce p99 / p99 idle", r["allreduce_p99_ms"] / r["allreduce_p99_idle_ms"],
                    "<= 1.10" if r["config"] == "dlop_offload" else ""))
    for name in ("dlop_local", "dlop_offload_unscheduled"):
        if name in by and stock is not None:
            out.append((f"{name} / stock samples/s", by[name]["samples_per_s"] / stock["samples_per_s"], ""))
    if off is not None and "dlop_offload_unscheduled" in by:
        un = by["dlop_offload_unscheduled"]
        out.append(("allreduce p99 scheduled / unscheduled", off["allreduce_p99_ms"] / un["allreduce_p99_ms"], ""))
    return out


def ratio_lines(runs: list[list[dict]]) -> list[str]:
    """Each ratio taken within a run, then the median over runs (with the runs' range when more than one)."""
    per_run = [ratios(rows) for rows in runs]
    lines = []
    for i, (what, _, target) in enumerate(per_run[0]):
        values = [run[i][1] for run in per_run]
        spread = f" (runs {min(values):.2f}-{max(values):.2f})" if len(values) > 1 else ""
        goal = f"; target {target}" if target else ""
        lines.append(f"{what} = {_common.median(values):.2f}{spread}{goal}")
    return lines


def traffic_lines(header: dict, rows: list[dict]) -> list[str]:
    """What one step moves, and how long the shaped link needs for it (is the link the bound?)."""
    pixel_bytes = 1 if header["wire"] == "uint8" else 4
    batch = header["batch_per_rank"] * header.get("sample_values", 3 * header["size"] ** 2) * pixel_bytes
    gradient = rows[0]["gradient_mib"] * 2**20
    lines = [f"per step and rank: {gradient / 2**20:.1f} MiB of gradient all-reduced in {rows[0]['buckets']} "
             f"bucket(s); an offloaded batch is {batch / 2**20:.2f} MiB ({header['wire']})"]
    rate, hosts = header.get("link_bytes_per_s"), header.get("trainer_hosts", 1)
    if rate and hosts > 1:
        ring = 2 * (hosts - 1) / hosts * gradient / rate
        per_host = header["ranks"] // hosts
        lines.append(f"at the link's rate: the all-reduce needs >= {1e3 * ring:.0f} ms per step (ring over "
                     f"{hosts} hosts), a trainer host's batches {1e3 * per_host * batch / rate:.0f} ms, the "
                     f"offloader host's {1e3 * header['ranks'] * batch / rate / header['offloader_hosts']:.0f} ms; "
                     f"the fastest config computes {min(r['compute_ms'] for r in rows):.0f} ms per step")
    return lines


def sample(header: dict) -> str:
    clip = header.get("clip")
    if not clip:
        return f"at {header['size']} px"
    low, high = clip["short_side"]
    return (f"of clips ({clip['frames']} frames at stride {clip['stride']}, short side {low}-{high}, crop "
            f"{clip['crop']}, 3D CNN)")


def markdown(header: dict, rows: list[dict], runs: list[list[dict]]) -> str:
    out = [f"# DDP training step: {header.get('placement', '')}", "", "```", header.get("command", ""), "```", "",
           _common.header_comment(header).lstrip("# ") + ".", "",
           f"{header['ranks']} ranks x batch {header['batch_per_rank']} {sample(header)}, model hidden "
           f"{header['hidden']}, {header['warmup']} untimed + {header['steps']} timed steps, k = {header['workers']}, "
           f"offloaded batches as {header['wire']}, median of {header['runs']} run(s). Definitions: the docstring of "
           "`bench/train/train.py`.", "",
           "| config | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for r in rows:
        out.append(f"| {r['config']} | " + " | ".join(cell(k, r[k]) for k in COLUMNS) + " |")
    out += ["", *(f"- {line}" for line in traffic_lines(header, rows) + ratio_lines(runs)), "",
            "![step time per config](train.png)", ""]
    return "\n".join(out)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(PNG_SIZE[0] / 100, PNG_SIZE[1] / 100), dpi=100)
    names = [r["config"] for r in rows]
    bottom = [0.0] * len(rows)
    for key, label, colour in PARTS:
        values = [r[key] for r in rows]
        ax.barh(names, values, left=bottom, label=label, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean over timed steps and ranks)")
    ax.set_title("Where a DDP step's time goes")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(PARTS), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(header: dict, rows: list[dict], runs: list[list[dict]], folder: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    md, png = os.path.join(folder, "train.md"), os.path.join(folder, "train.png")
    with open(md, "w") as f:
        f.write(markdown(header, rows, runs))
    plot(rows, png)
    return [md, png]
