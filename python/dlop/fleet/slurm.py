"""What dlop takes from SLURM's environment.

dlop.init() and `dlop run` under srun: besides rank and size, the rendezvous
address (the step's first node, where srun puts task 0) and a port that
differs between jobs sharing a node. In a heterogeneous job, `dlop offloader`
(het group 1) and `dlop run` (het group 0) agree on the offloaders' addresses
from the job alone: group 1's node list and a port derived from the job id."""

from __future__ import annotations

import re

# srun sets the step's node list; the job's is the fallback (sbatch's batch step).
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
PORT_BASE, PORT_SPAN = 20000, 20000  # MASTER_PORT = PORT_BASE + SLURM_JOB_ID % PORT_SPAN

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list ("node[01-03,07],login1", also "r[1-2]n[1-2]") as host names."""
    hosts: list[str] = []
    for item in _split_top(text):
        if not item:
            raise ValueError(f"empty host name in {text!r}")
        hosts += _expand_one(item, text)
    return hosts


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for k, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in {text!r}")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"']' without '[' in {text!r}")
        elif c == "," and depth == 0:
            items.append(text[start:k])
            start = k + 1
    if depth:
        raise ValueError(f"'[' without ']' in {text!r}")
    items.append(text[start:])
    return items


def _expand_one(item: str, text: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, spec, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    numbers: list[str] = []
    for part in spec.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ValueError(f"{part!r} in {text!r} is not a number or a range N-M")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {part!r} in {text!r} runs backwards")
        width = len(low)  # "01-10": zero-padded to the lower bound's width, as Slurm writes it
        numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    tails = _expand_one(rest, text) if rest else [""]
    return [prefix + n + t for n in numbers for t in tails]


def master_addr(env) -> str | None:
    """The step's first host, or None without a node list; ValueError naming the variable if unreadable."""
    for name in NODELIST_VARS:
        value = env.get(name)
        if value:
            try:
                return expand_hostlist(value)[0]
            except ValueError as e:
                raise ValueError(f"dlop.init: {name}={value!r} is not a Slurm host list: {e}; "
                                 "set MASTER_ADDR to the first node's address") from None
    return None


def master_port(env) -> str | None:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job is None:
        return None
    if not job.isdigit():
        raise ValueError(f"dlop.init: SLURM_JOB_ID={job!r} is not a number; set MASTER_PORT")
    return str(PORT_BASE + int(job) % PORT_SPAN)


# ------------------------------------------------ offloaders in a heterogeneous job

# `dlop offloader` in het group 1 listens on OFFLOADER_PORT_BASE + SLURM_JOB_ID % OFFLOADER_PORT_SPAN
# (+ SLURM_LOCALID): every component of a het job sees the leader's id, so the trainers in group 0
# compute the same port. Below Linux's ephemeral range (32768-60999) and MASTER_PORT's (20000-39999).
OFFLOADER_PORT_BASE, OFFLOADER_PORT_SPAN = 10000, 10000
OFFLOADER_GROUP = "1"  # the het group that runs the offloaders
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node list ("2(x3),1") as one count per node ([2, 2, 2, 1])."""
    counts: list[int] = []
    for part in text.split(","):
        m = _TASKS.match(part.strip())
        if not m:
            raise ValueError(f"{part!r} in {text!r} is not N or N(xM)")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def tasks_on_this_node(env) -> int:
    """How many tasks of this srun step run on this node (1 outside a step)."""
    counts = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or "1")
    node = env.get("SLURM_NODEID") or "0"
    if not node.isdigit():
        raise ValueError(f"SLURM_NODEID={node!r} is not a number")
    return counts[min(int(node), len(counts) - 1)]


def _job_id(env) -> int:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not job.isdigit():
        raise ValueError(f"SLURM_JOB_ID={job!r} is not a job id")
    return int(job)


def offloader_port(env) -> int:
    """The first offloader port of this job on each node (DLOP_SLURM_OFFLOADER_PORT overrides it)."""
    fixed = env.get("DLOP_SLURM_OFFLOADER_PORT")
    if fixed is not None:
        if not fixed.isdigit() or not 0 < int(fixed) < 65536:
            raise ValueError(f"DLOP_SLURM_OFFLOADER_PORT={fixed!r} is not a port number")
        return int(fixed)
    return OFFLOADER_PORT_BASE + _job_id(env) % OFFLOADER_PORT_SPAN


def het_offloaders(env) -> list[str] | None:
    """HOST:PORT of every offloader task of het group 1, or None outside a job with such a group.

    Node i of SLURM_JOB_NODELIST_HET_GROUP_1 runs SLURM_TASKS_PER_NODE_HET_GROUP_1[i] tasks,
    task k listening on offloader_port() + k. ValueError naming the variable when one is unreadable."""
    nodes_var = f"SLURM_JOB_NODELIST_HET_GROUP_{OFFLOADER_GROUP}"
    tasks_var = f"SLURM_TASKS_PER_NODE_HET_GROUP_{OFFLOADER_GROUP}"
    if not env.get(nodes_var):
        return None
    try:
        hosts = expand_hostlist(env[nodes_var])
        counts = tasks_per_node(env[tasks_var]) if env.get(tasks_var) else [1] * len(hosts)
        port = offloader_port(env)
    except ValueError as e:
        raise ValueError(f"the offloaders of SLURM het group {OFFLOADER_GROUP}: {e}") from None
    if len(counts) != len(hosts):
        raise ValueError(f"{tasks_var}={env.get(tasks_var)!r} counts {len(counts)} nodes, "
                         f"{nodes_var}={env[nodes_var]!r} names {len(hosts)}")
    return [f"{host}:{port + k}" for host, n in zip(hosts, counts) for k in range(n)]


def torch_env(env) -> dict[str, str]:
    """torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) for an srun task,
    those `env` lacks; {} outside a job step. ValueError naming the variable when one is unreadable."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return {}
    names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
    values = {n: env.get(n, "0") for n in names}
    bad = [f"{n}={v!r}" for n, v in values.items() if not v.isdigit()]
    if bad:
        raise ValueError(f"{', '.join(bad)}: not a number")
    mapped = {"RANK": values["SLURM_PROCID"], "WORLD_SIZE": values["SLURM_NTASKS"],
              "LOCAL_RANK": values["SLURM_LOCALID"]}
    addr, port = master_addr(env), master_port(env)
    if addr is not None:
        mapped["MASTER_ADDR"] = addr
    if port is not None:
        mapped["MASTER_PORT"] = port
    return {k: v for k, v in mapped.items() if k not in env}
