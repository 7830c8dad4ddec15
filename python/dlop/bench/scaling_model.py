"""An alpha-beta model of DDP's linearity beyond one machine, calibrated on measured runs.

A step of N ranks takes the one-rank compute time plus what of the gradient
all-reduce does not hide behind backward compute:

    step(N) = compute x oversubscription + overhead + exposed
    exposed = max(allreduce(G) - BACKWARD_SHARE x compute, allreduce(last bucket))
    linearity(N) = compute / step(N)

overhead is what DDP itself adds to a step with nothing to communicate (its
1-rank step less the model alone's: gradient hooks, bucket copies).

Overlap assumption (DDP's): gradients are all-reduced in buckets of
``bucket_cap_mb`` while backward goes on, so communication hides behind the
backward pass (BACKWARD_SHARE = 2/3 of the step: backward costs about twice
forward) except the last bucket, which only starts when backward ends.
Compute is not slowed by communication (true of GPUs with their own copy
engines; on CPUs the transport's threads take cores from compute, which the
checks against measured runs show as error).

All-reduce of B bytes over N ranks, each bucket paying the latencies
(alpha = link latency, beta = 1 / link bandwidth):

- flat ring: 2(N-1) alpha + 2(N-1)/N B beta over the slowest link on the ring
  (the network link as soon as the ranks span more than one host);
- hierarchical, p ranks per host and H = N / p hosts: an intra-host reduce
  ((p-1) alpha_intra + (p-1)/p B beta_intra), a ring among the H host
  leaders (2(H-1) alpha_net + 2(H-1)/H B beta_net), an intra-host broadcast
  (as the reduce).

The intra-host link is calibrated: its bandwidth is the one that best fits
the measured step times of the smallest measured N > 1 (that N is in-sample,
the others are a real check); its latency is a parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BACKWARD_SHARE = 2.0 / 3.0
ALGORITHMS = ("flat ring", "hierarchical")


@dataclass(frozen=True)
class Link:
    gbps: float  # Gbit/s
    latency_us: float

    def seconds(self, steps: float, nbytes: float) -> float:
        """`steps` latencies plus `nbytes` at this link's bandwidth."""
        return steps * self.latency_us * 1e-6 + nbytes * 8 / (self.gbps * 1e9)


def ring_allreduce(nbytes: float, ranks: int, link: Link) -> float:
    if ranks <= 1:
        return 0.0
    return link.seconds(2 * (ranks - 1), 2 * (ranks - 1) / ranks * nbytes)


def hierarchical_allreduce(nbytes: float, ranks: int, per_host: int, intra: Link, net: Link) -> float:
    p = min(per_host, ranks)
    hosts = math.ceil(ranks / p)
    local = intra.seconds(p - 1, (p - 1) / p * nbytes) if p > 1 else 0.0
    return 2 * local + ring_allreduce(nbytes, hosts, net)  # reduce, leaders' ring, broadcast


def allreduce_seconds(algorithm: str, nbytes: float, ranks: int, per_host: int, intra: Link, net: Link) -> float:
    if algorithm == "flat ring":
        return ring_allreduce(nbytes, ranks, net if ranks > per_host else intra)
    if algorithm == "hierarchical":
        return hierarchical_allreduce(nbytes, ranks, per_host, intra, net)
    raise ValueError(f"unknown all-reduce algorithm '{algorithm}': {', '.join(ALGORITHMS)}")


def step_seconds(compute_s: float, gradient_bytes: float, bucket_bytes: float, algorithm: str, ranks: int,
                 per_host: int, intra: Link, net: Link, oversubscription: float = 1.0, overhead_s: float = 0.0) -> float:
    """One DDP step of `ranks` ranks (see the module's docstring for the overlap assumption)."""
    if ranks <= 1:
        return compute_s * oversubscription + overhead_s
    buckets = max(1, math.ceil(gradient_bytes / bucket_bytes))
    last = gradient_bytes - (buckets - 1) * bucket_bytes

    def bucketed(nbytes: float, count: int) -> float:
        # Each bucket pays the latencies; the bytes add up.
        return count * allreduce_seconds(algorithm, nbytes / count, ranks, per_host, intra, net)

    whole = bucketed(gradient_bytes, buckets)
    exposed = max(whole - BACKWARD_SHARE * compute_s, bucketed(last, 1))
    return compute_s * oversubscription + overhead_s + exposed


def linearity(compute_s: float, step_s: float) -> float:
    return compute_s / step_s


def oversubscription(ranks_on_host: int, threads: int, cores: int) -> float:
    """How much slower each rank computes when its host has fewer cores than its ranks' threads."""
    return max(1.0, ranks_on_host * threads / cores)


@dataclass
class Workload:
    """What the model needs of one benchmark model, from the measured runs."""

    name: str
    compute_s: float  # the 1-rank step time (model alone)
    gradient_bytes: float
    overhead_s: float = 0.0  # DDP's 1-rank step time less compute_s (at least 0)


def fit_intra_gbps(points: list[tuple[Workload, int, float, float]], bucket_bytes: float, latency_us: float) -> float:
    """The intra-host bandwidth (Gbit/s) that best fits measured (workload, ranks, oversubscription, step_s)
    points on one host, by a log-spaced search (relative squared error of the step time)."""
    best, best_error = 1.0, math.inf
    for k in range(401):
        gbps = 10 ** (-2 + 6 * k / 400)  # 0.01 .. 10000 Gbit/s
        link = Link(gbps, latency_us)
        error = sum(((step_seconds(w.compute_s, w.gradient_bytes, bucket_bytes, "flat ring", n, n, link, link, o,
                                   w.overhead_s) - measured) / measured) ** 2 for w, n, o, measured in points)
        if error < best_error - 1e-12:
            best, best_error = gbps, error
    return best
