"""The scaling model's terms: what each is, the benchmark that measures it, and how that benchmark's rows become it.

``SOURCES`` names every term for the report's tables (linearity_text.py) and
its runs (linearity_report.py). The functions turn a benchmark's JSON rows
into a term the way a measured run does (``python -m bench.linearity``, whose
calibration runs the benchmarks), so measurements made up from known terms
go through the same steps as real ones.
"""

from __future__ import annotations

from dlop.report import scaling_model as sm

CPU_BYTES = 4 << 20  # the all-reduce whose CPU per call gives a link's CPU per byte (bandwidth-bound, and brief)

# key: (what it is, the benchmark that measured it)
SOURCES = {
    "intra_gbps": ("intra-host link bandwidth (Gbit/s)", "2-rank all-reduce on this host"),
    "intra_latency_us": ("intra-host link latency (us)", "2-rank all-reduce on this host"),
    "net_gbps": ("network bandwidth (Gbit/s)", "dlop-bench p2p between 2 namespace hosts, 2 MiB"),
    "net_latency_us": ("network latency (us)", "dlop-bench p2p between 2 namespace hosts, 8 B ping-pong"),
    "intra_cpu_ns": ("intra-host CPU per byte sent (ns)", "2-rank all-reduce on this host, 4 MiB, CPU per call"),
    "net_cpu_ns": ("network CPU per byte sent (ns)",
                   "2-rank all-reduce between 2 namespace hosts, 4 MiB, CPU per call"),
    "compute_s": ("compute per step (s)", "bench.ddp, model alone, 1 rank"),
    "compute_cpu_s": ("compute CPU per step (s)", "bench.ddp, model alone, 1 rank"),
    "backward_share": ("backward's share of compute (overlap window)", "model alone, backward timed apart"),
    "overhead_s": ("DDP overhead per step (s)", "bench.ddp, 1 rank, DDP less the model alone"),
    "backend_cpu_s": ("backend CPU per rank and step (s)", "bench.ddp, 2 ranks, CPU beyond the model alone's"),
    "crowding": ("CPU per byte sent with more ranks than cores, over a core each",
                 "ring all-reduce of all those ranks on this host, 4 MiB, CPU per call, over the 2-rank one's"),
}


def link_of(rows: list[dict], ranks: int) -> dict:
    """A ring all-reduce's rows (bytes, time_us) as a link: 2(N-1) hops, 2(N-1)/N of the bytes."""
    points = [(2 * (ranks - 1), 2 * (ranks - 1) / ranks * r["bytes"], r["time_us"] * 1e-6) for r in rows]
    link = sm.fit_link(points)
    return {"gbps": link.gbps, "latency_us": link.latency_us}


def cpu_per_byte(rows: list[dict], nbytes: int = CPU_BYTES) -> dict[str, float]:
    """{impl: CPU ns per byte each rank sends}: bench.c10d's CPU per call of a 2-rank all-reduce of `nbytes`
    (a 2-rank ring sends each rank's whole buffer once)."""
    return {r["impl"]: r["cpu_us"] * 1e3 / r["bytes"] for r in rows if r["bytes"] == nbytes}


def crowded_ranks(cores: int) -> int:
    """The ranks of the crowded all-reduce: two per core, at most 16 (enough to tell the slope)."""
    return min(2 * cores, 16)


def p2p_link(rows: list[dict]) -> dict:
    """dlop-bench p2p's rows as a link: the smallest message's one-way latency, the largest's bandwidth."""
    small, large = min(rows, key=lambda r: r["bytes"]), max(rows, key=lambda r: r["bytes"])
    return {"latency_us": small["latency_us"], "gbps": large["bandwidth_gbps"] * 8}


def ddp_terms(one: list[dict], two: list[dict], model: str) -> dict:
    """compute and compute_cpu (the model alone at 1 rank), then per backend its 1-rank overhead and its CPU per
    rank and step at 2 ranks, and its linearity there (the in-sample check)."""
    alone = next(r for r in one if r["model"] == model and r["backend"] == "none")
    # Compute as on a quiet machine: a single-threaded step's CPU time, or its wall time where threads made it
    # shorter; the wall time alone would carry whatever else ran beside it.
    cpu = alone["cpu_ms_per_step"] / 1e3
    compute = min(alone["step_ms"] / 1e3, cpu)
    terms = {"compute_s": compute, "compute_cpu_s": cpu, "gradient_bytes": alone["gradient_mib"] * 2**20,
             "overhead_s": {}, "backend_cpu_s": {}, "linearity_2": {}}
    for r in one:
        if r["model"] == model and r["backend"] != "none":
            terms["overhead_s"][r["backend"]] = max(0.0, r["step_ms"] / 1e3 - alone["step_ms"] / 1e3)
    # Beyond the model alone of the same run, which ran beside the same idle ranks.
    alone_two_row = next(r for r in two if r["model"] == model and r["backend"] == "none")
    alone_two = alone_two_row["cpu_ms_per_step"] / 1e3
    for r in two:
        if r["model"] == model and r["backend"] != "none":
            terms["backend_cpu_s"][r["backend"]] = max(0.0, r["cpu_ms_per_step"] / 1e3 - alone_two)
            terms["linearity_2"][r["backend"]] = r["linearity"]
    terms["background_cores"] = {"1": alone["background_cores"], "2": alone_two_row["background_cores"]}
    return terms
