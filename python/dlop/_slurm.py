"""What dlop.init() takes from srun's environment besides rank and size: the
rendezvous address (the step's first node, where srun puts task 0) and a port
that differs between jobs sharing a node."""

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
