"""DDP's linearity on H hosts x p ranks, from terms each measured by the benchmark that isolates it.

A DDP step of N = H x p ranks takes a compute phase, DDP's own overhead, and
what of the gradient's all-reduce does not hide behind backward:

    busy      = max(compute + overhead, (compute_cpu + crowding x (backend_cpu + network_cpu)) / cores_per_rank)
    step      = busy + max(links(G) - backward_share x busy, links(last bucket))
    linearity = max(compute, compute_cpu / alone_cores) / step

(links(B): an all-reduce's time on the links alone. A rank's CPU for the
all-reduce, network_cpu included, adds to its busy time instead of hiding
behind the links' time: DDP steps across namespace hosts measure the sum.
On a 1 Gbit/s link, the last bucket's 130 ms on the link had room for all
of that CPU, and the step still paid both. DDP's 1-rank overhead is CPU work
that backend_cpu already holds, so it adds only where the cores do not bind.)

(alone_cores: what the 1-rank baseline had; on a machine shared with other
work, cores are a fair share: cores / (busy ranks + other runnable threads).)

Terms and where they come from (linearity_terms.py; the benchmarks that measure them:
bench/linearity/linearity_calibrate.py):

- intra-host link (latency, bandwidth): ``dlop-bench allreduce --local 2``
  (shm/cma) for dlop, a 2-rank Gloo all-reduce for Gloo;
- network link: ``dlop-bench p2p`` between two namespace hosts (ping-pong
  latency, streaming bandwidth);
- each link's CPU per byte: the CPU a rank's process spends per byte it sends
  in a 2-rank all-reduce through torch, on this host and across two hosts.
  Across hosts TCP costs the backend far more than shared memory does, and
  where cores are few that CPU, not the link, sets the time:
  network_cpu = the bytes a rank sends across hosts per step x (the
  network's CPU per byte - the intra-host link's, which backend_cpu holds);
- compute, compute_cpu (CPU seconds per step) and backward_share: the model
  alone on one rank, forward and backward timed apart;
- overhead: the backend's 1-rank DDP step less the model alone's;
- backend_cpu: the CPU each rank's process spends per step beyond the model
  alone's, from the 2-rank DDP run on one host. CPU contention is a term of its
  own (cores_per_rank), never folded into a link: on a machine with spare
  cores busy = compute, on an oversubscribed one the ranks' CPU is shared;
- crowding: where ranks outnumber cores, each byte a backend moves costs more
  CPU than with a core per rank (waits that yield, switches between ranks,
  caches shared). A ring all-reduce on this host with more ranks than cores
  measures its CPU per byte sent against the 2-rank one's; the backend's CPU
  (its links' CPU per byte, backend_cpu and network_cpu) scales linearly in
  ranks per core from 1 at one core per rank through that point (a ratio
  below 1 counts as 1). The model's own compute is not scaled.

All-reduce of B bytes on the links (alpha = a link's latency, beta = 1 / its
bandwidth); alone, an all-reduce is also never faster than the CPU its
bytes take on the rank's cores (each link's CPU per byte, x crowding):

- flat ring, ranks placed on hosts in rank order (torchrun's placement, so
  one ring edge leaves each host): 2(N-1) steps of B/N bytes, every step as
  slow as the slowest edge (the network once the ring spans hosts);
- hierarchical (dlop's): binomial reduce onto each host's leader, a ring
  among the H leaders, binomial broadcast; segments of HIER_SEGMENT bytes
  flow through the three phases as a pipeline, so the time is the first
  segment through all three plus the slowest phase per further segment.

Gradients go in DDP's buckets: the first holds FIRST_BUCKET bytes, the others
up to bucket_cap; each bucket pays the latencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

ALGORITHMS = ("ring", "hierarchical")
HIER_SEGMENT = 4 << 20  # collectives/algorithms/allreduce_hierarchical.cpp's kSegmentBytes
FIRST_BUCKET = 1 << 20  # torch's dist._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class Link:
    gbps: float  # Gbit/s
    latency_us: float
    cpu_ns_per_byte: float = 0.0  # a rank's CPU (all its threads) per byte it sends on this link

    def seconds(self, steps: float, nbytes: float) -> float:
        """`steps` latencies plus `nbytes` at this link's bandwidth."""
        return steps * self.latency_us * 1e-6 + nbytes * 8 / (self.gbps * 1e9)


def slowest(a: Link, b: Link) -> Link:
    """The edge a lockstep ring waits for when its edges are a and b."""
    return Link(min(a.gbps, b.gbps), max(a.latency_us, b.latency_us), max(a.cpu_ns_per_byte, b.cpu_ns_per_byte))


@dataclass(frozen=True)
class Crowding:
    """A backend's CPU per byte with `ranks_per_core` ranks per core, over its CPU per byte with a core each."""

    factor: float = 1.0
    ranks_per_core: float = 2.0

    def scale(self, cores_per_rank: float) -> float:
        """The backend's CPU multiplier where each rank has `cores_per_rank` cores. A factor below 1 counts as 1:
        sharing a core does not make a byte cheaper. Such a factor says the 2-rank run's CPU held waiting that the
        crowded run did not pay, and waiting is no part of a byte's cost."""
        crowded = 1 / cores_per_rank
        if crowded <= 1 or self.ranks_per_core <= 1 or self.factor <= 1:
            return 1.0
        return 1 + (self.factor - 1) * (crowded - 1) / (self.ranks_per_core - 1)


NO_CROWDING = Crowding()


@dataclass(frozen=True)
class Layout:
    hosts: int
    per_host: int
    cores_per_rank: float  # cores each rank can use (compute threads and the backend's)
    alone_cores: float = math.inf  # cores the 1-rank baseline (the model alone) had

    @property
    def ranks(self) -> int:
        return self.hosts * self.per_host


def ring_allreduce(nbytes: float, ranks: int, link: Link) -> float:
    if ranks <= 1:
        return 0.0
    return link.seconds(2 * (ranks - 1), 2 * (ranks - 1) / ranks * nbytes)


def binomial(nbytes: float, ranks: int, link: Link) -> float:
    """A binomial reduce (or broadcast) of the whole vector over `ranks`: ceil(log2 ranks) rounds."""
    rounds = math.ceil(math.log2(ranks)) if ranks > 1 else 0
    return link.seconds(rounds, rounds * nbytes)


def hierarchical_allreduce(nbytes: float, layout: Layout, intra: Link, net: Link) -> float:
    segments = max(1, math.ceil(nbytes / HIER_SEGMENT))
    seg = nbytes / segments
    local = binomial(seg, layout.per_host, intra)
    leaders = ring_allreduce(seg, layout.hosts, net)
    return 2 * local + leaders + (segments - 1) * max(local, leaders)


def network_bytes(algorithm: str, nbytes: float, layout: Layout) -> float:
    """The bytes a rank sends across hosts in one all-reduce, averaged over the ranks."""
    if layout.hosts <= 1:
        return 0.0
    if algorithm == "hierarchical" and layout.per_host > 1:  # only the leaders' ring crosses hosts
        return 2 * (layout.hosts - 1) / layout.hosts * nbytes / layout.per_host
    ranks = layout.ranks
    return 2 * (ranks - 1) / ranks * nbytes * layout.hosts / ranks  # one ring edge in ranks/hosts leaves a host


def intra_bytes(algorithm: str, nbytes: float, layout: Layout) -> float:
    """The bytes a rank sends to ranks on its own host in one all-reduce, averaged over the ranks."""
    if algorithm == "hierarchical" and layout.hosts > 1:  # binomial reduce, then broadcast: each edge twice
        return 2 * (layout.per_host - 1) / layout.per_host * nbytes
    ranks = layout.ranks
    return 2 * (ranks - 1) / ranks * nbytes - network_bytes(algorithm, nbytes, layout)


def allreduce_seconds(algorithm: str, nbytes: float, layout: Layout, intra: Link, net: Link,
                      crowding: Crowding = NO_CROWDING) -> float:
    """An all-reduce on its own: its time on the links, or the CPU its bytes take, whichever is longer."""
    cpu = (network_bytes(algorithm, nbytes, layout) * net.cpu_ns_per_byte
           + intra_bytes(algorithm, nbytes, layout) * intra.cpu_ns_per_byte) * 1e-9
    cpu *= crowding.scale(layout.cores_per_rank)
    return max(allreduce_on_links(algorithm, nbytes, layout, intra, net), cpu / layout.cores_per_rank)


def allreduce_on_links(algorithm: str, nbytes: float, layout: Layout, intra: Link, net: Link) -> float:
    if algorithm == "ring":
        if layout.hosts == 1:
            return ring_allreduce(nbytes, layout.ranks, intra)
        # In rank order, a ring of one rank per host has only network edges; otherwise it has both kinds.
        return ring_allreduce(nbytes, layout.ranks, net if layout.per_host == 1 else slowest(intra, net))
    if algorithm == "hierarchical":
        if layout.hosts == 1 or layout.per_host == 1:
            return ring_allreduce(nbytes, layout.ranks, net if layout.hosts > 1 else intra)
        return hierarchical_allreduce(nbytes, layout, intra, net)
    raise ValueError(f"unknown all-reduce algorithm '{algorithm}': {', '.join(ALGORITHMS)}")


def buckets(gradient_bytes: float, bucket_bytes: float) -> list[float]:
    """DDP's buckets, in the order they are all-reduced: a small first one, then up to bucket_bytes each."""
    first = min(FIRST_BUCKET, gradient_bytes)
    rest = gradient_bytes - first
    if rest <= 0:
        return [first]
    count = math.ceil(rest / bucket_bytes)
    return [first] + [rest / count] * count


@dataclass(frozen=True)
class Terms:
    """One workload's calibrated terms (seconds per step unless said)."""

    compute_s: float  # the model alone's step on one rank
    compute_cpu_s: float  # its CPU seconds per step
    backward_share: float  # backward's share of compute: the window all-reduce can hide behind
    overhead_s: float  # the backend's 1-rank DDP step less compute_s
    backend_cpu_s: float  # the backend's CPU per rank and step beyond the model alone's
    gradient_bytes: float
    intra: Link
    net: Link
    crowding: Crowding = NO_CROWDING

    def moved(self, **changes) -> Terms:
        return replace(self, **changes)


def step_seconds(t: Terms, algorithm: str, layout: Layout, bucket_bytes: float) -> float:
    """One DDP step on `layout` (see the module's docstring)."""
    sizes = buckets(t.gradient_bytes, bucket_bytes)
    # backend_cpu_s was measured on one host: what the network costs beyond the same bytes over the intra-host link.
    network_cpu = (sum(network_bytes(algorithm, b, layout) for b in sizes)
                   * max(0.0, t.net.cpu_ns_per_byte - t.intra.cpu_ns_per_byte) * 1e-9)
    backend_cpu = (t.backend_cpu_s + network_cpu) * t.crowding.scale(layout.cores_per_rank)
    busy = max(t.compute_s + t.overhead_s, (t.compute_cpu_s + backend_cpu) / layout.cores_per_rank)
    times = [allreduce_on_links(algorithm, b, layout, t.intra, t.net) for b in sizes]
    return busy + max(sum(times) - t.backward_share * busy, times[-1])


def linearity(t: Terms, algorithm: str, layout: Layout, bucket_bytes: float) -> float:
    """The 1-rank baseline's step (on layout.alone_cores) over the N-rank step."""
    alone = max(t.compute_s, t.compute_cpu_s / layout.alone_cores)
    return alone / step_seconds(t, algorithm, layout, bucket_bytes)


def fair_share(cores: float, ranks: int, background: float) -> float:
    """A rank's cores when `ranks` busy ranks and `background` runnable threads of other processes share `cores`
    (a rank alone on spare cores may run its backend's threads beside its compute)."""
    return cores / (ranks + background)


def fit_link(points: list[tuple[float, float, float]]) -> Link:
    """The link that best fits measured (hops, bytes, seconds): seconds = hops x latency + bytes / bandwidth,
    least squares on relative error (so 8 B and 16 MiB weigh alike)."""
    # Normal equations of sum(((h a + b c) - s) / s)^2 in (a, c) = (latency s, s per byte).
    shh = sum((h / s) ** 2 for h, _, s in points)
    sbb = sum((b / s) ** 2 for _, b, s in points)
    shb = sum(h * b / s**2 for h, b, s in points)
    sh = sum(h / s for h, _, s in points)
    sb = sum(b / s for _, b, s in points)
    det = shh * sbb - shb**2
    if det <= 0:
        raise ValueError("fit_link needs points of at least two sizes")
    latency = (sh * sbb - sb * shb) / det
    per_byte = (shh * sb - shb * sh) / det
    if per_byte <= 0:
        raise ValueError(f"fit_link: no bandwidth in these points (seconds per byte {per_byte:.3g})")
    return Link(8 / per_byte / 1e9, max(latency, 0.0) * 1e6)
