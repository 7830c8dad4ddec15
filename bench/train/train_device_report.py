"""The output of ``python -m bench.train --device DEV``: rows from the trainers' measurements, ratios,
targets, the table, train_device.md and train_device.png."""

from __future__ import annotations

import math
import os

from bench.common import _common

COLUMNS = ("samples_per_s", "device_busy", "data_stall_ms", "trainer_cpu_ms_per_sample",
           "offloader_cpu_ms_per_sample", "peak_pinned_mib")
BASES = ("stock", "stock_uint8", "stock_all_cores", "synthetic", "gpu_decode")
# Where dlop_offload's gain over stock comes from, as (factor, row, base): their product is dlop_offload/stock.
FACTORS = (("format", "stock_uint8", "stock"), ("decoder", "native_local", "stock_uint8"),
           ("offloading", "dlop_offload", "native_local"))
PNG_SIZE = (900, 450)  # pixels: figsize (9, 4.5) at 100 dpi
# The targets on a GPU with K = 4, as (row, base, least ratio) of samples/s.
TARGETS = {"image": (("dlop_offload", "stock", 3.0), ("dlop_offload", "stock_all_cores", 1.3),
                     ("dlop_offload", "stock_uint8", 1.5), ("dlop_offload", "gpu_decode", 1.0),
                     ("dlop_run", "dlop_offload", 0.8)),
           "video": (("dlop_offload", "stock", 4.0), ("dlop_offload", "stock_all_cores", 1.2)),
           "audio": ()}


def describe_sample(args) -> str:
    if args.kind == "image":
        return f"JPEG -> RandomResizedCrop {args.size}, flip, normalise"
    if args.kind == "video":
        c = args.clip
        return (f"{c['frames']} frames at stride {c['stride']}, short side {c['short_side'][0]}-"
                f"{c['short_side'][1]}, crop {c['crop']}, flip, multi-label")
    return f"80-bin log-mel of a random {args.audio_seconds:g} s crop, SpecAugment"


def summarise(row: str, raw: dict, batch: int, base: dict) -> dict:
    """One row's figures from its trainer's measurements (definitions: bench.train.train_device)."""
    samples = raw["samples"]  # trained on in the timed window, as the batches held them
    out = {"row": row, "samples_per_s": samples / raw["wall_s"], "device_busy": raw["busy_s"] / raw["wall_s"],
           "data_stall_ms": 1e3 * sum(raw["stall_s"]) / max(1, len(raw["stall_s"])),
           "trainer_cpu_ms_per_sample": 1e3 * raw["trainer_cpu_s"] / samples,
           "offloader_cpu_ms_per_sample": 1e3 * raw["offloader_cpu_s"] / samples,
           "peak_pinned_mib": raw["peak_pinned_mib"], "steps": raw["steps"], "wall_s": raw["wall_s"],
           "cores": raw["cores"], "loss": raw["loss"], "row_wall_s": raw.get("row_wall_s"),
           "untimed_steps": raw["warmup"], "drained_batches": raw["drained"], "input_dtype": raw["input_dtype"]}
    if row in ("stock", "stock_uint8", "stock_all_cores", "gpu_decode", "dlop_run"):
        out["workers"] = raw["workers"]
    elif row == "native_local":
        out["threads"] = raw["workers"]
    if row in ("dlop_offload", "native_local"):
        out["pipeline"] = base["offload_path"] if row == "dlop_offload" else "native"
    if row == "dlop_run":
        out["dlop_run_loader"] = raw.get("dlop_run")  # "offloaded" when dlop run took the DataLoader over
    return out


def ratios(rows: list[dict]) -> dict:
    """samples/s of every row over each base row present, and trainer-host CPU per sample over stock's."""
    by = {r["row"]: r for r in rows}
    out = {}
    for base in BASES:
        if base in by:
            for r in rows:
                if r["row"] != base:
                    out[f"{r['row']}/{base}"] = r["samples_per_s"] / by[base]["samples_per_s"]
    if "dlop_run" in by and "dlop_offload" in by:
        out["dlop_run/dlop_offload"] = by["dlop_run"]["samples_per_s"] / by["dlop_offload"]["samples_per_s"]
    if "stock" in by:
        for name in ("dlop_offload", "dlop_run"):
            if name in by and by["stock"]["trainer_cpu_ms_per_sample"] > 0:
                out[f"{name}/stock trainer cpu per sample"] = (by[name]["trainer_cpu_ms_per_sample"] /
                                                                by["stock"]["trainer_cpu_ms_per_sample"])
    return out


def attribution(rows: list[dict]) -> dict:
    """Each factor of dlop_offload's gain over stock whose two rows ran: its samples/s ratio."""
    by = {r["row"]: r for r in rows}
    return {f"{name} ({row}/{base})": by[row]["samples_per_s"] / by[base]["samples_per_s"]
            for name, row, base in FACTORS if row in by and base in by}


def targets(kind: str, rows: list[dict]) -> list[dict]:
    """The targets whose rows ran: each with its measured ratio and whether it is met."""
    by = {r["row"]: r for r in rows}
    out = []
    for row, base, least in TARGETS[kind]:
        if row in by and base in by:
            ratio = by[row]["samples_per_s"] / by[base]["samples_per_s"]
            out.append({"what": f"{row}/{base} samples/s", "ratio": ratio, "target": least, "met": ratio >= least})
    if "stock" in by:
        for row in ("dlop_offload", "dlop_run"):
            if row in by and by["stock"]["trainer_cpu_ms_per_sample"] > 0:
                ratio = by[row]["trainer_cpu_ms_per_sample"] / by["stock"]["trainer_cpu_ms_per_sample"]
                out.append({"what": f"{row}/stock trainer-host CPU per sample", "ratio": ratio, "target": 0.1,
                            "met": ratio <= 0.1, "at_most": True})
    return out


def cores_to_feed(rows: list[dict]) -> float | None:
    """Offloader cores that would feed the device at synthetic's rate: its samples/s x dlop_offload's offloader
    CPU per sample."""
    by = {r["row"]: r for r in rows}
    if "synthetic" not in by or "dlop_offload" not in by:
        return None
    return by["synthetic"]["samples_per_s"] * by["dlop_offload"]["offloader_cpu_ms_per_sample"] / 1e3


def cell(key: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.1f}" if key in ("samples_per_s", "peak_pinned_mib") else \
        f"{value:.2f}" if key != "data_stall_ms" else f"{value:.1f}"


def lines(header: dict, rows: list[dict]) -> list[str]:
    """The ratios, targets and notes, one line each."""
    out = [f"{k} = {v:.2f}" for k, v in header["ratios"].items()]
    factors = header.get("attribution", {})
    for name, value in factors.items():
        out.append(f"gain from the {name} = {value:.2f}x")
    if len(factors) == len(FACTORS):
        out.append("dlop_offload/stock = format x decoder x offloading = " +
                   " x ".join(f"{v:.2f}" for v in factors.values()) + f" = {math.prod(factors.values()):.2f}")
    for t in header["targets"]:
        sign = "<=" if t.get("at_most") else ">="
        out.append(f"target {t['what']} {sign} {t['target']:g}: {t['ratio']:.2f} ({'met' if t['met'] else 'NOT met'})")
    if header.get("offloader_cores_to_feed_device") is not None:
        out.append(f"offloader cores to feed the device at synthetic's rate: "
                   f"{header['offloader_cores_to_feed_device']:.1f} (given {len(header['offloader_cores'])})")
    for row, why in header.get("absent", {}).items():
        out.append(f"{row}: absent: {why}")
    for row, why in header.get("skipped", {}).items():
        out.append(f"{row}: skipped: {why}")
    for r in rows:
        if r["row"] == "dlop_run" and r.get("dlop_run_loader") != "offloaded":
            out.append(f"dlop_run: the DataLoader was NOT offloaded ({r.get('dlop_run_loader')})")
    return out


def print_table(rows: list[dict], header: dict) -> None:
    line = "{:>16} " + " ".join(["{:>14}"] * len(COLUMNS))
    print(line.format("# row", *COLUMNS))
    for r in rows:
        print(line.format(r["row"], *(cell(k, r[k]) for k in COLUMNS)), flush=True)
    for row, why in header.get("skipped", {}).items():
        print("{:>16} skipped: {}".format(row, why))
    for text in lines(header, rows):
        print(f"# {text}")


def markdown(header: dict, rows: list[dict]) -> str:
    cores = header["trainer_cores"]
    out = [f"# {header['kind']} training on one {header['device']} device: offloaded preprocessing against "
           "torch's DataLoader", "", "```", header.get("command", ""), "```", "",
           _common.header_comment(header).lstrip("# ") + ".", "",
           f"{header['model']}, batch {header['batch']}, {header['sample']}; trainer on {len(cores)} core(s) "
           f"{cores}, offloaders on {header['offloader_cores']} (one daemon per core), stock_all_cores on "
           f"{len(header['all_cores'])}; DataLoader workers {header['workers']}, native_local "
           f"{header['native_local_threads']} threads; autocast {header['autocast']}, channels_last "
           f"{header['channels_last']}. "
           "Definitions: the docstring of `bench/train/train_device.py`.", "",
           "| row | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for r in rows:
        out.append(f"| {r['row']} | " + " | ".join(cell(k, r[k]) for k in COLUMNS) + " |")
    for row, why in header.get("skipped", {}).items():
        out.append(f"| {row} | skipped: {why} |" + " |" * (len(COLUMNS) - 1))
    out += ["", *(f"- {text}" for text in lines(header, rows)), "", "![samples/s per row](train_device.png)", ""]
    return "\n".join(out)


def plot(header: dict, rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(PNG_SIZE[0] / 100, PNG_SIZE[1] / 100), dpi=100)
    names = [r["row"] for r in rows]
    rates = [r["samples_per_s"] for r in rows]
    colour = {"synthetic": "#8c8c8c", "gpu_decode": "#c44e52", "native_local": "#8172b2"}
    bars = ax.bar(names, rates, color=[colour.get(n, "#c44e52" if n.startswith("stock") else "#4c72b0")
                                       for n in names])
    for bar, r in zip(bars, rows):
        ax.annotate(f"busy {r['device_busy']:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("samples/s")
    ax.set_title(f"{header['kind']}, {header['model']} on {header['device']}, trainer on "
                 f"{len(header['trainer_cores'])} core(s): samples/s and device-busy fraction")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(header: dict, rows: list[dict], folder: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    md, png = os.path.join(folder, "train_device.md"), os.path.join(folder, "train_device.png")
    with open(md, "w") as f:
        f.write(markdown(header, rows))
    plot(header, rows, png)
    return [md, png]
